"""``attach()`` and the :class:`CanaryHandle` it returns."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from kvcanary.consts import RealKvHashMode
from kvcanary.errors import invalid
from kvcanary.integrations.transformers import hooks, refusals
from kvcanary.integrations.transformers.geometry import FULL_ATTENTION
from kvcanary.integrations.transformers.refusals import UnsupportedSettingError
from kvcanary.integrations.transformers.session import CanarySession, SessionOptions
from kvcanary.runtime.canary import KVCanary
from kvcanary.runtime.collector import check_mode
from kvcanary.runtime.health import CanaryHealth
from kvcanary.runtime.report import CanaryViolationError, Violation

logger = logging.getLogger("kvcanary")

#: The transformers release this integration was written against and is tested with.
TESTED_TRANSFORMERS_VERSION = "5.24.0"

# KVCanary arguments the integration derives from the cache (attach() refuses them in canary_kwargs).
_DERIVED = frozenset({"num_slots", "max_batch_size", "max_tokens_per_step", "device", "with_v", "k_sources",
                      "v_sources", "real_kv_hash_mode", "mode", "block_size", "pad_row", "sweep_interval",
                      "expected_tokens_shape", "name", "swa"})


class CanaryHandle:
    """A :class:`~kvcanary.KVCanary` attached to a transformers continuous-batching run (see :func:`attach`).

    The canary is built when the engine builds its cache (at ``manager.warmup()``, or at the start of
    ``generate_batch``), sized from it, and lives as long as that cache: a new ``generate_batch`` call builds a
    new cache and so a new canary (the previous one's violations are kept in :attr:`violations`). The handle
    keeps the latest canary, and through its real-KV sources the latest cache, until the next run starts or it is
    detached and dropped.

    Use it as a context manager (``with attach(model) as h: ...``) or call :meth:`detach`. Detach once the
    generation loop has stopped (``generate_batch`` returned, or ``manager.stop()``).
    """

    def __init__(self, target: Any, options: SessionOptions) -> None:
        from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

        self.options = options
        self._manager = target if isinstance(target, ContinuousBatchingManager) else None
        self.model = target.model if self._manager is not None else target
        self._session: CanarySession | None = None
        self._retired: list[Violation] = []
        self._totals = {"sessions": 0, "engine_steps": 0, "fork_blocks": 0, "offloaded_blocks": 0,
                        "restored_blocks": 0, "dedup_swaps": 0, "soft_resets": 0}
        self.errors: list[BaseException] = []
        self.attached = False

    # -- what attach() and the hooks call -----------------------------------------------------------------

    def owns_manager(self, manager: Any) -> bool:
        if self._manager is not None:
            return manager is self._manager
        return getattr(manager, "model", None) is self.model

    def check_new_manager(self, manager: Any) -> None:
        """A manager of this handle's model was just built: refuse what its resolved config turns on, leaving
        the model's attention implementation as it was."""
        try:
            refusals.check_manager(manager)
        except UnsupportedSettingError:
            original = getattr(manager, "_original_attn_impl", None)
            if original is not None:
                manager.model.set_attn_implementation(original)
                manager._original_attn_impl = None
            raise

    def bind(self, manager: Any, processor: Any) -> None:
        """The manager built (or reset and kept) its batch processor: start a session for a new cache."""
        s = self._session
        if s is not None and s.processor is processor and s.cache is processor.cache:
            return   # a persistent manager's next run: same cache, same canary (rows were freed by the reset)
        self.retire_session()
        refusals.check_processor(processor)
        alloc = processor.cache.cache_allocators[FULL_ATTENTION]
        if alloc.ledger.block_to_hash or alloc.block_table:
            raise invalid("the manager's cache already holds KV the canary has not seen (a persistent manager that "
                          "ran before attach()); attach before its first run")
        self._session = CanarySession(processor, manager.model, self.options)
        self._totals["sessions"] += 1
        hooks.register_session(self, self._session)

    def retire_session(self, *, keep: bool = False) -> None:
        """Stop serving the current session: read its outstanding violations, unregister it, and (unless ``keep``)
        drop it, releasing its canary and the cache its sources view."""
        s = self._session
        if s is None:
            return
        hooks.unregister_session(s)
        try:
            s.canary.poll(sync=True)
        except CanaryViolationError as e:   # raise mode: violations of the last steps, read only now
            self.record_error(e)
        if not keep:
            for k, v in {**s.mover.moved, **s.events}.items():
                self._totals[k] += v
            self._totals["engine_steps"] += s.engine_steps
            self._retired.extend(s.canary.violations)
            self._session = None

    def record_error(self, error: BaseException) -> None:
        """A canary error raised in the engine's thread (the engine then fails its requests)."""
        self.errors.append(error)

    # -- public -------------------------------------------------------------------------------------------

    @property
    def canary(self) -> KVCanary | None:
        """The canary of the current (or last) run; None before the engine built its first cache."""
        return None if self._session is None else self._session.canary

    @property
    def session(self) -> CanarySession | None:
        """The current session (tables, record mover, step log), for inspection."""
        return self._session

    @property
    def error(self) -> BaseException | None:
        """The first canary error raised in the engine's thread (``mode="raise"``), or None."""
        return self.errors[0] if self.errors else None

    @property
    def violations(self) -> list[Violation]:
        """Every violation decoded so far, over every run of this handle, oldest first."""
        current = [] if self._session is None else self._session.canary.violations
        return self._retired + current

    def poll(self, *, sync: bool = True) -> list[Violation]:
        """The current canary's new violations (see :meth:`kvcanary.KVCanary.poll`; ``sync=True`` by default:
        call it when the engine is idle)."""
        return [] if self._session is None else self._session.canary.poll(sync=sync)

    def health(self) -> CanaryHealth:
        """The current canary's counters (:meth:`kvcanary.KVCanary.health`)."""
        if self._session is None:
            raise invalid("no canary yet: the engine has not built its cache (run generate_batch or warmup first)")
        return self._session.canary.health()

    def stats(self) -> dict[str, int]:
        """Totals over every run: sessions (caches), engine steps, the blocks whose records moved with forks,
        offloads and restores, and the operations that moved none (de-duplicated blocks, soft-reset requests)."""
        out = dict(self._totals)
        s = self._session
        if s is not None:
            out["engine_steps"] += s.engine_steps
            for k, v in {**s.mover.moved, **s.events}.items():
                out[k] += v
        return out

    def engine_step_of(self, violation: Violation) -> tuple[int, str] | None:
        """``(engine step, phase)`` in which the current canary found ``violation`` (engine steps count from 1
        in each run; phase ``"head"``, ``"tail"`` or ``"sweep"``), or None when unknown."""
        return None if self._session is None else self._session.engine_step_of(violation.step)

    @property
    def mode(self) -> str:
        return self.options.mode

    @mode.setter
    def mode(self, value: str) -> None:
        check_mode(value)
        self.options = dataclasses.replace(self.options, mode=value)
        if self._session is not None:
            self._session.canary.mode = value

    def detach(self) -> None:
        """Stop guarding: the engine's own functions are put back (when no other handle is attached) and the
        current canary's outstanding violations are read. The canary stays readable through :attr:`canary`."""
        if not self.attached:
            return
        self.retire_session(keep=True)
        hooks.remove_handle(self)
        self.attached = False

    def __enter__(self) -> CanaryHandle:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.detach()
        if exc_type is None and self.options.mode == "raise" and self.error is not None:
            raise self.error

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"CanaryHandle({state}, model={type(self.model).__name__}, stats={self.stats()})"


def attach(target: Any, *, mode: str = "log", sweep_interval: int | None = 16,
           real_kv_hash_mode: int = RealKvHashMode.PARTIAL, real_kv_read_bytes: int | None = None,
           check_tokens: bool = True, max_seq_len: int | None = None, max_rows: int | None = None,
           name: str = "transformers", **canary_kwargs: Any) -> CanaryHandle:
    """Guard a transformers continuous-batching run with a :class:`~kvcanary.KVCanary`.

    Args:
        target: a model (``PreTrainedModel`` with continuous batching: every manager built for it by
            ``generate_batch``, ``continuous_batching_context_manager`` or ``init_continuous_batching`` is
            guarded), or one ``ContinuousBatchingManager`` (attach before its first run).
        mode: ``"log"``, ``"raise"`` or ``"quiet"`` (:class:`~kvcanary.KVCanary`). In ``"raise"`` mode a
            violation stops the engine's loop (it fails its requests with the
            :class:`~kvcanary.CanaryViolationError`), and leaving the ``with`` block re-raises it.
        sweep_interval: sweep every block the prefix cache has hashed every this many engine steps (None: never).
        real_kv_hash_mode: :class:`~kvcanary.RealKvHashMode` of the TAIL and SWEEP fingerprints over every layer's
            K and V (PARTIAL: 16 bytes per token and layer; ALL: ``real_kv_read_bytes``; NONE: no real-KV check).
        real_kv_read_bytes: bytes per token and layer ALL mode folds (default: all of them).
        check_tokens: keep each request's token history on the device and check the token of every verified slot
            (catches a block that holds other tokens at the right positions: a bad de-duplication or a shared
            block another request writes into).
        max_seq_len: the longest request, in tokens (default: the model's ``max_position_embeddings``, capped by
            the cache); sizes the block table and the token pool.
        max_rows: rows of both tables (default: twice the engine's ``max_requests_per_batch``).
        name: the canary's name in log lines and metrics.
        canary_kwargs: further :class:`~kvcanary.KVCanary` arguments (``ring_capacity``, ``watchdog_patience``,
            ``metrics``, ``stats_interval``, ``sweep_capacity``, ``slot_stride_bytes``).

    Returns a :class:`CanaryHandle`; :attr:`CanaryHandle.canary` is the canary once the engine built its cache.

    Raises :class:`~kvcanary.integrations.transformers.UnsupportedSettingError` (a ``ValueError`` whose message
    starts with ``kv-canary:`` and names the setting) for settings the canary cannot guard: sliding-window or
    hybrid layers, flash attention and its decode fast path, CUDA graphs, torch.compile, async batching, tensor
    parallel. Those known at attach time are refused here; the others when the engine builds its manager.
    """
    import transformers
    from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager

    check_mode(mode)
    bad = sorted(set(canary_kwargs) & _DERIVED)
    if bad:
        raise invalid(f"attach() derives {bad} from the cache and its own arguments; got them in canary_kwargs")
    for arg, value in (("sweep_interval", sweep_interval), ("max_seq_len", max_seq_len), ("max_rows", max_rows),
                       ("real_kv_read_bytes", real_kv_read_bytes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise invalid(f"{arg} must be a positive int or None, got {value!r}")
    if int(real_kv_hash_mode) not in set(RealKvHashMode):
        raise invalid(f"real_kv_hash_mode must be a RealKvHashMode (0, 1 or 2), got {real_kv_hash_mode!r}")
    is_manager = isinstance(target, ContinuousBatchingManager)
    if not is_manager and not hasattr(target, "init_continuous_batching"):
        raise TypeError("kv-canary: attach() needs a transformers model with continuous batching or a "
                        f"ContinuousBatchingManager, got {type(target).__name__}")
    if transformers.__version__ != TESTED_TRANSFORMERS_VERSION:
        logger.warning("kv-canary: the transformers integration is tested with transformers %s, found %s",
                       TESTED_TRANSFORMERS_VERSION, transformers.__version__)
    for h in hooks.attached_handles():
        if (h._manager is target) or (not is_manager and h._manager is None and h.model is target):
            raise invalid("a canary is already attached to this target; detach() it first")

    refusals.check_model(target.model if is_manager else target)
    if is_manager:
        refusals.check_manager(target)
        if target.is_running():
            raise invalid("the manager is already generating; attach before manager.start()")
    options = SessionOptions(mode=mode, sweep_interval=sweep_interval,
                             real_kv_hash_mode=RealKvHashMode(int(real_kv_hash_mode)),
                             real_kv_read_bytes=real_kv_read_bytes, check_tokens=bool(check_tokens),
                             max_seq_len=max_seq_len, max_rows=max_rows, name=name, canary_kwargs=dict(canary_kwargs))
    handle = CanaryHandle(target, options)
    hooks.add_handle(handle)
    handle.attached = True
    try:
        if is_manager and target.batch_processor is not None:
            handle.bind(target, target.batch_processor)
    except BaseException:
        handle.detach()
        raise
    return handle
