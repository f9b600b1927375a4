#!/usr/bin/env python3
"""Which part of timing the plan op slows the small kernels timed after it?

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=. python3 bench/probe_after_op.py [--shape A] [--layout shuffled]

In ``bench/bench_cuda.py`` the decode writes at A (``write_table`` and the bare ``write_floor``) take about 0.15-0.2
µs more per launch in a graph when the ``plan`` op was timed before them in the same process, and a 3 s pause
does not undo it (docs/BENCHMARKS.md, 2026-12-05 18:12-18:24 UTC); the SGLang-named verify timed before them does
not do it, and every process has already run the plan op a few times in ``Case.check``. This probe builds one case
as ``bench_cuda.py`` does and times both decode writes in a graph (``Timer.graph``: 20 launches per replay, median
of 30 replays) at the start and after each of the steps that timing the plan op consists of, one at a time and
cumulative (the effect outlasts a pause): its eager timing (30 launches after an L2 flush each), its host timing
(50 calls back to back), its capture in a graph and 30 replays. The first row after which both writes are slower is
the step that does it; a pause and ``torch.cuda.empty_cache`` follow, to see whether anything undoes it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cuda as B

import kvcanary
from kvcanary import RealKvHashMode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="A", choices=sorted(k for k, v in B.SHAPES.items() if v["extend"] == 1))
    ap.add_argument("--layout", default="shuffled", choices=("contiguous", "shuffled"))
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_after_op: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    kvcanary.warmup(device=dev)
    timer = B.Timer(dev)
    case = B.Case(args.shape, RealKvHashMode.NONE, args.layout, dev, args.seed)
    failed = [f"{c.name}: {c.detail}" for c in case.check() if not c.ok]
    if failed:
        print("probe_after_op: checks failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    floor = case.write_floor_op(timer)
    steps = [
        ("start", lambda: None),
        ("nothing (again)", lambda: None),
        ("3 s idle", lambda: time.sleep(3)),
        ("plan: eager timing (30 launches, L2 flushed)", lambda: timer.eager(case.plan, runs=30, warmup=5)),
        ("plan: host timing (50 calls back to back)", lambda: timer.host(case.plan, calls=50)),
        ("plan: captured in a graph, 30 replays", lambda: timer.graph(case.plan, runs=30, reps=20)),
        ("3 s idle", lambda: time.sleep(3)),
        ("torch.cuda.empty_cache()", torch.cuda.empty_cache),
    ]
    name = torch.cuda.get_device_name(dev)
    print(f"{name}; shape {args.shape} {args.layout} NONE; µs per launch in a graph (20 per replay, median of 30)")
    print("| after | write_table | write_floor | SM MHz |")
    print("|---|---|---|---|")
    for label, step in steps:
        step()
        torch.cuda.synchronize()
        wt = timer.graph(case.write_table, runs=30, reps=20)
        wf = timer.graph(floor, runs=30, reps=20)
        print(f"| {label} | {wt:.2f} | {wf:.2f} | {timer.sm_mhz():.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
