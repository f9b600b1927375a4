#!/usr/bin/env python3
"""Per-block and per-warp timeline of the plan-free verify: where one launch's time goes across the SMs.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=. python3 bench/timeline_verify_table.py                    # shape A, both slot layouts
    PYTHONPATH=. python3 bench/timeline_verify_table.py --shape B --layouts shuffled
    PYTHONPATH=. python3 bench/timeline_verify_table.py --variant 2x4x1x1   # a bench/tune_geometry.py variant

Compiles an instrumented copy of ``kernels_cu/verify_table.cu`` (the library's kernel source is pointed at the
copy, as ``bench/tune_geometry.py`` does) that records, for every block, ``%globaltimer`` and ``clock64`` at its
start and at the end of its entries, its SM, and the cycles from its start until its first tile's rows are loaded,
until their scan is done and until its warps begin their entries; for every warp, the cycles until the end of its
first step and of its last, and its number of steps; and when block 0 has ended its closing walk over the rows.
It then times ``verify_table`` of ``bench/bench_cuda.py``'s case (real-KV NONE, one buffer) with that script's
``Timer.graph`` (20 launches per replay, the L2 not flushed) and reads the record of the last replay's last launch.

Printed per layout: the kernel's span (first block start to last block end, ``%globaltimer``, ns), percentiles of
the block and warp times, and the block and warp times per generation: a block's rank by index among the blocks of
its SM, the order the SM was given them in (with four blocks per SM, generation 3 is the fourth block an SM took;
the first instructions of an SM's blocks run within a few hundred cycles of each other in any order, so their
start cycles do not tell the order); and the blocks that end last, by index. The stores add a few registers and
instructions: compare spans within one run of this script, not with ``bench_cuda.py``'s times.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from kvcanary import RealKvHashMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

MAX_BLOCKS = 4096
LAST_BLOCKS = 8  # the report names this many of the blocks that end last
MAX_WARPS = MAX_BLOCKS * 32
_GLOBALS = f"""
__device__ unsigned long long kvc_tl_block[{MAX_BLOCKS} * 8];
__device__ unsigned long long kvc_tl_warp[{MAX_WARPS} * 4];
__device__ unsigned long long kvc_tl_close;
__device__ __forceinline__ unsigned long long kvc_tl_gt() {{
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }}
__device__ __forceinline__ unsigned long long kvc_tl_smid() {{
    unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }}
"""
_B = "kvc_tl_block[blockIdx.x * 8 + {}]"
_W = "kvc_tl_warp[(blockIdx.x * kvc::kVtWarps + warp) * 4 + {}]"
# Block fields: 0 start (globaltimer), 1 start (clock64), 2 SM, 3 rows loaded, 4 scan done, 5 entries begin (cycles),
# 6 entries end (globaltimer), 7 entries end (clock64). Warp fields: 0 first step end, 1 end (clock64), 2 end
# (globaltimer), 3 steps. A first-tile field is written once (0 until then); the conditions on len and tile_total
# make the stores wait for those values.
_PATCHES = (
    ('extern "C" __global__ void __launch_bounds__', "before", _GLOBALS),
    ("const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;", "after",
     f"\n    if (tid == 0) {{ {_B.format(0)} = kvc_tl_gt(); {_B.format(1)} = clock64(); {_B.format(2)} = kvc_tl_smid();"
     f" {_B.format(3)} = {_B.format(4)} = {_B.format(5)} = 0; }}"),
    ("        // Rows past bs have no entries", "before",
     f"        if (tid == 0 && {_B.format(3)} == 0 && len != -1) {_B.format(3)} = clock64();\n"),
    ("        s_off[tid] = off;", "after",
     f"\n        if (tid == 0 && {_B.format(4)} == 0 && tile_total != -1) {_B.format(4)} = clock64();"),
    ("__syncthreads();  // every thread has read the walk state (and lane 0 has written wr[0], wr[1])", "after",
     f"\n        if (tid == 0 && {_B.format(5)} == 0) {_B.format(5)} = clock64();"),
    ("    for (;;) {\n        __syncthreads();  // the walk state", "before",
     f"    int kvc_tl_steps = 0;\n    if (lane == 0) {_W.format(0)} = 0;\n"),
    ("            if (base >= hi) break;", "replace",
     f"            if (base >= hi) {{\n                if (lane == 0) {{ {_W.format(1)} = clock64(); {_W.format(2)} = kvc_tl_gt();"
     f" {_W.format(3)} = kvc_tl_steps; }}\n                break;\n            }}"),
    ("            kvc_vt_step_rest<false>(p, t, nctx, lane, ws, en, raw, cell, prev_cell, look, lead);  // both kinds\n"
     "#endif", "after",
     f"\n            if (lane == 0 && kvc_tl_steps == 0) {_W.format(0)} = clock64();\n            ++kvc_tl_steps;"),
    ("    if (blockIdx.x == 0) {  // block 0 counts", "before",
     f"    if (tid == 0) {{ {_B.format(6)} = kvc_tl_gt(); {_B.format(7)} = clock64(); }}\n"),
    ("            if (b.invalid_rows != nullptr)", "before",
     "            kvc_tl_close = kvc_tl_gt();\n"),
)


def instrumented_source(text: str) -> str:
    """``verify_table.cu``'s text with the timeline's stores; every anchor must occur exactly once."""
    for anchor, where, code in _PATCHES:
        n = text.count(anchor)
        if n != 1:
            raise ValueError(f"timeline_verify_table: anchor {anchor!r} occurs {n} times in verify_table.cu "
                             "(update _PATCHES to the kernel's current text)")
        new = {"before": code + anchor, "after": anchor + code, "replace": code}[where]
        text = text.replace(anchor, new)
    return text


def _pct(a: np.ndarray) -> list[str]:
    return [f"{np.percentile(a, q):.0f}" for q in (0, 10, 50, 90, 100)] if a.size else ["-"] * 5


def report(blocks: np.ndarray, warps: np.ndarray, close: int, warps_per_block: int) -> str:
    """The markdown table of one launch's record (``blocks`` [n, 8], ``warps`` [n * warps_per_block, 4], int64;
    ``close``: the globaltimer when block 0 ended its closing walk)."""
    gt0, clk0, sm = blocks[:, 0], blocks[:, 1], blocks[:, 2]
    t0 = gt0.min()
    end = blocks[:, 6] - t0  # ns after the first start
    span = end.max()
    dur = blocks[:, 7] - clk0
    wclk0 = np.repeat(clk0, warps_per_block)
    busy = warps[:, 3] > 0
    gen = np.zeros(len(blocks), dtype=int)
    for s in np.unique(sm):
        idx = np.flatnonzero(sm == s)  # ascending: the order the SM was given its blocks in
        gen[idx] = np.arange(len(idx))
    rows = [
        ("block start (ns after the first)", gt0 - t0),
        ("block end (ns after the first start)", end),
        ("block duration (cycles)", dur),
        ("rows loaded (cycles after block start)", blocks[:, 3] - clk0),
        ("rows scanned (cycles)", blocks[:, 4] - clk0),
        ("entries begin (cycles)", blocks[:, 5] - clk0),
        ("warp's first step ends (cycles)", (warps[:, 0] - wclk0)[busy]),
        ("warp ends (cycles)", (warps[:, 1] - wclk0)[busy]),
        ("warp's steps", warps[busy, 3]),
    ]
    for g in range(int(gen.max()) + 1):
        m = gen == g
        rows.append((f"block duration, generation {g} ({int(m.sum())} blocks; cycles)", dur[m]))
        rows.append((f"warp ends, generation {g} (cycles)", (warps[:, 1] - wclk0)[np.repeat(m, warps_per_block) & busy]))
    out = [f"kernel span {span} ns (globaltimer); {len(blocks)} blocks on {len(np.unique(sm))} SMs, "
           f"{int(busy.sum())} of {len(warps)} warps with entries; block 0's closing walk ends "
           f"{close - t0} ns after the first start",
           "", "| what | p0 | p10 | p50 | p90 | max |", "|---|---|---|---|---|---|"]
    out += [f"| {name} | " + " | ".join(_pct(np.asarray(v))) + " |" for name, v in rows]
    # The blocks that end last, by index: a block held back by one of its warps shows up here (e.g. a warp whose
    # range straddles a tile boundary, which its block's other warps wait for at the tile's barriers).
    last = np.argsort(end)[::-1][:LAST_BLOCKS]
    out += ["", "blocks that end last (index: end ns after the first start, duration cycles): " +
            ", ".join(f"{int(i)}: {int(end[i])}, {int(dur[i])}" for i in last)]
    return "\n".join(out)


def _read(cp, mod, name: str, n: int, k: int) -> np.ndarray:
    """The module's ``__device__`` array ``name`` as an int64 [n, k] host array."""
    return cp.ndarray((n, k), dtype=cp.uint64, memptr=mod.get_global(name)).get().astype(np.int64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="A")
    ap.add_argument("--layouts", default="shuffled,contiguous")
    ap.add_argument("--replays", type=int, default=3, help="timed graph replays; the last one's record is printed")
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--variant", default="shipped",
                    help="the kernel's defines as one bench/tune_geometry.py verify_table variant (UxBxSxLxMxC)")
    args = ap.parse_args(argv)
    import tune_geometry as tg

    (values,) = tg.parse_variants("verify_table", args.variant)
    if not torch.cuda.is_available():
        print("timeline_verify_table: no CUDA device", file=sys.stderr)
        return 2
    import bench_cuda as bc

    from kvcanary.ops.cuda import specs

    with tempfile.TemporaryDirectory(prefix="kvc_timeline_") as work:
        kernels = Path(work) / "kernels_cu"
        shutil.copytree(specs.kernels_dir(), kernels)
        f = kernels / "verify_table.cu"
        f.write_text(instrumented_source(tg.variant_source("verify_table", values, f.read_text())))
        bc.use_kernels_dir(kernels)
        dev = torch.device("cuda", 0)
        timer = bc.Timer(dev)
        for layout in args.layouts.split(","):
            print(f"\nvariant {tg.name(values)}" +
                  timeline(bc.Case(args.shape, RealKvHashMode.NONE, layout, dev, args.seed), timer, args.replays),
                  flush=True)
    return 0


def timeline(case, timer, replays: int) -> str:
    """The record of the last launch of ``timer.graph``'s ``replays`` timed replays of 20 ``case.verify_table()``
    launches (the instrumented kernel must be the library's source: :func:`bench_cuda.use_kernels_dir`), as a heading
    and a table."""
    import bench_cuda as bc
    import cupy as cp

    from kvcanary.ops.cuda import grids, loader, specs

    dev = case.device
    grid = grids.verify_table_grid(False, torch.cuda.get_device_properties(dev).multi_processor_count)
    assert grid.blocks <= MAX_BLOCKS, grid
    wpb = grid.threads // 32
    case.stamp_prefix()
    with bc.modules_seen() as seen:
        case.verify_table()  # compiles and loads the module the launcher takes (32-bit where it applies)
    torch.cuda.synchronize()
    flat32 = seen[-1]
    spec = specs.spec_for("verify_table", has_lut=False, check_token=False, has_real_kv=False, contexts=1,
                          flat32=flat32)
    mod = loader._modules[(dev.index or 0, spec.key)]
    us = timer.graph(case.verify_table, runs=replays, reps=20)
    blocks = _read(cp, mod, "kvc_tl_block", MAX_BLOCKS, 8)[:grid.blocks]
    warps = _read(cp, mod, "kvc_tl_warp", MAX_WARPS, 4)[:grid.blocks * wpb]
    close = int(_read(cp, mod, "kvc_tl_close", 1, 1)[0, 0])
    head = (f"\n## {case.shape} {case.layout} NONE, verify_table ({'32' if flat32 else '64'}-bit modules), one buffer "
            f"({torch.cuda.get_device_name(dev)}; "
            f"{grid.blocks} blocks x {grid.threads} threads; instrumented, {us:.2f} µs per launch in the graph; "
            f"violations {case.violations()})\n")
    return head + "\n" + report(blocks, warps, close, wpb)


if __name__ == "__main__":
    sys.exit(main())
