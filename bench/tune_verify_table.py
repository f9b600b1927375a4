#!/usr/bin/env python3
"""Launch-geometry sweep of the plan-free verify (``kernels_cu/verify_table.cu``): entries per thread per step
(``KVC_VT_UNROLL``, ``KVC_VT_UNROLL_REAL_KV``) and blocks per SM (``KVC_VT_BLOCKS_PER_SM``,
``KVC_VT_BLOCKS_PER_SM_REAL_KV``), timed on ``bench_cuda.py``'s cases, with a correctness check of every variant.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=. python3 bench/tune_verify_table.py                       # the default variants
    PYTHONPATH=. python3 bench/tune_verify_table.py --variants 2x4,4x2 --shapes B

A variant ``UxB`` compiles a copy of ``kernels_cu/`` whose defines read ``U`` entries per thread and ``B`` blocks per
SM for both specializations (without and with real KV); ``shipped`` is the source as it is. The launchers read the
grid from the same copy, so a variant is what the library would run with those defines. Per variant and case: the eager time
(L2 flushed, median) and the registers and local (spill) bytes per thread. Before timing a variant, its plan-free
verify must pass the case's correctness checks (clean prefix verified clean, one flipped token caught), run on
shape A. The table is printed last (and written to ``$OUT/tune_verify_table.md`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cuda as B

from kvcanary import RealKvHashMode
from kvcanary.ops.cuda import grids, launch, loader, specs

DEFAULT_VARIANTS = "shipped,2x4,1x4,2x3,2x6,1x6,1x8,4x2"


def use_variant(unroll: int, per_sm: int, work: Path) -> Path:
    """A copy of kernels_cu/ with the variant's defines, made the library's kernel source; caches cleared."""
    src = specs.kernels_dir() if not hasattr(use_variant, "orig") else use_variant.orig  # type: ignore[attr-defined]
    use_variant.orig = src  # type: ignore[attr-defined]
    dst = work / f"u{unroll}b{per_sm}"
    if not dst.exists():
        shutil.copytree(src, dst)
        f = dst / "verify_table.cu"
        text = f.read_text()
        if unroll > 0:  # 0 x 0: "shipped"
            for name, value in (("KVC_VT_UNROLL", unroll), ("KVC_VT_BLOCKS_PER_SM", per_sm),
                                ("KVC_VT_UNROLL_REAL_KV", unroll), ("KVC_VT_BLOCKS_PER_SM_REAL_KV", per_sm)):
                text, n = re.subn(rf"^#define {name} \d+", f"#define {name} {value}", text, flags=re.M)
                assert n == 1, name
        f.write_text(text)
    specs.kernels_dir = lambda d=dst: d  # type: ignore[assignment]
    for fn in (specs._file_source, specs.int_define, grids.verify_table_grid):
        fn.cache_clear()
    loader._modules.clear()
    loader._kernels.clear()
    loader._functions.clear()
    launch.clear_caches()
    return dst


def name(var: tuple[int, int]) -> str:
    return "shipped" if var[0] == 0 else f"{var[0]} x {var[1]}"


def kernel_info(device_index: int, real_kv: bool) -> tuple[int, int]:
    k = loader.kernel(specs.spec_for("verify_table", has_lut=False, check_token=False, has_real_kv=real_kv),
                      "kvc_verify_from_table", device_index)
    return int(k.num_regs), int(k.local_size_bytes)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--shapes", default="A,B")
    ap.add_argument("--modes", default="NONE,PARTIAL")
    ap.add_argument("--layouts", default="shuffled,contiguous")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=20240601)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_verify_table: no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    variants = []
    for v in args.variants.split(","):
        if v.strip() == "shipped":
            variants.append((0, 0))
            continue
        u, b = (int(x) for x in v.lower().split("x"))
        variants.append((u, b))
    timer = B.Timer(dev)
    modes = [RealKvHashMode[m.strip().upper()] for m in args.modes.split(",")]
    combos = [(s.strip().upper(), lay.strip(), m) for s in args.shapes.split(",")
              for lay in args.layouts.split(",") for m in modes]
    results: dict[tuple, float] = {}
    info: dict[tuple, tuple] = {}
    failures: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="kvc_tune_"))
    try:
        # Correctness of every variant first, on shape A (both modes, shuffled).
        for mode in modes:
            case = B.Case("A", mode, "shuffled", dev, args.seed)
            for var in variants:
                use_variant(*var, work)
                bad = [c for c in case.check() if not c.ok]
                if bad:
                    failures.append(f"{var} A/{mode.name}: " + "; ".join(f"{c.name}: {c.detail}" for c in bad))
                info[var, mode.name] = kernel_info(dev.index, mode != RealKvHashMode.NONE)
            del case
        for shape, layout, mode in combos:
            case = B.Case(shape, mode, layout, dev, args.seed)
            case.stamp_prefix()
            for var in variants:
                use_variant(*var, work)
                us = timer.eager(case.verify_table, runs=args.runs, warmup=3)
                results[var, shape, layout, mode.name] = us
                print(f"  {name(var)} {shape} {layout} {mode.name}: {us:.2f} µs", flush=True)
            if case.violations():
                failures.append(f"{shape}/{layout}/{mode.name}: {case.violations()} violations while timing")
            del case
            torch.cuda.empty_cache()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cols = [(s, lay, m.name) for s, lay, m in combos]
    lines = [f"GPU: {torch.cuda.get_device_name(dev)}; eager µs (L2 flushed, median of {args.runs}) of "
             "launch_canary_verify_from_table, one buffer", "",
             "| entries/thread x blocks/SM | regs NONE / PARTIAL | spill B | "
             + " | ".join(f"{s} {lay[:4]} {m}" for s, lay, m in cols) + " |",
             "|" + "---|" * (3 + len(cols))]
    for var in variants:
        rn = info.get((var, "NONE"), (0, 0))
        rp = info.get((var, "PARTIAL"), (0, 0))
        lines.append(f"| {name(var)} | {rn[0]} / {rp[0]} | {rn[1]} / {rp[1]} | "
                     + " | ".join(f"{results.get((var, *c), float('nan')):.2f}" for c in cols) + " |")
    lines += ["", "checks: " + ("all clean" if not failures else "FAILED: " + " | ".join(failures))]
    text = "\n".join(lines)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "tune_verify_table.md").write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
