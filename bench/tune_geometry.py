#!/usr/bin/env python3
"""Launch-geometry sweep of the plan-free kernels, timed on ``bench_cuda.py``'s cases, every variant checked first.

Usage (on a CUDA machine, from the repository root)::

    PYTHONPATH=. python3 bench/tune_geometry.py                         # verify_table, the default variants
    PYTHONPATH=. python3 bench/tune_geometry.py --kernel write_table    # write_table, its default variants
    PYTHONPATH=. python3 bench/tune_geometry.py --variants shipped,2x4,1x4 --shapes B

``--kernel verify_table`` (``kernels_cu/verify_table.cu``): a variant ``UxBxSxLxMxCxDxRxH`` sets ``U`` entries per thread
per step and ``B`` blocks per SM for both specializations (``KVC_VT_UNROLL[_REAL_KV]``,
``KVC_VT_BLOCKS_PER_SM[_REAL_KV]``), ``S`` (1: a step inside one row takes the row once, ``KVC_VT_STEP_IN_ROW``),
``L`` (n > 0: a warp's range of at most n steps starts at its lead, the entry before it, loaded and hashed but
not checked, ``KVC_VT_LEAD_ENTRY``), ``M`` (1: the 64-bit modules' multiplies in three instructions too,
``KVC_VT_MUL3_ALL``; time it without ``--flat32``), ``C`` (1: a step inside one row runs its own copy of the
rest of the step, ``KVC_VT_IN_ROW_SPLIT``), ``D`` (1: programmatic dependent launch, ``KVC_VT_PDL``) and ``R``
(1: a block whose range straddles a tile boundary walks its next tile from the row of its first entry,
``KVC_VT_REBASE``) and ``H`` (1: a step's hashes computed together, branch-free, before its checks, in the 32-bit and
the 64-bit modules alike: ``KVC_VT_HASH_ILP`` and ``KVC_VT_HASH_ILP_64``).
``--kernel write_table`` (``kernels_cu/write_table.cu``): a variant ``TxBxRxSxPxMxD`` sets ``T`` threads per block,
``B`` blocks per SM, ``R`` rows per thread of the row scan, ``S`` (1: stamp counts summed per block, 0: per warp),
``P`` (1: short requests spread over the blocks first, 0: over the first blocks' warps first), ``M`` (1:
splitmix64's multiplies in three instructions) and ``D`` (1: programmatic dependent launch) (``KVC_WT_THREADS``,
``KVC_WT_BLOCKS_PER_SM``, ``KVC_WT_ROW_ITEMS``, ``KVC_WT_BLOCK_STAMPS``, ``KVC_WT_SPREAD``, ``KVC_WT_MUL3``,
``KVC_WT_PDL``; kvcanary/ops/cuda/pdl.py reads ``D`` from the variant's source, so it launches the variant as
compiled). A variant may give only the first numbers (``2x4``): the other defines keep the source's values.
``shipped`` is the source as it is. Each variant compiles a copy of ``kernels_cu/`` with those defines, and the
launchers read the grid from the same copy, so a variant is what the library would run (the CPU suite compiles
every default variant: tests/ops/test_nvrtc_compile.py). A variant may be named more than once
(``--variants 2x4x1x0,2x4x1x4,2x4x1x0,2x4x1x4``): each timing gets its own row, so two variants can be timed in turns
against the drift of one process.
``--flat32`` times the verify's 32-bit modules (the same defines set their geometry). ``--verify-lens`` (verify_table
only) verifies a shorter prefix of each stamped row than the case's whole one, so that warps' ranges no longer
meet the rows and the 256-row tiles as they do in the uniform shapes: ``N`` (every row's first ``N`` positions) or
``random:LO`` (each row a length drawn from ``[LO, prefix]`` with the seed), as an engine's batch of requests of
mixed lengths.

Per variant and case: the eager time (L2 flushed, median) and the time per launch in a CUDA graph (about 2 ms of
launches per replay, as ``bench_cuda.py``; the L2 not flushed); registers and local (spill) bytes per thread.
The timer captures ``bench_cuda.GRAPHS_BEFORE_TIMING`` graphs before the first variant is timed, so that variant
no longer gets a process's faster first graphs (until 2026-12-05 18:35 UTC it did: docs/BENCHMARKS.md).
Before timing, every variant must pass ``bench_cuda.Case.check`` on shape A (clean prefix verified clean, one
flipped token caught, the plan-free write stamping what the plan-based one stamps). The table is printed last (and
written to ``$OUT/tune_<kernel>.md`` when ``$OUT`` is set).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_cuda as B

from kvcanary import RealKvHashMode
from kvcanary.ops.cuda import loader, specs

KERNELS = {
    # kernel -> (source, entry point, defines a variant sets (in variant order, each define: its names),
    #            default variants, timed Case method, spec flags (NONE, real KV))
    "verify_table": ("verify_table.cu", "kvc_verify_from_table",
                     [("KVC_VT_UNROLL", "KVC_VT_UNROLL_REAL_KV"),
                      ("KVC_VT_BLOCKS_PER_SM", "KVC_VT_BLOCKS_PER_SM_REAL_KV"),
                      ("KVC_VT_STEP_IN_ROW",), ("KVC_VT_LEAD_ENTRY",), ("KVC_VT_MUL3_ALL",),
                      ("KVC_VT_IN_ROW_SPLIT",), ("KVC_VT_PDL",), ("KVC_VT_REBASE",),
                      ("KVC_VT_HASH_ILP", "KVC_VT_HASH_ILP_64")],
                     ("shipped,2x4,1x4,2x3,2x6,1x6,1x8,4x2,2x4x1x1,2x4x1x0x1,2x4x1x0x0x1,2x4x1x4x0x0x1x0,2x4x1x4x0x0x1x1x0,"
                      "2x4x1x4x0x0x1x1x1"),
                     "verify_table",
                     lambda kv: dict(has_lut=False, check_token=False, has_real_kv=kv, contexts=1,
                                     flat32=B.kernel_specs.FLAT32)),
    "write_table": ("write_table.cu", "kvc_write_from_table",
                    [("KVC_WT_THREADS",), ("KVC_WT_BLOCKS_PER_SM",), ("KVC_WT_ROW_ITEMS",), ("KVC_WT_BLOCK_STAMPS",),
                     ("KVC_WT_SPREAD",), ("KVC_WT_MUL3",), ("KVC_WT_PDL",)],
                    "shipped,256x1x4x1x0,256x1x4x0x1,256x1x4x1x1,128x2x4x1x1,512x1x2x1x1,256x1x4x1x1x1", "write_table",
                    lambda kv: dict(input_assert=False, has_real_kv=kv, contexts=1)),
}
_original: list[Path] = []


def parse_variants(kernel: str, text: str) -> list[tuple[int, ...]]:
    """``"shipped,2x4,..."`` as value tuples (``()`` for the source as it is), each of 1 to the kernel's length."""
    variants = []
    for v in text.split(","):
        v = v.strip().lower()
        values = () if v == "shipped" else tuple(int(x) for x in v.split("x"))
        if values and len(values) > len(KERNELS[kernel][2]):
            raise ValueError(f"{v!r} has more than {len(KERNELS[kernel][2])} numbers for {kernel}")
        variants.append(values)
    return variants


def variant_source(kernel: str, values: tuple[int, ...], text: str) -> str:
    """``text`` (the kernel's source file) with the variant's defines (``()``, ``shipped``: as it is)."""
    _, _, defines, *_ = KERNELS[kernel]
    if not values:
        return text
    if len(values) > len(defines):
        raise ValueError(f"a {kernel} variant has at most {len(defines)} numbers, got {values}")
    for names, value in zip(defines, values):
        for name in names:
            text = specs.set_int_define(text, name, value, KERNELS[kernel][0])
    return text


def use_variant(kernel: str, values: tuple[int, ...], work: Path) -> None:
    """A copy of kernels_cu/ with the variant's defines, made the library's kernel source; caches cleared."""
    if not _original:
        _original.append(specs.kernels_dir())
    source = KERNELS[kernel][0]
    dst = work / ("shipped" if not values else "_".join(map(str, values)))
    if not dst.exists():
        shutil.copytree(_original[0], dst)
        f = dst / source
        f.write_text(variant_source(kernel, values, f.read_text()))
    B.use_kernels_dir(dst)


def parse_verify_lens(text: str) -> tuple[int, bool] | None:
    """``--verify-lens``: ``None`` for ``stamped``, ``(N, False)`` for ``N``, ``(LO, True)`` for ``random:LO``."""
    text = text.strip().lower()
    if text == "stamped":
        return None
    random_form = text.startswith("random:")
    try:
        n = int(text.removeprefix("random:"))
    except ValueError:
        raise ValueError(f"{text!r} is not stamped, N or random:LO") from None
    if n < 0:
        raise ValueError(f"{text!r}: a length is >= 0")
    return n, random_form


def verify_lens(rule: tuple[int, bool], bs: int, prefix: int, seed: int) -> torch.Tensor:
    """Each row's verified prefix under ``rule`` (``parse_verify_lens``), at most the stamped ``prefix``: int64
    ``[bs]`` on the CPU; ``random:LO`` draws from ``[min(LO, prefix), prefix]`` with ``seed``."""
    n, random_form = rule
    if not random_form:
        return torch.full((bs,), min(n, prefix), dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(min(n, prefix), prefix + 1, (bs,), generator=g, dtype=torch.int64)


def name(values: tuple[int, ...]) -> str:
    return "shipped" if not values else " x ".join(map(str, values))


def kernel_info(kernel: str, device_index: int, real_kv: bool) -> tuple[int, int]:
    _, entry, _, _, _, flags = KERNELS[kernel]
    k = loader.kernel(specs.spec_for(kernel, **flags(real_kv)), entry, device_index)
    return int(k.num_regs), int(k.local_size_bytes)


def table_lines(kernel: str, variants: list[tuple[int, ...]], cols: list[tuple[str, str, str]],
                eager: dict[tuple, float], graph: dict[tuple, float], info: dict[tuple, tuple]) -> list[str]:
    """The markdown table: one row per entry of ``variants`` (a variant named twice has two rows, from its two
    timings: ``eager``/``graph`` are keyed by (index in ``variants``, shape, layout, mode)), one column per case of
    ``cols``; registers and spill bytes from ``info`` ((variant, mode) -> (registers, spill bytes))."""
    head = ("entries/thread x blocks/SM (x step in row x lead x mul3 all x in-row copy x pdl x rebase)"
            if kernel == "verify_table" else "threads x blocks/SM x rows/thread x block stamps x spread (x mul3 x pdl)")
    lines = [f"| {head} | regs NONE / PARTIAL | spill B | " + " | ".join(f"{s} {lay[:4]} {m}" for s, lay, m in cols)
             + " |", "|" + "---|" * (3 + len(cols))]

    def cell(key):
        return f"{eager.get(key, float('nan')):.2f} / {graph.get(key, float('nan')):.2f}"

    for i, var in enumerate(variants):
        rn = info.get((var, "NONE"), (0, 0))
        rp = info.get((var, "PARTIAL"), (0, 0))
        lines.append(f"| {name(var)} | {rn[0]} / {rp[0]} | {rn[1]} / {rp[1]} | "
                     + " | ".join(cell((i, *c)) for c in cols) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", choices=tuple(KERNELS), default="verify_table")
    ap.add_argument("--variants", default=None, help="default: the kernel's list (see the module docstring)")
    ap.add_argument("--shapes", default=None, help="default: A,B (verify_table); A,B,D (write_table)")
    ap.add_argument("--modes", default="NONE,PARTIAL")
    ap.add_argument("--layouts", default=None, help="default: shuffled,contiguous (verify_table); shuffled")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=20240601)
    ap.add_argument("--flat32", action="store_true",
                    help="verify_table: time its 32-bit modules (kvcanary.ops.cuda.specs.FLAT32)")
    ap.add_argument("--verify-lens", default="stamped",
                    help="verify_table: each row's verified prefix: stamped (the whole), N, or random:LO")
    args = ap.parse_args(argv)
    try:
        lens_rule = parse_verify_lens(args.verify_lens)
    except ValueError as e:
        ap.error(f"--verify-lens: {e}")
    if lens_rule is not None and args.kernel != "verify_table":
        ap.error("--verify-lens applies to --kernel verify_table only")
    B.kernel_specs.FLAT32 = args.flat32
    if not torch.cuda.is_available():
        print("tune_geometry: no CUDA device", file=sys.stderr)
        return 2
    kernel = args.kernel
    _, _, _, default_variants, method, _ = KERNELS[kernel]
    is_write = kernel == "write_table"
    shapes = args.shapes or ("A,B,D" if is_write else "A,B")
    layouts = args.layouts or ("shuffled" if is_write else "shuffled,contiguous")
    dev = torch.device("cuda", torch.cuda.current_device())
    try:
        variants = parse_variants(kernel, args.variants or default_variants)
    except ValueError as e:
        ap.error(f"--variants: {e}")
    timer = B.Timer(dev)
    modes = [RealKvHashMode[m.strip().upper()] for m in args.modes.split(",")]
    combos = [(s.strip().upper(), lay.strip(), m) for s in shapes.split(",") for lay in layouts.split(",")
              for m in modes]
    eager: dict[tuple, float] = {}
    graph: dict[tuple, float] = {}
    info: dict[tuple, tuple] = {}
    mhz: list[float] = []  # the SM clock after each timing (bench_cuda.Timer.sm_mhz)
    failures: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="kvc_tune_"))
    try:
        for mode in modes:  # correctness of every variant first, on shape A
            case = B.Case("A", mode, "shuffled", dev, args.seed)
            for var in dict.fromkeys(variants):  # once per distinct variant
                use_variant(kernel, var, work)
                bad = [c for c in case.check() if not c.ok]
                if bad:
                    failures.append(f"{name(var)} A/{mode.name}: " + "; ".join(f"{c.name}: {c.detail}" for c in bad))
                info[var, mode.name] = kernel_info(kernel, dev.index, mode != RealKvHashMode.NONE)
            del case
        for shape, layout, mode in combos:
            case = B.Case(shape, mode, layout, dev, args.seed)
            case.stamp_prefix()
            fn = getattr(case, method)
            if lens_rule is not None:
                lens = verify_lens(lens_rule, case.bs, case.prefix, args.seed).to(dev)
                fn = functools.partial(fn, prefix_lens=lens)  # (method is verify_table here)
            for i, var in enumerate(variants):  # a variant named twice is timed twice, a row each (interleaving)
                use_variant(kernel, var, work)
                key = (i, shape, layout, mode.name)
                eager[key] = timer.eager(fn, runs=args.runs, warmup=3)
                # as bench_cuda.py: about 2 ms of launches per replay
                reps = max(1, min(20, int(2000 / max(eager[key], 1e-3))))
                graph[key] = timer.graph(fn, runs=args.runs, reps=reps)
                mhz.append(timer.sm_mhz())
                print(f"  {name(var)} {shape} {layout} {mode.name}: eager {eager[key]:.2f} µs, graph "
                      f"{graph[key]:.2f} µs, SM {mhz[-1]:.0f} MHz", flush=True)
            if case.violations():
                failures.append(f"{shape}/{layout}/{mode.name}: {case.violations()} violations while timing")
            del case
            torch.cuda.empty_cache()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cols = [(s, lay, m.name) for s, lay, m in combos]
    lines = [f"GPU: {torch.cuda.get_device_name(dev)}; {kernel}, one buffer: µs eager / graph (eager: L2 flushed; "
             f"median of {args.runs}); verified prefix per row: {args.verify_lens}", ""]
    lines += table_lines(kernel, variants, cols, eager, graph, info)
    lines += ["", f"SM clock after each timing: {min(mhz, default=0):.0f}-{max(mhz, default=0):.0f} MHz",
              "checks: " + ("all clean" if not failures else "FAILED: " + " | ".join(failures))]
    text = "\n".join(lines)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"tune_{kernel}.md").write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
