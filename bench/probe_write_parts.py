#!/usr/bin/env python3
"""Where does the decode write from the table spend its time over ``write_floor``? Times copies of
``kernels_cu/write_table.cu`` with parts cut out, at one decode shape, in turns.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=. python3 bench/probe_write_parts.py [--shape A] [--rounds 2] [--variants shipped,counters,...]

A variant is ``shipped`` or cuts joined by ``+`` (``counters+loops+barrier``); each cut is a text edit of the source
(``CUTS``; every edit's text must be found exactly once, so a changed kernel fails loudly rather than timing the
wrong thing):

* ``counters``: no ``kernel_run_counter`` add and no stamped-slot counts (``run_counter`` and ``stamp_counts``:
  each alone; ``stamp_atomics``: the decode path's per-warp stamp sums kept, their atomics not issued;
  ``lane_atomics``, not a cut: the decode path's stamps added by each stamping lane, with no warp sum first);
* ``flags``: the contexts' position flags not loaded (0);
* ``loops``: the short- and long-request loops after the row scan not entered (a decode batch's rows are all
  written by the threads that scanned them, so they have no work there);
* ``barrier``: the barrier that publishes the rows and tells whether every row has one token is gone, each thread
  trusting its own row (needs ``loops``: the loops read what the barrier publishes);
* ``exit``: with at most ``KVC_WT_THREADS`` rows, a thread whose row is not its block's returns at the kernel's start
  (needs ``barrier``);
* ``nowrite``: the one-token write itself (``kvc_wt_single``: the record store) is skipped.

The cut kernels are wrong on purpose (no counts, no checks), so nothing is checked: this is a probe of what each
part costs, not a variant to ship. Only a decode batch whose every row has one token runs them safely, so only
the decode shapes (A, B) are offered, with real-KV NONE; ``barrier`` and ``exit`` change only a batch of at most
``KVC_WT_THREADS`` rows (A: the one-row scan; B takes the check without the scan, which they leave as it is). Each
round times every variant (eager with the L2 flushed, and per launch in a CUDA graph, after ``bench_cuda.Timer``'s
settling graphs) and ``write_floor`` last.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cuda as B

from kvcanary import RealKvHashMode
from kvcanary.ops.cuda import specs

SOURCE = "write_table.cu"
_RUN_COUNTER = ("            if (c < nctx) kvc_counter_add(p.ctx[c].kernel_run_counter, 1);", "            ;")
_STAMP_COUNTS = ("    if (all_decode)\n        kvc_write_count_stamps<NC, 0>(cx, stamped);\n    else\n"
                 "        kvc_write_count_stamps<NC, KVC_WT_BLOCK_STAMPS ? kvc::kWtWarps : 0>(cx, stamped);",
                 "    (void)all_decode;")
CUTS: dict[str, list[tuple[str, str]]] = {
    "counters": [_RUN_COUNTER, _STAMP_COUNTS],
    "run_counter": [_RUN_COUNTER],
    "stamp_counts": [_STAMP_COUNTS],
    # the decode path's kvc_write_count_stamps<NC, 0> replaced by a stand-in that keeps its warp sums (a redux per
    # warp and context) but never issues the atomic
    "stamp_atomics": [("        kvc_write_count_stamps<NC, 0>(cx, stamped);\n",
                       "        kvc_probe_sum_stamps<NC>(cx, stamped);\n"),
                      ("extern \"C\" __global__ void __launch_bounds__",
                       "template <int NC, class Cx>\n__device__ __forceinline__ void kvc_probe_sum_stamps("
                       "const Cx& cx, const kvc_i64 (&stamped)[NC]) {\n    __syncwarp();\n#pragma unroll\n"
                       "    for (int c = 0; c < NC; ++c) {\n"
                       "        const unsigned t = __reduce_add_sync(kvc::kFullMask, (unsigned)stamped[c]);\n"
                       "        if (c < cx.count() && (threadIdx.x & 31) == 0 && t == 0xFFFFFFFFu)\n"
                       "            kvc_counter_add(cx.ctx(c).slot_run_counter, 1);  // never: keeps the sum\n"
                       "    }\n}\n\nextern \"C\" __global__ void __launch_bounds__")],
    # not a cut: the decode path's stamps added by each stamping lane itself (the same sum, no warp sum first)
    "lane_atomics": [("        kvc_write_count_stamps<NC, 0>(cx, stamped);\n",
                      "#pragma unroll\n        for (int c = 0; c < NC; ++c)\n"
                      "            if (c < nctx && stamped[c] != 0)\n"
                      "                kvc_counter_add(cx.ctx(c).slot_run_counter, stamped[c]);\n")],
    "flags": [("position_flag[c] = c < nctx ? kvc_position_flag_load(cx.ctx(c)) : 0;",
               "position_flag[c] = 0;")],
    "loops": [
        ("for (kvc_i64 r = kvc_first_congruent(tile, warps, gwarp); r < tile_end; r += warps) {",
         "for (kvc_i64 r = tile_end; r < tile_end; r += warps) {"),
        ("for (kvc_i64 r = kvc_first_congruent(tile, blocks, block); rows.any_long && r < tile_end; r += blocks) {",
         "for (kvc_i64 r = tile_end; rows.any_long && r < tile_end; r += blocks) {"),
    ],
    "barrier": [("    if (__syncthreads_and(ones)) return out;", "    if (ones) return out;")],
    "exit": [("    const kvc_i64 blocks = gridDim.x, block = blockIdx.x;\n",
              "    const kvc_i64 blocks = gridDim.x, block = blockIdx.x;\n"
              "    if (p.batch.bs <= KVC_WT_THREADS && (kvc_i64)threadIdx.x % blocks != block) return;\n")],
    "nowrite": [("        if (one.go) {\n            if (!decode)", "        if (false) {\n            if (!decode)")],
}
NEEDS = {"barrier": "loops", "exit": "barrier"}
DEFAULT = ("shipped,counters,run_counter,stamp_counts,stamp_atomics,lane_atomics,flags,loops,counters+loops,"
           "counters+loops+barrier,counters+loops+barrier+flags,counters+loops+barrier+flags+exit,"
           "counters+loops+barrier+flags+exit+nowrite")


def parse(text: str) -> list[tuple[str, ...]]:
    """``"shipped,a+b"`` as tuples of cut names (``()``: shipped), each cut known and its prerequisite present."""
    out = []
    for v in text.split(","):
        v = v.strip()
        cuts = () if v == "shipped" else tuple(c.strip() for c in v.split("+"))
        for c in cuts:
            if c not in CUTS:
                raise ValueError(f"unknown cut {c!r} (known: {', '.join(CUTS)})")
            if c in NEEDS and NEEDS[c] not in cuts:
                raise ValueError(f"cut {c!r} needs {NEEDS[c]!r}")
        out.append(cuts)
    return out


def cut_source(text: str, cuts: tuple[str, ...]) -> str:
    """``text`` with the cuts' edits; each edit's text must be found exactly once."""
    for c in cuts:
        for old, new in CUTS[c]:
            n = text.count(old)
            if n != 1:
                raise ValueError(f"cut {c!r}: its text is found {n} times in {SOURCE}, not once: {old[:60]!r}")
            text = text.replace(old, new)
    return text


def label(cuts: tuple[str, ...]) -> str:
    return "+".join(cuts) or "shipped"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="A", choices=sorted(k for k, v in B.SHAPES.items() if v["extend"] == 1))
    ap.add_argument("--layout", default="shuffled", choices=B.LAYOUTS)
    ap.add_argument("--variants", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args(argv)
    try:
        variants = parse(args.variants)
    except ValueError as e:
        ap.error(f"--variants: {e}")
    original = specs.kernels_dir()
    for v in variants:  # every edit applies before anything runs
        cut_source((original / SOURCE).read_text(), v)
    if not torch.cuda.is_available():
        print("probe_write_parts: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    timer = B.Timer(dev)
    case = B.Case(args.shape, RealKvHashMode.NONE, args.layout, dev, args.seed)
    failed = [f"{c.name}: {c.detail}" for c in case.check() if not c.ok]
    if failed:
        print("probe_write_parts: checks of the shipped kernels failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    case.stamp_prefix()
    floor = case.write_floor_op(timer)
    work = Path(tempfile.mkdtemp(prefix="kvc_probe_"))
    times: dict[str, list[tuple[float, float]]] = {}
    try:
        for rnd in range(args.rounds):
            for v in variants:
                dst = work / label(v)
                if not dst.exists():
                    shutil.copytree(original, dst)
                    (dst / SOURCE).write_text(cut_source((dst / SOURCE).read_text(), v))
                B.use_kernels_dir(dst)
                e = timer.eager(case.write_table, runs=args.runs, warmup=3)
                g = timer.graph(case.write_table, runs=args.runs, reps=20)
                times.setdefault(label(v), []).append((e, g))
                print(f"  round {rnd + 1} {label(v)}: eager {e:.2f} µs, graph {g:.2f} µs", flush=True)
            e = timer.eager(floor, runs=args.runs, warmup=3)
            g = timer.graph(floor, runs=args.runs, reps=20)
            times.setdefault(f"write_floor ({floor.geometry})", []).append((e, g))
            print(f"  round {rnd + 1} write_floor: eager {e:.2f} µs, graph {g:.2f} µs", flush=True)
    finally:
        B.use_kernels_dir(original)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{torch.cuda.get_device_name(dev)}; shape {args.shape} {args.layout} NONE, write from the table with "
          f"parts cut out; µs eager (L2 flushed) / per launch in a graph (20 per replay), median of {args.runs}, "
          f"one column per round\n")
    print("| variant | " + " | ".join(f"round {i + 1}" for i in range(args.rounds)) + " |")
    print("|---|" + "---|" * args.rounds)
    for name, ts in times.items():
        print(f"| {name} | " + " | ".join(f"{e:.2f} / {g:.2f}" for e, g in ts) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
