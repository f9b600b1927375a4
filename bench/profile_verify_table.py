#!/usr/bin/env python3
"""Launches of one kvcanary op on a benchmark shape, for Nsight Compute (hardware counters).

Usage (on a CUDA machine, from the repository root)::

    ncu --clock-control none -k regex:kvc_verify_from_table --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        python3 bench/profile_verify_table.py --shape B

    ncu --clock-control none -k regex:kvc_write_from_table --launch-skip 2 --launch-count 1 ... \
        python3 bench/profile_verify_table.py --shape A --op write_table

Builds the case of ``bench/bench_cuda.py`` (``--shape``, real-KV NONE, slots as ``--layout``, shuffled by default;
its prefix stamped first, with two launches of the plan-based write) and launches ``--op`` three times (one buffer):
``verify_table`` (default; its 32-bit modules), ``verify_table_64`` (the same on the verify's 64-bit modules only),
``write_table`` or ``write`` (the plan-based decode write, after one plan).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cuda import LAYOUTS, Case

from kvcanary import RealKvHashMode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="B")
    ap.add_argument("--op", default="verify_table", choices=("verify_table", "verify_table_64", "write_table", "write"))
    ap.add_argument("--layout", default="shuffled", choices=LAYOUTS)
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    case = Case(args.shape, RealKvHashMode.NONE, args.layout, dev, seed=0)
    case.stamp_prefix()
    if args.op == "write":
        case.plan()
    for _ in range(3):
        getattr(case, args.op)()
    torch.cuda.synchronize()
    print(f"launched 3 {args.op} of shape", args.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
