"""A tiny real model plugged into kvcanary's engine model, and three engine bugs to plant in it.

The engine itself is :class:`kvcanary.testing.engine.ServingSimulation` (the one the demo, the tests and
the simulation use): a paged KV pool ``[num_pages, page_size, heads, head_dim]`` with an SGLang-style
``req_to_token`` table, a prefix cache sharing full pages between requests, a sliding-window (SWA) group
with its own pool and a ``full_to_swa_index_mapping`` table, chunked prefill mixed with decode, periodic
sweeps of the prefix cache, and :class:`kvcanary.KVCanary` wired around every forward. This file adds:

* :class:`TinyModel`, a forward for it: one full-attention layer and one SWA layer with random (untrained)
  float32 weights and greedy sampling. It writes its K/V where the engine allocated them and attends
  through the engine's live tables, so a corrupted table or pool really changes the output;
* :class:`ToyEngine`, the engine with that model, the example's geometry (:func:`toy_config`) and
  :class:`Bugs` to plant, each a one-line mistake in one of the engine's seams:

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

Each time a planted bug's line runs, it is recorded in ``engine.bug_events`` as (engine step, bug, slots).

Usage::

    engine = ToyEngine(bugs=Bugs(chunk_position_slip=True))
    for arrival, prompt, max_new in make_workload(seed=0, num_requests=24):
        engine.submit(prompt, max_new, arrival)
    engine.run()                           # until every request has finished
    engine.violations                      # the kvcanary.Violation records the canary reported
    engine.engine_step_of(engine.violations[0])   # (engine step, "head" | "tail" | "sweep")
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch

import kvcanary as kc
from kvcanary.testing.engine import Batch, KvPools, Request, ServingSimulation, SimConfig


def toy_config(seed: int = 0) -> SimConfig:
    """The example's geometry: 96 pages of 4 slots, an SWA window of 8 over 256 SWA slots, 7 running
    requests, 16 prompt tokens per step, a 64-token vocabulary, a sweep every 4 steps, no padding rows,
    requests only from :meth:`~kvcanary.testing.engine.ServingSimulation.submit`."""
    return SimConfig(num_slots=96 * 4, page_size=4, max_running=7, max_seq_len=96, arrival_prob=0.0,
                     chunk_size=16, prefill_budget=16, pad_to=1, swa_window=8, swa_num_slots=256, vocab=64,
                     sweep_every=4, seed=seed)


class TinyModel:
    """One full-attention layer and one SWA layer (``num_heads`` x ``head_dim`` float32 K/V per token, so
    ``num_heads * head_dim * 4`` bytes, a multiple of 16 for the real-KV fingerprint), random weights,
    greedy sampling. Implements :class:`kvcanary.testing.models.Model`."""

    def __init__(self, *, vocab: int = 64, num_heads: int = 2, head_dim: int = 8, swa_window: int = 8,
                 seed: int = 0, device: Any = "cpu"):
        self.token_shape = (num_heads, head_dim)
        self.dtype = torch.float32
        self.swa_window = swa_window
        g = torch.Generator().manual_seed(seed)
        e = num_heads * head_dim
        # An embedding, Q/K/V projections for the full layer and the SWA layer, an output head.
        self.w = {name: (torch.randn(shape, generator=g) / math.sqrt(shape[0])).to(device) for name, shape in [
            ("emb", (vocab, e)), ("wq", (e, e)), ("wk", (e, e)), ("wv", (e, e)),
            ("sq", (e, e)), ("sk", (e, e)), ("sv", (e, e)), ("out", (e, vocab))]}
        self.w["emb"] *= math.sqrt(vocab)

    def _pe(self, positions: torch.Tensor) -> torch.Tensor:
        e = self.w["wq"].shape[0]
        freq = torch.exp(-math.log(1000.0) * torch.arange(0, e, 2, device=positions.device) / e)
        ang = positions.to(torch.float32)[:, None] * freq[None, :]
        return torch.cat([ang.sin(), ang.cos()], dim=1)

    def forward(self, sim: ServingSimulation, batch: Batch, args: dict[str, torch.Tensor],
                pools: KvPools) -> list[list[int]]:
        """Write K/V of the new tokens into both pools (where the allocator put them), then attend: the
        full layer over the request's prefix through ``req_to_token``, the SWA layer over its window through
        ``req_to_token`` and the full->SWA table. Returns the greedy next token at every fed position."""
        w = self.w
        h, d = self.token_shape
        assert pools.swa_k is not None and pools.swa_v is not None
        k_flat, v_flat = pools.k.view(-1, h, d), pools.v.view(-1, h, d)
        swa_k, swa_v = pools.swa_k.view(-1, h, d), pools.swa_v.view(-1, h, d)
        ids, pos, loc, swa_loc = (args[k] for k in ("input_ids", "positions", "out_cache_loc", "swa_out_cache_loc"))
        x = w["emb"][ids] + self._pe(pos)
        k_flat[loc] = (x @ w["wk"]).view(-1, h, d)
        v_flat[loc] = (x @ w["wv"]).view(-1, h, d)
        swa_k[swa_loc] = (x @ w["sk"]).view(-1, h, d)
        swa_v[swa_loc] = (x @ w["sv"]).view(-1, h, d)

        out = []
        for row in batch.rows:
            n, start = row.n, row.prefix
            xq = x[row.start:row.start + n]
            end = start + n
            q_idx = torch.arange(start, end, device=x.device)
            k_idx = torch.arange(end, device=x.device)
            slots = sim.req_to_token[row.req.row, :end].long()
            causal = k_idx[None, :] <= q_idx[:, None]
            full = _attend((xq @ w["wq"]).view(n, h, d), k_flat[slots], v_flat[slots], causal)
            # The SWA layer reads its pool through the full->SWA table, inside the window only.
            window = causal & (k_idx[None, :] > q_idx[:, None] - self.swa_window)
            swa_slots = sim.full_to_swa[slots]
            swa = _attend((xq @ w["sq"]).view(n, h, d), swa_k[swa_slots], swa_v[swa_slots], window)
            logits = (full + swa).reshape(n, -1) @ w["out"]
            out.append(torch.argmax(logits, dim=1).tolist())
        return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention of ``q [n, h, d]`` over ``k, v [m, h, d]`` with a boolean ``mask [n, m]``."""
    scores = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hnm,mhd->nhd", scores.softmax(-1), v)


@dataclass(frozen=True)
class Bugs:
    """The bugs that can be planted in the engine (see the module docstring)."""

    page_freed_while_cached: bool = False
    swa_table_off_by_one: bool = False
    chunk_position_slip: bool = False


class ToyEngine(ServingSimulation):
    """The engine model with :class:`TinyModel` plugged in and, optionally, planted :class:`Bugs`.

    ``canary=False`` runs it without a canary (to compare outputs); ``device`` may be a CUDA device (the
    canary then runs its CUDA kernels); ``canary_mode`` is passed to :class:`kvcanary.KVCanary` (default
    ``"quiet"``: read the reports with ``engine.violations``). The canary fingerprints the whole of every
    token's K and V (``real_kv_hash_mode=ALL``) and checks stored tokens against each request's history.
    """

    def __init__(self, config: SimConfig | None = None, *, bugs: Bugs | None = None, canary: bool = True,
                 device: Any = "cpu", canary_mode: str = "quiet", real_kv_hash_mode: int = kc.RealKvHashMode.ALL):
        self.bugs = bugs or Bugs()
        self.bug_events: list[tuple[int, str, list[int]]] = []
        cfg = config or toy_config()
        model = TinyModel(vocab=cfg.vocab, swa_window=cfg.swa_window, seed=cfg.seed, device=device)
        super().__init__(cfg, device=device, mode=canary_mode, canary=canary, model=model,
                         canary_kwargs=dict(real_kv_hash_mode=real_kv_hash_mode, name="toy"))

    def _swa_table_index(self, full_slot: int) -> int:
        if not self.bugs.swa_table_off_by_one:
            return full_slot
        # BUG: the table has num_slots + 1 entries; treating it as 1-based shifts every update by one entry.
        self.bug_events.append((self.step_index, "swa_table_off_by_one", [full_slot]))
        return full_slot + 1

    def _first_private_page(self, req: Request, cached: int) -> int:
        if not self.bugs.page_freed_while_cached or cached == 0:
            return cached
        # BUG: the "past the cached part" slice starts one page early, so the last page the cache holds goes
        # back to the free list while the cache still maps it.
        page = req.pages[cached - 1]
        if page in self.page_key:
            self.bug_events.append((self.step_index, "page_freed_while_cached", list(self._page_slots(page))))
        return cached - 1

    def _first_position(self, req: Request, start: int, n: int) -> int:
        if not self.bugs.chunk_position_slip or start <= req.cached_len:
            return start
        # BUG: a continuation chunk counts positions from the request's first computed token, forgetting the
        # tokens it got from the prefix cache.
        if req.cached_len:
            self.bug_events.append((self.step_index, "chunk_position_slip", [req.slot(p) for p in range(start, start + n)]))
        return start - req.cached_len


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
