"""The engine model: a serving engine's KV-cache management around a pluggable model, guarded by
:class:`~kvcanary.KVCanary`. The simulation, the demo, the tests and the notebooks all drive this one.

What it models (everything an engine does to its KV cache; the model itself is plugged in, see
:mod:`kvcanary.testing.models`):

* a **paged KV pool** (K and V ``[num_pages, page_size, *token_shape]``; page 0 is reserved, so slot 0 is
  the dummy slot padding tokens write to) with a page allocator (shuffled at start, LIFO reuse), and an
  SGLang-style ``req_to_token`` table ``int32 [max_reqs, max_seq_len]`` (row 0 is the padding row);
* **requests** arriving (submitted with an arrival step, or drawn at random each step) and finishing,
  admitted while a page reservation guarantees every running request can finish;
* **chunked prefill** (``chunk_size`` tokens per request per step, at most ``prefill_budget`` prompt tokens
  per step when set) mixed with **decode** in one batch;
* a **prefix cache** of full pages keyed by the tokens they end (prompt pages are cached as soon as they are
  full, every full page when the request finishes), shared between requests (reference counted) and
  evicted least-recently-used when pages run short;
* a **sliding-window (SWA) group** with its own pool (one slot per token), the allocator's record of each
  FULL slot's SWA slot, and the ``full_to_swa_index_mapping`` table the canary reads (0 = none). A request
  frees the SWA slots that left its window on pages nobody else holds; cached pages keep theirs until SWA
  slots run short, when those no running request's window covers are reclaimed (a prefix match must end
  where the window's SWA slots are still there);
* **CUDA-graph padding rows** (the batch is padded to a multiple of ``pad_to`` with rows pointing at row 0,
  one dummy token to slot 0);
* periodic **sweeps** of the prefix cache;
* **EAGLE-style speculative decoding** (``spec_tokens > 0``): a draft model with its own KV pools (same
  slot indices: it shares ``req_to_token`` and the allocator, as SGLang's EAGLE worker does) guarded by its
  own :class:`~kvcanary.KVCanary` built with ``kv_token_id_vs_position_offset=+1``. Each step: draft-decode
  forwards propose ``k`` tokens, a target-verify forward checks them (extend ``1 + k``), the accepted prefix
  and the target's bonus token are kept, a draft-extend forward rewrites the draft KV over the accepted
  positions; the slots of rejected draft tokens stay mapped and are overwritten by the next step. See
  docs/INTEGRATION.md for the recipe.

Every forward is ``canary.step("head")``, the model's forward, ``canary.step("tail")``; index tables live on
the host and are copied to the device before each forward (as an engine's scheduler would), pools live on
the device. :meth:`ServingSimulation.step` takes a ``hook(sim, batch)`` called after the target batch is
built and before HEAD: faults are planted there (:mod:`kvcanary.testing.faults`,
:mod:`kvcanary.testing.scenarios`). A :class:`~kvcanary.faults.FaultSchedule` can be attached to inject
faults at random and check each is reported. Three methods are seams where engines' bugs live
(``_swa_table_index``, ``_first_private_page``, ``_first_position``); ``examples/toy_engine.py`` overrides
them to plant bugs.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kvcanary.errors import invalid
from kvcanary.ops.structs import RealKvSource
from kvcanary.runtime.canary import KVCanary, SwaConfig
from kvcanary.runtime.report import Violation
from kvcanary.testing import faults
from kvcanary.testing.engine_types import Batch, EngineView, KvPools, Request, Row, SimConfig, StepInfo
from kvcanary.testing.models import Model, StandInDraft, StandInModel

if TYPE_CHECKING:
    from kvcanary.testing.faults import Injection
    from kvcanary.testing.schedule import FaultSchedule


_STATS = ("steps", "admitted", "finished", "aborted", "cache_hits", "prefix_hit_tokens", "evictions", "tokens",
          "sweeps", "swept_slots", "swa_frees", "swa_reclaimed", "partial_chunks", "continuation_chunks",
          "padding_rows", "forwards", "draft_forwards", "draft_tokens", "drafted", "accepted")


class ServingSimulation:
    """The engine model (see the module docstring).

    Args:
        config: its shape and random workload.
        device: where the canaries, the pools and the batch tensors live (default CPU).
        mode: the canaries' reporting mode (default ``"quiet"``: read results with ``canary.poll()``).
        canary: False runs the engine without canaries (to compare a model's outputs).
        canary_kwargs: extra :class:`~kvcanary.KVCanary` arguments for the target canary.
        model: the target model (default :class:`~kvcanary.testing.models.StandInModel`).
        draft_model: the draft model when ``config.spec_tokens > 0`` (default
            :class:`~kvcanary.testing.models.StandInDraft`).
        draft_canary_kwargs: extra :class:`~kvcanary.KVCanary` arguments for the draft canary.
        fault_schedule: a :class:`~kvcanary.faults.FaultSchedule` to run: each step it may plant faults into
            the batch (before HEAD) and it is shown what both canaries report. The engine then polls the
            canaries itself (``canary.poll()`` returns nothing new to the caller).

    Attributes: ``canary`` and ``draft_canary`` (None without speculation), ``req_to_token`` /
    ``expected_tokens`` / ``full_to_swa`` (device tables; ``r2t_host`` / ``exp_host`` / ``lut_host`` their
    host masters), ``pools`` / ``draft_pools``, ``k_source`` / ``v_source`` / ``swa_k_source`` /
    ``swa_v_source``, ``running``, ``waiting``, ``finished``, ``stats``, ``history``, ``step_index`` (the
    number of steps run), ``canary_steps`` / ``draft_canary_steps`` (canary step number -> (engine step,
    phase)).
    """

    def __init__(self, config: SimConfig = SimConfig(), *, device: Any = "cpu", mode: str = "quiet",
                 canary: bool = True, canary_kwargs: dict[str, Any] | None = None, model: Model | None = None,
                 draft_model: Model | None = None, draft_canary_kwargs: dict[str, Any] | None = None,
                 fault_schedule: FaultSchedule | None = None):
        self.cfg = c = config
        if c.num_slots % c.page_size:
            raise invalid(f"config.num_slots must be a multiple of page_size={c.page_size}, got {c.num_slots}")
        self.device = torch.device(device)
        self.rng = np.random.default_rng(c.seed)
        self.model: Model = model if model is not None else StandInModel(c.kv_bytes_per_token, c.vocab)
        self.spec = c.spec_tokens > 0
        self.window = c.swa_window
        self.max_reqs = c.max_running + 2
        self.num_pages = c.num_slots // c.page_size
        self.max_batch = math.ceil(c.max_running / c.pad_to) * c.pad_to
        self.step_tokens = max(c.chunk_size, c.spec_tokens + 1)   # most tokens one row feeds in one forward
        self.max_tokens = self.max_batch * self.step_tokens

        on_cpu = self.device.type == "cpu"
        self.r2t_host = torch.zeros((self.max_reqs, c.max_seq_len), dtype=torch.int32)
        self.exp_host = torch.zeros((self.max_reqs, c.max_seq_len), dtype=torch.int32)
        self.lut_host = torch.zeros(c.num_slots + 1, dtype=torch.int64)
        self.req_to_token = self.r2t_host if on_cpu else self.r2t_host.to(self.device)
        self.expected_tokens = self.exp_host if on_cpu else self.exp_host.to(self.device)
        self.full_to_swa = self.lut_host if on_cpu else self.lut_host.to(self.device)

        self.pools = self._pools(self.model, with_swa=self.window > 0)
        self.k_source, self.v_source = self._source(self.pools.k), self._source(self.pools.v)
        self.swa_k_source = self.swa_v_source = None
        if self.pools.swa_k is not None and self.pools.swa_v is not None:
            self.swa_k_source, self.swa_v_source = self._source(self.pools.swa_k), self._source(self.pools.swa_v)

        self.draft_model: Model | None = None
        self.draft_pools: KvPools | None = None
        if self.spec:
            self.draft_model = draft_model if draft_model is not None else StandInDraft(
                c.kv_bytes_per_token, c.vocab, c.spec_accept_prob)
            self.draft_pools = self._pools(self.draft_model, with_swa=False)

        self.canary: KVCanary | None = None
        self.draft_canary: KVCanary | None = None
        if canary:
            swa = None
            if self.window > 0:
                swa = SwaConfig(num_slots=c.swa_num_slots, window_size=self.window,
                                full_to_swa_index_mapping=self.full_to_swa, k_sources=(self.swa_k_source,),
                                v_sources=(self.swa_v_source,) if c.with_v else ())
            kwargs: dict[str, Any] = dict(
                num_slots=c.num_slots, max_batch_size=self.max_batch, max_tokens_per_step=self.max_tokens,
                device=self.device, k_sources=(self.k_source,), v_sources=(self.v_source,) if c.with_v else (),
                with_v=c.with_v, swa=swa, mode=mode, expected_tokens_shape=(self.max_reqs, c.max_seq_len),
                name="sim")
            kwargs.update(canary_kwargs or {})
            self.canary = KVCanary(**kwargs)
            if self.draft_pools is not None:
                # The draft pool stores at position p the KV of token p + 1: its expected-token check reads
                # the token one position later.
                draft_kwargs: dict[str, Any] = dict(
                    num_slots=c.num_slots, max_batch_size=self.max_batch, max_tokens_per_step=self.max_tokens,
                    device=self.device, k_sources=(self._source(self.draft_pools.k),),
                    v_sources=(self._source(self.draft_pools.v),) if c.with_v else (), with_v=c.with_v,
                    mode=mode, expected_tokens_shape=(self.max_reqs, c.max_seq_len),
                    kv_token_id_vs_position_offset=1, name="draft")
                draft_kwargs.update(draft_canary_kwargs or {})
                self.draft_canary = KVCanary(**draft_kwargs)

        # Allocators (host side). Pages are handed out in a shuffled order, then reused LIFO.
        self.free_pages: list[int] = self.rng.permutation(np.arange(1, self.num_pages)).tolist()
        self.page_ref = [0] * self.num_pages
        self.free_swa: list[int] = self.rng.permutation(np.arange(1, c.swa_num_slots)).tolist() if self.window else []
        self.swa_of: dict[int, int] = {}       # FULL slot -> SWA slot (the allocator's own record)
        self.swa_owner: dict[int, int] = {}    # SWA slot -> FULL slot
        self.free_rows = list(range(1, self.max_reqs))
        # Prefix cache: key (the tokens a page ends, plus the next one with speculation) -> page, LRU order.
        self.cache: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self.page_key: dict[int, tuple[int, ...]] = {}
        self.pinned: set[int] = set()          # cached pages kept idle: never matched nor evicted

        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.system_tokens = [self.rng.integers(1, c.vocab, c.system_prompt_len).tolist()
                              for _ in range(c.system_prompts)]
        self.step_index = 0
        self.next_rid = 0
        self.stats = dict.fromkeys(_STATS, 0)
        self.history: list[StepInfo] = []
        self.canary_steps: dict[int, tuple[int, str]] = {}
        self.draft_canary_steps: dict[int, tuple[int, str]] = {}
        self.fault_schedule = fault_schedule
        self._ring_rows: dict[str, int] = {}   # rows each canary's ring holds (the schedule resets it)
        self._step_finished = 0
        self._step_hits = 0

    def _pools(self, model: Model, *, with_swa: bool) -> KvPools:
        c = self.cfg

        def pool(rows: int, page_size: int) -> torch.Tensor:
            return torch.zeros((rows, page_size, *model.token_shape), dtype=model.dtype, device=self.device)

        pools = KvPools(pool(self.num_pages, c.page_size), pool(self.num_pages, c.page_size))
        if with_swa:
            pools.swa_k, pools.swa_v = pool(c.swa_num_slots, 1), pool(c.swa_num_slots, 1)
        return pools

    @staticmethod
    def _source(t: torch.Tensor) -> RealKvSource:
        nbytes = t[0, 0].numel() * t.element_size()
        return RealKvSource(tensor=t, page_size=t.shape[1], num_bytes_per_token=nbytes, read_bytes=nbytes)

    # -- requests --------------------------------------------------------------------------------------

    def submit(self, prompt: list[int], max_new_tokens: int, arrival_step: int = 0,
               sys_id: int | None = None) -> Request:
        """Queue a request arriving at ``arrival_step``; it is admitted, in arrival order, once it has
        arrived and a row and enough pages are free."""
        if len(prompt) < 1 or max_new_tokens < 1 or len(prompt) + max_new_tokens > self.cfg.max_seq_len:
            raise invalid(f"a request needs a prompt and max_new_tokens >= 1 within max_seq_len="
                          f"{self.cfg.max_seq_len}, got {len(prompt)} + {max_new_tokens}")
        req = Request(self.next_rid, list(prompt), int(max_new_tokens), self.cfg.page_size, int(arrival_step),
                      sys_id, tokens=list(prompt))
        self.next_rid += 1
        self.waiting.append(req)
        self.waiting.sort(key=lambda r: r.arrival_step)
        return req

    @property
    def idle(self) -> bool:
        """No request waiting or running (and no random arrivals configured)."""
        return not self.waiting and not self.running and self.cfg.arrival_prob <= 0

    def _arrivals(self) -> None:
        c = self.cfg
        if c.arrival_prob <= 0:
            return
        while len(self.running) + len(self.waiting) < c.max_running and self.rng.random() < c.arrival_prob:
            sys_id = int(self.rng.integers(c.system_prompts)) if self.rng.random() < c.share_prob else None
            n = int(self.rng.integers(c.prompt_len[0], c.prompt_len[1] + 1))
            prompt = (self.system_tokens[sys_id] if sys_id is not None else []) + self.rng.integers(1, c.vocab, n).tolist()
            max_new = min(int(self.rng.integers(c.max_new_tokens[0], c.max_new_tokens[1] + 1)),
                          c.max_seq_len - len(prompt))
            self.submit(prompt, max_new, self.step_index, sys_id)

    def _pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.cfg.page_size)

    def _admit(self) -> None:
        """Admit waiting requests in order while a row is free, every running request can still get the
        pages it may need (a reservation: without it requests deadlock waiting for each other's pages) and
        the SWA pool can hold every running request's window and in-flight tokens."""
        c = self.cfg
        reserved = sum(max(0, self._pages_for(len(r.prompt) + r.max_new) - len(r.pages)) for r in self.running)
        while (self.waiting and self.free_rows and len(self.running) < c.max_running
               and self.waiting[0].arrival_step <= self.step_index):
            if self.window and (len(self.running) + 1) * (self.window + self.step_tokens) > c.swa_num_slots - 1:
                return
            req = self.waiting[0]
            pages = self._match_prefix(req.prompt)
            need = self._pages_for(len(req.prompt) + req.max_new) - len(pages)
            evictable = sum(1 for p in self.cache.values()
                            if self.page_ref[p] == 1 and p not in self.pinned and p not in pages)
            if len(self.free_pages) + evictable - reserved < need:
                return
            self.waiting.pop(0)
            req.row = self.free_rows.pop(0)
            for p in pages:
                self.page_ref[p] += 1
                self.cache.move_to_end(self.page_key[p])
            req.pages = list(pages)
            req.cached_len = req.computed = len(pages) * c.page_size
            self.r2t_host[req.row].zero_()
            self.exp_host[req.row].zero_()
            self.exp_host[req.row, :len(req.tokens)] = torch.tensor(req.tokens, dtype=torch.int32)
            if pages:
                self.r2t_host[req.row, :req.computed] = torch.tensor(req.slots, dtype=torch.int32)
                self.stats["cache_hits"] += 1
                self.stats["prefix_hit_tokens"] += req.computed
                self._step_hits += req.computed
            reserved += need
            self.running.append(req)
            self.stats["admitted"] += 1

    # -- pages, prefix cache, SWA slots ------------------------------------------------------------------

    def _key(self, tokens: list[int], pages: int) -> tuple[int, ...]:
        # With speculation a page is keyed by its tokens and the next one (EAGLE "bigram" keys): the draft
        # KV at a position depends on the token after it, so a shared page must be followed by that token.
        return tuple(tokens[:pages * self.cfg.page_size + (1 if self.spec else 0)])

    def _match_prefix(self, prompt: list[int]) -> list[int]:
        """Pages of the longest cached prefix, leaving at least one prompt token to compute (its logits give
        the first output token), shortened until the SWA window before its end still has its SWA slots."""
        ps, pages = self.cfg.page_size, list[int]()
        while (len(pages) + 1) * ps <= len(prompt) - 1:
            page = self.cache.get(self._key(prompt, len(pages) + 1))
            if page is None or page in self.pinned:
                break
            pages.append(page)
        while pages and self.window:
            n = len(pages) * ps
            if all(pages[p // ps] * ps + p % ps in self.swa_of for p in range(max(0, n - self.window), n)):
                break
            pages.pop()
        return pages

    def _cache_pages(self, req: Request, upto: int) -> int:
        """Insert the full pages of ``req``'s first ``upto`` positions into the prefix cache (the cache takes
        its own reference); returns how many leading pages that covers."""
        n = min(upto, len(req.tokens) - (1 if self.spec else 0)) // self.cfg.page_size
        for i in range(n):
            key, page = self._key(req.tokens, i + 1), req.pages[i]
            if key not in self.cache and page not in self.page_key:
                self.cache[key] = page
                self.page_key[page] = key
                self.page_ref[page] += 1
        return n

    def _page_slots(self, page: int) -> range:
        ps = self.cfg.page_size
        return range(page * ps, (page + 1) * ps)

    def _alloc_page(self) -> int:
        while not self.free_pages:
            if not self._evict_one():
                raise RuntimeError("kv-canary: engine model out of KV pages (the admission reservation failed)")
        page = self.free_pages.pop()
        self.page_ref[page] = 1
        return page

    def _evict_one(self) -> bool:
        """Drop the least recently used cache page that only the cache holds."""
        for key, page in self.cache.items():
            if self.page_ref[page] == 1 and page not in self.pinned:
                del self.cache[key]
                del self.page_key[page]
                self._unref(page)
                self.stats["evictions"] += 1
                return True
        return False

    def _uncache(self, page: int) -> None:
        key = self.page_key.pop(page, None)
        self.pinned.discard(page)
        if key is not None:
            del self.cache[key]
            self._unref(page)

    def _unref(self, page: int) -> None:
        self.page_ref[page] -= 1
        if self.page_ref[page] <= 0:
            self._release_page(page)

    def _release_page(self, page: int) -> None:
        self.page_ref[page] = 0
        for s in self._page_slots(page):
            self._release_swa(s)
        self.free_pages.append(page)

    def _swa_table_index(self, full_slot: int) -> int:
        """The ``full_to_swa_index_mapping`` entry of ``full_slot`` (a seam: a buggy engine gets it wrong)."""
        return full_slot

    def _alloc_swa(self, full_slot: int) -> None:
        if not self.free_swa:
            self._reclaim_swa()
        while not self.free_swa:
            if not self._evict_one():
                raise RuntimeError("kv-canary: engine model out of SWA slots (the admission bound failed)")
        swa = self.free_swa.pop()
        self.swa_of[full_slot] = swa
        self.swa_owner[swa] = full_slot
        self.lut_host[self._swa_table_index(full_slot)] = swa

    def _release_swa(self, full_slot: int) -> None:
        swa = self.swa_of.pop(full_slot, None)
        if swa is None:
            return
        del self.swa_owner[swa]
        self.lut_host[self._swa_table_index(full_slot)] = 0   # the plan skips a slot whose entry is 0
        self.free_swa.append(swa)
        self.stats["swa_frees"] += 1

    def _reclaim_swa(self) -> None:
        """Free the SWA slots of cached pages (least recently used first) that no running request's window
        covers; their FULL KV stays cached, but a prefix match can no longer end right after them."""
        ps, W = self.cfg.page_size, self.window
        for page in list(self.cache.values()):
            holders = [(r, r.pages.index(page)) for r in self.running if page in r.pages]
            for j, s in enumerate(self._page_slots(page)):
                if s in self.swa_of and all(i * ps + j < r.computed - W for r, i in holders):
                    self._release_swa(s)
                    self.stats["swa_reclaimed"] += 1
            if self.free_swa:
                return

    def _release_out_of_window(self, req: Request, before: int) -> None:
        """Free the SWA slots of positions that left ``req``'s window this step, on pages only it holds."""
        ps, W = self.cfg.page_size, self.window
        for p in range(max(0, before - W), max(0, req.computed - W)):
            page = req.pages[p // ps]
            if self.page_ref[page] == 1 and page not in self.page_key:
                self._release_swa(req.slot(p))

    def idle_cache_pages(self) -> list[int]:
        """Cached pages no running request holds (only a sweep checks their slots), not pinned."""
        return [p for p in self.cache.values() if self.page_ref[p] == 1 and p not in self.pinned]

    # -- finishing, aborting, quarantine ---------------------------------------------------------------

    def _first_private_page(self, req: Request, cached: int) -> int:
        """Index of ``req``'s first page the prefix cache did not take when it finished (a seam)."""
        return cached

    def _finish(self, req: Request) -> None:
        cached = self._cache_pages(req, req.computed)
        # The cache holds its own reference to the first `cached` pages: drop this request's reference to
        # those, and free the pages past them outright (only this request ever held them).
        first = self._first_private_page(req, cached)
        for page in req.pages[:first]:
            self._unref(page)
        for page in req.pages[first:]:
            self._release_page(page)
        self._retire(req)
        req.finished = True
        self.finished.append(req)
        self.stats["finished"] += 1
        self._step_finished += 1

    def _retire(self, req: Request) -> None:
        self.r2t_host[req.row].zero_()
        self.free_rows.append(req.row)
        self.running.remove(req)

    def abort(self, req: Request) -> None:
        """Fail a running request: free its pages without caching them (cached pages it shares stay)."""
        for page in req.pages:
            self._unref(page)
        self._retire(req)
        req.aborted = True
        self.stats["aborted"] += 1

    def quarantine(self, *, slots: Iterable[int] = (), requests: Iterable[Request] = ()) -> None:
        """Contain a detected corruption, as an engine would after a violation: drop the pages holding
        ``slots`` (FULL slots) from the prefix cache and abort every running request that holds one of them,
        plus ``requests``. The pages return to the allocator and are overwritten when reused."""
        pages = {s // self.cfg.page_size for s in slots if s > 0}
        requests = list(requests)
        named = set(map(id, requests))
        for page in pages:
            self._uncache(page)
        for req in requests:
            if req.finished:  # it finished before the report came: drop the pages it gave the cache
                for i, page in enumerate(req.pages):
                    if self.page_key.get(page) == self._key(req.tokens, i + 1):
                        self._uncache(page)
        for req in list(self.running):
            if id(req) in named or pages.intersection(req.pages):
                self.abort(req)

    # -- one step --------------------------------------------------------------------------------------

    def _schedule(self) -> list[tuple[Request, int, str]]:
        """``(request, tokens fed, kind)`` for this step: a prefill chunk (within the prefill budget), one
        decode token, or with speculation the last token plus its draft tokens (``verify``)."""
        c = self.cfg
        out = []
        budget = c.prefill_budget if c.prefill_budget > 0 else math.inf
        for req in self.running:
            if req.prefilling:
                n = int(min(c.chunk_size, len(req.prompt) - req.computed, budget))
                if n > 0:
                    budget -= n
                    out.append((req, n, "prefill"))
            else:
                # The draft-extend forward proposed the first draft token; draft-decode forwards add the rest.
                k = min(c.spec_tokens, req.remaining - 1) if req.draft else 0
                req.draft = req.draft[:1] if k else []
                out.append((req, 1 + k, "verify" if k else "decode"))
        return out

    def _allocate(self, sched: list[tuple[Request, int, str]]) -> None:
        ps = self.cfg.page_size
        for req, n, _ in sched:
            end = req.computed + n
            while len(req.pages) * ps < end:
                req.pages.append(self._alloc_page())
            slots = [req.slot(p) for p in range(req.computed, end)]
            self.r2t_host[req.row, req.computed:end] = torch.tensor(slots, dtype=torch.int32)
            if self.window:
                for s in slots:
                    if s not in self.swa_of:
                        self._alloc_swa(s)

    def _first_position(self, req: Request, start: int, n: int) -> int:
        """The position of a prefill chunk's first token (a seam: ``start`` in a correct engine)."""
        return start

    def _batch(self, kind: str, entries: list[tuple[Request, int, list[int], int, list[int], str]]) -> Batch:
        """Build a batch from ``(request, prefix, token ids, first position, slots, row kind)`` entries and
        pad it to a multiple of ``pad_to`` rows (padding rows: row 0, one token to the dummy slot 0)."""
        rpi: list[int] = []
        pre: list[int] = []
        ext: list[int] = []
        valid: list[int] = []
        ids: list[int] = []
        pos: list[int] = []
        loc: list[int] = []
        rows: list[Row] = []
        for req, prefix, toks, first, slots, row_kind in entries:
            rows.append(Row(req, len(ids), len(toks), prefix, row_kind))
            rpi.append(req.row)
            pre.append(prefix)
            ext.append(len(toks))
            valid.append(len(req.tokens))
            ids += toks
            pos += range(first, first + len(toks))
            loc += slots
        pad = (-len(rows)) % self.cfg.pad_to
        if kind == "target":
            self.stats["padding_rows"] += pad
        rpi += [0] * pad
        pre += [0] * pad
        ext += [1] * pad
        valid += [0] * pad
        ids += [0] * pad
        pos += [0] * pad
        loc += [0] * pad

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64)

        swa = None
        if kind == "target" and self.window:
            swa = t([self.swa_of.get(s, 0) if s > 0 else 0 for s in loc])
        return Batch(kind, rows, t(rpi), t(pre), t(ext), t(ids), t(pos), t(loc), swa, t(valid))

    def _target_batch(self, sched: list[tuple[Request, int, str]]) -> Batch:
        entries = []
        for req, n, kind in sched:
            p0 = req.computed
            slots = [req.slot(p) for p in range(p0, p0 + n)]
            if kind == "prefill":
                toks, first = req.tokens[p0:p0 + n], self._first_position(req, p0, n)
                self.stats["partial_chunks"] += p0 + n < len(req.prompt)
                self.stats["continuation_chunks"] += p0 > req.cached_len
            else:
                toks, first = [req.tokens[p0], *req.draft], p0
            entries.append((req, p0, toks, first, slots, kind))
        return self._batch("target", entries)

    def _push(self, batch: Batch, canary: KVCanary | None) -> dict[str, Any]:
        """Copy the host tables to the device (an engine's scheduler does this before each forward) and
        return the canary's ``step()`` arguments on the device."""
        if self.device.type != "cpu":
            self.req_to_token.copy_(self.r2t_host)
            self.expected_tokens.copy_(self.exp_host)
            self.full_to_swa.copy_(self.lut_host)
        d = self.device
        args: dict[str, Any] = dict(
            req_pool_indices=batch.req_pool_indices.to(d), prefix_lens=batch.prefix_lens.to(d),
            extend_seq_lens=batch.extend_seq_lens.to(d), req_to_token=self.req_to_token,
            input_ids=batch.input_ids.to(d), positions=batch.positions.to(d), out_cache_loc=batch.out_cache_loc.to(d),
            expected_tokens=self.expected_tokens, expected_tokens_valid_lens=batch.valid_lens.to(d))
        if batch.swa_out_cache_loc is not None:
            args["swa_out_cache_loc"] = batch.swa_out_cache_loc.to(d)
        return args

    def _forward(self, batch: Batch, draft: bool) -> list[list[int]]:
        """HEAD, the model's forward, TAIL on the target or the draft canary; the model's predictions."""
        canary = self.draft_canary if draft else self.canary
        steps = self.draft_canary_steps if draft else self.canary_steps
        model = self.draft_model if draft else self.model
        pools = self.draft_pools if draft else self.pools
        assert model is not None and pools is not None
        args = self._push(batch, canary)
        if canary is not None:
            canary.step("head", **args)
            steps[canary.step_number] = (self.step_index, "head")
        preds = model.forward(self, batch, args, pools)
        if canary is not None:
            canary.step("tail", **args)
            steps[canary.step_number] = (self.step_index, "tail")
        self.stats["draft_forwards" if draft else "forwards"] += 1
        if draft:
            self.stats["draft_tokens"] += sum(row.n for row in batch.rows)
        return preds

    def _append(self, req: Request, tokens: list[int]) -> None:
        for tok in tokens:
            req.tokens.append(int(tok))
            self.exp_host[req.row, len(req.tokens) - 1] = int(tok)

    def _draft_decode(self, sched: list[tuple[Request, int, str]]) -> None:
        """Draft-decode forwards: the draft proposes tokens 2..k of each verify row, one per forward, at
        positions ``computed .. computed + k - 2`` (its pool holds the token after each position)."""
        rows = [(req, n - 1) for req, n, kind in sched if kind == "verify"]
        for j in range(1, max((k for _, k in rows), default=0)):
            entries = []
            for req, k in rows:
                if k > j:
                    p = req.computed - 1 + j
                    entries.append((req, p, [req.draft[j - 1]], p, [req.slot(p)], "draft_decode"))
            preds = self._forward(self._batch("draft_decode", entries), draft=True)
            for (req, *_), pred in zip(entries, preds):
                req.draft.append(pred[0])

    def _accept(self, batch: Batch, preds: list[list[int]]) -> list[int]:
        """Apply the target's predictions: a finished prompt samples its first token; a decode row its next
        token; a verify row keeps its longest agreeing draft prefix plus the target's bonus token. Returns
        the accepted draft tokens per row."""
        accepted = []
        for row, pred in zip(batch.rows, preds):
            req = row.req
            if row.kind == "prefill":
                req.computed += row.n
                if req.computed == len(req.tokens):
                    self._append(req, [pred[-1]])
                accepted.append(0)
                continue
            k, a = row.n - 1, 0
            while a < k and req.draft[a] == pred[a]:
                a += 1
            # Positions computed .. computed + a now hold the fed token and the accepted drafts; the KV of
            # the rejected ones (past them) is stale and is overwritten by the next step.
            req.computed += a + 1
            self._append(req, req.draft[:a] + [pred[a]])
            self.stats["drafted"] += k
            self.stats["accepted"] += a
            accepted.append(a)
        return accepted

    def _draft_extend(self, batch: Batch, accepted: list[int]) -> None:
        """The draft-extend forward: the draft KV over this step's accepted positions (a prefill chunk, or
        the verified token and its accepted drafts), each position fed the token after it. Its last
        prediction is the next step's first draft token."""
        entries = []
        for row, a in zip(batch.rows, accepted):
            req = row.req
            n = row.n if row.kind == "prefill" else a + 1
            p0 = row.prefix
            entries.append((req, p0, req.tokens[p0 + 1:p0 + n + 1], p0, [req.slot(p) for p in range(p0, p0 + n)],
                            "draft_extend"))
        preds = self._forward(self._batch("draft_extend", entries), draft=True)
        for (req, *_), pred in zip(entries, preds):
            req.draft = [pred[-1]] if not req.prefilling else []

    def plant_fault(self, name: str, batch: Batch, rng: np.random.Generator | None = None, *, kv: str = "k",
                    group: str = "full") -> Injection | None:
        """Plant fault ``name`` (a :data:`~kvcanary.faults.FAULTS` entry) into this step's batch or the
        engine's tables and pools, through the target finder registered beside its injector; None when the
        batch offers no target. Call it between building the batch and HEAD (``step(hook=...)``)."""
        kind = faults.fault_kind(name)
        if group not in kind.groups:
            raise invalid(f"fault {name!r} targets groups {kind.groups}, got group={group!r}")
        if kv not in ("k", "v") or (kv == "v" and not self.cfg.with_v):
            raise invalid(f"kv must be 'k' or 'v' (and 'v' needs config.with_v), got kv={kv!r}")
        if group == "swa" and not self.window:
            return None
        return kind.find_target(self, batch, self.rng if rng is None else rng, kv=kv, group=group)

    def step(self, hook: Callable[[ServingSimulation, Batch], None] | None = None) -> Batch:
        """One engine step: arrivals and admission, scheduling and allocation, (speculation: draft-decode
        forwards), the target batch, ``hook(sim, batch)`` (the fault injection point: the batch's host tensors
        and the host tables may be edited), the target forward (HEAD, model, TAIL), acceptance,
        (speculation: the draft-extend forward), prefix caching, SWA window release, finishing requests, and
        every ``sweep_every`` steps a sweep. A step with nothing to run runs no forward."""
        self._step_finished = self._step_hits = 0
        self._arrivals()
        self._admit()
        sched = self._schedule()
        self._allocate(sched)
        if self.spec:
            self._draft_decode(sched)
        batch = self._target_batch(sched)
        if self.fault_schedule is not None:
            self.fault_schedule.inject(self.step_index, lambda name, kv, group, rng: self.plant_fault(
                name, batch, rng, kv=kv, group=group))
        if hook is not None:
            hook(self, batch)
        if batch.rows:
            accepted = self._accept(batch, self._forward(batch, draft=False))
            if self.spec:
                self._draft_extend(batch, accepted)
        for row in batch.rows:
            req = row.req
            self.stats["tokens"] += row.n
            self._cache_pages(req, min(req.computed, len(req.prompt)))
            if self.window:
                self._release_out_of_window(req, row.prefix)
            if not req.prefilling and req.remaining <= 0 and req in self.running:
                self._finish(req)
        swept = self.sweep() if self.cfg.sweep_every and (self.step_index + 1) % self.cfg.sweep_every == 0 else 0
        prefill = sum(r.n for r in batch.rows if r.kind == "prefill")
        self.history.append(StepInfo(self.step_index, len(batch.rows), prefill,
                                     sum(r.n for r in batch.rows) - prefill, self._step_hits, self._step_finished,
                                     swept))
        if self.fault_schedule is not None:
            self._observe_schedule(sync=False)
        self.step_index += 1
        self.stats["steps"] += 1
        return batch

    def run(self, steps: int | None = None, *, max_steps: int = 10_000) -> None:
        """Run ``steps`` steps; without ``steps``, until every submitted request has finished (at most
        ``max_steps``; needs ``config.arrival_prob == 0``), then :meth:`flush`."""
        if steps is None and self.cfg.arrival_prob > 0:
            raise invalid(f"run() without steps needs a finite workload (config.arrival_prob=0), got arrival_prob="
                          f"{self.cfg.arrival_prob}")
        if steps is not None:
            for _ in range(steps):
                self.step()
            return
        n = 0
        while not self.idle and n < max_steps:
            self.step()
            n += 1
        self.flush()

    def sweep(self) -> int:
        """Sweep every prefix-cache page (FULL group) against its TAIL records, with the tokens the cache
        claims it holds: a radix-cache walk. Returns the slots checked."""
        if self.canary is None:
            return 0
        ps = self.cfg.page_size
        slots, positions, prevs, toks = [], [], [], []
        for key, page in self.cache.items():
            i = (len(key) - (1 if self.spec else 0)) // ps - 1
            parent = self.cache.get(self._key(list(key), i)) if i > 0 else None
            for j in range(ps):
                slots.append(page * ps + j)
                positions.append(i * ps + j)
                toks.append(key[i * ps + j])
                if j > 0:
                    prevs.append(page * ps + j - 1)
                elif i == 0:
                    prevs.append(-1)                     # position 0: chained from the anchor
                else:                                    # parent page evicted: predecessor unknown
                    prevs.append(parent * ps + ps - 1 if parent is not None else 0)
        if not slots:
            return 0

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=self.device)

        self.canary.sweep(t(slots), t(positions), t(prevs), expected_tokens=t(toks))
        self.canary_steps[self.canary.step_number] = (self.step_index, "sweep")
        self.stats["sweeps"] += 1
        self.stats["swept_slots"] += len(slots)
        return len(slots)

    # -- reports -----------------------------------------------------------------------------------------

    @property
    def violations(self) -> list[Violation]:
        """Every violation the target canary has decoded so far (see :meth:`flush`)."""
        return self.canary.violations if self.canary is not None else []

    def flush(self) -> list[Violation]:
        """Read the target canary's violations not polled yet (a host sync)."""
        return self.canary.poll(sync=True) if self.canary is not None else []

    def engine_step_of(self, violation: Violation, *, draft: bool = False) -> tuple[int, str]:
        """``(engine step, phase)`` of the launch that appended ``violation`` (``(-1, "?")`` if unknown)."""
        return (self.draft_canary_steps if draft else self.canary_steps).get(violation.step, (-1, "?"))

    def _observe_schedule(self, *, sync: bool) -> None:
        schedule = self.fault_schedule
        assert schedule is not None
        for canary, steps, match in ((self.canary, self.canary_steps, True),
                                     (self.draft_canary, self.draft_canary_steps, False)):
            if canary is not None:
                found = canary.poll(sync=sync)
                # Injected faults fill the violation ring over a long run: empty it once half full (an
                # engine running a schedule in CI must too, or later faults go unreported).
                kept = self._ring_rows.get(canary.name, 0) + len(found)
                if kept >= canary.ring_capacity // 2:
                    found += canary.reset_log()
                    kept = 0
                self._ring_rows[canary.name] = kept
                schedule.observe(self.step_index, found, [steps.get(v.step, (self.step_index, ""))[0] for v in found],
                                 match=match)
        schedule.end_step(self.step_index)

    def finish_fault_schedule(self) -> None:
        """Read every outstanding report (a host sync) and show it to the fault schedule."""
        if self.fault_schedule is not None:
            self._observe_schedule(sync=True)


if TYPE_CHECKING:
    def _engine_view(sim: ServingSimulation) -> EngineView:
        return sim  # checked by mypy: the engine has everything the faults read of it (engine_types.EngineView)
