"""A simulated serving workload that drives a :class:`~kvcanary.KVCanary` like an engine would.

No model runs; everything else an engine does to its KV cache does: a paged KV pool with a slot
allocator, requests arriving and finishing, chunked prefill then decode, a prefix cache whose system
prompts are shared between requests (and evicted when idle and memory is short), a sliding-window (SWA)
group with its own pool and a full->SWA index table whose out-of-window slots are freed and recycled,
CUDA-graph-style padding rows, and a "forward" that writes deterministic K/V bytes for every new token
into the real pools (so TAIL fingerprints are real). Every step calls ``canary.step("head")``, writes the
KV, then ``canary.step("tail")``; every ``sweep_every`` steps the prefix cache is swept.

The engine's index tables (``req_to_token``, the SWA table, the expected-token pool) are kept on the host
and copied to the device before each step, as an engine's scheduler would; the real KV pools live on the
device. :func:`run_fault_scenario` plants one :mod:`kvcanary.testing.faults` injector at a realistic moment and
reports whether the canary caught it as documented; the demo, the tests and the notebooks use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvcanary.ops.structs import RealKvSource
from kvcanary.runtime.canary import KVCanary, SwaConfig
from kvcanary.runtime.report import Violation
from kvcanary.testing import faults
from kvcanary.testing.faults import ExpectedViolation


@dataclass(frozen=True)
class SimConfig:
    """Workload shape. Defaults run a few hundred steps per second or so on the CPU reference."""

    num_slots: int = 384            # FULL pool slots (slot 0 is the padding slot); a multiple of page_size
    page_size: int = 4
    max_running: int = 6
    max_seq_len: int = 96
    prompt_len: tuple[int, int] = (4, 36)     # random part of the prompt, inclusive range
    max_new_tokens: tuple[int, int] = (3, 20)
    chunk_size: int = 12             # chunked prefill: tokens per request per step
    system_prompts: int = 2
    system_prompt_len: int = 10
    share_prob: float = 0.6          # chance a new request starts with a system prompt
    arrival_prob: float = 0.7
    swa_window: int = 6              # 0 = no SWA group
    swa_num_slots: int = 192
    with_v: bool = True
    pad_to: int = 4                  # pad the batch rows to a multiple of this (CUDA-graph buckets)
    vocab: int = 32000
    kv_bytes_per_token: int = 32     # bytes of K (and of V) per token in each pool
    sweep_every: int = 8             # 0 = never
    seed: int = 0


@dataclass
class Request:
    rid: int
    row: int
    tokens: list[int]
    prompt_len: int
    max_new: int
    sys_id: int | None
    generated: int = 0
    computed: int = 0                # positions whose KV is written
    slots: list[int] = field(default_factory=list)   # FULL slot of every computed position
    owned_from: int = 0              # positions below this are owned by a prefix-cache entry
    swa: dict[int, int] = field(default_factory=dict)  # position -> SWA slot owned by this request
    entry: CacheEntry | None = None

    @property
    def remaining(self) -> int:
        return self.max_new - self.generated


@dataclass
class CacheEntry:
    sys_id: int
    tokens: list[int]
    slots: list[int]                 # FULL slots of positions [0, L)
    swa: dict[int, int]              # position -> SWA slot, for the window positions [L - W, L)
    refs: int = 0
    no_share: bool = False           # a scenario keeps it idle


@dataclass
class Batch:
    """One step's batch: host (CPU) torch tensors, as the scheduler built them; ``rows`` maps each real
    batch row to its request, its first flat token index and its extend length."""

    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    valid_lens: torch.Tensor
    rows: list[tuple[Request, int, int]]
    new_slots: dict[int, list[int]]


class ServingSimulation:
    """An engine-shaped workload around a :class:`~kvcanary.KVCanary` (``self.canary``).

    Args:
        config: the workload shape.
        device: where the canary, the pools and the batch tensors live (default CPU).
        mode: the canary's reporting mode (default ``"quiet"``: read results with ``canary.poll()``).
        canary_kwargs: extra :class:`~kvcanary.KVCanary` arguments (e.g. ``ring_capacity``).
    """

    def __init__(self, config: SimConfig = SimConfig(), *, device: Any = "cpu", mode: str = "quiet",
                 canary_kwargs: dict | None = None):
        self.cfg = c = config
        self.device = torch.device(device)
        self.rng = np.random.default_rng(c.seed)
        self.max_reqs = c.max_running + 2
        num_pages = c.num_slots // c.page_size
        dim = c.kv_bytes_per_token // 2  # int16 elements
        self.kv_dim = dim

        def pool(pages: int) -> torch.Tensor:
            # int16 "KV": the stand-in forward computes it with integer arithmetic, so the bytes (and the
            # TAIL fingerprints) are identical on every device.
            return torch.zeros((pages, c.page_size, dim), dtype=torch.int16, device=self.device)

        def source(t: torch.Tensor) -> RealKvSource:
            return RealKvSource(tensor=t, page_size=c.page_size, num_bytes_per_token=c.kv_bytes_per_token,
                                read_bytes=c.kv_bytes_per_token)

        self.k_pool, self.v_pool = pool(num_pages), pool(num_pages)
        self.k_source, self.v_source = source(self.k_pool), source(self.v_pool)
        self.r2t_host = torch.zeros((self.max_reqs, c.max_seq_len), dtype=torch.int32)
        self.exp_host = torch.zeros((self.max_reqs, c.max_seq_len), dtype=torch.int32)
        self.lut_host = torch.zeros(c.num_slots + 1, dtype=torch.int64)
        on_cpu = self.device.type == "cpu"
        self.req_to_token = self.r2t_host if on_cpu else self.r2t_host.to(self.device)
        self.expected_tokens = self.exp_host if on_cpu else self.exp_host.to(self.device)
        self.full_to_swa = self.lut_host if on_cpu else self.lut_host.to(self.device)

        swa = None
        if c.swa_window > 0:
            swa_pages = c.swa_num_slots // c.page_size
            self.swa_k_pool, self.swa_v_pool = pool(swa_pages), pool(swa_pages)
            self.swa_k_source, self.swa_v_source = source(self.swa_k_pool), source(self.swa_v_pool)
            swa = SwaConfig(num_slots=c.swa_num_slots, window_size=c.swa_window,
                            full_to_swa_index_mapping=self.full_to_swa, k_sources=(self.swa_k_source,),
                            v_sources=(self.swa_v_source,) if c.with_v else ())
        self.max_batch = math.ceil(c.max_running / c.pad_to) * c.pad_to
        self.max_tokens = self.max_batch * c.chunk_size
        kwargs = dict(num_slots=c.num_slots, max_batch_size=self.max_batch, max_tokens_per_step=self.max_tokens,
                      device=self.device, k_sources=(self.k_source,),
                      v_sources=(self.v_source,) if c.with_v else (), with_v=c.with_v, swa=swa, mode=mode,
                      expected_tokens_shape=(self.max_reqs, c.max_seq_len), name="sim")
        kwargs.update(canary_kwargs or {})
        self.canary = KVCanary(**kwargs)

        self.free = list(self.rng.permutation(np.arange(1, c.num_slots)).tolist())
        self.swa_free = list(self.rng.permutation(np.arange(1, c.swa_num_slots)).tolist()) if swa else []
        self.free_rows = list(range(1, self.max_reqs))
        self.running: list[Request] = []
        self.cache: dict[int, CacheEntry] = {}
        self.system_tokens = [self.rng.integers(1, c.vocab, c.system_prompt_len).tolist()
                              for _ in range(c.system_prompts)]
        self.step_index = 0
        self.next_rid = 0
        self.stats = {"steps": 0, "admitted": 0, "finished": 0, "cache_hits": 0, "evictions": 0,
                      "tokens": 0, "sweeps": 0, "swept_slots": 0, "stalls": 0, "swa_frees": 0,
                      "partial_chunks": 0, "padding_rows": 0}
        self.sim_step_of: dict[int, int] = {}  # canary step number -> simulation step

    # -- allocator and prefix cache --------------------------------------------------------------------

    def _alloc(self, n: int) -> list[int] | None:
        if len(self.free) < n:
            self._evict(n - len(self.free))
        if len(self.free) < n:
            return None
        out, self.free = self.free[:n], self.free[n:]
        return out

    def _evict(self, need: int) -> None:
        for sys_id, e in list(self.cache.items()):
            if need <= 0:
                return
            if e.refs == 0 and not e.no_share:
                self._free_swa(e.swa, e.slots)
                self.free.extend(e.slots)
                del self.cache[sys_id]
                need -= len(e.slots)
                self.stats["evictions"] += 1

    def _free_swa(self, swa: dict[int, int], slots: list[int], positions: list[int] | None = None) -> None:
        for pos in list(swa) if positions is None else positions:
            self.swa_free.append(swa.pop(pos))
            self.stats["swa_frees"] += 1
            self.lut_host[slots[pos]] = 0  # the engine clears the table entry with the SWA slot

    def idle_cache_entries(self) -> list[CacheEntry]:
        """Prefix-cache entries no running request uses: only a sweep checks their slots."""
        return [e for e in self.cache.values() if e.refs == 0]

    # -- scheduling ------------------------------------------------------------------------------------

    def _outstanding(self) -> int:
        # Slots the running requests may still allocate (upper bound: every prompt and new token).
        return sum(r.prompt_len + r.max_new - r.computed for r in self.running)

    def _evictable(self, keep: CacheEntry | None) -> int:
        return sum(len(e.slots) for e in self.cache.values() if e.refs == 0 and not e.no_share and e is not keep)

    def _admit(self) -> None:
        """Admit arrivals while a slot budget guarantees every running request can finish (the
        scheduler's reservation; without it requests deadlock waiting for each other's slots)."""
        c = self.cfg
        while len(self.running) < c.max_running and self.free_rows and self.rng.random() < c.arrival_prob:
            sys_id = int(self.rng.integers(c.system_prompts)) if self.rng.random() < c.share_prob else None
            body = self.rng.integers(1, c.vocab, int(self.rng.integers(c.prompt_len[0], c.prompt_len[1] + 1))).tolist()
            prefix = self.system_tokens[sys_id] if sys_id is not None else []
            max_new = int(self.rng.integers(c.max_new_tokens[0], c.max_new_tokens[1] + 1))
            tokens = prefix + body
            if len(tokens) + max_new > c.max_seq_len:
                max_new = c.max_seq_len - len(tokens)
            entry = self.cache.get(sys_id) if sys_id is not None else None
            if entry is not None and entry.no_share:
                entry = None
            need = len(tokens) + max_new - (len(entry.slots) if entry is not None else 0)
            if len(self.free) + self._evictable(entry) < self._outstanding() + need:
                return
            row = self.free_rows.pop(0)
            req = Request(self.next_rid, row, tokens, len(tokens), max_new, sys_id)
            self.next_rid += 1
            self.r2t_host[row].zero_()
            self.exp_host[row].zero_()
            self.exp_host[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
            if entry is not None:
                L = len(entry.slots)
                req.computed = L
                req.slots = list(entry.slots)
                req.owned_from = L
                req.entry = entry
                entry.refs += 1
                self.r2t_host[row, :L] = torch.tensor(entry.slots, dtype=torch.int32)
                self.stats["cache_hits"] += 1
            self.running.append(req)
            self.stats["admitted"] += 1

    def build_batch(self) -> Batch:
        """Admit arrivals, give every running request its chunk (prefill) or one token (decode), allocate
        slots and fill ``req_to_token`` and the SWA table (host copies)."""
        self._admit()
        c = self.cfg
        rows, ids, pos, loc = [], [], [], []
        rpi, pre, ext, valid = [], [], [], []
        new_slots: dict[int, list[int]] = {}
        for req in self.running:
            n = min(c.chunk_size, len(req.tokens) - req.computed)
            slots = self._alloc(n) or []
            if len(slots) < n:
                n = 0
                self.stats["stalls"] += 1
            if self.canary.swa is not None and n:
                if len(self.swa_free) < n:  # cannot happen with the default sizing; stall rather than corrupt
                    self.free.extend(slots)
                    slots, n = [], 0
                    self.stats["stalls"] += 1
                else:
                    swa_slots, self.swa_free = self.swa_free[:n], self.swa_free[n:]
                    for k, (s, w) in enumerate(zip(slots, swa_slots)):
                        self.lut_host[s] = w
                        req.swa[req.computed + k] = w
            start = len(ids)
            p0 = req.computed
            if 0 < n < len(req.tokens) - p0:
                self.stats["partial_chunks"] += 1  # a chunked prefill: more of the prompt follows
            if n:
                self.r2t_host[req.row, p0:p0 + n] = torch.tensor(slots, dtype=torch.int32)
            ids += req.tokens[p0:p0 + n]
            pos += list(range(p0, p0 + n))
            loc += slots
            rows.append((req, start, n))
            new_slots[req.rid] = slots
            rpi.append(req.row)
            pre.append(p0)
            ext.append(n)
            valid.append(len(req.tokens))
        # Padding rows, as a CUDA-graph bucket pads a batch: row 0, one dummy token written to slot 0.
        pad = (-len(rpi)) % c.pad_to
        self.stats["padding_rows"] += pad
        for _ in range(pad):
            rpi.append(0), pre.append(0), ext.append(1), valid.append(0)
            ids.append(0), pos.append(0), loc.append(0)

        def t(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int64)

        return Batch(t(rpi), t(pre), t(ext), t(ids), t(pos), t(loc), t(valid), rows, new_slots)

    def _push(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.device.type != "cpu":
            self.req_to_token.copy_(self.r2t_host)
            self.expected_tokens.copy_(self.exp_host)
            self.full_to_swa.copy_(self.lut_host)
        d = self.device
        return dict(req_pool_indices=batch.req_pool_indices.to(d), prefix_lens=batch.prefix_lens.to(d),
                    extend_seq_lens=batch.extend_seq_lens.to(d), req_to_token=self.req_to_token,
                    input_ids=batch.input_ids.to(d), positions=batch.positions.to(d),
                    out_cache_loc=batch.out_cache_loc.to(d), expected_tokens=self.expected_tokens,
                    expected_tokens_valid_lens=batch.valid_lens.to(d))

    def _forward(self, args: dict[str, torch.Tensor]) -> None:
        """Write deterministic K/V bytes for every token of the batch (a stand-in for the model)."""
        loc, ids, pos = args["out_cache_loc"], args["input_ids"], args["positions"]
        keep = loc > 0
        loc, ids, pos = loc[keep], ids[keep], pos[keep]
        j = torch.arange(self.kv_dim, device=self.device, dtype=torch.int64)
        mixed = (ids[:, None] * 2654435761 + pos[:, None] * 40503 + j * 97) % 65521
        k, v = (mixed - 32760).to(torch.int16), ((mixed * 7 + 13) % 65521 - 32760).to(torch.int16)
        self.k_pool.view(-1, self.kv_dim)[loc] = k
        self.v_pool.view(-1, self.kv_dim)[loc] = v
        if self.canary.swa is not None:
            swa = self.full_to_swa[loc]
            live = swa > 0
            self.swa_k_pool.view(-1, self.kv_dim)[swa[live]] = k[live]
            self.swa_v_pool.view(-1, self.kv_dim)[swa[live]] = v[live]

    def _finish_step(self, batch: Batch) -> None:
        c = self.cfg
        W = c.swa_window
        for req, _, n in batch.rows:
            req.computed += n
            req.slots += batch.new_slots[req.rid]
            self.stats["tokens"] += n
            if n and req.computed == len(req.tokens):
                tok = int(self.rng.integers(1, c.vocab))
                req.tokens.append(tok)
                self.exp_host[req.row, len(req.tokens) - 1] = tok
                req.generated += 1
            L = c.system_prompt_len
            if (req.sys_id is not None and req.entry is None and req.computed >= L
                    and req.sys_id not in self.cache):
                # Insert the system prompt into the prefix cache: the entry owns its FULL slots and the SWA
                # slots of its last window; older SWA slots are freed now.
                if W:
                    self._free_swa(req.swa, req.slots, [p for p in req.swa if p < L - W])
                entry = CacheEntry(req.sys_id, req.tokens[:L], req.slots[:L],
                                   {p: req.swa.pop(p) for p in range(max(0, L - W), L)} if W else {}, refs=1)
                self.cache[req.sys_id] = entry
                req.entry, req.owned_from = entry, L
            if W:  # slide the window: free this request's SWA slots that no future step reads
                self._free_swa(req.swa, req.slots, [p for p in req.swa if p < req.computed - W])
        for req in [r for r, _, _ in batch.rows if r.remaining <= 0]:
            self._free_swa(req.swa, req.slots)
            self.free.extend(req.slots[req.owned_from:])
            if req.entry is not None:
                req.entry.refs -= 1
            self.running.remove(req)
            self.free_rows.append(req.row)
            self.stats["finished"] += 1

    def step(self, hook: Callable[[ServingSimulation, Batch], None] | None = None) -> Batch:
        """One engine step: build the batch, ``hook(sim, batch)`` (fault injection point: the batch's host
        tensors and the host tables can be edited), HEAD, forward, TAIL, bookkeeping, periodic sweep."""
        batch = self.build_batch()
        if hook is not None:
            hook(self, batch)
        args = self._push(batch)
        self.canary.step("head", **args)
        self.sim_step_of[self.canary.step_number] = self.step_index
        self._forward(args)
        self.canary.step("tail", **args)
        self.sim_step_of[self.canary.step_number] = self.step_index
        self._finish_step(batch)
        self.step_index += 1
        self.stats["steps"] += 1
        if self.cfg.sweep_every and self.step_index % self.cfg.sweep_every == 0:
            self.sweep()
        return batch

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def sweep(self) -> int:
        """Sweep every prefix-cache entry (FULL group): a radix-cache walk. Returns the slots checked."""
        slots, positions, prev = [], [], []
        for e in self.cache.values():
            slots += e.slots
            positions += list(range(len(e.slots)))
            prev += [-1, *e.slots[:-1]]
        if not slots:
            return 0
        d = self.device

        def t(x):
            return torch.tensor(x, dtype=torch.int64, device=d)

        self.canary.sweep(t(slots), t(positions), t(prev))
        self.sim_step_of[self.canary.step_number] = self.step_index
        self.stats["sweeps"] += 1
        self.stats["swept_slots"] += len(slots)
        return len(slots)


# ------------------------------------------------------------------------------------------------------
# Fault scenarios


@dataclass
class FaultResult:
    """One injector run: what was expected, what the canary reported, when."""

    name: str
    expected: ExpectedViolation | None
    matched: list[Violation]
    violations: list[Violation]
    injected_at_step: int
    clean_before: bool
    note: str = ""
    sim_step_of: dict[int, int] = field(default_factory=dict)

    def steps_after_injection(self, v: Violation) -> int | None:
        """Simulation steps between the edit and the launch that appended ``v`` (0 = the same step)."""
        s = self.sim_step_of.get(v.step)
        return None if s is None or self.injected_at_step < 0 else s - self.injected_at_step

    @property
    def detected(self) -> bool:
        return bool(self.matched)

    @property
    def first(self) -> Violation | None:
        return self.matched[0] if self.matched else None


def _continuing(batch: Batch, *, decode: bool, min_prefix: int = 1, min_remaining: int = 2) -> list[tuple[Request, int, int]]:
    out = []
    for req, start, n in batch.rows:
        if n == 0 or req.computed < min_prefix or req.remaining < min_remaining:
            continue
        if decode and not (n == 1 and req.computed >= req.prompt_len):
            continue
        out.append((req, start, n))
    return out


def _inject(name: str, sim: ServingSimulation, batch: Batch) -> ExpectedViolation | None:
    """Plant fault ``name`` into this step's batch / tables; None when this batch offers no target."""
    rng = sim.rng
    if name == "remap_req_to_token":
        cands = _continuing(batch, decode=False, min_prefix=3)
        if not cands:
            return None
        req, _, _ = cands[int(rng.integers(len(cands)))]
        p = req.computed - 2  # its successor (p + 1) is in the prefix too
        others = [(r, q) for r in sim.running if r is not req for q in range(r.computed) if q != p]
        if not others:
            return None
        r, q = others[int(rng.integers(len(others)))]
        return faults.remap_req_to_token(sim.r2t_host, req_pool_index=req.row, position=p, new_slot=r.slots[q])
    if name == "flip_real_kv_byte":
        cands = _continuing(batch, decode=False, min_prefix=1, min_remaining=1)
        if not cands:
            return None
        req, _, _ = cands[int(rng.integers(len(cands)))]
        slot = req.slots[int(rng.integers(req.computed))]
        return faults.flip_real_kv_byte(sim.k_source, slot=slot, byte=int(rng.integers(16)), mask=0x10)
    if name == "swap_input_tokens":
        cands = _continuing(batch, decode=True)
        pairs = [(a, b) for a in cands for b in cands
                 if a[0].rid < b[0].rid and int(batch.input_ids[a[1]]) != int(batch.input_ids[b[1]])]
        if not pairs:
            return None
        a, b = pairs[int(rng.integers(len(pairs)))]
        return faults.swap_input_tokens(batch.input_ids, i=a[1], j=b[1], out_cache_loc=batch.out_cache_loc)
    if name == "shift_position":
        cands = _continuing(batch, decode=True)
        if not cands:
            return None
        req, start, _ = cands[int(rng.integers(len(cands)))]
        return faults.shift_position(batch.positions, index=start, delta=1, out_cache_loc=batch.out_cache_loc)
    if name == "recycle_slot":
        thieves = _continuing(batch, decode=True)
        for thief, start, _ in thieves:
            pos = int(batch.positions[start])
            victims = [(v, q) for v, _, _ in _continuing(batch, decode=False, min_prefix=3)
                       if v is not thief for q in range(v.computed - 1) if q != pos]
            if victims:
                v, q = victims[int(rng.integers(len(victims)))]
                return faults.recycle_slot(batch.out_cache_loc, sim.r2t_host, token_index=start,
                                           req_pool_index=thief.row, position=pos, live_slot=v.slots[q])
        return None
    raise ValueError(f"kv-canary: unknown fault {name!r}")


FAULT_NAMES = tuple(faults.INJECTORS)


def run_fault_scenario(name: str, config: SimConfig = SimConfig(), *, device: Any = "cpu", warmup_steps: int = 12,
                       observe_steps: int = 2, max_tries: int = 20) -> FaultResult:
    """Run a fresh simulation clean for ``warmup_steps`` steps, plant fault ``name`` (one of
    :data:`FAULT_NAMES`) at the first step that offers a target, run ``observe_steps`` more steps (for
    the idle-slot fault: then sweep), and report what the canary found against the injector's
    :class:`~kvcanary.testing.faults.ExpectedViolation`. ``clean_before`` says no violation preceded the fault."""
    if name not in FAULT_NAMES:
        raise ValueError(f"kv-canary: unknown fault {name!r}; choose from {FAULT_NAMES}")
    sim = ServingSimulation(config, device=device)
    sim.run(warmup_steps)
    clean = not sim.canary.poll(sync=True)
    expected: ExpectedViolation | None = None
    note = ""
    if name == "flip_idle_slot_byte":
        # Keep one prefix-cache entry away from new requests until nobody uses it, then corrupt it.
        for _ in range(max_tries * 4):
            idle = sim.idle_cache_entries()
            if idle:
                break
            for e in sim.cache.values():
                e.no_share = True
            sim.step()
        idle = sim.idle_cache_entries()
        if idle:
            e = idle[0]
            e.no_share = True
            slot = e.slots[int(sim.rng.integers(len(e.slots)))]
            injected_at = sim.step_index
            expected = faults.flip_idle_slot_byte(sim.k_source, slot=slot, byte=0, mask=0x01)
            sim.run(observe_steps)
            before_sweep = sim.canary.poll(sync=True)
            if before_sweep:
                note = f"{len(before_sweep)} row(s) before the sweep"
            sim.sweep()
            found = before_sweep + sim.canary.poll(sync=True)
        else:
            injected_at, found, note = sim.step_index, [], "no idle cache entry appeared"
    else:
        injected_at = -1
        for _ in range(max_tries):
            holder: list[ExpectedViolation | None] = []
            sim.step(lambda s, b, holder=holder: holder.append(_inject(name, s, b)))
            if holder[0] is not None:
                expected = holder[0]
                injected_at = sim.step_index - 1
                break
        if expected is None:
            note = "no target found"
        sim.run(observe_steps)
        found = sim.canary.poll(sync=True)
    matched = expected.found_in(found) if expected is not None else []
    return FaultResult(name, expected, matched, found, injected_at, clean, note, dict(sim.sim_step_of))
