"""bench/timeline_verify_table.py runs on a GPU only: keep its instrumentation in step with verify_table.cu's text,
and its per-generation analysis right (a block's generation is its rank by index among its SM's blocks)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from support.bench_scripts import bench_module

ROOT = Path(__file__).resolve().parents[2]
tl = bench_module("timeline_verify_table")
tg = bench_module("tune_geometry")


def test_every_anchor_is_in_the_kernel_once_and_gets_its_store():
    src = (ROOT / "kernels_cu" / "verify_table.cu").read_text()
    out = tl.instrumented_source(src)
    for anchor, where, code in tl._PATCHES:
        assert out.count(code) == 1, anchor
        if where != "replace":
            assert out.count(anchor) == 1, anchor
    # the warp's end is recorded where its entry loop ends, and nothing else of the kernel is lost
    assert "if (base >= hi) break;" not in out
    assert len(out) > len(src)
    with pytest.raises(ValueError, match="anchor"):
        tl.instrumented_source(src.replace("        s_off[tid] = off;", "        s_off[tid]  = off;"))


def test_a_tune_geometry_variant_is_instrumented_too():
    """``--variant``: the kernel's defines set as ``bench/tune_geometry.py`` sets them, then the same stores."""
    src = (ROOT / "kernels_cu" / "verify_table.cu").read_text()
    (values,) = tg.parse_variants("verify_table", "2x4x1x1")
    out = tl.instrumented_source(tg.variant_source("verify_table", values, src))
    for define, value in (("KVC_VT_UNROLL", 2), ("KVC_VT_UNROLL_REAL_KV", 2), ("KVC_VT_BLOCKS_PER_SM", 4),
                          ("KVC_VT_STEP_IN_ROW", 1), ("KVC_VT_LEAD_ENTRY", 1)):
        assert re.search(rf"^#define {define} {value}$", out, re.M), define
    for anchor, _where, code in tl._PATCHES:
        assert out.count(code) == 1, anchor


def _row(table: str, name: str) -> list[float]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {name} |"))
    return [float(v) for v in line.strip("|").split("|")[1:]]


def test_report_ranks_the_blocks_of_each_sm_by_index():
    rng = np.random.default_rng(7)
    sms, per_sm, wpb = 3, 2, 2
    blocks, warps, durs = [], [], {0: [], 1: []}
    for b in range(sms * per_sm):
        sm = b % sms
        gen = 1 if b >= sms else 0
        start = 1000 - 50 * gen + int(rng.integers(0, 10))  # generation 1 starts first: the index tells, not the cycle
        dur = int(rng.integers(20_000, 30_000)) + 5_000 * gen
        durs[gen].append(dur)
        blocks.append([start * 2, start, sm, start + 100, start + 200, start + 300, (start + dur) * 2, start + dur])
        for w in range(wpb):
            warps.append([start + 400, start + dur - 10 * w, (start + dur) * 2, 3])
    table = tl.report(np.array(blocks, dtype=np.int64), np.array(warps, dtype=np.int64), 5000, wpb)
    for gen in (0, 1):
        name = f"block duration, generation {gen} ({sms} blocks; cycles)"
        p0, _, p50, _, top = _row(table, name)
        assert (p0, p50, top) == (min(durs[gen]), float(np.median(durs[gen])), max(durs[gen]))
    assert _row(table, "warp's steps") == [3.0] * 5
    span = max(b[6] for b in blocks) - min(b[0] for b in blocks)
    assert re.search(rf"kernel span {span} ns", table)
    # The blocks that end last, latest first, each with its end (ns after the first start) and duration (cycles).
    t0 = min(b[0] for b in blocks)
    order = sorted(range(len(blocks)), key=lambda i: -blocks[i][6])
    listed = re.search(r"blocks that end last \(.*?\): (.*)$", table, re.M).group(1)
    assert listed == ", ".join(f"{i}: {blocks[i][6] - t0}, {blocks[i][7] - blocks[i][1]}" for i in order)


def test_tune_table_keeps_a_row_per_timing_of_a_variant_named_twice():
    """Interleaved repeats (``--variants 2x4x1x0,2x4x1x4,2x4x1x0,2x4x1x4``) are the way to time two variants against
    the drift of one process: each timing gets its own row (the table once showed the last pair's numbers on every
    row of the same variant)."""
    variants = tg.parse_variants("verify_table", "2x4x1x0,2x4x1x4,2x4x1x0,2x4x1x4")
    cols = [("A", "shuffled", "NONE")]
    graph = {(i, "A", "shuffled", "NONE"): g for i, g in enumerate([15.52, 15.22, 15.85, 15.45])}
    eager = {k: 30.0 + i for i, k in enumerate(graph)}
    info = {((2, 4, 1, 0), "NONE"): (48, 0), ((2, 4, 1, 4), "NONE"): (54, 0)}
    rows = tg.table_lines("verify_table", variants, cols, eager, graph, info)[2:]
    assert [r.split("|")[4].strip() for r in rows] == ["30.00 / 15.52", "31.00 / 15.22", "32.00 / 15.85",
                                                       "33.00 / 15.45"]
    assert [r.split("|")[1].strip() for r in rows] == ["2 x 4 x 1 x 0", "2 x 4 x 1 x 4"] * 2
    assert [r.split("|")[2].strip() for r in rows] == ["48 / 0", "54 / 0"] * 2


def test_tune_verify_lens_shorten_each_row_within_its_stamped_prefix():
    """``--verify-lens``: ``stamped`` keeps the case's prefix (no tensor), ``N`` every row's first N positions (at most
    the stamped prefix), ``random:LO`` a seeded draw from ``[LO, prefix]`` per row, the same for the same seed."""
    assert tg.parse_verify_lens("stamped") is None
    assert tg.parse_verify_lens("8153") == (8153, False)
    assert tg.parse_verify_lens("random:4096") == (4096, True)
    for bad in ("random:", "x", "-3", "random:-1"):
        with pytest.raises(ValueError):
            tg.parse_verify_lens(bad)
    assert tg.verify_lens((8153, False), 4, 8192, 1).tolist() == [8153] * 4
    assert tg.verify_lens((9000, False), 3, 8192, 1).tolist() == [8192] * 3
    lens = tg.verify_lens((4096, True), 1024, 8192, 7)
    assert lens.dtype == torch.int64 and lens.shape == (1024,)
    assert int(lens.min()) >= 4096 and int(lens.max()) <= 8192 and len(set(lens.tolist())) > 500
    assert torch.equal(lens, tg.verify_lens((4096, True), 1024, 8192, 7))
    assert not torch.equal(lens, tg.verify_lens((4096, True), 1024, 8192, 8))
