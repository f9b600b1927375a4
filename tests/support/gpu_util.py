"""Builders and comparisons shared by the GPU differential tests.

Every test builds its inputs once on the CPU from a seeded NumPy generator (fresh random values per test),
poisons every output buffer with random bytes, clones the whole state to the GPU, runs the public op on
both copies (CPU -> ``kvcanary.ops.reference``, CUDA -> ``kvcanary.ops.cuda``) and compares every byte of every
buffer. Violation rows appended by several GPU threads are compared as a multiset (SPEC §4 leaves their
order unspecified); rows past the append index must still hold the identical poison.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import kvcanary as kc
from kvcanary.consts import RealKvHashMode
from kvcanary.ops.reference.hashing import ANCHOR_HASH, mix3

SMALL = os.environ.get("KVCANARY_GPU_SMALL", "") not in ("", "0")


def size(full: int, small: int) -> int:
    """``full``, or ``small`` under ``KVCANARY_GPU_SMALL=1`` (compute-sanitizer runs)."""
    return small if SMALL else full


def rng_for(*key: Any) -> np.random.Generator:
    """A generator seeded from the test's parameters plus fresh OS entropy (fresh inputs per run); the seed
    is printed so a failure can be replayed."""
    entropy = int.from_bytes(os.urandom(8), "little")
    seed = [entropy] + [hash(str(k)) & 0xFFFFFFFF for k in key]
    print(f"rng seed: {seed}")
    return np.random.default_rng(seed)


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def random_bytes(rng: np.random.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``shape`` filled with random bytes (the poison)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    n = math.prod(shape) * itemsize
    return t(rng.integers(0, 256, n, dtype=np.uint8)).view(dtype).reshape(shape)


def bytes_of(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def assert_same_bytes(cpu: torch.Tensor, gpu: torch.Tensor, what: str) -> None:
    a, b = bytes_of(cpu), bytes_of(gpu)
    assert a.shape == b.shape, f"{what}: sizes differ"
    if not np.array_equal(a, b):
        bad = np.flatnonzero(a != b)
        raise AssertionError(f"{what}: {len(bad)} bytes differ, first at byte {bad[0]} "
                             f"(cpu {a[bad[0]]}, gpu {b[bad[0]]})")


def sort_rows(rows: np.ndarray) -> np.ndarray:
    if len(rows) == 0:
        return rows
    return rows[np.lexsort(rows.T[::-1])]


# ----------------------------------------------------------------------------------------------------------
# A state: named buffers built on the CPU, cloned to the GPU, compared byte for byte.


@dataclass
class SourceSpec:
    """A real-KV source over a random base buffer; rows may be wider than the slot bytes (interleaved data)."""

    base: torch.Tensor  # uint8 [rows, stride_bytes]
    page_size: int
    num_bytes_per_token: int
    read_bytes: int
    row_bytes: int
    dtype: torch.dtype
    three_d: bool

    def source(self, base: torch.Tensor) -> kc.RealKvSource:
        v = base[:, : self.row_bytes].view(self.dtype)
        if self.three_d:
            v = v.unflatten(1, (-1, 16 // v.element_size()))  # rows stay dim 0; inner dims contiguous
        return kc.RealKvSource(tensor=v, page_size=self.page_size, num_bytes_per_token=self.num_bytes_per_token,
                               read_bytes=self.read_bytes)


def make_source(rng: np.random.Generator, num_slots: int, *, page_size: int, num_bytes_per_token: int,
                read_bytes: int, dtype: torch.dtype = torch.uint8, extra_row_bytes: int = 0,
                stride_pad: int = 0, three_d: bool = False) -> SourceSpec:
    rows = -(-num_slots // page_size) + int(rng.integers(0, 3))
    row_bytes = page_size * num_bytes_per_token + extra_row_bytes
    stride = row_bytes + stride_pad
    base = random_bytes(rng, (rows, stride), torch.uint8)
    return SourceSpec(base, page_size, num_bytes_per_token, read_bytes, row_bytes, dtype, three_d)


@dataclass
class LogState:
    ring: torch.Tensor
    index: torch.Tensor
    slot_counter: torch.Tensor
    kernel_counter: torch.Tensor

    def to(self, device: str) -> LogState:
        return LogState(*(x.to(device).clone() for x in (self.ring, self.index, self.slot_counter,
                                                         self.kernel_counter)))


def make_log(rng: np.random.Generator, capacity: int, start_index: int = 0) -> LogState:
    return LogState(
        ring=random_bytes(rng, (capacity, 8), torch.int64),
        index=torch.tensor([start_index], dtype=torch.int32),
        slot_counter=torch.tensor([int(rng.integers(0, 1 << 40))], dtype=torch.int64),
        kernel_counter=torch.tensor([int(rng.integers(0, 1000))], dtype=torch.int64),
    )


def compare_logs(cpu: LogState, gpu: LogState, *, ordered: bool = False) -> int:
    """Counters and index equal; appended rows equal (as a multiset unless ``ordered``); the rest of the
    ring byte-equal (both poisoned alike). Returns the number of appended rows."""
    assert_same_bytes(cpu.index, gpu.index, "violation_write_index")
    assert_same_bytes(cpu.slot_counter, gpu.slot_counter, "slot_run_counter")
    assert_same_bytes(cpu.kernel_counter, gpu.kernel_counter, "kernel_run_counter")
    cap = cpu.ring.shape[0]
    n = int(cpu.index[0])
    end = min(max(n, 0), cap)
    a, b = cpu.ring.cpu().numpy(), gpu.ring.cpu().numpy()
    if ordered:
        np.testing.assert_array_equal(a[:end], b[:end], err_msg="violation rows (ordered)")
    else:
        np.testing.assert_array_equal(sort_rows(a[:end]), sort_rows(b[:end]), err_msg="violation rows (multiset)")
    np.testing.assert_array_equal(a[end:], b[end:], err_msg="ring past the appended rows")
    return end


def context(canary: torch.Tensor, log: LogState, *, tag: int, sources: list[SourceSpec] = (),
            source_bases: list[torch.Tensor] | None = None, mode: int = RealKvHashMode.NONE,
            flag: torch.Tensor | None = None) -> kc.VerifyOrWriteContext:
    bases = source_bases if source_bases is not None else [s.base for s in sources]
    return kc.VerifyOrWriteContext(
        canary_buf=canary, kernel_kind=tag, violation_ring=log.ring, violation_write_index=log.index,
        slot_run_counter=log.slot_counter, kernel_run_counter=log.kernel_counter,
        real_kv_sources=tuple(s.source(b) for s, b in zip(sources, bases)), real_kv_hash_mode=mode,
        enable_chain_position_assert=flag)


def fingerprints(sources: list[SourceSpec], mode: int, slots: np.ndarray) -> np.ndarray:
    """Reference real-KV fingerprints (int64) of valid ``slots``, through the CPU reference."""
    from kvcanary.ops.reference.realkv import fingerprint
    from kvcanary.ops.validation import context_views

    if not sources or mode == RealKvHashMode.NONE:
        return np.zeros(len(slots), np.int64)
    canary = torch.zeros((1, 32), dtype=torch.uint8)
    log = LogState(torch.zeros((1, 8), dtype=torch.int64), torch.zeros(1, dtype=torch.int32),
                   torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64))
    views = context_views(context(canary, log, tag=0, sources=sources, mode=mode))
    return fingerprint(views.real_kv_sources, mode, slots).view(np.int64)


# ----------------------------------------------------------------------------------------------------------
# Chains: records that verify clean, built vectorized over requests (serial only along positions).


def build_chains(records: np.ndarray, chains: list[np.ndarray], tokens: list[np.ndarray],
                 rkv: np.ndarray | None = None) -> None:
    """Stamp ``records`` (int64 view of a canary buffer) so each chain of slots verifies clean from the
    anchor: slot j of a chain gets (token, j, prev_hash, rkv)."""
    if not chains:
        return
    lens = np.array([len(c) for c in chains])
    longest = int(lens.max()) if len(lens) else 0
    h = np.full(len(chains), ANCHOR_HASH, dtype=np.uint64)
    slot_mat = np.zeros((len(chains), longest), np.int64)
    tok_mat = np.zeros((len(chains), longest), np.int64)
    for i, (c, tk) in enumerate(zip(chains, tokens)):
        slot_mat[i, : len(c)] = c
        tok_mat[i, : len(c)] = tk
    for j in range(longest):
        live = lens > j
        s = slot_mat[live, j]
        records[s, 0] = tok_mat[live, j]
        records[s, 1] = j
        records[s, 2] = h[live].view(np.int64)
        h[live] = mix3(h[live], tok_mat[live, j], np.full(live.sum(), j, np.int64))
    if rkv is not None:
        all_slots = np.concatenate(chains)
        records[all_slots, 3] = rkv[all_slots]


def run_both(op: Callable[..., None], cpu_kwargs: dict, gpu_kwargs: dict, stream: Any = None) -> None:
    op(**cpu_kwargs)
    op(**gpu_kwargs, stream=stream)
    torch.cuda.synchronize()


def make_verify_case(rng, *, num_slots, n_chains, len_lo, len_hi, stride=32, mode=RealKvHashMode.NONE, source_cfgs=(),
              corrupt=0.05, windowed=True, extra_capacity=16, ring_cap=None, start_index=0):
    """Canary, sources, plan and log of one verify launch (CPU tensors)."""
    canary = random_bytes(rng, (num_slots, stride), torch.uint8)
    recs = canary.numpy().view(np.int64)
    sources = [make_source(rng, num_slots, **cfg) for cfg in source_cfgs]
    lens = rng.integers(len_lo, len_hi + 1, n_chains)
    assert lens.sum() < num_slots
    perm = rng.permutation(np.arange(1, num_slots))[: lens.sum()]
    chains = np.split(perm, np.cumsum(lens)[:-1])
    tokens = [rng.integers(-(1 << 62), 1 << 62, n) for n in lens]
    rkv = np.zeros(num_slots, np.int64)
    rkv[perm] = fingerprints(sources, mode, perm)
    build_chains(recs, chains, tokens, rkv)

    slot, prev, exp_tok, exp_pos = [], [], [], []
    for c, tk in zip(chains, tokens):
        ws = int(rng.integers(0, len(c))) if windowed and rng.random() < 0.3 else 0
        j = np.arange(ws, len(c))
        slot.append(c[j])
        prev.append(np.where(j > 0, c[np.maximum(j - 1, 0)], -1))
        exp_tok.append(np.where(rng.random(len(j)) < 0.2, -1, tk[j]))
        exp_pos.append(j)
    slot, prev, exp_tok, exp_pos = (np.concatenate(x).astype(np.int64) for x in (slot, prev, exp_tok, exp_pos))
    n = len(slot)

    # Corrupt a random share of the entries, one kind each.
    k = int(n * corrupt)
    idx = rng.choice(n, k, replace=False) if k else np.zeros(0, np.int64)
    kinds = rng.integers(0, 12, k)
    for e, kind in zip(idx, kinds):
        s = slot[e]
        if kind == 0:
            recs[s, 0] ^= 1 << int(rng.integers(0, 63))  # stored token
        elif kind == 1:
            recs[s, 1] += int(rng.integers(1, 5))  # stored position
        elif kind == 2:
            recs[s, 2] ^= 1 << int(rng.integers(0, 63))  # chain hash
        elif kind == 3:
            recs[s, 3] ^= 1 << int(rng.integers(0, 63))  # real-KV hash
        elif kind == 4:
            exp_tok[e] = int(rng.integers(0, 1 << 40))
        elif kind == 5:
            exp_pos[e] += 1
        elif kind == 6:
            slot[e] = 0  # padding entry: skipped
        elif kind == 7:
            prev[e] = 0  # unknown predecessor: no chain check
        elif kind == 8:
            prev[e] = -2  # LUT miss: a chain head
        elif kind == 9:
            slot[e] = num_slots + int(rng.integers(0, 1 << 40))  # out of range
        elif kind == 10:
            slot[e] = -int(rng.integers(1, 1 << 40))  # negative
        else:
            prev[e] = num_slots + int(rng.integers(0, 3))  # prev out of range

    cap = n + extra_capacity
    plan = dict(
        verify_slot_indices=t(np.concatenate([slot, rng.integers(-(1 << 62), 1 << 62, cap - n)])),
        verify_expected_tokens=t(np.concatenate([exp_tok, rng.integers(-(1 << 62), 1 << 62, cap - n)])),
        verify_expected_positions=t(np.concatenate([exp_pos, rng.integers(-(1 << 62), 1 << 62, cap - n)])),
        verify_prev_slot_indices=t(np.concatenate([prev, rng.integers(-(1 << 62), 1 << 62, cap - n)])),
        verify_num_valid=torch.tensor([n], dtype=torch.int32),
        enable=torch.tensor([1], dtype=torch.int32),
    )
    log = make_log(rng, ring_cap if ring_cap is not None else n + 8, start_index)
    return canary, sources, plan, log, mode
