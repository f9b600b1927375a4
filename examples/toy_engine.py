"""A toy paged-attention serving engine in plain torch, with :class:`kvcanary.KVCanary` wired in.

It is small enough to read in one sitting and has the moving parts whose bugs corrupt real KV caches:

* a **paged KV pool** (K and V tensors ``[num_pages, page_size, heads, head_dim]``; page 0 is reserved, so
  KV slot 0 is the dummy slot of SPEC §2) and a **req_to_token** table ``int32 [max_reqs, max_seq_len]``
  mapping each request's positions to slots (SGLang style; row 0 is the padding row);
* a **prefix cache**: full pages keyed by the token prefix they end, shared (reference counted) between
  requests with the same prompt prefix, evicted LRU when the pool runs short;
* a **sliding-window (SWA) layer** with its own K/V pool (one slot per token) and a
  ``full_to_swa_index_mapping`` table ``int64 [num_slots + 1]`` from a full-pool slot to its SWA slot
  (0 = none); SWA slots that fall out of the window are released and their table entries reset to 0;
* **chunked prefill** (at most ``prefill_budget`` prompt tokens per step) and **decode** (one token per
  running request per step), in one mixed batch;
* a tiny deterministic model: one full-attention layer and one SWA layer with random (untrained) weights,
  greedy sampling.

The canary runs at HEAD (before the forward: plan, verify every request's prefix, stamp the new tokens),
at TAIL (after the forward wrote K/V: verify again and stamp with a real-KV fingerprint of the K and V
bytes) and as a periodic SWEEP over the pages the prefix cache holds. The engine also hands the canary
its per-request token history, so stored tokens are checked too.

Three real-looking bugs can be planted with :class:`Bugs` (all off by default):

``page_freed_while_cached``
    On finish, a request drops its reference to the pages the prefix cache holds and frees the pages
    past them outright, but that slice starts one page early: the last cached page becomes free while the
    cache still maps it, gets reallocated and overwritten, and the next request that hits that prefix
    attends to someone else's tokens. Seen by the sweep (``SWEEP_*_FULL``) and by the HEAD/TAIL verify
    of a request that hits the stale prefix (``chain_hash + position + verify_token``).
``swa_table_off_by_one``
    The full->SWA table update is shifted by one entry, as if the table (which has ``num_slots + 1``
    entries) were 1-based: ``table[full_slot + 1] = swa_slot``. The SWA K/V are written where the
    allocator said, but read through the shifted table. Seen by the next ``HEAD_*_SWA`` verify
    (``position`` and ``chain_hash``: each window position now maps to its neighbour's SWA slot).
``chunk_position_slip``
    The positions of a continuation prefill chunk are counted from the request's first *computed* token,
    forgetting the tokens it got from the prefix cache. The model silently applies the wrong positional
    encoding; the HEAD write's chain position assert sees a position that does not continue the prefix
    (``write_position``).

Each time a planted bug's line runs, it is recorded in ``engine.bug_events``; ``engine.stats`` counts what
the workload exercised (prefix-cache hits, evictions, SWA releases, continuation chunks, sweeps).

Usage::

    engine = ToyEngine(ToyConfig(), bugs=Bugs(chunk_position_slip=True))
    for arrival, prompt, max_new in make_workload(seed=0, num_requests=24):
        engine.submit(prompt, max_new, arrival)
    engine.run()                           # until every request has finished
    engine.violations                      # the kvcanary.Violation records the canary reported
    engine.engine_step_of(engine.violations[0])   # (engine step, "head" | "tail" | "sweep")
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

import kvcanary as kc


@dataclass(frozen=True)
class ToyConfig:
    """Geometry of the toy engine. ``num_bytes_per_token`` of each pool = ``num_heads * head_dim * 4``
    (float32), which must be a multiple of 16 for the real-KV fingerprint (SPEC §3.1)."""

    page_size: int = 4
    num_pages: int = 96            # page 0 is reserved: slot 0 is the dummy slot
    swa_num_slots: int = 256       # SWA pool slots (slot 0 reserved)
    swa_window: int = 8
    max_reqs: int = 8              # req_to_token rows (row 0 is padding)
    max_seq_len: int = 96
    prefill_budget: int = 16       # prompt tokens per step (chunked prefill)
    vocab: int = 64
    num_heads: int = 2
    head_dim: int = 8
    sweep_every: int = 4           # sweep the prefix cache every N steps (0 = never)
    seed: int = 0

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def bytes_per_token(self) -> int:
        return self.num_heads * self.head_dim * 4


@dataclass(frozen=True)
class Bugs:
    """The bugs that can be planted in the engine (see the module docstring)."""

    page_freed_while_cached: bool = False
    swa_table_off_by_one: bool = False
    chunk_position_slip: bool = False


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival_step: int = 0
    row: int = 0                          # req_to_token row
    tokens: list[int] = field(default_factory=list)   # prompt + generated
    computed: int = 0                     # positions whose K/V is in the pool (the prefix)
    cached_len: int = 0                   # tokens taken from the prefix cache at admission
    pages: list[int] = field(default_factory=list)
    finished: bool = False

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)


@dataclass
class StepInfo:
    """What one engine step did."""

    step: int
    batch_rows: int
    prefill_tokens: int
    decode_tokens: int
    prefix_hit_tokens: int      # tokens served from the prefix cache to requests admitted this step
    finished: int
    swept_slots: int
    new_violations: list = field(default_factory=list)


class ToyEngine:
    """The engine. ``canary=False`` runs it without a canary (to compare outputs); ``device`` may be a CUDA
    device (the canary then runs its CUDA kernels); ``canary_mode`` is passed to :class:`kvcanary.KVCanary`
    (default ``"quiet"``: violations are collected in :attr:`violations`, nothing is logged)."""

    def __init__(self, config: ToyConfig | None = None, *, bugs: Bugs | None = None, canary: bool = True,
                 device: Any = "cpu", canary_mode: str = "quiet", real_kv_hash_mode: int = kc.RealKvHashMode.ALL):
        self.cfg = cfg = config or ToyConfig()
        self.bugs = bugs or Bugs()
        self.device = torch.device(device)
        dev = self.device
        h, d = cfg.num_heads, cfg.head_dim
        g = torch.Generator().manual_seed(cfg.seed)
        e = h * d
        # The model: an embedding, Q/K/V projections for the full layer and the SWA layer, an output head.
        self.w = {name: (torch.randn(shape, generator=g) / math.sqrt(shape[0])).to(dev) for name, shape in [
            ("emb", (cfg.vocab, e)), ("wq", (e, e)), ("wk", (e, e)), ("wv", (e, e)),
            ("sq", (e, e)), ("sk", (e, e)), ("sv", (e, e)), ("out", (e, cfg.vocab))]}
        self.w["emb"] *= math.sqrt(cfg.vocab)

        # KV pools: the full layer is paged; the SWA layer has one slot per token.
        self.k_pool = torch.zeros((cfg.num_pages, cfg.page_size, h, d), dtype=torch.float32, device=dev)
        self.v_pool = torch.zeros_like(self.k_pool)
        self.swa_k_pool = torch.zeros((cfg.swa_num_slots, h, d), dtype=torch.float32, device=dev)
        self.swa_v_pool = torch.zeros_like(self.swa_k_pool)
        self.req_to_token = torch.zeros((cfg.max_reqs, cfg.max_seq_len), dtype=torch.int32, device=dev)
        self.full_to_swa = torch.zeros(cfg.num_slots + 1, dtype=torch.int64, device=dev)
        # Every request's known token ids (the canary's expected-token pool).
        self.req_tokens = torch.zeros((cfg.max_reqs, cfg.max_seq_len), dtype=torch.int32, device=dev)

        # Allocators (host side). LIFO free lists: a freed page is reused soon, as in real allocators.
        self.free_pages = list(range(cfg.num_pages - 1, 0, -1))
        self.page_ref = [0] * cfg.num_pages
        self.free_swa = list(range(cfg.swa_num_slots - 1, 0, -1))
        self.swa_of: dict[int, int] = {}        # full slot -> SWA slot, the allocator's own record
        self.free_rows = list(range(cfg.max_reqs - 1, 0, -1))
        self.prefix_cache: OrderedDict[tuple[int, ...], int] = OrderedDict()  # prefix tokens -> page (LRU order)

        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.step_no = 0
        self.history: list[StepInfo] = []
        self.violations: list[kc.Violation] = []
        self._next_rid = 0
        # What the workload exercised (tests check these are non-zero, so a clean run proves something).
        self.stats = {"prefix_hit_tokens": 0, "evictions": 0, "swa_releases": 0, "continuation_chunks": 0,
                      "sweeps": 0}
        # Every time a planted bug fires: (engine step, bug flag, the slots it affected).
        self.bug_events: list[tuple[int, str, list[int]]] = []
        # canary step number (KVCanary.step_number, what Violation.step refers to) -> (engine step, phase)
        self.canary_steps: dict[int, tuple[int, str]] = {}

        self.canary = None
        if canary:
            nbytes = cfg.bytes_per_token

            def source(pool: torch.Tensor, page_size: int) -> kc.RealKvSource:
                return kc.RealKvSource(tensor=pool, page_size=page_size, num_bytes_per_token=nbytes,
                                       read_bytes=nbytes)

            self.k_source = source(self.k_pool, cfg.page_size)
            self.v_source = source(self.v_pool, cfg.page_size)
            self.swa_k_source = source(self.swa_k_pool, 1)
            self.swa_v_source = source(self.swa_v_pool, 1)
            # Capacities from the pool geometry: one row per request slot, one prefill chunk plus one decode
            # token per running request per step; verify capacity defaults to 3 x the pool.
            self.canary = kc.KVCanary.from_pool_geometry(
                pool_slots=cfg.num_slots, max_running_requests=cfg.max_reqs - 1,
                max_prefill_tokens=cfg.prefill_budget, device=dev,
                k_sources=(self.k_source,), v_sources=(self.v_source,), real_kv_hash_mode=real_kv_hash_mode,
                swa=kc.SwaConfig(num_slots=cfg.swa_num_slots, window_size=cfg.swa_window,
                                 full_to_swa_index_mapping=self.full_to_swa,
                                 k_sources=(self.swa_k_source,), v_sources=(self.swa_v_source,)),
                expected_tokens_shape=(cfg.max_reqs, cfg.max_seq_len), mode=canary_mode, name="toy")

    # ------------------------------------------------------------------------------------------------
    # Requests

    def submit(self, prompt: list[int], max_new_tokens: int, arrival_step: int = 0) -> Request:
        """Queue a request arriving at ``arrival_step``; it is admitted (in arrival order) once it has
        arrived and a req_to_token row and enough pages are free."""
        if len(prompt) < 1 or len(prompt) + max_new_tokens > self.cfg.max_seq_len:
            raise ValueError(f"prompt of {len(prompt)} + {max_new_tokens} new tokens does not fit max_seq_len")
        req = Request(self._next_rid, list(prompt), max_new_tokens, arrival_step=int(arrival_step))
        req.tokens = list(prompt)
        self._next_rid += 1
        self.waiting.append(req)
        self.waiting.sort(key=lambda r: r.arrival_step)
        return req

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def run(self, max_steps: int = 10_000) -> list[StepInfo]:
        """Step until every submitted request has finished (or ``max_steps``); then read the canary's last
        violations (a host sync). Returns the step records."""
        out = []
        while not self.idle and len(out) < max_steps:
            out.append(self.step())
        self.flush()
        return out

    def flush(self) -> list:
        """Read violations not reported yet (host sync); they are added to :attr:`violations`."""
        if self.canary is None:
            return []
        new = self.canary.poll(sync=True)
        self.violations.extend(new)
        if self.history and new:
            self.history[-1].new_violations.extend(new)
        return new

    # ------------------------------------------------------------------------------------------------
    # Allocation

    def _page_slots(self, page: int) -> range:
        ps = self.cfg.page_size
        return range(page * ps, (page + 1) * ps)

    def _evict_one(self) -> bool:
        """Drop the least recently used cache entry that no running request holds."""
        for key, page in self.prefix_cache.items():
            if self.page_ref[page] == 1:
                del self.prefix_cache[key]
                self._unref(page)
                self.stats["evictions"] += 1
                return True
        return False

    def _alloc_page(self) -> int:
        while not self.free_pages:
            if not self._evict_one():
                raise RuntimeError("toy engine: out of KV pages")
        page = self.free_pages.pop()
        self.page_ref[page] = 1
        return page

    def _unref(self, page: int) -> None:
        self.page_ref[page] -= 1
        if self.page_ref[page] == 0:
            self._release_page(page)

    def _release_page(self, page: int) -> None:
        self.page_ref[page] = 0
        for s in self._page_slots(page):
            self._release_swa(s)
        self.free_pages.append(page)

    def _alloc_swa(self, full_slot: int) -> int:
        while not self.free_swa:
            if not self._evict_one():
                raise RuntimeError("toy engine: out of SWA slots")
        swa = self.free_swa.pop()
        self.swa_of[full_slot] = swa
        # BUG (swa_table_off_by_one): the table has num_slots + 1 entries; treating it as 1-based shifts
        # every update by one entry.
        entry = full_slot + 1 if self.bugs.swa_table_off_by_one else full_slot
        self.full_to_swa[entry] = swa
        if entry != full_slot:
            self.bug_events.append((self.step_no, "swa_table_off_by_one", [full_slot]))
        return swa

    def _release_swa(self, full_slot: int) -> None:
        swa = self.swa_of.pop(full_slot, None)
        if swa is None:
            return
        entry = full_slot + 1 if self.bugs.swa_table_off_by_one else full_slot
        self.full_to_swa[entry] = 0
        self.free_swa.append(swa)
        self.stats["swa_releases"] += 1

    def _pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.cfg.page_size)

    def _match_prefix(self, prompt: list[int]) -> list[int]:
        """Pages of the longest cached prefix, leaving at least one prompt token to compute (its logits
        give the first output token). The SWA layer needs its window over the prefix: shorten the match
        until every window position still has an SWA slot."""
        ps, pages = self.cfg.page_size, []
        while (len(pages) + 1) * ps <= len(prompt) - 1:
            page = self.prefix_cache.get(tuple(prompt[: (len(pages) + 1) * ps]))
            if page is None:
                break
            pages.append(page)
        while pages:
            n = len(pages) * ps
            window = range(max(0, n - self.cfg.swa_window), n)
            if all(pages[p // ps] * ps + p % ps in self.swa_of for p in window):
                break
            pages.pop()
        return pages

    def _admit(self) -> int:
        """Admit waiting requests in order while a row and enough pages are available; returns prefix-hit tokens."""
        hit = 0
        # Pages and SWA slots every running request may still need before it finishes.
        reserved = sum(self._pages_for(len(r.prompt) + r.max_new_tokens) - len(r.pages) for r in self.running)
        reserved_swa = sum(len(r.prompt) + r.max_new_tokens - r.computed for r in self.running)
        while self.waiting and self.free_rows and self.waiting[0].arrival_step <= self.step_no:
            req = self.waiting[0]
            pages = self._match_prefix(req.prompt)
            need = self._pages_for(len(req.prompt) + req.max_new_tokens) - len(pages)
            need_swa = len(req.prompt) + req.max_new_tokens - len(pages) * self.cfg.page_size
            evictable = [p for p in self.prefix_cache.values() if self.page_ref[p] == 1 and p not in pages]
            evictable_swa = sum(s in self.swa_of for p in evictable for s in self._page_slots(p))
            if (len(self.free_pages) + len(evictable) - reserved < need
                    or len(self.free_swa) + evictable_swa - reserved_swa < need_swa):
                break
            self.waiting.pop(0)
            req.row = self.free_rows.pop()
            for p in pages:
                self.page_ref[p] += 1
            for key in [k for k, p in self.prefix_cache.items() if p in pages]:
                self.prefix_cache.move_to_end(key)
            req.pages = list(pages)
            req.cached_len = req.computed = len(pages) * self.cfg.page_size
            n = req.cached_len
            if n:
                slots = torch.tensor([pages[p // self.cfg.page_size] * self.cfg.page_size + p % self.cfg.page_size
                                      for p in range(n)], dtype=torch.int32)
                self.req_to_token[req.row, :n] = slots.to(self.device)
            self.req_tokens[req.row].zero_()
            self.req_tokens[req.row, : len(req.prompt)] = torch.tensor(req.prompt, dtype=torch.int32)
            hit += n
            self.stats["prefix_hit_tokens"] += n
            reserved += need
            reserved_swa += need_swa
            self.running.append(req)
        return hit

    def _cache_pages(self, req: Request, upto: int) -> None:
        """Insert every full page of the first ``upto`` computed tokens into the prefix cache (it takes its
        own reference), so later requests with the same prefix share it, even while this one still runs."""
        ps = self.cfg.page_size
        for i in range(upto // ps):
            key = tuple(req.tokens[: (i + 1) * ps])
            if key not in self.prefix_cache:
                self.prefix_cache[key] = req.pages[i]
                self.page_ref[req.pages[i]] += 1

    def _finish(self, req: Request) -> None:
        ps = self.cfg.page_size
        self._cache_pages(req, req.computed)
        # The cache now holds its own reference to the first `cached` pages: drop this request's reference
        # to those, and free the pages past them outright (only this request ever held them).
        cached = req.computed // ps
        # BUG (page_freed_while_cached): the "past the cached part" slice starts one page early, so the last
        # page the cache holds goes back to the free list while the cache still maps it.
        first_uncached = max(0, cached - 1) if self.bugs.page_freed_while_cached else cached
        for page in req.pages[:first_uncached]:
            self._unref(page)
        for page in req.pages[first_uncached:]:
            if page in self.prefix_cache.values():
                self.bug_events.append((self.step_no, "page_freed_while_cached", list(self._page_slots(page))))
            self._release_page(page)
        self.req_to_token[req.row].zero_()
        self.free_rows.append(req.row)
        req.finished = True
        self.running.remove(req)
        self.finished.append(req)

    # ------------------------------------------------------------------------------------------------
    # One step

    def _schedule(self) -> list[tuple[Request, int]]:
        """(request, tokens to feed) for this step: every decoding request feeds one token; prefilling
        requests share the prefill budget, oldest first."""
        batch, budget = [], self.cfg.prefill_budget
        for req in self.running:
            if not req.prefilling:
                batch.append((req, 1))
            elif budget > 0:
                n = min(len(req.prompt) - req.computed, budget)
                budget -= n
                batch.append((req, n))
        return batch

    def step(self) -> StepInfo:
        """Admit, schedule, allocate, run HEAD canary, forward, TAIL canary, finish, sweep, poll."""
        self.step_no += 1
        cfg, ps, dev = self.cfg, self.cfg.page_size, self.device
        hit = self._admit()
        batch = self._schedule()

        rows, prefix, extend, ids, pos, loc, swa_loc = [], [], [], [], [], [], []
        for req, n in batch:
            start = req.computed
            while len(req.pages) * ps < start + n:
                req.pages.append(self._alloc_page())
            slots = [req.pages[p // ps] * ps + p % ps for p in range(start, start + n)]
            self.req_to_token[req.row, start:start + n] = torch.tensor(slots, dtype=torch.int32)
            swa_loc += [self._alloc_swa(s) for s in slots]
            continuation = req.prefilling and start > req.cached_len
            self.stats["continuation_chunks"] += continuation
            if self.bugs.chunk_position_slip and continuation:
                # BUG: a continuation chunk counts positions from the request's first computed token,
                # forgetting the tokens it got from the prefix cache.
                first = start - req.cached_len
                if req.cached_len:
                    self.bug_events.append((self.step_no, "chunk_position_slip", slots))
            else:
                first = start
            rows.append(req.row)
            prefix.append(start)
            extend.append(n)
            ids += req.tokens[start:start + n]
            pos += list(range(first, first + n))
            loc += slots

        def t64(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=dev)

        meta = dict(req_pool_indices=t64(rows), prefix_lens=t64(prefix), extend_seq_lens=t64(extend),
                    req_to_token=self.req_to_token, input_ids=t64(ids), positions=t64(pos), out_cache_loc=t64(loc),
                    swa_out_cache_loc=t64(swa_loc), expected_tokens=self.req_tokens,
                    expected_tokens_valid_lens=t64(prefix))
        if self.canary is not None and batch:
            self.canary.step("head", **meta)
            self.canary_steps[self.canary.step_number] = (self.step_no, "head")
        if batch:
            self._forward(batch, meta)
        if self.canary is not None and batch:
            self.canary.step("tail", **meta)
            self.canary_steps[self.canary.step_number] = (self.step_no, "tail")

        prefill_tokens = sum(n for req, n in batch if req.prefilling)
        decode_tokens = sum(n for req, n in batch if not req.prefilling)
        finished = 0
        for req, n in batch:
            req.computed += n
            # Prompt pages are cached as soon as they are full (and keep their SWA slots); pages of
            # generated tokens are cached when the request finishes.
            self._cache_pages(req, min(req.computed, len(req.prompt)))
            self._release_out_of_window(req, n)
            if not req.prefilling and len(req.generated) >= req.max_new_tokens:
                self._finish(req)
                finished += 1

        swept = 0
        if self.canary is not None and cfg.sweep_every and self.step_no % cfg.sweep_every == 0:
            swept = self.sweep()
        new = self.canary.poll() if self.canary is not None else []
        self.violations.extend(new)
        info = StepInfo(self.step_no, len(batch), prefill_tokens, decode_tokens, hit, finished, swept, new)
        self.history.append(info)
        return info

    def _release_out_of_window(self, req: Request, n: int) -> None:
        """Release SWA slots of positions that left every future window of ``req`` (only on pages this
        request holds alone: a page shared with the cache or another request keeps its SWA slots)."""
        ps = self.cfg.page_size
        for p in range(max(0, req.computed - n - self.cfg.swa_window), req.computed - self.cfg.swa_window):
            page = req.pages[p // ps]
            if self.page_ref[page] == 1:
                self._release_swa(page * ps + p % ps)

    # ------------------------------------------------------------------------------------------------
    # The model

    def _pe(self, positions: torch.Tensor) -> torch.Tensor:
        e = self.cfg.num_heads * self.cfg.head_dim
        freq = torch.exp(-math.log(1000.0) * torch.arange(0, e, 2, device=self.device) / e)
        ang = positions.to(torch.float32)[:, None] * freq[None, :]
        return torch.cat([ang.sin(), ang.cos()], dim=1)

    def _forward(self, batch: list[tuple[Request, int]], meta: dict) -> None:
        """Write K/V of the new tokens into both pools, attend, and sample one token for every request
        whose prompt is complete."""
        cfg, w = self.cfg, self.w
        h, d = cfg.num_heads, cfg.head_dim
        k_flat = self.k_pool.view(cfg.num_slots, h, d)
        v_flat = self.v_pool.view(cfg.num_slots, h, d)
        ids, pos, loc, swa_loc = (meta[k] for k in ("input_ids", "positions", "out_cache_loc", "swa_out_cache_loc"))
        x = w["emb"][ids] + self._pe(pos)
        # KV writes: where the allocator put each token (full pool by slot, SWA pool by SWA slot).
        k_flat[loc] = (x @ w["wk"]).view(-1, h, d)
        v_flat[loc] = (x @ w["wv"]).view(-1, h, d)
        self.swa_k_pool[swa_loc] = (x @ w["sk"]).view(-1, h, d)
        self.swa_v_pool[swa_loc] = (x @ w["sv"]).view(-1, h, d)

        off = 0
        for req, n in batch:
            xq = x[off:off + n]
            off += n
            end = req.computed + n
            q_idx = torch.arange(req.computed, end, device=self.device)
            k_idx = torch.arange(end, device=self.device)
            slots = self.req_to_token[req.row, :end].long()
            causal = k_idx[None, :] <= q_idx[:, None]
            full = _attend((xq @ w["wq"]).view(n, h, d), k_flat[slots], v_flat[slots], causal)
            # The SWA layer reads its pool through the full->SWA table, inside the window only.
            swa_slots = self.full_to_swa[slots]
            window = causal & (k_idx[None, :] > q_idx[:, None] - cfg.swa_window)
            swa = _attend((xq @ w["sq"]).view(n, h, d), self.swa_k_pool[swa_slots], self.swa_v_pool[swa_slots],
                          window)
            if end == len(req.tokens):  # the last known token was fed: sample the next one
                logits = (full[-1] + swa[-1]).reshape(-1) @ w["out"]
                tok = int(torch.argmax(logits))
                req.tokens.append(tok)
                self.req_tokens[req.row, len(req.tokens) - 1] = tok

    # ------------------------------------------------------------------------------------------------
    # Sweep

    def cached_slots(self) -> tuple[list[int], list[int], list[int], list[int]]:
        """(slots, positions, prev_slots, tokens) of every slot the prefix cache holds, for a sweep."""
        ps = self.cfg.page_size
        slots, positions, prevs, toks = [], [], [], []
        for key, page in self.prefix_cache.items():
            i = len(key) // ps - 1
            parent = self.prefix_cache.get(key[: i * ps]) if i > 0 else None
            for j in range(ps):
                slots.append(page * ps + j)
                positions.append(i * ps + j)
                toks.append(key[i * ps + j])
                if j > 0:
                    prevs.append(page * ps + j - 1)
                elif i == 0:
                    prevs.append(-1)                       # first position: chained from the anchor
                else:                                      # parent page evicted: predecessor unknown
                    prevs.append(parent * ps + ps - 1 if parent is not None else 0)
        return slots, positions, prevs, toks

    def sweep(self) -> int:
        """Verify every cached slot against its TAIL record (chain, position, token, real KV)."""
        slots, positions, prevs, toks = self.cached_slots()
        if not slots:
            return 0

        def t64(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64, device=self.device)

        self.canary.sweep(t64(slots), t64(positions), t64(prevs), expected_tokens=t64(toks))
        self.canary_steps[self.canary.step_number] = (self.step_no, "sweep")
        self.stats["sweeps"] += 1
        return len(slots)

    def engine_step_of(self, violation: kc.Violation) -> tuple[int, str]:
        """(engine step, canary phase) of the launch that appended ``violation`` ((-1, "?") if unknown)."""
        return self.canary_steps.get(violation.step, (-1, "?"))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention of ``q [n, h, d]`` over ``k, v [m, h, d]`` with a boolean ``mask [n, m]``."""
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)


def make_workload(seed: int = 0, num_requests: int = 16, *, vocab: int = 64, page_size: int = 4,
                  system_prompt_pages: tuple[int, ...] = (3, 5, 2),
                  mean_gap: float = 1.5) -> list[tuple[int, list[int], int]]:
    """``(arrival_step, prompt, max_new_tokens)`` triples: most prompts start with one of a few shared system
    prompts (whole pages, so the prefix cache can serve them) followed by a request-specific part; arrivals
    are spread over time so later requests find earlier ones' pages in the cache."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1, vocab) for _ in range(n * page_size)] for n in system_prompt_pages]
    out, t = [], 0.0
    for _ in range(num_requests):
        head = rng.choice(systems) if rng.random() < 0.8 else []
        tail = [rng.randrange(1, vocab) for _ in range(rng.randint(3, 22))]
        out.append((int(t), head + tail, rng.randint(4, 16)))
        t += rng.expovariate(1.0 / mean_gap)
    return out


def summarize(violations: list) -> dict[tuple[str, str], int]:
    """``{(launch tag, reasons): count}`` of a list of violations."""
    out: dict[tuple[str, str], int] = {}
    for v in violations:
        key = (v.tag_name, "+".join(v.reason_labels))
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))
