#!/usr/bin/env python3
"""Does a CUDA graph's time per launch depend on how many graphs the process has captured?

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=. python3 bench/probe_graph_state.py [--shape A] [--layout shuffled]

What it found (docs/BENCHMARKS.md, 2026-12-05 18:26-18:28 UTC, an H100; by the same steps, before this script): the
bare decode write at A took 1.83-1.86 µs per launch in the first two graphs of 20 launches the process captured and
1.99-2.05 in every graph after them; the first graph, kept alive, took the later time too once more graphs had been
captured, and kept it after they were dropped. So a process's first graph timings are faster than the rest,
whatever was timed before them: ``bench_cuda.py``'s ``Timer`` therefore captures ``GRAPHS_BEFORE_TIMING`` graphs
before anything is timed.

This probe builds shape A (or B) as ``bench_cuda.py`` does, without its ``Timer`` (which would settle the state
first), and times the bare decode write (``write_floor``, 128 threads per block) and ``write_table`` in graphs of 20
launches each (``bench_cuda.capture_graph`` and ``graph_per_launch``, median of 30 replays): the first pair of graphs
twice; two pairs more, kept alive, and the first pair again; the first pair after those are dropped; and a new pair.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cuda as B

import kvcanary
from kvcanary import RealKvHashMode

REPS, RUNS = 20, 30


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="A", choices=sorted(k for k, v in B.SHAPES.items() if v["extend"] == 1))
    ap.add_argument("--layout", default="shuffled", choices=B.LAYOUTS)
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("probe_graph_state: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    kvcanary.warmup(device=dev)
    case = B.Case(args.shape, RealKvHashMode.NONE, args.layout, dev, args.seed)
    failed = [f"{c.name}: {c.detail}" for c in case.check() if not c.ok]
    if failed:
        print("probe_graph_state: checks failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    floor = case.write_floor_at(128)
    cycles = int(1000 * B.sleep_cycles_per_us())  # 1 ms: covers a replay's enqueueing (some µs of host time)
    print(f"{torch.cuda.get_device_name(dev)}; shape {args.shape} {args.layout} NONE; µs per launch in a graph "
          f"({REPS} per replay, median of {RUNS} replays)")
    print("| graph | write_floor | write_table |")
    print("|---|---|---|")

    def capture(fn) -> torch.cuda.CUDAGraph:
        return B.capture_graph(fn, REPS, dev)

    def row(label: str, gf, gt) -> None:
        us = [B.graph_per_launch(g, reps=REPS, runs=RUNS, cycles=cycles) for g in (gf, gt)]
        print(f"| {label} | {us[0]:.2f} | {us[1]:.2f} |", flush=True)

    first = (capture(floor), capture(case.write_table))
    row("the first (captured first)", *first)
    row("the first, again", *first)
    more = [(capture(floor), capture(case.write_table)) for _ in range(2)]
    row("the first, with two pairs more alive", *first)
    for i, pair in enumerate(more):
        row(f"pair {i + 2}", *pair)
    del more
    row("the first, after they were dropped", *first)
    row("a new pair", capture(floor), capture(case.write_table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
