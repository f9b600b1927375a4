#!/usr/bin/env python3
"""One plan-free verify launch of a benchmark shape, for Nsight Compute (hardware counters).

Usage (on a CUDA machine, from the repository root)::

    ncu --clock-control none -k regex:kvc_verify_from_table --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \\
        python3 bench/profile_verify_table.py --shape B

Builds the case of ``bench/bench_cuda.py`` (``--shape``, real-KV NONE, shuffled slots; its prefix stamped and
checked clean first) and launches ``launch_canary_verify_from_table`` three times (one buffer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cuda import Case

from kvcanary import RealKvHashMode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="B")
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    case = Case(args.shape, RealKvHashMode.NONE, "shuffled", dev, seed=0)
    case.stamp_prefix()
    for _ in range(3):
        case.verify_table()
    torch.cuda.synchronize()
    print("launched 3 verify_from_table of shape", args.shape)
    return 0


if __name__ == "__main__":
    sys.exit(main())
