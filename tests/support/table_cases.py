"""Random cases for the plan-free ops (SPEC §10-§12) and the record ops (§13), shared by the CPU and GPU tests.

Everything is built on the CPU from a NumPy generator and returned as CPU tensors; ``.to(device)`` on each case
(or :func:`to_device` on a list of cases) returns a deep copy on another device (sources keep viewing their own
copy of the pool bytes, a shared log stays shared), so a GPU test can run the CUDA path on the copy and compare
every byte with the CPU reference. Host-side helpers (``slots_of``, ``active_rows``, :func:`stamp_batch`) need
the CPU copy.

* :func:`make_table_batch`: a batch and its table in both forms (a block table and the ``req_to_token`` it
  expands to), with padding rows (``pad_row`` 0 or -1), invalid rows, out-of-range and negative block ids,
  shared prefixes, an optional SWA window with its LUT (LUT misses included) and an optional expected-token
  pool (``token_offset`` 0 or +1 for EAGLE).
* :func:`make_canary_case` / :func:`make_canary_cases`: canary buffer + violation log (poisoned ring, random
  counters) + any number of real-KV sources (optionally covering fewer slots than the canary) for one context;
  :func:`stamp_batch` stamps the batch's prefixes as clean chains, then corrupts a share of the records.
* :func:`make_write_tokens`: the flattened token arrays of the batch's new tokens (skipped, out-of-range and
  misplaced tokens included; optional input assert).
* :func:`make_records_case`: a canary buffer (and a second one for cross-buffer copies), slots with negative,
  out-of-range and duplicate entries, records and poisoned outputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import kvcanary as kc
from kvcanary.consts import RealKvHashMode
from kvcanary.ops.reference.hashing import ANCHOR_HASH
from kvcanary.ops.reference.hashing import mix3 as ref_mix3
from support.gpu_util import LogState, SourceSpec, fingerprints, make_log, random_bytes, t


def to_device(x: Any, device: Any, memo: dict[int, Any] | None = None) -> Any:
    """A deep copy of the tensors in ``x`` (dataclasses, lists, tuples, dicts) on ``device``; a tensor or
    dataclass reached twice (e.g. a log shared by several contexts) is copied once, so the copies share it too."""
    memo = {} if memo is None else memo
    if isinstance(x, torch.Tensor):
        if id(x) not in memo:
            memo[id(x)] = x.to(device).clone()
        return memo[id(x)]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        if id(x) not in memo:
            memo[id(x)] = dataclasses.replace(x, **{f.name: to_device(getattr(x, f.name), device, memo)
                                                    for f in dataclasses.fields(x) if f.init})
        return memo[id(x)]
    if isinstance(x, list):
        return [to_device(v, device, memo) for v in x]
    if isinstance(x, tuple):
        return tuple(to_device(v, device, memo) for v in x)
    if isinstance(x, dict):
        return {k: to_device(v, device, memo) for k, v in x.items()}
    return x


# ----------------------------------------------------------------------------------------------------------
# A batch and its table


@dataclass
class TableBatch:
    """One batch over a table given in both forms; CPU tensors unless moved with :meth:`to`.

    ``num_slots`` is the canary's slot space (the SWA pool when ``swa_window_size > 0``). ``tokens[rp, p]`` is
    the token a clean engine holds at position ``p`` of table row ``rp`` (used to stamp chains and to build the
    expected-token pool and the new tokens).
    """

    req_pool_indices: torch.Tensor  # int64 [bs]
    prefix_lens: torch.Tensor  # int64 [bs]
    extend_seq_lens: torch.Tensor  # int64 [bs]
    block_table: torch.Tensor  # int32 [max_reqs, max_blocks]
    block_size: int
    req_to_token: torch.Tensor  # int32 [max_reqs, max_blocks * block_size], the expansion of block_table
    pad_row: int
    swa_window_size: int
    lut: torch.Tensor | None  # int64 [lut_len]
    expected_tokens: torch.Tensor | None  # int32 [max_reqs, max_context_len]
    expected_valid_lens: torch.Tensor | None  # int64 [bs]
    token_offset: int
    num_slots: int
    tokens: np.ndarray = field(repr=False)  # int64 [max_reqs, max_seq_len]

    @property
    def bs(self) -> int:
        return int(self.req_pool_indices.shape[0])

    def to(self, device: Any) -> TableBatch:
        return to_device(self, device)

    def table_kwargs(self, paged: bool) -> dict:
        if paged:
            return dict(block_table=self.block_table, block_size=self.block_size)
        return dict(req_to_token=self.req_to_token)

    def verify_kwargs(self, paged: bool, *, check_token: bool = True) -> dict:
        """Every argument of ``launch_canary_verify_from_table`` but ``contexts`` and the outputs."""
        return dict(req_pool_indices=self.req_pool_indices, prefix_lens=self.prefix_lens, pad_row=self.pad_row,
                    swa_window_size=self.swa_window_size, full_to_swa_index_mapping=self.lut,
                    req_to_verify_expected_tokens=self.expected_tokens,
                    req_to_verify_expected_tokens_valid_lens=self.expected_valid_lens,
                    kv_token_id_vs_position_offset=self.token_offset, check_verify_expected_token=check_token,
                    **self.table_kwargs(paged))

    def write_kwargs(self, paged: bool) -> dict:
        """The table arguments of ``launch_canary_write_from_table`` (add ``contexts`` and the tokens)."""
        return dict(req_pool_indices=self.req_pool_indices, prefix_lens=self.prefix_lens,
                    extend_seq_lens=self.extend_seq_lens, pad_row=self.pad_row, swa_window_size=self.swa_window_size,
                    full_to_swa_index_mapping=self.lut, **self.table_kwargs(paged))

    def plan_kwargs(self, paged: bool) -> dict:
        """The batch arguments of ``launch_canary_plan_kernels`` (add the plans and ``verify_capacity``)."""
        return dict(req_pool_indices=self.req_pool_indices, prefix_lens=self.prefix_lens,
                    extend_seq_lens=self.extend_seq_lens, pad_row=self.pad_row, swa_window_size=self.swa_window_size,
                    full_to_swa_index_mapping=self.lut, req_to_verify_expected_tokens=self.expected_tokens,
                    req_to_verify_expected_tokens_valid_lens=self.expected_valid_lens,
                    kv_token_id_vs_position_offset=self.token_offset, **self.table_kwargs(paged))

    # Host-side views of the table (CPU batches), for stamping and for building tokens.
    def slots_of(self, rps: np.ndarray, ps: np.ndarray) -> np.ndarray:
        """The canary slot ``T(RT(rp, p))`` of each ``(rps[i], ps[i])`` (SPEC §5, §10), vectorized."""
        bsz = self.block_size
        blk = self.block_table.numpy()[rps, ps // bsz].astype(np.int64)
        x = np.where(blk < 0, -1, blk * bsz + ps % bsz)
        if self.lut is None:
            return x
        lut = self.lut.numpy()
        out = x.copy()
        hit = (x >= 0) & (x < len(lut))
        out[hit] = lut[x[hit]]
        out[x >= len(lut)] = -2
        return out

    def active_rows(self) -> list[int]:
        """Batch rows that are neither padding nor invalid (SPEC §9, §10)."""
        max_reqs = self.block_table.shape[0]
        max_seq_len = self.block_table.shape[1] * self.block_size
        out = []
        for r in range(self.bs):
            rp, pre = int(self.req_pool_indices[r]), int(self.prefix_lens[r])
            if rp != self.pad_row and 0 <= rp < max_reqs and pre <= max_seq_len:
                out.append(r)
        return out


def make_table_batch(
    rng: np.random.Generator,
    *,
    n_active: int = 6,
    n_padding: int = 2,
    n_invalid: int = 2,
    max_reqs: int = 10,
    max_blocks: int = 8,
    block_size: int = 16,
    pad_row: int = 0,
    window: int = 0,
    lut_misses: bool = True,
    with_pool: bool = True,
    token_offset: int = 0,
    bad_blocks: int = 2,
    share_prefixes: bool = True,
    max_extend: int = 8,
    spare_blocks: int = 4,
    extend_cycle: tuple[int, ...] | None = None,
    shuffle: bool = True,
) -> TableBatch:
    """A random batch (see the module docstring); ``window > 0`` adds a LUT into a smaller SWA slot space.

    ``bad_blocks`` block ids inside used prefixes are replaced by out-of-range or negative ids (both table
    forms alike). Padding rows use ``pad_row``; invalid rows use indices outside ``[0, max_reqs)`` or a prefix
    beyond ``max_seq_len``. Random extend lengths are in ``[-1, max_extend]``, at least one of them positive;
    ``extend_cycle`` gives the active rows' extend lengths in turn instead (a boundary the kernels branch on, for
    certain). ``shuffle=False`` keeps the batch in order: the active rows (``extend_cycle``'s order), then the
    padding rows, then the invalid ones (rows placed in the kernels' tiles).
    """
    max_seq_len = max_blocks * block_size
    rows = [r for r in range(max_reqs) if r != pad_row]
    assert n_active <= len(rows)
    active = [int(x) for x in rng.choice(rows, n_active, replace=False)]
    num_blocks = n_active * max_blocks + spare_blocks + 1  # block 0 (slots [0, block_size)) is never handed out
    assert num_blocks * block_size + block_size < 1 << 31
    free = list(rng.permutation(np.arange(1, num_blocks)))
    block_table = np.full((max_reqs, max_blocks), -1, np.int32)
    tokens = rng.integers(0, 1 << 31, (max_reqs, max_seq_len)).astype(np.int64)
    prefix, extend = {}, {}
    if extend_cycle is None:
        exts = [int(rng.integers(-1, max_extend + 1)) if rng.random() < 0.9 else 0 for _ in active]
        if max_extend > 0 and max(exts) <= 0:  # some active row writes, so every write test has tokens to check
            exts[int(rng.integers(0, n_active))] = int(rng.integers(1, max_extend + 1))
    for i, rp in enumerate(active):
        ext = extend_cycle[i % len(extend_cycle)] if extend_cycle is not None else exts[i]
        pre = int(rng.integers(0, max_seq_len - max(ext, 0) + 1))
        prefix[rp], extend[rp] = pre, ext
        shared = 0
        if share_prefixes and i > 0 and rng.random() < 0.3:
            src = active[int(rng.integers(0, i))]
            shared = min(pre, prefix[src]) // block_size  # whole blocks below both prefixes: never written
            block_table[rp, :shared] = block_table[src, :shared]
            tokens[rp, :shared * block_size] = tokens[src, :shared * block_size]
        need = -(-(pre + max(ext, 0)) // block_size)
        for b in range(shared, need):
            block_table[rp, b] = free.pop()
    # Out-of-range and negative block ids inside used prefixes (RT beyond the pool, or -1).
    for _ in range(bad_blocks):
        rp = active[int(rng.integers(0, n_active))]
        used = -(-prefix[rp] // block_size)
        if used:
            b = int(rng.integers(0, used))
            block_table[rp, b] = (num_blocks + int(rng.integers(0, 50)) if rng.random() < 0.5
                                  else -int(rng.integers(1, 100)))

    full_slots = num_blocks * block_size
    lut = None
    num_slots = full_slots
    if window > 0:
        num_slots = full_slots // 2 + 1
        lut_len = full_slots + 1 - (int(rng.integers(1, 2 * block_size + 1)) if lut_misses else 0)
        lut_np = np.zeros(lut_len, np.int64)
        free_swa = list(rng.permutation(np.arange(1, num_slots)))
        for x in rng.permutation(np.arange(block_size, lut_len)):
            if not free_swa:
                break
            if rng.random() < 0.85:
                lut_np[x] = free_swa.pop()
        if lut_len > 3:
            lut_np[rng.integers(1, lut_len, 2)] = num_slots + rng.integers(0, 9, 2)  # translated out of range
        lut = t(lut_np)

    # The batch: active rows, padding rows and invalid rows, shuffled.
    entries = [(rp, prefix[rp], extend[rp]) for rp in active]
    for _ in range(n_padding):
        # A padding row's prefix may exceed max_seq_len too (then it is an invalid row, SPEC §9).
        entries.append((pad_row, int(rng.integers(0, max_seq_len + 3)), int(rng.integers(0, 4))))
    for k in range(n_invalid):
        kind = k % 3
        if kind == 0:
            entries.append((max_reqs + int(rng.integers(0, 5)), int(rng.integers(0, 9)), int(rng.integers(0, 4))))
        elif kind == 1:
            entries.append((-2 - int(rng.integers(0, 5)), int(rng.integers(0, 9)), int(rng.integers(0, 4))))
        else:  # a real row with a prefix beyond max_seq_len
            entries.append((rows[int(rng.integers(0, len(rows)))], max_seq_len + int(rng.integers(1, 5)), 1))
    if shuffle:
        entries = [entries[i] for i in rng.permutation(len(entries))]
    rpi = np.array([e[0] for e in entries], np.int64)
    pre_a = np.array([e[1] for e in entries], np.int64)
    ext_a = np.array([e[2] for e in entries], np.int64)

    # req_to_token: the expansion of the block table (SPEC §10).
    p = np.arange(max_seq_len)
    blk = block_table[:, p // block_size].astype(np.int64)
    r2t = np.where(blk < 0, -1, blk * block_size + p % block_size).astype(np.int32)

    pool = valid_lens = None
    if with_pool:
        cols = max_seq_len - int(rng.integers(0, block_size + 1))  # max_context_len may be below max_seq_len
        pool_np = rng.integers(0, 1 << 31, (max_reqs + int(rng.integers(0, 3)), cols)).astype(np.int32)
        q = np.arange(cols)
        src = q - token_offset
        okq = (src >= 0) & (src < max_seq_len)
        pool_np[:max_reqs, okq] = tokens[:, src[okq]].astype(np.int32)
        pool = t(pool_np)
        valid_lens = t(np.maximum(pre_a + token_offset + rng.integers(-3, 3, len(rpi)), -1))

    return TableBatch(req_pool_indices=t(rpi), prefix_lens=t(pre_a), extend_seq_lens=t(ext_a),
                      block_table=t(block_table), block_size=block_size, req_to_token=t(r2t), pad_row=pad_row,
                      swa_window_size=window, lut=lut, expected_tokens=pool, expected_valid_lens=valid_lens,
                      token_offset=token_offset, num_slots=num_slots, tokens=tokens)


# ----------------------------------------------------------------------------------------------------------
# Contexts


def make_source_rows(rng: np.random.Generator, rows: int, *, page_size: int, num_bytes_per_token: int,
                     read_bytes: int, dtype: torch.dtype = torch.uint8, extra_row_bytes: int = 0,
                     stride_pad: int = 0) -> SourceSpec:
    """A real-KV source of exactly ``rows`` rows (covering ``rows * page_size`` slots) over random bytes."""
    row_bytes = page_size * num_bytes_per_token + extra_row_bytes
    base = random_bytes(rng, (rows, row_bytes + stride_pad), torch.uint8)
    return SourceSpec(base, page_size, num_bytes_per_token, read_bytes, row_bytes, dtype, False)


@dataclass
class CanaryCase:
    """The state of one context: canary buffer, log, sources (their pools' bytes), mode, tag and flag."""

    canary: torch.Tensor  # uint8 [num_slots, stride]
    log: LogState
    sources: list[SourceSpec]
    mode: int
    tag: int
    flag: torch.Tensor | None  # int32 [1]

    def to(self, device: Any) -> CanaryCase:
        return to_device(self, device)

    @property
    def num_slots(self) -> int:
        return int(self.canary.shape[0])

    def context(self) -> kc.VerifyOrWriteContext:
        return kc.VerifyOrWriteContext(
            canary_buf=self.canary, kernel_kind=self.tag, violation_ring=self.log.ring,
            violation_write_index=self.log.index, slot_run_counter=self.log.slot_counter,
            kernel_run_counter=self.log.kernel_counter,
            real_kv_sources=tuple(s.source(s.base) for s in self.sources), real_kv_hash_mode=self.mode,
            enable_chain_position_assert=self.flag)

    def covered(self) -> int:
        """Slots the launch may touch (SPEC §9): fewer than ``num_slots`` when a source covers fewer and the
        mode reads real KV."""
        if self.mode == RealKvHashMode.NONE or not self.sources:
            return self.num_slots
        return min(self.num_slots, *(s.base.shape[0] * s.page_size for s in self.sources))

    def outputs(self) -> list[torch.Tensor]:
        """Every buffer an op may write."""
        return [self.canary, self.log.ring, self.log.index, self.log.slot_counter, self.log.kernel_counter]


def record_stride(rng: np.random.Generator, *, aligned: bool = False) -> int:
    """A random canary record stride: 32, 40 or 48 bytes; with ``aligned`` only the multiples of 16 (the CUDA verify's
    32-bit modules take only 16-byte aligned records)."""
    return int(rng.choice([32, 48] if aligned else [32, 40, 48]))


def make_canary_case(rng: np.random.Generator, num_slots: int, *, n_sources: int = 0,
                     mode: int = RealKvHashMode.NONE, stride: int = 32, ring_capacity: int = 256,
                     start_index: int = 0, tag: int | None = None, flag: int | None = 1,
                     source_rows: int | None = None, page_size: int | None = None, num_bytes_per_token: int = 32,
                     read_bytes: int | None = None) -> CanaryCase:
    """A context over a random-byte canary buffer (the poison) with ``n_sources`` random pools.

    Size ``ring_capacity`` above the rows a launch can append when results are compared across backends:
    which rows land in an overflowing ring is unspecified.

    Sources cover ``num_slots`` (rounded up to whole pages) unless ``source_rows`` is given, in which case the
    last source has exactly that many rows (it may cover fewer slots than the canary, SPEC §9).
    """
    sources = []
    for k in range(n_sources):
        ps = page_size if page_size is not None else int(rng.choice([1, 2, 4, 16]))
        rows = -(-num_slots // ps) + int(rng.integers(0, 2))
        if source_rows is not None and k == n_sources - 1:
            rows = source_rows
        rb = read_bytes if read_bytes is not None else 16 * int(rng.integers(1, num_bytes_per_token // 16 + 1))
        sources.append(make_source_rows(rng, rows, page_size=ps, num_bytes_per_token=num_bytes_per_token,
                                        read_bytes=rb, extra_row_bytes=16 * int(rng.integers(0, 2)),
                                        stride_pad=16 * int(rng.integers(0, 2))))
    return CanaryCase(
        canary=random_bytes(rng, (num_slots, stride), torch.uint8),
        log=make_log(rng, ring_capacity, start_index),
        sources=sources,
        mode=int(mode),
        tag=int(rng.integers(0, 12)) if tag is None else tag,
        flag=None if flag is None else torch.tensor([flag], dtype=torch.int32),
    )


def make_canary_cases(rng: np.random.Generator, num_slots: int, n_contexts: int, *, shared_log: bool = False,
                      **kw) -> list[CanaryCase]:
    """``n_contexts`` contexts over one slot space, each with its own canary buffer and sources, and its own
    log unless ``shared_log`` (then all append to the first one's log, as the contexts of one canary do)."""
    cases = [make_canary_case(rng, num_slots, **kw) for _ in range(n_contexts)]
    if shared_log:
        cases = [dataclasses.replace(c, log=cases[0].log) for c in cases]
    return cases


def stamp_batch(rng: np.random.Generator, case: CanaryCase, batch: TableBatch, *, corrupt: float = 0.03) -> None:
    """Stamp every active row's prefix as a clean chain from the anchor (record of position ``p``: token,
    ``p``, the running hash, the slot's fingerprint), then corrupt ``corrupt`` of the stamped records.

    Vectorized across rows, serial along positions. Positions whose slot is outside ``[1, covered)`` are not
    stamped (the chain still advances over them).
    """
    recs = case.canary.numpy().view(np.int64)
    limit = case.covered()
    rows = batch.active_rows()
    rps = batch.req_pool_indices.numpy()[rows]
    lens = batch.prefix_lens.numpy()[rows]
    longest = int(lens.max()) if len(lens) else 0
    if longest == 0:
        return
    pmat = np.broadcast_to(np.arange(longest), (len(rows), longest))
    slots = batch.slots_of(np.repeat(rps[:, None], longest, axis=1), pmat)
    toks = batch.tokens[rps, :longest]
    stampable = (slots > 0) & (slots < limit) & (pmat < lens[:, None])
    uniq = np.unique(slots[stampable])
    fp = np.zeros(case.num_slots, np.int64)
    fp[uniq] = fingerprints(case.sources, case.mode, uniq)
    h = np.full(len(rows), ANCHOR_HASH, np.uint64)
    for j in range(longest):
        live = lens > j
        ok = stampable[:, j]
        s = slots[ok, j]
        recs[s, 0] = toks[ok, j]
        recs[s, 1] = j
        recs[s, 2] = h[ok].view(np.int64)
        recs[s, 3] = fp[s]
        h[live] = ref_mix3(h[live], toks[live, j], np.full(int(live.sum()), j, np.int64))
    stamped = slots[stampable]
    if len(stamped) and corrupt > 0:
        victims = rng.choice(np.unique(stamped), max(1, int(len(stamped) * corrupt)))
        fields = rng.integers(0, 4, len(victims))
        recs[victims, fields] ^= np.int64(1) << rng.integers(0, 62, len(victims))


# ----------------------------------------------------------------------------------------------------------
# New tokens for the write


@dataclass
class WriteTokens:
    input_ids: torch.Tensor  # int64 [N]
    positions: torch.Tensor  # int64 [N]
    out_cache_loc: torch.Tensor  # int64 [N]
    expected_input_tokens: torch.Tensor | None
    expected_input_positions: torch.Tensor | None

    @property
    def enable_write_input_assert(self) -> bool:
        return self.expected_input_tokens is not None

    def kwargs(self) -> dict:
        return dict(input_ids=self.input_ids, positions=self.positions, out_cache_loc=self.out_cache_loc,
                    enable_write_input_assert=self.enable_write_input_assert,
                    expected_input_tokens=self.expected_input_tokens,
                    expected_input_positions=self.expected_input_positions)

    def to(self, device: Any) -> WriteTokens:
        return to_device(self, device)


def make_write_tokens(rng: np.random.Generator, batch: TableBatch, *, assert_on: bool = False, tail: int = 3,
                      short: int = 0, skip: float = 0.05, out_of_range: float = 0.03, misplaced: float = 0.05) -> WriteTokens:
    """The flattened new tokens of the batch (request by request, active rows only, ``max(extend, 0)`` each):
    ``out_cache_loc`` is the slot the table gives for the position (a share set to -1 or out of range; with
    ``out_of_range`` > 0 at least one token of a request inside the arrays, so a write always reports a row and a
    differential test always compares some), positions follow the prefix (a share off by a few), then ``tail``
    garbage tokens; ``short`` drops the last tokens so that a request's range runs past the arrays."""
    rows = batch.active_rows()
    rps = batch.req_pool_indices.numpy()[rows]
    pre = batch.prefix_lens.numpy()[rows]
    wl = np.maximum(batch.extend_seq_lens.numpy()[rows], 0)
    req = np.repeat(np.arange(len(rows)), wl)
    p = pre[req] + (np.arange(int(wl.sum())) - (np.cumsum(wl) - wl)[req])
    ids = batch.tokens[rps[req], p].tolist()
    pos = p.tolist()
    # Each slot written at most once per launch (the GPU stamps requests in parallel): repeats -> -1.
    loc_np = batch.slots_of(rps[req], p)
    _, first = np.unique(loc_np, return_index=True)
    dup = np.ones(len(loc_np), bool)
    dup[first] = False
    loc_np[dup | (loc_np == 0)] = -1
    loc = loc_np.tolist()
    n = len(ids)
    ids_a = np.array(ids + list(rng.integers(0, 1 << 31, tail)), np.int64)
    pos_a = np.array(pos + list(rng.integers(0, 1 << 20, tail)), np.int64)
    loc_a = np.array(loc + list(rng.integers(-1, batch.num_slots, tail)), np.int64)
    exp_tok, exp_pos = ids_a.copy(), pos_a.copy()
    if n:
        k = rng.random(n)
        loc_a[:n][k < skip] = -1
        oor = (k >= skip) & (k < skip + out_of_range)
        inside = np.flatnonzero(np.cumsum(wl)[req] <= n - short)  # tokens of requests that stay inside the arrays
        if out_of_range > 0 and len(inside) and not oor[inside].any():
            oor[rng.choice(inside)] = True
        loc_a[:n][oor] = batch.num_slots + rng.integers(0, 1 << 20)
        m = rng.random(n) < misplaced
        pos_a[:n][m] += rng.integers(1, 4, int(m.sum()))
        if assert_on:
            bad = rng.random(n) < 0.05
            exp_tok[:n][bad] ^= 1
    if short:
        ids_a, pos_a, loc_a = ids_a[: max(n - short, 0)], pos_a[: max(n - short, 0)], loc_a[: max(n - short, 0)]
        exp_tok, exp_pos = exp_tok[: len(ids_a)], exp_pos[: len(ids_a)]
    return WriteTokens(t(ids_a), t(pos_a), t(loc_a), t(exp_tok) if assert_on else None,
                       t(exp_pos) if assert_on else None)


# ----------------------------------------------------------------------------------------------------------
# Records


@dataclass
class RecordsCase:
    """Buffers and slot lists for gather / scatter / copy (SPEC §13); outputs poisoned."""

    canary: torch.Tensor  # uint8 [num_slots, stride], random bytes
    other: torch.Tensor  # uint8 [other_slots, other_stride], random bytes (cross-buffer copies)
    slots: torch.Tensor  # int64 [n]: valid, negative, out-of-range and duplicate slots of `canary`
    dst_slots: torch.Tensor  # int64 [n]: slots of `other` (or of `canary` for in-buffer copies)
    records: torch.Tensor  # int64 [n, 4], random
    records_out: torch.Tensor  # int64 [n, 4], poison
    out_of_range: torch.Tensor  # int32 [1], poison

    def to(self, device: Any) -> RecordsCase:
        return to_device(self, device)


def _slot_list(rng: np.random.Generator, n: int, num_slots: int, *, unique: bool, bad: float) -> np.ndarray:
    if unique:
        s = rng.permutation(num_slots)[:n].astype(np.int64)
        s = np.concatenate([s, rng.integers(0, num_slots, n - len(s))]) if len(s) < n else s
    else:
        s = rng.integers(0, num_slots, n)
    k = rng.random(n)
    s[k < bad / 2] = -rng.integers(1, 1 << 40, int((k < bad / 2).sum()))
    oor = (k >= bad / 2) & (k < bad)
    s[oor] = num_slots + rng.integers(0, 1 << 40, int(oor.sum()))
    if bad > 0:  # at least one entry of each kind, which needs two entries
        assert n >= 2, f"a slot list with bad entries needs n >= 2, got n={n}"
        i, j = rng.choice(n, 2, replace=False)
        s[i], s[j] = -1, num_slots + int(rng.integers(0, 4))
    return s


def make_records_case(rng: np.random.Generator, *, n: int = 64, num_slots: int = 100, stride: int = 32,
                      other_slots: int = 80, other_stride: int = 48, bad: float = 0.15,
                      unique_dst: bool = True) -> RecordsCase:
    """``slots`` are drawn with repeats (a gather may read one slot twice); ``dst_slots`` are distinct valid
    slots of ``other`` unless ``unique_dst`` is False; both include negative and out-of-range entries."""
    return RecordsCase(
        canary=random_bytes(rng, (num_slots, stride), torch.uint8),
        other=random_bytes(rng, (other_slots, other_stride), torch.uint8),
        slots=t(_slot_list(rng, n, num_slots, unique=False, bad=bad)),
        dst_slots=t(_slot_list(rng, n, other_slots, unique=unique_dst, bad=bad)),
        records=t(rng.integers(-(1 << 63), (1 << 63) - 1, (n, 4), dtype=np.int64)),
        records_out=random_bytes(rng, (n, 4), torch.int64),
        out_of_range=random_bytes(rng, (1,), torch.int32),
    )
