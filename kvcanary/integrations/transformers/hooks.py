"""The functions of transformers' continuous batching the canary wraps, and the dispatch to the attached handles.

Every wrapper is installed on the class (transformers builds its manager, batch processor and cache inside
``generate_batch``), once, however many handles are attached; each call is routed to the session of the cache
it acts on, and passes straight through when no attached handle owns that cache. The last ``detach()`` puts the
original functions back (the very same objects).

| wrapped (class.function) | when the engine calls it | what the canary does |
|---|---|---|
| ``ContinuousBatchProcessor._generation_step`` | each engine step: model kwargs, forward, sampling | HEAD before, TAIL after (a sweep first when due) |
| ``ContinuousBatchingManager.__init__`` | a manager is built (config resolved) | refuse unsupported settings, early |
| ``ContinuousBatchingManager._create_batch_processor`` | ``warmup()`` / the loop builds or resets the processor | start a session on a new cache |
| ``PagedAttentionCache.free_blocks`` | finish, cancel, offload, soft reset | release the request's table row |
| ``PagedAttentionCache.free_all_requests`` | processor reset, cache reset | release every row (and forget hashed blocks) |
| ``PagedAttentionCache.perform_cache_copy`` | forks copy the parent's partial blocks | copy their records |
| ``CacheAllocator.mark_complete_blocks`` | blocks completed: hashed, maybe de-duplicated | remember their content for the sweep |
| ``OffloadingManager._offload_to_cpu`` | victims copied to the CPU swap pool | gather their records to the host |
| ``OffloadingManager.restore_scheduled_requests`` | offloaded requests copied back | scatter their records into the new blocks |

``PagedAttentionCache.update`` is deliberately not used: the flash decode path and graph replays skip it, and
the per-step write index already says where the forward writes.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("kvcanary")

_lock = threading.RLock()
_handles: list[Any] = []                                   # attached handles, oldest first
_originals: dict[tuple[type, str], Any] = {}               # (class, name) -> the engine's own function
_wrappers: dict[tuple[type, str], Any] = {}                # (class, name) -> the installed wrapper
_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # cache -> (handle, session)
_allocators: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # allocator -> cache


def _classes() -> dict[str, type]:
    from transformers.generation.continuous_batching import cache as cb_cache
    from transformers.generation.continuous_batching import continuous_api as cb_api
    from transformers.generation.continuous_batching import offloading_manager as cb_off
    from transformers.generation.continuous_batching.cache_allocators import cache_allocator as cb_alloc

    return {"processor": cb_api.ContinuousBatchProcessor, "manager": cb_api.ContinuousBatchingManager,
            "cache": cb_cache.PagedAttentionCache, "allocator": cb_alloc.CacheAllocator,
            "offloading": cb_off.OffloadingManager}


# -- registry ---------------------------------------------------------------------------------------------------


def register_session(handle: Any, session: Any) -> None:
    with _lock:
        _sessions[session.cache] = (handle, session)
        for alloc in session.cache.cache_allocators.values():
            _allocators[alloc] = session.cache


def unregister_session(session: Any) -> None:
    with _lock:
        _sessions.pop(session.cache, None)


def session_of_cache(cache: Any) -> Any:
    entry = _sessions.get(cache)
    return None if entry is None else entry[1]


def _entry_of_cache(cache: Any) -> tuple[Any, Any] | None:
    return _sessions.get(cache)


def handle_of_manager(manager: Any) -> Any:
    for h in _handles:
        if h.owns_manager(manager):
            return h
    return None


def attached_handles() -> list[Any]:
    return list(_handles)


# -- the wrappers -------------------------------------------------------------------------------------------------


def _generation_step(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, model):
        entry = _entry_of_cache(self.cache)
        if entry is None:
            return orig(self, model)
        handle, session = entry
        try:
            session.head()
        except BaseException as e:
            session.abort()
            handle.record_error(e)
            raise
        try:
            out = orig(self, model)
        except BaseException:
            session.abort()
            raise
        try:
            session.tail()
        except BaseException as e:
            handle.record_error(e)
            raise
        return out
    return wrapper


def _manager_init(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        handle = handle_of_manager(self)
        if handle is not None:
            handle.check_new_manager(self)
    return wrapper


def _create_batch_processor(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self):
        handle = handle_of_manager(self)
        if handle is None:
            return orig(self)
        if getattr(self, "batch_processor", None) is None:
            handle.retire_session()   # before the new cache is allocated: the old one's canary lets it go
        processor = orig(self)
        handle.bind(self, processor)
        return processor
    return wrapper


def _free_blocks(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, request_id, no_cache=False):
        orig(self, request_id, no_cache)
        s = session_of_cache(self)
        if s is not None:
            s.on_request_freed(request_id)
    return wrapper


def _free_all_requests(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, clear_ledgers=False):
        orig(self, clear_ledgers)
        s = session_of_cache(self)
        if s is not None:
            s.on_all_freed(clear_ledgers)
    return wrapper


def _perform_cache_copy(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, copy_src_and_dst):
        orig(self, copy_src_and_dst)
        s = session_of_cache(self)
        if s is not None:
            s.on_fork_copy(copy_src_and_dst)
    return wrapper


def _mark_complete_blocks(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, request_id, token_ids, new_new_blocks):
        cache = _allocators.get(self)
        s = None if cache is None else session_of_cache(cache)
        if s is None or s.alloc is not self:
            return orig(self, request_id, token_ids, new_new_blocks)
        before = list(self.block_table.get(request_id, ()))
        orig(self, request_id, token_ids, new_new_blocks)
        s.on_blocks_hashed(request_id, token_ids, before)
    return wrapper


def _offload_to_cpu(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, victims, victim_block_tables):
        offloaded = orig(self, victims, victim_block_tables)
        s = session_of_cache(self.cache)
        if s is not None:
            s.on_offloaded(self, victim_block_tables, set(offloaded))
        return offloaded
    return wrapper


def _restore_scheduled_requests(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def wrapper(self, requests_in_batch):
        s = session_of_cache(self.cache)
        if s is None:
            return orig(self, requests_in_batch)
        pairs = s.restore_pairs(self, requests_in_batch)   # the engine forgets its CPU blocks as it restores
        out = orig(self, requests_in_batch)
        s.on_restored(self, pairs)
        return out
    return wrapper


#: (class key, function name, wrapper factory), in the order they are installed.
PATCHES: tuple[tuple[str, str, Callable[[Callable], Callable]], ...] = (
    ("processor", "_generation_step", _generation_step),
    ("manager", "__init__", _manager_init),
    ("manager", "_create_batch_processor", _create_batch_processor),
    ("cache", "free_blocks", _free_blocks),
    ("cache", "free_all_requests", _free_all_requests),
    ("cache", "perform_cache_copy", _perform_cache_copy),
    ("allocator", "mark_complete_blocks", _mark_complete_blocks),
    ("offloading", "_offload_to_cpu", _offload_to_cpu),
    ("offloading", "restore_scheduled_requests", _restore_scheduled_requests),
)


def patched_functions() -> dict[str, Any]:
    """``{"Class.function": the function the class holds now}`` for every function the canary wraps."""
    classes = _classes()
    return {f"{classes[key].__name__}.{name}": classes[key].__dict__[name] for key, name, _ in PATCHES}


def add_handle(handle: Any) -> None:
    """Register an attached handle; the first one installs the wrappers."""
    with _lock:
        if not _handles:
            classes = _classes()
            for key, name, factory in PATCHES:
                cls = classes[key]
                orig = cls.__dict__[name]
                wrapper = factory(orig)
                _originals[(cls, name)] = orig
                _wrappers[(cls, name)] = wrapper
                setattr(cls, name, wrapper)
        _handles.append(handle)


def remove_handle(handle: Any) -> None:
    """Unregister a handle; the last one puts the engine's own functions back."""
    with _lock:
        if handle in _handles:
            _handles.remove(handle)
        for cache, (h, _s) in list(_sessions.items()):
            if h is handle:
                _sessions.pop(cache, None)
        if _handles:
            return
        for (cls, name), orig in list(_originals.items()):
            if cls.__dict__.get(name) is _wrappers[(cls, name)]:
                setattr(cls, name, orig)
            else:
                # Someone patched over the wrapper after attach: restoring would drop their patch. The wrapper
                # left inside it passes every call straight through now that no handle is attached.
                logger.warning("kv-canary: %s.%s was replaced after attach(); left as it is", cls.__name__, name)
        _originals.clear()
        _wrappers.clear()
