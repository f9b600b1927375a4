#!/usr/bin/env python3
"""Benchmark of the CUDA kernels: the SGLang-named ops (plan, verify, write, scatter) and kvcanary's plan-free
ops (verify and write straight from the table), on four serving shapes.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=. python3 bench/bench_cuda.py            # all shapes, real-KV NONE and PARTIAL, both layouts
    PYTHONPATH=. python3 bench/bench_cuda.py --shapes A,B --modes NONE --layouts shuffled --ops verify_table

Shapes (``bs`` requests, each with ``prefix`` cached positions and ``extend`` new tokens; page size 1):

* A decode: 256 x prefix 4096, extend 1 (1,048,576 verify entries)
* B decode: 1024 x prefix 8192, extend 1 (8,388,608 verify entries)
* C prefill: 1 request, prefix 0, extend 32,768 (one 32,768-token write chain)
* D mixed: 16 x prefix 1024, extend 2048

Ops (``--ops``; verify ops only where there is a prefix): ``plan``, ``verify``, ``write``, ``scatter`` (the
SGLang-named ops, one buffer; scatter only when asked for), ``verify_table`` / ``write_table`` (the plan-free ops,
one buffer), ``verify_table_kv`` (the plan-free verify of a K and a V buffer in one launch; both take the verify's
32-bit modules where they apply, ``kvcanary.ops.cuda.specs.FLAT32``), ``verify_table_64`` / ``verify_table_kv_64``
(the same on its 64-bit modules only, as shipped before 2026-12-05) and ``gather_floor`` (not a kvcanary op: a
bare kernel that reads the same table entries and records, and real-KV sectors, as the plan-free verify of one
buffer, in the same order, and checks nothing: the memory floor of that verify on this GPU, measured in the same
run); ``gather_floor_kv`` (the same of a K and a V buffer: the table once, both
buffers' records: the floor of ``verify_table_kv``); ``check_floor`` (real-KV NONE only; not a kvcanary op: the
reads of ``gather_floor`` plus the one computation SPEC §7 asks of every entry, the slot's ``slot_hash`` (three
splitmix64 rounds) handed to the next entry and compared with its stored ``prev_hash``, and the stored position
compared; no row mapping, bounds, log or counters: the floor of a NONE verify that hashes); ``write_floor``
(decode shapes only; not a kvcanary op: a bare kernel doing only the three dependent loads a plan-free decode
write cannot avoid - row, table entry of the seed, seed record - and the record store, no row scan, checks,
counters or log: the latency floor of that write on this GPU).

Real-KV: NONE, and PARTIAL with one source of 256-byte rows per buffer (``uint8 [num_slots, 256]``, page size 1).
Slot layouts (``--layouts``): ``contiguous`` (a request's slots are consecutive) and ``shuffled`` (a random
permutation of the pool).

For every case the script stamps the prefix (a write of the whole prefix), then checks that one
plan -> verify -> write step is clean (no violation; plan counts as expected), that a verify of every
position afterwards is clean, that flipping one stored token is caught (exactly one chain violation, on its
successor) - by the two-pass verify and by verify from the table - and that the plan-free write stamps the same
bytes as the two-pass write; then restores the buffer. Only then does it time each op through the public
``kvcanary.launch_*`` functions on torch CUDA tensors:

* eager: each launch alone, median over ``--runs`` launches after ``--warmup``; before each launch the L2 is
  flushed (a 256 MiB memset) and the GPU is kept busy with ``torch.cuda._sleep`` long enough to cover the
  host-side validation and launch, so the CUDA events bracket GPU time only (a launch enqueued after its sleep
  could have ended, by the host clock, is timed again with a longer sleep: ``Timer.eager``);
* graph: up to ``--graph-reps`` launches of the op (fewer when one launch exceeds 100 µs, so a replay stays
  near 2 ms) captured in one ``torch.cuda.CUDAGraph``, replayed ``--runs`` times; per-launch time = median
  replay time / reps (back to back, L2 left warm);
* host: the median CPU time of one call of the public op (validation, packing, launch) over ``--host-calls``
  back-to-back calls with a reused context (and plan);
* SM MHz: the SM clock right after the op's graph timing (``Timer.sm_mhz``: ``torch.cuda._sleep``'s cycles over
  their event time). The card's clock is left as found and moves with its load, so an op timed after others may
  run at another clock than the same op alone: compare ops in one table through this column too.

Bytes per unit ("B/unit"): for the SGLang-named ops nominal bytes: plan 36 B per verify
entry (four int64 fields written, one int32 ``req_to_token`` read), verify 88 B per entry (four plan fields, the
slot's 32-byte record, 24 bytes of the predecessor's), write 56 B per token (three int64 inputs, one 32-byte
record), scatter 12 B per token (int64 in, int32 out), PARTIAL's real-KV bytes not counted; for the plan-free
verify the *byte minimum*: 36 B per entry and buffer (4 B of table + the slot's 32-byte record; the predecessor's
record is the neighbouring entry's) plus one 32-byte sector of real KV per entry and buffer in PARTIAL
(``verify_table_kv``: 4 + 2 x 32, + 2 x 32). "% copy" compares ``units * B/unit / time`` with a device-to-device
copy (``torch.Tensor.copy_``, bytes read + written) measured in the same run. Write's "ns/token" is the launch
time divided by ``extend`` (the serial chain length; the chains of different requests run in parallel).

The markdown table is printed last and, when ``$OUT`` is set (or ``--out`` is given), written to
``$OUT/bench.md``. Exit status 1 if any correctness check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch

import kvcanary
from kvcanary import (
    CanaryLaunchTag,
    RealKvHashMode,
    RealKvSource,
    VerifyPlan,
    ViolationLog,
    WritePlan,
    allocate_canary_buffer,
    allocate_chain_position_flag,
)
from kvcanary.ops.cuda import specs as kernel_specs
from kvcanary.ops.cuda import verify_table as cuda_verify_table
from kvcanary.ops.cuda.launch import resolve_stream
from kvcanary.ops.interop import Device

SHAPES = {
    "A": dict(bs=256, prefix=4096, extend=1, what="decode"),
    "B": dict(bs=1024, prefix=8192, extend=1, what="decode"),
    "C": dict(bs=1, prefix=0, extend=32768, what="prefill"),
    "D": dict(bs=16, prefix=1024, extend=2048, what="mixed"),
}
# Bytes per unit of work (see the module docstring): nominal for the SGLang-named ops, the byte minimum for the
# plan-free verify (its PARTIAL share added per mode below); the plan-free write is latency-bound (not counted).
BYTES_PER_UNIT = {"plan": 36, "verify": 88, "write": 56, "scatter": 12, "verify_table": 36, "verify_table_kv": 68,
                  "verify_table_64": 36, "verify_table_kv_64": 68, "gather_floor": 36, "gather_floor_kv": 68,
                  "check_floor": 36, "random_reads": 32}
PARTIAL_BYTES_PER_UNIT = {"verify_table": 32, "verify_table_kv": 64, "verify_table_64": 32, "verify_table_kv_64": 64,
                          "gather_floor": 32, "gather_floor_kv": 64, "random_reads": 32}
ALL_OPS = ("plan", "verify", "write", "scatter", "verify_table", "verify_table_kv", "verify_table_64",
           "verify_table_kv_64", "write_table", "gather_floor", "gather_floor_kv", "check_floor", "random_reads",
           "write_floor")
DEFAULT_OPS = tuple(op for op in ALL_OPS if op != "scatter")
VERIFY_OPS = ("plan", "verify", "verify_table", "verify_table_kv", "verify_table_64", "verify_table_kv_64",
              "gather_floor", "gather_floor_kv", "check_floor", "random_reads")


@contextlib.contextmanager
def modules_seen():
    """Within the block, the ``flat32`` flag of every verify-from-table module launched is appended to the list it
    yields."""
    seen: list[bool] = []
    real = cuda_verify_table.function
    cuda_verify_table.function = lambda *a: seen.append(bool(a[-1])) or real(*a)
    try:
        yield seen
    finally:
        cuda_verify_table.function = real


@contextlib.contextmanager
def flat32_modules(on: bool):
    """Within the block the verify from the table takes its 32-bit modules where they apply (``on``, as shipped) or
    only its 64-bit ones (``verify_table_64``, ``verify_table_kv_64``: timed beside the shipped choice in one run)."""
    was = kernel_specs.FLAT32
    kernel_specs.FLAT32 = on
    try:
        yield
    finally:
        kernel_specs.FLAT32 = was

# The floor of the plan-free verify's memory traffic on this GPU (not kvcanary ops). gather_floor reads the same
# table entries and the same 32-byte records (and, with real KV, the same first 16 bytes of each slot's KV row)
# in the same order as a one-buffer verify, with every check, hash and append left out; random_reads reads as
# many random 32-byte records of the same buffer (addresses from a hash of the index: no table at all);
# gather_floor_kv reads the table once and, per entry, the slot's record (and real KV) in a K and in a V buffer, as
# the K + V verify (verify_table_kv) does. Each is
# timed at several launch geometries (entries per thread U in {1, 2, 4} x blocks of 256 threads per SM in
# {2, 4, 8}) and the fastest is kept: no verify kernel can read those bytes faster than these bare reads do.
FLOOR_SRC = r"""
#include "common.cuh"  // check_floor's slot_hash: the kernels' own (compiled with -I kernels_cu)

template <int U, bool TWO>
__device__ __forceinline__ void kvc_bench_gather(const int* __restrict__ table, long long cols, unsigned int bs,
        unsigned int prefix, const ulonglong2* __restrict__ rec, unsigned long long nrec,
        const ulonglong2* __restrict__ kv, long long kv_row16, unsigned long long* __restrict__ out,
        const ulonglong2* __restrict__ rec2, const ulonglong2* __restrict__ kv2) {
    const unsigned int n = bs * prefix;
    const unsigned int step = blockDim.x * U;
    unsigned long long acc = 0;
    for (unsigned int e0 = blockIdx.x * step + threadIdx.x; e0 < n; e0 += gridDim.x * step) {
        long long slot[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const unsigned int e = e0 + blockDim.x * u;
            slot[u] = -1;
            if (e < n) {
                if (table != nullptr) {
                    slot[u] = table[(long long)(e / prefix + 1) * cols + e % prefix];
                } else {  // a random record: a 64-bit mix of the index, reduced to [1, nrec)
                    unsigned long long h = (e + 1) * 0x9E3779B97F4A7C15ull;
                    h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 29;
                    slot[u] = 1 + (long long)__umul64hi(h, nrec - 1);
                }
            }
        }
        ulonglong2 a[U], b[U], k[U], a2[U], b2[U], k2[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            a[u] = b[u] = k[u] = a2[u] = b2[u] = k2[u] = make_ulonglong2(0, 0);
            if (slot[u] >= 0) {
                a[u] = __ldg(rec + 2 * slot[u]);
                b[u] = __ldg(rec + 2 * slot[u] + 1);
                if (kv != nullptr) k[u] = __ldg(kv + kv_row16 * slot[u]);
                if (TWO) {  // the V buffer's record (and real KV) of the same slot
                    a2[u] = __ldg(rec2 + 2 * slot[u]);
                    b2[u] = __ldg(rec2 + 2 * slot[u] + 1);
                    if (kv2 != nullptr) k2[u] = __ldg(kv2 + kv_row16 * slot[u]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            acc ^= a[u].x ^ a[u].y ^ b[u].x ^ b[u].y ^ k[u].x ^ k[u].y;
            if (TWO) acc ^= a2[u].x ^ a2[u].y ^ b2[u].x ^ b2[u].y ^ k2[u].x ^ k2[u].y;
        }
    }
    if (acc == 0x9E3779B97F4A7C15ull) out[0] = acc;  // never true in practice; keeps the loads
}
#define KVC_BENCH_FLOOR(U)                                                                                       \
    extern "C" __global__ void __launch_bounds__(256) kvc_bench_floor_u##U(const int* table, long long cols,     \
            unsigned int bs, unsigned int prefix, const ulonglong2* rec, unsigned long long nrec,                \
            const ulonglong2* kv, long long kv_row16, unsigned long long* out) {                                 \
        kvc_bench_gather<U, false>(table, cols, bs, prefix, rec, nrec, kv, kv_row16, out, nullptr, nullptr);     \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(256) kvc_bench_floor_kv_u##U(const int* table, long long cols,  \
            unsigned int bs, unsigned int prefix, const ulonglong2* rec, unsigned long long nrec,                \
            const ulonglong2* kv, long long kv_row16, unsigned long long* out, const ulonglong2* rec2,           \
            const ulonglong2* kv2) {                                                                             \
        kvc_bench_gather<U, true>(table, cols, bs, prefix, rec, nrec, kv, kv_row16, out, rec2, kv2);             \
    }
KVC_BENCH_FLOOR(1)
KVC_BENCH_FLOOR(2)
KVC_BENCH_FLOOR(4)

// check_floor: gather_floor's reads (one buffer, no real KV) plus SPEC §7's chain and position checks of each entry:
// its record's slot_hash goes to the next lane (the next entry of the same request unless it starts a row) and
// is compared with that entry's stored prev_hash; the stored position with the entry's. Lane 0 has no
// predecessor in the warp and checks only the position. The mismatch count is kept, never stored.
template <int U>
__device__ __forceinline__ void kvc_bench_check(const int* __restrict__ table, long long cols, unsigned int bs,
        unsigned int prefix, const ulonglong2* __restrict__ rec, unsigned long long* __restrict__ out) {
    const unsigned int n = bs * prefix;
    const unsigned int step = blockDim.x * U;
    const unsigned int lane = threadIdx.x & 31;
    unsigned long long bad = 0;
    for (unsigned int e0 = blockIdx.x * step + threadIdx.x; e0 - threadIdx.x < n; e0 += gridDim.x * step) {
        long long slot[U];
        unsigned int pos[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const unsigned int e = e0 + blockDim.x * u;
            slot[u] = -1;
            pos[u] = e % prefix;
            if (e < n) slot[u] = table[(long long)(e / prefix + 1) * cols + pos[u]];
        }
        ulonglong2 a[U], b[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            a[u] = b[u] = make_ulonglong2(0, 0);
            if (slot[u] >= 0) {
                a[u] = __ldg(rec + 2 * slot[u]);      // token, position
                b[u] = __ldg(rec + 2 * slot[u] + 1);  // prev_hash, real-KV hash
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const unsigned long long h = kvc_record_hash((kvc_i64)b[u].x, (kvc_i64)a[u].x, (kvc_i64)a[u].y);
            const unsigned long long pred = __shfl_up_sync(0xffffffffu, h, 1);
            const bool live = slot[u] >= 0;
            bad += (live && lane > 0 && pos[u] > 0 && b[u].x != pred) | (live && a[u].y != pos[u]);
        }
    }
    if (bad == 0x9E3779B97F4A7C15ull) out[0] = bad;  // never true in practice; keeps the work
}
#define KVC_BENCH_CHECK(U)                                                                                       \
    extern "C" __global__ void __launch_bounds__(256) kvc_bench_check_u##U(const int* table, long long cols,     \
            unsigned int bs, unsigned int prefix, const ulonglong2* rec, unsigned long long* out) {              \
        kvc_bench_check<U>(table, cols, bs, prefix, rec, out);                                                   \
    }
KVC_BENCH_CHECK(1)
KVC_BENCH_CHECK(2)
KVC_BENCH_CHECK(4)
"""
FLOOR_GEOMETRIES = [(u, b) for u in (1, 2, 4) for b in (2, 4, 8)]


def use_kernels_dir(path) -> None:
    """Make ``path`` (a copy of ``kernels_cu/``, possibly edited) the kernel source the library compiles and reads its
    launch defines from, with every cache built from the previous source cleared (bench/tune_geometry.py,
    bench/timeline_verify_table.py)."""
    from kvcanary.ops.cuda import grids, launch, loader, specs

    specs.kernels_dir = lambda d=path: d  # type: ignore[assignment]
    grids.clear_source_caches()
    loader._modules.clear()
    loader._kernels.clear()
    loader._functions.clear()
    launch.clear_caches()


@functools.cache
def floor_module():
    """FLOOR_SRC compiled once (CuPy ``RawModule``; the kernels' headers from ``kernels_cu/``)."""
    import cupy

    from kvcanary.ops.cuda.specs import kernels_dir

    return cupy.RawModule(code=FLOOR_SRC, options=("-std=c++17", f"-I{kernels_dir()}"))


def _launch_on_current_stream(fn, grid: tuple, block: tuple, args: tuple, device: Device) -> None:
    """A floor kernel (``cupy.RawKernel``) on torch's current stream of ``device``: through its ``Function`` with the
    stream kvcanary's own launches resolve (``launch.resolve_stream``), not inside a ``cupy.cuda.ExternalStream``,
    which CuPy 14 deprecates (the suite's bench log of 2026-12-05 15:41 UTC printed its DeprecationWarning)."""
    fn.kernel(grid, block, args, stream=resolve_stream(None, device))


# The floor of a plan-free decode write (not a kvcanary op): one thread per row does only the dependent loads such a
# write cannot avoid (the row's pool index and prefix -> the table entry of position prefix - 1 -> that seed
# slot's 32-byte record), reads the row's token, position and slot, and stores a 32-byte record; no row scan (it
# takes token r for row r, as in a decode batch), no checks, no counters, no log. The records go to a scratch
# buffer. Timed at 32, 64, 128 and 256 threads per block; the fastest is kept.
WRITE_FLOOR_SRC = r"""
extern "C" __global__ void kvc_bench_write_floor(const long long* __restrict__ rpi,
        const long long* __restrict__ prefix, const int* __restrict__ table, long long cols,
        const long long* __restrict__ ids, const long long* __restrict__ pos, const long long* __restrict__ loc,
        const ulonglong2* __restrict__ rec, ulonglong2* __restrict__ out, unsigned int bs) {
    const unsigned int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= bs) return;
    const long long rp = rpi[r], pf = prefix[r], tok = ids[r], p = pos[r], slot = loc[r];
    const long long seed = pf > 0 ? (long long)table[rp * cols + pf - 1] : -1;
    ulonglong2 a = make_ulonglong2(0, 0), b = make_ulonglong2(0, 0);
    if (seed >= 0) {
        a = rec[2 * seed];
        b = rec[2 * seed + 1];
    }
    unsigned long long h = (a.x ^ (a.y * 0x9E3779B97F4A7C15ull) ^ b.x) * 0xBF58476D1CE4E5B9ull;
    h ^= (unsigned long long)tok * 0x94D049BB133111EBull ^ (unsigned long long)p;
    out[2 * slot] = make_ulonglong2((unsigned long long)tok, (unsigned long long)p);
    out[2 * slot + 1] = make_ulonglong2(h, b.y);
}
"""
WRITE_FLOOR_THREADS = (32, 64, 128, 256)
REAL_KV_ROW_BYTES = 256
TOKEN_VOCAB = 32000
FLUSH_BYTES = 256 << 20
LAYOUTS = ("contiguous", "shuffled")  # the slot layouts a Case builds (see the module docstring)
# Graphs captured (and dropped) before anything is timed. On an H100 and an H200 the graphs a process captures
# first replay small kernels about 0.18 µs per launch faster than those it captures once about 40 launches have
# been captured (two graphs of 20, or one of the plan op's 60), and the first ones slow down too once the later ones
# exist (docs/BENCHMARKS.md, 2026-12-05 18:12-18:28 UTC; bench/probe_graph_state.py). An engine captures many
# graphs, so every op is timed in the later state, not the first ops of a run in the earlier one.
GRAPHS_BEFORE_TIMING = 4


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------


def sleep_cycles_per_us() -> float:
    """Cycles of ``torch.cuda._sleep`` per microsecond on the current device, measured (a 20 M-cycle sleep)."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    s.record()
    torch.cuda._sleep(20_000_000)
    e.record()
    torch.cuda.synchronize()
    return 20_000_000 / (s.elapsed_time(e) * 1e3)


def capture_graph(fn, reps: int, device: torch.device) -> torch.cuda.CUDAGraph:
    """``reps`` launches of ``fn`` captured back to back in one graph, replayed once. One launch on a side stream
    first, so that nothing the capture cannot do (a first-use allocation or module load) happens inside it."""
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    return g


def graph_per_launch(g: torch.cuda.CUDAGraph, *, reps: int, runs: int, cycles: int) -> float:
    """Median GPU microseconds per launch over ``runs`` replays of ``g`` (``reps`` launches), each replay enqueued
    behind a GPU sleep of ``cycles`` that outlasts its enqueueing, so the events bracket GPU time only."""
    pairs = []
    for _ in range(runs):
        torch.cuda._sleep(cycles)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs) / reps


class Timer:
    """CUDA-event timing with the GPU kept busy while the host enqueues (so events measure GPU time).

    Construct it before anything else is timed: it captures ``GRAPHS_BEFORE_TIMING`` graphs of a one-element add
    first (``settle_graphs``), and keeps what one launch of that add took in a graph before and after them in
    ``graph_state``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.retaken = 0  # eager samples taken again (see eager)
        self.flush_buf = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
        self.cycles_per_us = sleep_cycles_per_us()
        self._one = torch.zeros(1, device=device)
        self.graph_state = self.settle_graphs()

    def tiny(self) -> None:
        """One launch of a one-element add: what the graph state is read with (``graph_launch_us``)."""
        self._one.add_(1)

    def graph_launch_us(self) -> float:
        """Microseconds per launch of ``tiny`` in a graph (as ``graph``: 20 per replay, median of 30 replays)."""
        return self.graph(self.tiny, runs=30, reps=20)

    def settle_graphs(self, count: int = GRAPHS_BEFORE_TIMING) -> tuple[float, float]:
        """Capture (and replay once) ``count`` graphs of 20 launches of ``tiny`` after a first one that is timed,
        then time one more: (µs per launch in the first graph, µs per launch after the ``count``)."""
        first = self.graph_launch_us()
        for _ in range(count):
            capture_graph(self.tiny, 20, self.device)
        return first, self.graph_launch_us()

    def _sleep_cycles(self, fn, calls: int = 3) -> int:
        torch.cuda.synchronize()
        host = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        us = max(50.0, 3e6 * max(host) + 20.0)
        return int(us * self.cycles_per_us)

    def sm_mhz(self) -> float:
        """The SM clock now, in MHz: a short and a long ``torch.cuda._sleep`` (about 0.5 and 1.5 ms) timed with
        events; the difference of their cycles over the difference of their times cancels the launch cost."""
        n = int(500 * self.cycles_per_us)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record()
        torch.cuda._sleep(n)
        ev[1].record()
        torch.cuda._sleep(3 * n)
        ev[2].record()
        torch.cuda.synchronize()
        return 2 * n / ((ev[1].elapsed_time(ev[2]) - ev[0].elapsed_time(ev[1])) * 1e3)

    def eager(self, fn, *, runs: int, warmup: int, flush: bool = True) -> float:
        """Median GPU microseconds of one ``fn()`` launch.

        A sample whose enqueueing outlasted its sleep (host clock, from the sleep's enqueue to ``fn()``'s return:
        the GPU may then have idled between the events, waiting for the launch) is taken again with a sleep twice as
        long, up to four times; ``self.retaken`` counts them (a host slowed by something else once put 470 µs of
        waiting into a median: docs/GPU_SUITE.md, the 15:35 UTC run of 2026-12-05)."""
        for _ in range(warmup):
            fn()
        cycles = self._sleep_cycles(fn)
        pairs = []
        for _ in range(runs):
            for attempt in range(5):
                if flush:
                    self.flush_buf.zero_()
                sleep = cycles << attempt
                t0 = time.perf_counter()
                torch.cuda._sleep(sleep)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                if (time.perf_counter() - t0) * 1e6 * self.cycles_per_us < sleep:
                    break  # the launch was enqueued while the sleep still ran (it starts no earlier than enqueued)
                self.retaken += 1
            pairs.append((s, e))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs)

    def host(self, fn, *, calls: int) -> float:
        """Median CPU microseconds of one ``fn()`` call (back to back, the GPU running behind)."""
        torch.cuda.synchronize()
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return statistics.median(times) * 1e6

    def graph(self, fn, *, runs: int, reps: int) -> float:
        """Median GPU microseconds per launch with ``reps`` launches captured back to back in one graph (dropped
        after: ``capture_graph``, ``graph_per_launch``)."""
        g = capture_graph(fn, reps, self.device)
        return graph_per_launch(g, reps=reps, runs=runs, cycles=self._sleep_cycles(g.replay, calls=2))


def copy_bandwidth(timer: Timer, runs: int) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read + written."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=timer.device).random_(0, 256)
    dst = torch.empty_like(src)
    us = timer.eager(lambda: dst.copy_(src), runs=runs, warmup=3, flush=False)
    return 2 * n / (us * 1e3)


# ---------------------------------------------------------------------------------------------------------
# One benchmark case: a shape and a real-KV mode, with its buffers
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


class Case:
    def __init__(self, shape: str, mode: RealKvHashMode, layout: str, device: torch.device, seed: int):
        p = SHAPES[shape]
        self.shape, self.mode, self.layout, self.device = shape, mode, layout, device
        self.bs, self.prefix, self.extend = p["bs"], p["prefix"], p["extend"]
        bs, prefix, extend = self.bs, self.prefix, self.extend
        L = self.L = prefix + extend
        self.num_slots = 1 + bs * L  # slot 0 is the padding slot, never used by a real request
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        flat = torch.arange(1, self.num_slots, dtype=torch.int64, device=device)
        if layout == "shuffled":
            flat = flat[torch.randperm(bs * L, generator=g, device=device)]
        self.slots = flat.view(bs, L)
        self.tokens = torch.randint(0, TOKEN_VOCAB, (bs, L), generator=g, device=device, dtype=torch.int64)
        self.positions = torch.arange(L, dtype=torch.int64, device=device).expand(bs, L)

        self.req_to_token = torch.zeros((bs + 1, L), dtype=torch.int32, device=device)  # row 0: padding
        self.req_to_token[1:] = self.slots.to(torch.int32)
        self.rpi = torch.arange(1, bs + 1, dtype=torch.int64, device=device)

        self.canary = allocate_canary_buffer(self.num_slots, device=device)
        self.log = ViolationLog.allocate(ring_capacity=4096, device=device)
        self.flag = allocate_chain_position_flag(1, device=device)
        sources: dict[str, tuple] = {"k": (), "v": ()}
        if mode != RealKvHashMode.NONE:
            for kv in ("k", "v"):
                pool = torch.randint(0, 256, (self.num_slots, REAL_KV_ROW_BYTES), generator=g, device=device,
                                     dtype=torch.uint8)
                sources[kv] = (RealKvSource(tensor=pool, page_size=1, num_bytes_per_token=REAL_KV_ROW_BYTES,
                                            read_bytes=REAL_KV_ROW_BYTES),)
        self.ctx = self.log.context(canary_buf=self.canary, kernel_kind=CanaryLaunchTag.TAIL_K_FULL,
                                    real_kv_sources=sources["k"], real_kv_hash_mode=mode,
                                    enable_chain_position_assert=self.flag)
        # A V buffer for the K+V launches: a copy of the K records (stamped alike), its own real KV.
        self.canary_v = allocate_canary_buffer(self.num_slots, device=device)
        self.ctx_v = self.log.context(canary_buf=self.canary_v, kernel_kind=CanaryLaunchTag.TAIL_V_FULL,
                                      real_kv_sources=sources["v"], real_kv_hash_mode=mode,
                                      enable_chain_position_assert=self.flag)

        # The timed step: verify the prefix, write the `extend` new tokens.
        self.step_prefix = torch.full((bs,), prefix, dtype=torch.int64, device=device)
        self.step_extend = torch.full((bs,), extend, dtype=torch.int64, device=device)
        self.vcap = max(1, bs * prefix)
        self.vplan = VerifyPlan.allocate(verify_capacity=self.vcap, device=device)
        self.wplan = WritePlan.allocate(write_req_capacity=bs, device=device)
        self.step_ids = self.tokens[:, prefix:].reshape(-1).contiguous()
        self.step_pos = self.positions[:, prefix:].reshape(-1).contiguous()
        self.step_loc = self.slots[:, prefix:].reshape(-1).contiguous()

        # Scatter: every request's whole token row into an expected-token pool.
        self.scatter_in = self.tokens.reshape(-1).contiguous()
        self.scatter_offsets = torch.arange(0, bs * L + 1, L, dtype=torch.int64, device=device)
        self.scatter_pool = torch.full((bs + 1, L), -7, dtype=torch.int32, device=device)

    # ---- the public ops, bound to this case's buffers
    def plan(self, vplan=None, prefix_lens=None, extend_lens=None, wplan=None):
        vplan = vplan or self.vplan
        kvcanary.launch_canary_plan_kernels(
            verify_plan_out=vplan,
            write_plan_out=wplan or self.wplan,
            req_pool_indices=self.rpi,
            prefix_lens=self.step_prefix if prefix_lens is None else prefix_lens,
            extend_seq_lens=self.step_extend if extend_lens is None else extend_lens,
            req_to_token=self.req_to_token,
            swa_window_size=0,
            full_to_swa_index_mapping=None,
            verify_capacity=vplan.capacity,
            req_to_verify_expected_tokens=None,
            req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        )

    def verify(self, vplan=None):
        kvcanary.launch_canary_verify_kernel(context=self.ctx, plan=vplan or self.vplan,
                                             check_verify_expected_token=False)

    def write(self, ids=None, pos=None, loc=None, wplan=None, ctx=None):
        kvcanary.launch_canary_write_kernel(
            context=ctx or self.ctx,
            plan=wplan or self.wplan,
            input_ids=self.step_ids if ids is None else ids,
            positions=self.step_pos if pos is None else pos,
            out_cache_loc=self.step_loc if loc is None else loc,
            enable_write_input_assert=False,
            expected_input_tokens=None,
            expected_input_positions=None,
        )

    def verify_table(self, prefix_lens=None, contexts=None):
        kvcanary.launch_canary_verify_from_table(
            contexts=contexts or (self.ctx,), req_pool_indices=self.rpi,
            prefix_lens=self.step_prefix if prefix_lens is None else prefix_lens, req_to_token=self.req_to_token)

    def _fastest(self, timer: Timer, kernel: str, args: tuple, out: torch.Tensor):
        """A launcher of FLOOR_SRC's ``{kernel}_u{U}`` at the fastest of FLOOR_GEOMETRIES, picked by timing each once
        (10 runs)."""
        mod = floor_module()
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        dev = Device("cuda", self.device.index)

        def make(u: int, b: int):
            fn = mod.get_function(f"{kernel}_u{u}")

            def run():
                _launch_on_current_stream(fn, (b * sms,), (256,), args, dev)
            run.geometry = f"{u} x {b}"  # type: ignore[attr-defined]
            run.keep = out  # type: ignore[attr-defined]
            return run

        best = min((timer.eager(make(u, b), runs=10, warmup=2), u, b) for u, b in FLOOR_GEOMETRIES)
        return make(best[1], best[2])

    def _floor_launcher(self, with_table: bool, timer: Timer, two: bool = False):
        """The bare read (see FLOOR_SRC) at its fastest geometry; `two`: of the K and the V buffer
        (gather_floor_kv)."""
        import cupy

        out = torch.zeros(1, dtype=torch.int64, device=self.device)
        kv, kv2 = ((self.ctx.real_kv_sources[0].tensor, self.ctx_v.real_kv_sources[0].tensor)
                   if self.mode != RealKvHashMode.NONE else (None, None))
        args = (cupy.uint64(self.req_to_token.data_ptr() if with_table else 0), cupy.int64(self.req_to_token.shape[1]),
                cupy.uint32(self.bs), cupy.uint32(self.prefix), cupy.uint64(self.canary.data_ptr()),
                cupy.uint64(self.num_slots), cupy.uint64(0 if kv is None else kv.data_ptr()),
                cupy.int64(REAL_KV_ROW_BYTES // 16), cupy.uint64(out.data_ptr()))
        if two:
            args += (cupy.uint64(self.canary_v.data_ptr()), cupy.uint64(0 if kv2 is None else kv2.data_ptr()))
        return self._fastest(timer, f"kvc_bench_floor{'_kv' if two else ''}", args, out)

    def check_floor_op(self, timer: Timer):
        """The bare check (see FLOOR_SRC: check_floor) at its fastest geometry (built once)."""
        if not hasattr(self, "_check_floor"):
            import cupy

            out = torch.zeros(1, dtype=torch.int64, device=self.device)
            args = (cupy.uint64(self.req_to_token.data_ptr()), cupy.int64(self.req_to_token.shape[1]),
                    cupy.uint32(self.bs), cupy.uint32(self.prefix), cupy.uint64(self.canary.data_ptr()),
                    cupy.uint64(out.data_ptr()))
            self._check_floor = self._fastest(timer, "kvc_bench_check", args, out)
        return self._check_floor

    def floor_op(self, with_table: bool, timer: Timer, two: bool = False):
        key = ("_gather" if with_table else "_random") + ("_kv" if two else "")
        if not hasattr(self, key):
            setattr(self, key, self._floor_launcher(with_table, timer, two))
        return getattr(self, key)

    def write_floor_op(self, timer: Timer):
        """The bare decode write (see WRITE_FLOOR_SRC) at the fastest of ``WRITE_FLOOR_THREADS`` block sizes, timed
        eagerly with ``timer`` (once per case)."""
        if not hasattr(self, "_write_floor"):
            best = min((timer.eager(self.write_floor_at(t), runs=10, warmup=2), t) for t in WRITE_FLOOR_THREADS)
            self._write_floor = self.write_floor_at(best[1])
        return self._write_floor

    def write_floor_at(self, threads: int):
        """The bare decode write at ``threads`` per block: a function that launches it on the current stream (the
        kernel, its scratch records and its arguments are built once per case)."""
        if not hasattr(self, "_write_floor_kernel"):
            import cupy

            fn = cupy.RawModule(code=WRITE_FLOOR_SRC, options=("-std=c++17",)).get_function("kvc_bench_write_floor")
            scratch = torch.zeros_like(self.canary)
            args = (cupy.uint64(self.rpi.data_ptr()), cupy.uint64(self.step_prefix.data_ptr()),
                    cupy.uint64(self.req_to_token.data_ptr()), cupy.int64(self.req_to_token.shape[1]),
                    cupy.uint64(self.step_ids.data_ptr()), cupy.uint64(self.step_pos.data_ptr()),
                    cupy.uint64(self.step_loc.data_ptr()), cupy.uint64(self.canary.data_ptr()),
                    cupy.uint64(scratch.data_ptr()), cupy.uint32(self.bs))
            self._write_floor_kernel = (fn, scratch, args)
        fn, scratch, args = self._write_floor_kernel
        dev = Device("cuda", self.device.index)

        def run():
            _launch_on_current_stream(fn, ((self.bs + threads - 1) // threads,), (threads,), args, dev)
        run.geometry = f"{threads} threads"  # type: ignore[attr-defined]
        run.keep = scratch  # type: ignore[attr-defined]
        return run

    def verify_table_kv(self):
        self.verify_table(contexts=(self.ctx, self.ctx_v))

    def verify_table_64(self):
        with flat32_modules(False):
            self.verify_table()

    def verify_table_kv_64(self):
        with flat32_modules(False):
            self.verify_table_kv()

    def write_table(self):
        kvcanary.launch_canary_write_from_table(
            contexts=(self.ctx,), req_pool_indices=self.rpi, prefix_lens=self.step_prefix,
            extend_seq_lens=self.step_extend, req_to_token=self.req_to_token, input_ids=self.step_ids,
            positions=self.step_pos, out_cache_loc=self.step_loc)

    def scatter(self):
        kvcanary.launch_scatter_req_token_ids_kernel(flat_in=self.scatter_in, offsets=self.scatter_offsets,
                                                     req_pool_indices=self.rpi, pool_out=self.scatter_pool)

    def violations(self) -> int:
        return int(self.log.violation_write_index.item())

    def reset_log(self) -> None:
        self.log.violation_write_index.zero_()
        self.log.violation_ring.zero_()

    # ---- set-up and correctness checks (not timed)
    def stamp_prefix(self) -> None:
        """Write the whole prefix of every request (positions 0..prefix-1) so the step verifies real records."""
        if self.prefix == 0:
            return
        zeros = torch.zeros_like(self.step_prefix)
        setup_w = WritePlan.allocate(write_req_capacity=self.bs, device=self.device)
        setup_v = VerifyPlan.allocate(verify_capacity=1, device=self.device)
        self.plan(vplan=setup_v, prefix_lens=zeros, extend_lens=torch.full_like(zeros, self.prefix), wplan=setup_w)
        p = self.prefix
        for ctx in (self.ctx, self.ctx_v):  # V is stamped like K (with its own real KV)
            self.write(ids=self.tokens[:, :p].reshape(-1).contiguous(),
                       pos=self.positions[:, :p].reshape(-1).contiguous(),
                       loc=self.slots[:, :p].reshape(-1).contiguous(), wplan=setup_w, ctx=ctx)

    def check(self) -> list[Check]:
        out = []
        bs, prefix, extend, L = self.bs, self.prefix, self.extend, self.L
        self.reset_log()
        self.stamp_prefix()
        self.plan()
        self.verify()
        self.write()
        self.write(ctx=self.ctx_v)
        torch.cuda.synchronize()
        nv, en = int(self.vplan.verify_num_valid.item()), int(self.vplan.enable.item())
        total = int(self.wplan.write_offsets[bs].item())
        out.append(Check("step", self.violations() == 0 and nv == bs * prefix and en == 1 and total == bs * extend,
                         f"violations={self.violations()} verify_num_valid={nv} (want {bs * prefix}) enable={en} "
                         f"write total={total} (want {bs * extend})"))

        # Every position, including the ones the step just wrote, verifies clean.
        full_v = VerifyPlan.allocate(verify_capacity=bs * L, device=self.device)
        full_w = WritePlan.allocate(write_req_capacity=bs, device=self.device)
        self.plan(vplan=full_v, prefix_lens=torch.full_like(self.step_prefix, L),
                  extend_lens=torch.zeros_like(self.step_extend), wplan=full_w)
        self.verify(vplan=full_v)
        torch.cuda.synchronize()
        nv = int(full_v.verify_num_valid.item())
        out.append(Check("all positions", self.violations() == 0 and nv == bs * L,
                         f"violations={self.violations()} entries={nv} (want {bs * L})"))

        # Negative control: one flipped token bit is caught on its successor's chain hash, exactly once.
        if L >= 2:
            victim = int(self.slots[bs // 2, L // 2 - 1].item())
            self.canary[victim, 0] ^= 1
            self.verify(vplan=full_v)
            torch.cuda.synchronize()
            n = self.violations()
            row = self.log.violation_ring[0].tolist()
            succ = int(self.slots[bs // 2, L // 2].item())
            self.canary[victim, 0] ^= 1
            out.append(Check("flipped token caught", n == 1 and row[1] == succ and row[7] & 1 == 1,
                             f"violations={n} row={row} (want slot {succ}, chain bit)"))
        del full_v, full_w

        # The plan-free ops: verify from the table (its 64-bit and its 32-bit modules) is clean on every position,
        # catches the same flipped token, and the plan-free write stamps exactly what the two-pass write stamped (it
        # is idempotent here).
        for flat32 in (False, True):
            name = "verify_table" if flat32 else "verify_table_64"
            with flat32_modules(flat32), modules_seen() as seen:
                if L >= 1:
                    self.reset_log()
                    self.verify_table(prefix_lens=torch.full_like(self.step_prefix, L))
                    torch.cuda.synchronize()
                    out.append(Check(f"{name} all positions", self.violations() == 0,
                                     f"violations={self.violations()}"))
                    # the timed rows are named for the modules they ran
                    out.append(Check(f"{name} modules", seen == [flat32], f"flat32 flags of the launches: {seen}"))
                if L >= 2:
                    self.reset_log()
                    victim = int(self.slots[bs // 2, L // 2 - 1].item())
                    self.canary[victim, 0] ^= 1
                    self.verify_table(prefix_lens=torch.full_like(self.step_prefix, L))
                    torch.cuda.synchronize()
                    n = self.violations()
                    row = self.log.violation_ring[0].tolist()
                    succ = int(self.slots[bs // 2, L // 2].item())
                    self.canary[victim, 0] ^= 1
                    out.append(Check(f"{name} flipped token caught", n == 1 and row[1] == succ and row[7] & 1 == 1,
                                     f"violations={n} row={row} (want slot {succ}, chain bit)"))
        self.reset_log()
        before = self.canary.clone()
        self.write_table()
        torch.cuda.synchronize()
        out.append(Check("write_table == write", bool(torch.equal(before, self.canary)) and self.violations() == 0,
                         f"bytes equal={bool(torch.equal(before, self.canary))} violations={self.violations()}"))

        # Scatter fills each request's row with its tokens.
        self.scatter()
        torch.cuda.synchronize()
        good = bool(torch.equal(self.scatter_pool[1:], self.tokens.to(torch.int32)))
        out.append(Check("scatter", good and bool((self.scatter_pool[0] == -7).all()), f"rows equal={good}"))

        self.reset_log()
        return out


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Row:
    shape: str
    layout: str
    mode: str
    op: str
    units: int
    eager_us: float
    graph_us: float | None
    host_us: float | None
    sm_mhz: float | None = None


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def bytes_per_unit(op: str, mode: str) -> int:
    return BYTES_PER_UNIT.get(op, 0) + (PARTIAL_BYTES_PER_UNIT.get(op, 0) if mode == "PARTIAL" else 0)


def table(rows: list[Row], copy_gbs: float) -> str:
    head = ("| shape | layout | real-KV | op | units | B/unit | eager µs | graph µs | eager % copy | graph % copy "
            "| host µs | ns/token | SM MHz |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        bpu = bytes_per_unit(r.op, r.mode)

        def pct(us, r=r, bpu=bpu):
            if us is None or r.units == 0 or bpu == 0:
                return None
            return 100 * bpu * r.units / (us * 1e3) / copy_gbs

        ns_tok = None
        if r.op in ("write", "write_table"):
            best = min(x for x in (r.eager_us, r.graph_us) if x is not None)
            ns_tok = best * 1e3 / SHAPES[r.shape]["extend"]
        lines.append(
            f"| {r.shape} | {r.layout} | {r.mode} | {r.op} | {r.units:,} | {bpu or '-'} | {fmt(r.eager_us, '.2f')} "
            f"| {fmt(r.graph_us, '.2f')} | {fmt(pct(r.eager_us))} | {fmt(pct(r.graph_us))} | {fmt(r.host_us, '.1f')} "
            f"| {fmt(ns_tok)} | {fmt(r.sm_mhz, '.0f')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="A,B,C,D")
    ap.add_argument("--modes", default="NONE,PARTIAL")
    ap.add_argument("--layouts", default="contiguous,shuffled",
                    help="slot layouts to run: contiguous (a request's slots are consecutive, so the "
                         "predecessor's record is usually in the same cache line) and/or shuffled (a random "
                         "permutation of the pool, every record read is its own memory access)"),
    ap.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"ops to time (of {', '.join(ALL_OPS)})")
    ap.add_argument("--host-calls", type=int, default=50, help="calls timed for the host-time column")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--graph-reps", type=int, default=20)
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--settle-ms", type=float, default=0.0,
                    help="leave the GPU idle this long before each op is timed (default 0: back to back)")
    ap.add_argument("--out", default=None, help="markdown file (default: $OUT/bench.md when OUT is set)")
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args(argv)
    if args.runs < 20:
        ap.error("--runs must be at least 20")
    if not torch.cuda.is_available():
        print("bench_cuda: no CUDA device", file=sys.stderr)
        return 2

    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    try:
        import cupy
        cupy_version = cupy.__version__
    except ImportError:
        cupy_version = "missing"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = [
        f"GPU: {props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB), "
        f"torch {torch.__version__}, CuPy {cupy_version}, kvcanary {kvcanary.__version__}, "
        f"Python {platform.python_version()}, {when}",
        f"command: bench/bench_cuda.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        f"layouts {args.layouts}, page size 1, eager: median of {args.runs} (L2 flushed), "
        f"graph: up to {args.graph_reps} launches per replay (about 2 ms), median of {args.runs} replays",
    ]
    for line in header:
        print(line, flush=True)

    if hasattr(kvcanary, "warmup"):
        t0 = time.perf_counter()
        kvcanary.warmup(device=dev)
        torch.cuda.synchronize()
        print(f"kvcanary.warmup: {time.perf_counter() - t0:.1f} s", flush=True)

    timer = Timer(dev)
    copy_gbs = copy_bandwidth(timer, args.runs)
    header.append(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write, 1 GiB, median of {args.runs}); "
                  f"SM clock {timer.sm_mhz():.0f} MHz after it")
    print(header[-1], flush=True)

    rows: list[Row] = []
    failures: list[str] = []
    floor_geometries: list[str] = []
    modes = [RealKvHashMode[m.strip().upper()] for m in args.modes.split(",")]
    layouts = [x.strip().lower() for x in args.layouts.split(",")]
    for x in layouts:
        if x not in LAYOUTS:
            ap.error(f"--layouts: unknown layout {x!r} ({', '.join(LAYOUTS)})")
    wanted_ops = [o.strip() for o in args.ops.split(",")]
    for o in wanted_ops:
        if o not in ALL_OPS:
            ap.error(f"--ops: unknown op {o!r} ({', '.join(ALL_OPS)})")
    combos = [(s.strip().upper(), lay, m) for s in args.shapes.split(",") for lay in layouts for m in modes]
    for shape, layout, mode in combos:
        p = SHAPES[shape]
        t0 = time.perf_counter()
        case = Case(shape, mode, layout, dev, args.seed)
        checks = case.check()
        for c in checks:
            if not c.ok:
                failures.append(f"{shape}/{layout}/{mode.name} {c.name}: {c.detail}")
        status = "clean" if all(c.ok for c in checks) else "FAILED " + "; ".join(
            f"{c.name}: {c.detail}" for c in checks if not c.ok)
        print(f"[{shape} {p['what']} {p['bs']}x{p['prefix']}+{p['extend']} {layout} {mode.name}] checks: {status} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
        ops = {
            "plan": (case.plan, case.bs * case.prefix),
            "verify": (case.verify, case.bs * case.prefix),
            "verify_table": (case.verify_table, case.bs * case.prefix),
            "verify_table_kv": (case.verify_table_kv, case.bs * case.prefix),
            "verify_table_64": (case.verify_table_64, case.bs * case.prefix),
            "verify_table_kv_64": (case.verify_table_kv_64, case.bs * case.prefix),
            "write": (case.write, case.bs * case.extend),
            "write_table": (case.write_table, case.bs * case.extend),
            # (the floors pick their fastest geometry first, so they are built only when wanted)
            "gather_floor": (case.floor_op(True, timer) if "gather_floor" in wanted_ops and case.prefix else None,
                             case.bs * case.prefix),
            "random_reads": (case.floor_op(False, timer) if "random_reads" in wanted_ops and case.prefix else None,
                             case.bs * case.prefix),
            "gather_floor_kv": (case.floor_op(True, timer, two=True)
                                if "gather_floor_kv" in wanted_ops and case.prefix else None, case.bs * case.prefix),
            "check_floor": (case.check_floor_op(timer) if "check_floor" in wanted_ops and case.prefix
                            and mode == RealKvHashMode.NONE else None, case.bs * case.prefix),
            "write_floor": (case.write_floor_op(timer) if "write_floor" in wanted_ops and case.extend == 1 else None,
                            case.bs),
            "scatter": (case.scatter, case.bs * case.L),
        }
        for op, (fn, units) in ops.items():
            if op not in wanted_ops or (case.prefix == 0 and op in VERIFY_OPS) or fn is None:
                continue
            if args.settle_ms > 0:  # the GPU idle between ops (does an op's time depend on the op before it?)
                torch.cuda.synchronize()
                time.sleep(args.settle_ms / 1e3)
            eager = timer.eager(fn, runs=args.runs, warmup=args.warmup)
            host = timer.host(fn, calls=args.host_calls)
            graph = None
            if not args.no_graph:
                # keep one replay near 2 ms: long serial chains (C's write) need few launches
                reps = max(1, min(args.graph_reps, int(2000 / max(eager, 1e-3))))
                try:
                    graph = timer.graph(fn, runs=args.runs, reps=reps)
                except Exception as e:  # report, keep benchmarking the rest
                    failures.append(f"{shape}/{layout}/{mode.name} {op}: graph capture failed: "
                                    f"{type(e).__name__}: {e}")
                    torch.cuda.synchronize()
            mhz = timer.sm_mhz()
            rows.append(Row(shape, layout, mode.name, op, units, eager, graph, host, mhz))
            if hasattr(fn, "geometry"):
                floor_geometries.append(f"{shape} {layout} {mode.name} {op} {fn.geometry}")
            print(f"  {op:15s} units {units:>10,}  eager {eager:9.2f} µs  graph {fmt(graph, '9.2f')} µs  "
                  f"host {host:6.1f} µs  SM {mhz:5.0f} MHz", flush=True)
        torch.cuda.synchronize()
        after = case.violations()
        if after:
            failures.append(f"{shape}/{layout}/{mode.name}: {after} violations after the timed runs")
        del case
        torch.cuda.empty_cache()

    graph_end = timer.graph_launch_us()
    md = table(rows, copy_gbs)
    notes = [
        "",
        "B/unit: nominal for plan (36), verify (88), write (56), scatter (12), real KV not counted; the byte minimum "
        "for verify_table (36 per entry, +32 in PARTIAL) and verify_table_kv (68, +64); the bare reads: "
        "gather_floor and check_floor as verify_table, gather_floor_kv as verify_table_kv, random_reads 32 per "
        "read (+32 in PARTIAL, so its share compares with gather_floor's). % copy = units * B/unit / "
        "time over the copy bandwidth. host µs = CPU time of one public-op call (median). ns/token = write time "
        "(better of eager and graph) / extend. Floor geometries (entries per thread x blocks per SM, the fastest of "
        "9): " + (", ".join(floor_geometries) or "-") + ".",
        f"eager samples taken again because the host enqueued a launch later than the sleep before it covered: "
        f"{timer.retaken}.",
        f"graph state: a one-element add took {timer.graph_state[0]:.2f} µs per launch in the process's first "
        f"graph, {timer.graph_state[1]:.2f} after {GRAPHS_BEFORE_TIMING} more (before anything was timed) and "
        f"{graph_end:.2f} at the end.",
        "checks: " + ("all clean" if not failures else "FAILED: " + " | ".join(failures)),
    ]
    text = "\n".join(header) + "\n\n" + md + "\n" + "\n".join(notes) + "\n"
    print()
    print(text, flush=True)
    out = args.out or (os.path.join(os.environ["OUT"], "bench.md") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            f.write(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
