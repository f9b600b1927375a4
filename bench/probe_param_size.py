#!/usr/bin/env python3
"""Does a kernel's by-value parameter size change its time per launch in a CUDA graph?

Usage (on a CUDA machine)::

    python3 bench/probe_param_size.py

The plan-free kernels take one parameter struct of 624 bytes (verify and write: four contexts' words, whatever
the module's context count). This probe times kernels that differ only in their parameter size (64 to 3,200
bytes; each reads one word per 13 and stores nothing), launched on a grid of one 256-thread block per SM,
``NODES`` of them captured back to back in one graph, as ``bench/bench_cuda.py``'s ``Timer.graph`` does, and
prints the median microseconds per launch of each round. ``--spin N``: each kernel first spins N clock cycles (5000:
about as long as the decode write); ``--no-reads``: the kernels read none of their words, so only the launch's copy
of the struct differs. docs/BENCHMARKS.md (2026-12-04 21:00-22:00 UTC, and 2026-12-06) has the numbers: the time per
launch grows with the size only while the kernels read their words (one per 13); without the reads it is flat
from 64 to 3,200 bytes (an H100, 2026-12-06), so a larger struct costs a launch nothing, and trimming the real
kernels' struct gained nothing.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

WORDS = (8, 39, 78, 160, 400)  # 8-byte words: the first is the output pointer
NODES, REPS, ROUNDS = 200, 15, 3

SRC = r"""
template <int N> struct P { unsigned long long* out; long long w[N - 1]; };
#define K(N)                                                                                   \
    extern "C" __global__ void k##N(const __grid_constant__ P<N> p, long long spin, int reads) { \
        long long s = 0;                                                                       \
        const long long t0 = clock64();                                                        \
        while (clock64() - t0 < spin) {}                                                       \
        if (threadIdx.x == 0 && reads)                                                         \
            for (int i = 0; i < N - 1; i += 13) s += p.w[i];                                   \
        if (s == 12345 && threadIdx.x == 0) p.out[blockIdx.x] = s; /* never: keeps the reads */ \
    }
K(8) K(39) K(78) K(160) K(400)
"""


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spin", type=int, default=0,
                    help="clock cycles each kernel spins before it reads its words (0: none)")
    ap.add_argument("--no-reads", action="store_true",
                    help="the kernels do not read their words (only the launch's copy of the struct is left)")
    args = ap.parse_args()

    mod = cp.RawModule(code=SRC, options=("-std=c++17",))
    out = cp.zeros(1024, dtype=cp.uint64)
    grid = cp.cuda.Device().attributes["MultiProcessorCount"]
    stream = cp.cuda.Stream(non_blocking=True)
    res: dict[int, list[float]] = {n: [] for n in WORDS}
    for _ in range(ROUNDS):
        for n in WORDS:
            fn = mod.get_function(f"k{n}")
            words = np.array([int(out.data.ptr), *range(1, n)], dtype=np.int64)
            arg = np.frombuffer(words.tobytes(), dtype=np.dtype((np.void, n * 8)))  # the struct's bytes by value
            with stream:
                stream.begin_capture()
                for _ in range(NODES):
                    fn((grid,), (256,), (arg, np.int64(args.spin), np.int32(0 if args.no_reads else 1)))
                graph = stream.end_capture()
                graph.launch(stream)
                stream.synchronize()
                times = []
                for _ in range(REPS):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(stream)
                    graph.launch(stream)
                    e1.record(stream)
                    e1.synchronize()
                    times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / NODES)
            res[n].append(statistics.median(times))
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print(f"{name}, {grid} blocks of 256 threads, {NODES} launches per graph, median of {REPS} replays, "
          f"each kernel spinning {args.spin} cycles" + (", reading none of its words" if args.no_reads else ""))
    print("| parameter bytes | µs per launch in a graph, per round |")
    print("|---|---|")
    for n in WORDS:
        print(f"| {n * 8} | {' '.join(f'{t:.3f}' for t in res[n])} |")


if __name__ == "__main__":
    main()
