"""The CUDA kernels, executed on the CPU, against the CPU reference (no GPU needed).

``support.cuda_emu`` compiles each kernel specialization's exact source with a host emulation of the CUDA
intrinsics the kernels use (one OS thread per CUDA thread; every ``__syncthreads`` and warp collective is a real
barrier, so one that not every thread reaches hangs and the timeout reports it) and routes the public ops on CPU
tensors through the CUDA backend: validation, the launchers' parameter packing, the grids and the kernels all
run. Each case runs the same op through the emulated CUDA path and through the reference on copies of one random
state (``support.table_cases``), poisoned outputs included, and compares every byte (violation rows as a
multiset: several threads append). Sizes are small (emulated threads are slow) but cross the kernels' tile and
chunk boundaries, and grids are sized for one SM, so several blocks share the work.

``test_kernels_sanitized.py`` runs this module again under AddressSanitizer and UndefinedBehaviorSanitizer.
``KVCANARY_EMU_CFLAGS=-fsanitize=thread`` (with ``LD_PRELOAD`` of libtsan) runs the kernels under ThreadSanitizer:
it reports races on global memory, but its view of shared-memory races is incomplete (the emulated barriers
synchronize more than a GPU does); compute-sanitizer's racecheck on the GPU is the reference for those.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary import RealKvHashMode as Mode
from kvcanary.ops.cuda import grids, specs
from kvcanary.ops.cuda import verify_table as cuda_verify_table
from support.cuda_emu import build, compiler, emulated_cuda
from support.gpu_util import assert_same_bytes, compare_logs, random_bytes, rng_for
from support.kernel_source import edited_copy, kernels_from
from support.table_cases import (
    make_canary_case,
    make_canary_cases,
    make_records_case,
    make_table_batch,
    make_write_tokens,
    record_stride,
    stamp_batch,
    to_device,
)

pytestmark = pytest.mark.skipif(compiler() is None, reason="no C++ compiler")


@pytest.fixture
def emu(monkeypatch):
    with emulated_cuda(monkeypatch, sms=1) as state:
        yield state


def _compare(cpu_cases, emu_cases) -> int:
    rows, seen = 0, set()
    for c, g in zip(cpu_cases, emu_cases):
        assert_same_bytes(c.canary, g.canary, "canary_buf")
        if id(c.log) not in seen:
            seen.add(id(c.log))
            assert int(c.log.index[0]) <= c.log.ring.shape[0], "ring too small for a multiset comparison"
            rows += compare_logs(c.log, g.log)
    return rows


def _ring(b, n_contexts=1) -> int:
    return n_contexts * (int(b.prefix_lens.clamp(min=0).sum()) + 4 * int(b.extend_seq_lens.clamp(min=0).sum())
                         + b.bs + 64)


def _setup(rng, *, block_size, window, pad_row, n_contexts, n_sources, mode, shared_log=False, n_active=8,
           max_blocks=None, max_extend=8, source_rows=None, stride=None):
    b = make_table_batch(rng, block_size=block_size, max_blocks=max_blocks or max(2, 128 // block_size),
                         pad_row=pad_row, window=window, token_offset=int(rng.integers(0, 2)), n_active=n_active,
                         max_reqs=n_active + 4, max_extend=max_extend)
    cases = make_canary_cases(rng, b.num_slots, n_contexts, n_sources=n_sources, mode=mode, shared_log=shared_log,
                              stride=stride or record_stride(rng), ring_capacity=_ring(b, n_contexts),
                              flag=int(rng.choice([0, 1])), source_rows=source_rows)
    for c in cases:
        stamp_batch(rng, c, b, corrupt=0.2)
    return b, cases


def _run(emu, op, make_kwargs, state):
    """``op(**make_kwargs(copy))`` on a reference copy and on an emulated-CUDA copy of ``state``."""
    ref, got = to_device(state, "cpu"), to_device(state, "cpu")
    op(**make_kwargs(ref))
    with emu.cuda():
        op(**make_kwargs(got))
    return ref, got


# ----------------------------------------------------------------------------------------------- verify


def _flat32_launched(emu) -> set[bool]:
    """The ``flat32`` flags of the verify-from-table modules launched so far."""
    return {bool(dict(zip(specs.family_flags(s.family), s.flags))["flat32"]) for s in emu.specs
            if s.family == "verify_table"}


@pytest.mark.parametrize("block_size, window, pad_row, n_contexts, mode", [
    (1, 0, 0, 1, Mode.NONE), (16, 7, -1, 2, Mode.PARTIAL), (64, 0, -1, 5, Mode.ALL), (4, 30, 0, 3, Mode.PARTIAL),
    (8, 7, 0, 2, Mode.NONE), (2, 0, -1, 3, Mode.NONE),  # several contexts without real KV
])
def test_verify_table_emulated(emu, vt_flat32, block_size, window, pad_row, n_contexts, mode):
    rng = rng_for("emu-verify_table", block_size, window, pad_row, n_contexts)
    b, cases = _setup(rng, block_size=block_size, window=window, pad_row=pad_row, n_contexts=n_contexts,
                      n_sources=int(rng.integers(1, 3)), mode=mode, shared_log=n_contexts == 3,
                      n_active=24 if block_size == 1 else 8, max_blocks=300 if block_size == 1 else None,
                      source_rows=None if mode != Mode.ALL else 3, stride=record_stride(rng, aligned=vt_flat32))
    inv = random_bytes(rng, (1,), torch.int32)
    # The per-position table with and without the expected-token check (the 32-bit modules have both).
    for paged, check in ((True, True), (False, False), (False, True)):
        ref, got = _run(emu, kc.launch_canary_verify_from_table,
                        lambda s, paged=paged, check=check: dict(
                            contexts=tuple(c.context() for c in s[1]), invalid_rows_out=s[2],
                            **s[0].verify_kwargs(paged, check_token=check)), (b, cases, inv))
        assert _compare(ref[1], got[1]) > 0
        assert_same_bytes(ref[2], got[2], "invalid_rows_out")
    assert {name for name, _, _ in emu.launched} == {"kvc_verify_from_table"}
    assert len(emu.launched) == 3 * (1 + (n_contexts - 1) // 4)
    # Each launch ran the smallest module compiled for its contexts (5 = a launch of 4, then one of 1).
    per_launch = [4, 1] if n_contexts == 5 else [n_contexts]
    assert emu.modules("verify_table") == sorted({specs.contexts_spec(n) for n in per_launch})
    # The block table always takes the 64-bit modules; the per-position one the 32-bit ones when they are on.
    assert _flat32_launched(emu) == {False, vt_flat32}


def test_flat32_modules_are_taken_only_within_their_bounds(monkeypatch):
    """``flat32_fits``: the 32-bit verify modules take a launch only when the switch is on, the table is per-position
    with rows of at most ``KVC_VT_FLAT32_MAX_SEQ_LEN`` positions, every context has at most
    ``KVC_VT_FLAT32_MAX_SLOTS`` slots, 16-byte aligned records, and the grid fewer than 2**24 threads; each bound
    is probed at its edge."""
    from types import SimpleNamespace as NS

    from kvcanary.ops.cuda.grids import Grid
    from kvcanary.ops.cuda.specs import int_define

    max_len = int_define("verify_table.cu", "KVC_VT_FLAT32_MAX_SEQ_LEN")
    max_slots = int_define("verify_table.cu", "KVC_VT_FLAT32_MAX_SLOTS")
    assert max_len * 256 + 2**24 <= 2**31 and max_slots == 2**31 - 1

    def table(cols, paged=False):
        return NS(paged=paged, array=NS(shape=(8, cols)))

    def ctx(num_slots=1000, stride=32, ptr=0x7F0000001000):
        return NS(num_slots=num_slots, slot_stride_bytes=stride, canary_buf=NS(ptr=ptr))

    grid = Grid(528, 256)
    fits = cuda_verify_table.flat32_fits
    monkeypatch.setattr(specs, "FLAT32", True)
    assert fits(table(max_len), (ctx(), ctx(num_slots=max_slots, stride=48)), grid)
    assert not fits(table(max_len + 1), (ctx(),), grid)
    assert not fits(table(64, paged=True), (ctx(),), grid)
    assert not fits(table(64), (ctx(), ctx(num_slots=max_slots + 1)), grid)
    assert not fits(table(64), (ctx(stride=40),), grid)
    assert not fits(table(64), (ctx(), ctx(ptr=0x7F0000001008)), grid)
    assert fits(table(64), (ctx(),), Grid(2**24 // 256 - 1, 256))
    assert not fits(table(64), (ctx(),), Grid(2**24 // 256, 256))
    monkeypatch.setattr(specs, "FLAT32", False)
    assert not fits(table(64), (ctx(),), grid)


@pytest.mark.parametrize("n_active, block_size, max_blocks, mode, n_contexts, paged", [
    (300, 2, 4, Mode.NONE, 1, True), (700, 4, 6, Mode.NONE, 2, True), (300, 2, 4, Mode.PARTIAL, 1, True),
    (700, 4, 6, Mode.PARTIAL, 2, True), (700, 4, 6, Mode.NONE, 1, False), (300, 2, 4, Mode.PARTIAL, 2, False),
])
def test_verify_table_emulated_many_rows(emu, vt_flat32, vt_steps, n_active, block_size, max_blocks, mode, n_contexts,
                                        paged):
    """More rows than a tile (256), so the kernel first walks every row for the batch total; each warp's share
    of the entries crosses tiles, and (the 700-row cases: about 8000 entries over 4 blocks) takes several steps.
    Without real KV a warp's steps are one contiguous range, with it they are grid-strided (steps that straddle
    a tile boundary continue in the next tile). Two contexts: each carries its own predecessor hash across steps.
    Block and per-position tables (an entry's cell from its row's s_cell0, published per tile)."""
    rng = rng_for("emu-verify_table-rows", n_active, mode.name, n_contexts, paged)
    b, cases = _setup(rng, block_size=block_size, window=0, pad_row=0, n_contexts=n_contexts,
                      n_sources=0 if mode == Mode.NONE else 1, mode=mode, n_active=n_active, max_blocks=max_blocks,
                      stride=record_stride(rng, aligned=vt_flat32))
    inv = random_bytes(rng, (1,), torch.int32)
    ref, got = _run(emu, kc.launch_canary_verify_from_table,
                    lambda s: dict(contexts=tuple(c.context() for c in s[1]), invalid_rows_out=s[2],
                                   **s[0].verify_kwargs(paged)),
                    (b, cases, inv))
    assert _compare(ref[1], got[1]) > 0
    assert_same_bytes(ref[2], got[2], "invalid_rows_out")
    assert _flat32_launched(emu) == {vt_flat32 and not paged}


LEAD_ALWAYS = 1 << 20  # KVC_VT_LEAD_ENTRY: the most steps of a range with a lead; this many: every range here


@contextlib.contextmanager
def _switched_kernels(tmp_path, source_file: str, names: tuple[str, ...], values) -> Iterator[None]:
    """Within the block the kernel source is a copy of ``kernels_cu/`` whose ``source_file`` has the int defines
    ``names`` set to ``values`` (the source's own values aside)."""
    def switched(text: str) -> str:
        for name, value in zip(names, values, strict=True):
            text = specs.set_int_define(text, name, value)
        return text

    with kernels_from(edited_copy(tmp_path / "kernels_cu", source_file, switched)):
        yield


@pytest.fixture(params=[(0, 0, 0, 0, 0), (1, 0, 0, 0, 0), (1, 1, 0, 0, 0), (0, LEAD_ALWAYS, 0, 0, 0),
                        (1, LEAD_ALWAYS, 0, 0, 0), (1, 0, 1, 0, 0), (1, LEAD_ALWAYS, 1, 0, 0), (1, 0, 0, 1, 0),
                        (1, 4, 0, 1, 0), (0, LEAD_ALWAYS, 0, 1, 0), (0, LEAD_ALWAYS, 0, 0, 1), (1, 4, 0, 1, 1),
                        (1, LEAD_ALWAYS, 1, 0, 1)],
                ids=["rows-searched", "step-in-row", "step-in-row+lead-1-step", "lead", "step-in-row+lead",
                     "in-row-copy", "in-row-copy+lead", "step-in-row+rebase", "step-in-row+lead-4-steps+rebase",
                     "lead+rebase", "lead+hashes-first", "step-in-row+lead-4-steps+rebase+hashes-first",
                     "in-row-copy+lead+hashes-first"])
def vt_steps(request, tmp_path) -> Iterator[tuple[int, int, int, int, int]]:
    """``kernels_cu/`` with ``KVC_VT_STEP_IN_ROW``, ``KVC_VT_LEAD_ENTRY``, ``KVC_VT_IN_ROW_SPLIT``,
    ``KVC_VT_REBASE`` and ``KVC_VT_HASH_ILP`` set to the parameter's five values, the last also as
    ``KVC_VT_HASH_ILP_64`` (a copy; the source's own values aside): the ways a warp's step without real KV may take
    its rows, its first entry's predecessor and the rest of a step inside one row, how a block whose range straddles
    a tile boundary walks its tiles, and whether a step's hashes come before its checks (1) in the 32-bit and the
    64-bit modules alike. ``lead-1-step``: the lead compiled in but taken only by ranges of one step, so most ranges
    here go without (an even ``per``)."""
    with _switched_kernels(tmp_path, "verify_table.cu",
                           ("KVC_VT_STEP_IN_ROW", "KVC_VT_LEAD_ENTRY", "KVC_VT_IN_ROW_SPLIT", "KVC_VT_REBASE",
                            "KVC_VT_HASH_ILP", "KVC_VT_HASH_ILP_64"),
                           request.param + request.param[-1:]):
        yield request.param


def _range_per(total: int, warps: int, lead: int) -> int:
    """The entries of each warp's range (``kvc_vt_ranges``): whole 64-entry steps, or, with leads (a range and its
    lead in at most ``lead`` steps, ``KVC_VT_LEAD_ENTRY``), one less."""
    per = math.ceil(total / warps)
    return (per + 64) // 64 * 64 - 1 if per // 64 + 1 <= lead else math.ceil(per / 64) * 64


@pytest.mark.parametrize("n_active, block_size, max_seq_len, window, n_contexts, check_token", [
    (10, 64, 2048, 0, 1, False), (10, 1, 2048, 1200, 2, True), (10, 16, 2048, 0, 2, True), (300, 16, 128, 0, 1, True),
])
def test_verify_table_emulated_steps_inside_rows(emu, vt_flat32, vt_steps, n_active, block_size, max_seq_len,
                                                 window, n_contexts, check_token):
    """Long rows over one SM's 32 warps: many of a warp's 64-entry steps (without real KV) lie inside one row that
    began before the step, which KVC_VT_STEP_IN_ROW takes without a per-entry row search; the others hold a row's
    start, the start of the warp's range (with KVC_VT_LEAD_ENTRY, its lead: the previous warp's last entry,
    loaded and hashed, not checked) or its end. With a SWA window (entries from the window start, slots
    through the LUT), expected tokens, two contexts (each carries its own hash across steps) and a fifth of the
    records corrupted, so violations fall inside such steps. 300 rows are two tiles: a warp's range that began in
    the first goes on in the second from its tile-local entry 0, so its end there falls anywhere in a step."""
    rng = rng_for("emu-verify_table-in-row", n_active, block_size, window, n_contexts)
    # A batch too short for several steps per warp (rare: seen once, 3,924 entries of 10 rows) is drawn again.
    for _ in range(8):
        b, cases = _setup(rng, block_size=block_size, window=window, pad_row=0, n_contexts=n_contexts, n_sources=0,
                          mode=Mode.NONE, n_active=n_active, max_blocks=max_seq_len // block_size,
                          stride=record_stride(rng, aligned=vt_flat32))
        entries = b.prefix_lens[torch.as_tensor(b.active_rows())].clamp(min=0)
        total = int((entries.clamp(max=window) if window else entries).sum())
        if total >= 32 * 2 * 64:
            break
    assert total >= 32 * 2 * 64, "few steps per warp"
    ref, got = _run(emu, kc.launch_canary_verify_from_table,
                    lambda s: dict(contexts=tuple(c.context() for c in s[1]),
                                   **s[0].verify_kwargs(False, check_token=check_token)), (b, cases))
    assert _compare(ref[1], got[1]) > 0
    assert _flat32_launched(emu) == {vt_flat32}


def test_verify_table_emulated_step_in_row_at_a_range_end(emu, vt_flat32, vt_steps):
    """A warp's range that began in the first tile goes on in the second from tile-local entry 0, so its end there
    is not a whole number of steps away: a step inside a long row that passes the range end must stop there (the
    next warp verifies the rest; verified twice, an entry's violation would be logged twice). Built so: 256 rows of
    one or two entries (273 in all), then long rows whose positions past the allocated blocks are out of range, so
    the entries at that range end are violations."""
    rng = rng_for("emu-verify_table-range-end")
    b = make_table_batch(rng, block_size=16, max_blocks=64, n_active=262, max_reqs=266, n_padding=0, n_invalid=0,
                         bad_blocks=0, max_extend=1, shuffle=False)
    b.prefix_lens[:256] = 1
    b.prefix_lens[:17] = 2
    b.prefix_lens[256:] = 1024
    cases = make_canary_cases(rng, b.num_slots, 1, n_sources=0, mode=Mode.NONE, stride=record_stride(rng, aligned=True),
                              ring_capacity=_ring(b))
    stamp_batch(rng, cases[0], b, corrupt=0.2)
    # The warp whose range holds entry 273 (the second tile's first): its tile-local end, hi, must fall inside a
    # step of its own, inside the first long row.
    grid = grids.verify_table_grid(False, 1)
    warps = grid.blocks * grid.threads // 32
    per = _range_per(int(b.prefix_lens.sum()), warps, vt_steps[1])
    hi = (273 // per + 1) * per - 273
    assert hi % 64 != 0 and 64 < hi < 1024, (warps, per, hi)
    ref, got = _run(emu, kc.launch_canary_verify_from_table,
                    lambda s: dict(contexts=(s[1][0].context(),), **s[0].verify_kwargs(False)), (b, cases))
    assert _compare(ref[1], got[1]) > 0
    assert _flat32_launched(emu) == {vt_flat32}


def test_verify_table_emulated_ranges_at_rows_and_tiles(emu, vt_flat32, vt_steps):
    """Warps' ranges that start at a row's first entry and at the second tile's first entry. 256 rows of 19 or 20
    entries (5,100: 20 ranges of 255), then 12 rows of 255 (a SWA window of 255 over longer prefixes, so each
    starts at a position > 0 whose predecessor is looked up in the table). With KVC_VT_LEAD_ENTRY a range holds
    255 entries: warp 20's starts the second tile (no lead there: its first entry's predecessor is looked up) and
    warps 21-31 take one long row each, their lead the previous row's last entry (loaded and hashed, not checked;
    checked twice, its violation would be logged twice). With KVC_VT_REBASE block 2 (warps 16-23, from entry 4,080 or
    4,096) walks a tile from its first entry's row, so warp 20's range starts inside that tile, at its lead when
    ranges take one. Without the lead the ranges (256) fall elsewhere. A fifth
    of the records corrupted, some slots out of range. The first row is pool row 0 (its window starts at position
    0): a lead wrongly taken before the first tile's first entry would read the int before the table, which the
    sanitized run of this module (test_kernels_sanitized.py) reports."""
    rng = rng_for("emu-verify_table-leads")
    while True:  # every pool row is some row's; pool row 0's prefix long enough for a first-tile share
        b = make_table_batch(rng, block_size=16, max_blocks=128, n_active=268, max_reqs=268, n_padding=0,
                             n_invalid=0, window=255, max_extend=1, pad_row=-1)
        zero = int(np.flatnonzero(b.req_pool_indices.numpy() == 0)[0])
        if int(b.prefix_lens[zero]) >= 20:
            break
    orig = b.prefix_lens.numpy().copy()
    order = np.argsort(orig, kind="stable")  # the 12 longest prefixes last: the second tile
    order = np.concatenate([[zero], order[order != zero]])  # pool row 0 first
    pre = orig[order].copy()
    short = np.minimum(pre[:256], np.where(np.arange(256) < 20, 19, 20))
    for i in np.flatnonzero(pre[:256] > short):  # rows too short for their share: the others take it
        short[i] += min(int(pre[i] - short[i]), 5100 - int(short.sum()))
    pre[:256] = short
    pre[256:] = 255 + rng.integers(1, 100, 12)
    assert short.sum() == 5100 and (pre <= orig[order]).all(), "prefixes only shortened (their blocks are held)"
    for name in ("req_pool_indices", "prefix_lens", "extend_seq_lens", "expected_valid_lens"):
        setattr(b, name, getattr(b, name)[torch.as_tensor(order)].clone())
    b.prefix_lens.copy_(torch.as_tensor(pre))
    assert int(b.req_pool_indices[0]) == 0 and 0 < int(b.prefix_lens[0]) <= 255
    cases = make_canary_cases(rng, b.num_slots, 1, n_sources=0, mode=Mode.NONE, stride=record_stride(rng, aligned=True),
                              ring_capacity=_ring(b))
    stamp_batch(rng, cases[0], b, corrupt=0.2)
    grid = grids.verify_table_grid(False, 1)
    assert grid.blocks * grid.threads // 32 == 32
    assert _range_per(5100 + 12 * 255, 32, vt_steps[1]) == (255 if vt_steps[1] >= 4 else 256)
    ref, got = _run(emu, kc.launch_canary_verify_from_table,
                    lambda s: dict(contexts=(s[1][0].context(),), **s[0].verify_kwargs(False)), (b, cases))
    assert _compare(ref[1], got[1]) > 0
    assert _flat32_launched(emu) == {vt_flat32}


def test_verify_table_emulated_block_range_across_tiles(emu, vt_flat32, vt_steps):
    """A block whose range starts inside the first tile, past its first row, and ends in the second: 300 rows of 20
    entries over one SM's 4 blocks of 8 warps. Block 3's range (ranges of 191 or 192 entries) starts in row 229 or 230
    and ends past the first tile's 5,120 entries, so with KVC_VT_REBASE it walks a tile from that row (its first
    entries, and with leads the lead, tile-local from there); without it, its warps past entry 5,120 take them in
    the second tile. A fifth of the records corrupted, so violations fall on both sides of the boundary. A new walk
    state one entry off fails this test with every rebase parameter."""
    rng = rng_for("emu-verify_table-block-across-tiles")
    b = make_table_batch(rng, block_size=16, max_blocks=4, n_active=300, max_reqs=301, n_padding=0, n_invalid=0,
                         bad_blocks=0, max_extend=1, shuffle=False)
    b.prefix_lens[:] = 20
    cases = make_canary_cases(rng, b.num_slots, 1, n_sources=0, mode=Mode.NONE, stride=record_stride(rng, aligned=True),
                              ring_capacity=_ring(b))
    stamp_batch(rng, cases[0], b, corrupt=0.2)
    grid = grids.verify_table_grid(False, 1)
    warps_per_block = grid.threads // 32
    total, first_tile = int(b.prefix_lens.sum()), int(b.prefix_lens[:256].sum())
    per = _range_per(total, grid.blocks * warps_per_block, vt_steps[1])
    start, end = 3 * warps_per_block * per, min(4 * warps_per_block * per, total)
    assert grid.blocks == 4 and 20 <= start < first_tile < end, (grid, per, start, end)
    ref, got = _run(emu, kc.launch_canary_verify_from_table,
                    lambda s: dict(contexts=(s[1][0].context(),), **s[0].verify_kwargs(False)), (b, cases))
    assert _compare(ref[1], got[1]) > 0
    assert _flat32_launched(emu) == {vt_flat32}


@pytest.mark.parametrize("stride", [32, 40])
def test_verify_table_emulated_slot_bounds(emu, vt_flat32, stride):
    """Slots at the edges of the bounds (SPEC §9) in a per-position table: num_slots - 1 (checked),
    num_slots and far beyond, -1 and INT32_MIN (out of range), 0 (skipped: its successor's prev is 0, no chain
    check whatever its stored prev_hash), each in lanes of warps whose other entries are clean (the cold path
    of one failing lane). Records of 40 bytes are not 16-byte aligned: the 64-bit modules take them even when the
    32-bit ones are on."""
    rng = rng_for("emu-verify_table-bounds", stride)
    b, cases = _setup(rng, block_size=1, window=0, pad_row=-1, n_contexts=1, n_sources=0, mode=Mode.NONE,
                      n_active=6, max_blocks=200, stride=stride)
    for c in cases:
        stamp_batch(rng, c, b, corrupt=0.0)
    ns = b.num_slots
    rows = [int(r) for r, p in zip(b.req_pool_indices.tolist(), b.prefix_lens.tolist())
            if 0 <= r < b.req_to_token.shape[0] and r != b.pad_row and 40 < p <= b.req_to_token.shape[1]]
    assert rows
    for k, slot in enumerate((ns - 1, ns, ns + 7, -1, -(2**31), 0, 0)):
        b.req_to_token[rows[k % len(rows)], 3 + 5 * k] = slot
    ref, got = _run(emu, kc.launch_canary_verify_from_table,
                    lambda s: dict(contexts=tuple(c.context() for c in s[1]), **s[0].verify_kwargs(False)),
                    (b, cases))
    assert _compare(ref[1], got[1]) > 0
    assert _flat32_launched(emu) == {vt_flat32 and stride % 16 == 0}


_FIND_ROW_PROBE = r"""
struct KvcProbeFindRow { const OFFSET* offsets; const OFFSET* es; int* out; long long n; };
// Warp w answers es[w], es[w + warps], ... with kvc_vt_warp_find_row (every lane calls it with the same e).
extern "C" __global__ void kvc_probe_warp_find_row(const KvcProbeFindRow p) {
    const int warps = (int)(blockDim.x >> 5);
    for (long long i = (long long)(threadIdx.x >> 5); i < p.n; i += warps) {
        const int r = kvc_vt_warp_find_row(p.offsets, p.es[i]);
        if ((threadIdx.x & 31) == 0) p.out[i] = r;
    }
}
"""


@pytest.mark.parametrize("flat32, offset, dtype", [(False, "long long", np.int64), (True, "int", np.int32)])
def test_verify_table_warp_find_row_emulated(flat32, offset, dtype):
    """kvc_vt_warp_find_row (the row of a warp's first entry in a tile) is the first row whose entries end past the
    entry, for every entry of tiles with empty rows (runs of them, at the start, across the 8-row vote groups and at
    the end) and one-entry rows. The verify kernel only starts its per-lane search there, so a row found too early
    would go unnoticed by the differential tests (only slower): this checks the exact row. The 64-bit modules' tile
    offsets are int64, the 32-bit modules' int32."""
    base = specs.spec_for("verify_table", has_lut=False, check_token=False, has_real_kv=False, contexts=1,
                          flat32=flat32)

    class Probe:  # the verify module's source with one probe kernel appended
        family, key, entry_points = "vt_probe", base.key + "+probe", ("kvc_probe_warp_find_row",)

        @staticmethod
        def source() -> str:
            return base.source() + _FIND_ROW_PROBE.replace("OFFSET", offset)

    lib = build(Probe)
    rng = np.random.default_rng(20261204)
    for case in range(4):
        lens = rng.choice([0, 0, 0, 1, 2, 5, 17], size=256).astype(np.int64)
        if case == 1:
            lens[:40] = 0  # an empty start, across five vote groups
        if case == 2:
            lens[200:] = 0  # an empty end: the last row with entries is 199
        if case == 3:
            lens[:] = 0
            lens[[7, 8, 63, 64, 255]] = [3, 1, 2, 4, 1]  # rows at the groups' edges
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(dtype)
        es = np.arange(int(offsets[-1]), dtype=dtype)
        out = np.full(es.size, -7, dtype=np.int32)
        args = np.zeros(1, dtype=[("offsets", "u8"), ("es", "u8"), ("out", "u8"), ("n", "i8")])
        args[0] = (offsets.ctypes.data, es.ctypes.data, out.ctypes.data, es.size)
        assert lib.emu_launch(b"kvc_probe_warp_find_row", 1, 64, args.ctypes.data) == 0
        want = np.searchsorted(offsets[1:], es, side="right")  # first r with offsets[r + 1] > e
        assert lens[want].min() > 0
        np.testing.assert_array_equal(out, want, err_msg=f"case {case}")


# ----------------------------------------------------------------------------------------------- write


@pytest.mark.parametrize("block_size, window, pad_row, n_contexts, mode, max_extend", [
    (1, 0, 0, 1, Mode.NONE, 6), (16, 7, -1, 2, Mode.PARTIAL, 40), (8, 0, 0, 5, Mode.ALL, 250),
])
def test_write_table_emulated(emu, block_size, window, pad_row, n_contexts, mode, max_extend):
    rng = rng_for("emu-write_table", block_size, window, pad_row, n_contexts)
    b, cases = _setup(rng, block_size=block_size, window=window, pad_row=pad_row, n_contexts=n_contexts,
                      n_sources=1, mode=mode, n_active=6, max_extend=max_extend,
                      max_blocks=max(4, (max_extend + 64) // block_size), source_rows=None)
    rows = 0
    for assert_on in (False, True):
        tokens = make_write_tokens(rng, b, assert_on=assert_on, short=int(assert_on), out_of_range=0.15)
        inv = random_bytes(rng, (1,), torch.int32)
        ref, got = _run(emu, kc.launch_canary_write_from_table,
                        # the count asked for in one pass and not in the other (the kernel then skips it)
                        lambda s, paged=assert_on: dict(contexts=tuple(c.context() for c in s[1]),
                                                        invalid_rows_out=s[3] if paged else None,
                                                        **s[0].write_kwargs(paged), **s[2].kwargs()),
                        (b, cases, tokens, inv))
        rows += _compare(ref[1], got[1])
        assert_same_bytes(ref[3], got[3], "invalid_rows_out")
        if not assert_on:
            assert_same_bytes(ref[3], inv, "invalid_rows_out not passed, left as it was")
    assert rows > 0
    per_launch = [4, 1] if n_contexts == 5 else [n_contexts]
    assert emu.modules("write_table") == sorted({specs.contexts_spec(n) for n in per_launch})


def _write_table_cycle(emu, rng, *, extend_cycle, flag, tokens=None, edit_tokens=None, **batch):
    """A one-buffer write (no real KV) of a batch whose active rows' extend lengths follow ``extend_cycle``, through
    the emulated kernel and the reference (``tokens``: make_write_tokens's keyword arguments; ``edit_tokens``: called
    with the tokens before the write); returns the batch, the violation rows compared and the slots the reference
    stamped (its slot_run_counter's increase)."""
    b = make_table_batch(rng, block_size=16, extend_cycle=extend_cycle, **batch)
    cases = make_canary_cases(rng, b.num_slots, 1, n_sources=0, mode=Mode.NONE, ring_capacity=_ring(b),
                              stride=32, flag=flag)
    for c in cases:
        stamp_batch(rng, c, b, corrupt=0.2)
    new_tokens = make_write_tokens(rng, b, **(tokens or {}))
    if edit_tokens is not None:
        edit_tokens(new_tokens)
    before = int(cases[0].log.slot_counter[0])
    ref, got = _run(emu, kc.launch_canary_write_from_table,
                    lambda s: dict(contexts=tuple(c.context() for c in s[1]), **s[0].write_kwargs(False),
                                   **s[2].kwargs()), (b, cases, new_tokens))
    return b, _compare(ref[1], got[1]), int(ref[1][0].log.slot_counter[0]) - before


def test_write_table_emulated_short_long_boundary(emu):
    """Requests of kWriteShort (32) tokens take the warp path and of 33 the block path; a tile whose only long
    requests have 33 tokens must still run the long-request loop."""
    b, _, _ = _write_table_cycle(emu, rng_for("emu-write_table-boundary"), extend_cycle=(33, 32, 1), flag=0,
                                 max_blocks=8, pad_row=0, n_active=6, max_reqs=10)
    assert int(b.extend_seq_lens.max()) == 33


@pytest.mark.parametrize("sms, n_active, extend_cycle, n_invalid", [
    (1, 200, (1,), 0), (3, 600, (1,), 0), (3, 1100, (1,) * 1024 + (3, 1), 2), (1, 1100, (3, 1) + (1,) * 1098, 0),
    (5, 1100, (1,), 0), (5, 1100, (3, 1) + (1,) * 1098, 0), (4, 1100, (1,) * 1024 + (3, 1), 2)])
def test_write_table_emulated_one_token_tiles(monkeypatch, sms, n_active, extend_cycle, n_invalid):
    """Tiles whose rows all have one token take their token offsets from the rows' indices (no block scan): a
    whole decode batch (1 and 2 rows per thread), a tile of one-token rows then a mixed one (its offsets start
    after the first tile's tokens), and a mixed tile then a tile of one-token rows. Three blocks: a thread's rows
    are 256 apart, so their blocks (row mod 3) step by 256 mod 3 and wrap. With more than one row per thread and
    grids whose own rows fit one per thread (600 rows over 3 blocks; tiles of 1024 rows over 4 or 5) the tile is
    first checked for one token per row without the scan (kvc_wt_decode_rows): both tiles of a decode batch, a
    one-token tile after a mixed one (its offsets start after the first tile's tokens), and a mixed tile, whose
    check fails, then the scan; with fewer blocks (1100 rows over 1 or 3) the scan's own one-token shortcut."""
    with emulated_cuda(monkeypatch, sms=sms) as emu:
        b, rows, _ = _write_table_cycle(emu, rng_for("emu-write_table-ones", n_active, len(extend_cycle)),
                                        extend_cycle=extend_cycle, flag=1, max_blocks=4, pad_row=-1,
                                        n_active=n_active, n_padding=0, n_invalid=n_invalid, max_reqs=n_active + 4,
                                        shuffle=False)
    ext = b.extend_seq_lens.numpy()
    assert rows > 0 and b.bs == n_active + n_invalid
    if len(extend_cycle) > 1:  # two tiles of 1024 rows: exactly one of them all one-token rows
        assert b.bs > 1024 and (ext[:1024] == 1).all() != (ext[1024:] == 1).all()
    else:
        assert (ext == 1).all()


def test_write_table_emulated_many_rows(emu):
    """More rows than a tile of the row scan (1024), one token each (the warp path)."""
    rng = rng_for("emu-write_table-rows")
    b, cases = _setup(rng, block_size=1, window=0, pad_row=-1, n_contexts=2, n_sources=0, mode=Mode.NONE,
                      n_active=1100, max_blocks=6, max_extend=2)
    tokens = make_write_tokens(rng, b)
    ref, got = _run(emu, kc.launch_canary_write_from_table,
                    lambda s: dict(contexts=tuple(c.context() for c in s[1]), **s[0].write_kwargs(False),
                                   **s[2].kwargs()), (b, cases, tokens))
    _compare(ref[1], got[1])


@pytest.mark.parametrize("n_active", [300, 700])
def test_write_table_emulated_two_and_three_rows_per_thread(emu, n_active):
    """Batches of 257 .. 1024 rows: the row scan's multi-row code with 2 and 3 rows per thread (one tile), short
    and long requests mixed, so the tile runs both request loops."""
    b, rows, _ = _write_table_cycle(emu, rng_for("emu-write_table-items", n_active),
                                    extend_cycle=(1, 2, 33, 1, 0, 5), flag=1, max_blocks=4, pad_row=-1,
                                    n_active=n_active, max_reqs=n_active + 4)
    assert rows > 0
    assert 256 < b.bs <= 1024 and int(b.extend_seq_lens.max()) == 33


@pytest.mark.parametrize("sms, n_contexts, mode, window, assert_on, n_active, n_other", [
    (3, 1, Mode.NONE, 0, False, 40, 9), (3, 2, Mode.PARTIAL, 7, True, 40, 9), (1, 5, Mode.ALL, 0, True, 40, 9),
    (2, 1, Mode.NONE, 0, True, 300, 9), (3, 2, Mode.NONE, 0, True, 40, 0), (2, 1, Mode.NONE, 0, False, 900, 0),
    (4, 2, Mode.PARTIAL, 0, True, 900, 0), (4, 1, Mode.NONE, 7, False, 600, 0), (4, 1, Mode.NONE, 0, True, 600, 9),
])
def test_write_table_emulated_decode(monkeypatch, sms, n_contexts, mode, window, assert_on, n_active, n_other):
    """A decode batch (one token per active row) among padding and invalid rows: a block's one-token rows are
    written by the thread that scanned them, from token loads issued at the row's index (right until the first
    padding or invalid row, then reloaded at the row's token offset) and seed records loaded during the scan; rows
    with a bad seed (out of the buffer, a LUT miss) or a token range past the arrays go to the warp loop. Grids of
    2 or 3 blocks (each block writes the rows r mod G == its index) and of one block with two rows per thread
    (its second row goes to the warp loop); the tokens' slots include -1 and out-of-range ones. ``n_other``: padding
    and invalid rows; with none every row has one token, so the tile's token offsets are the rows' indices,
    published without the block scan, and the warp loop's rows (bad seeds, short token arrays) start from them.
    Four blocks and 600 or 900 rows (2 to 4 rows per thread, a block's own rows fit one per thread): the tile is
    first checked without the scan (kvc_wt_decode_rows), whose own rows are written by the first threads of the
    block; with padding or invalid rows the check fails and the scan runs."""
    _write_table_decode_case(monkeypatch, sms, n_contexts, mode, window, assert_on, n_active, n_other)


@pytest.mark.parametrize("sms, n_active", [(4, 600), (2, 200)])
def test_write_table_emulated_decode_inactive_one_token_rows(monkeypatch, sms, n_active):
    """Padding and invalid rows whose extend length is 1, among one-token rows: they write nothing and take no
    tokens (SPEC §5), so the tile is not a decode tile although every extend length is 1 (the check without the
    scan must fail on them, and the scan's own shortcut too)."""
    _write_table_decode_case(monkeypatch, sms, 1, Mode.NONE, 0, True, n_active, 9, inactive_extend_one=True)


def _write_table_decode_case(monkeypatch, sms, n_contexts, mode, window, assert_on, n_active, n_other,
                             inactive_extend_one=False, flag=1):
    """One decode batch, written through the emulated kernel and the reference (tokens full and short by 2)."""
    rng = rng_for("emu-write_table-decode", sms, n_contexts, int(mode), assert_on,
                  *(("inactive-ones",) if inactive_extend_one else ()))
    b = make_table_batch(rng, block_size=4, extend_cycle=(1,), n_active=n_active, n_padding=5 * (n_other > 0),
                         n_invalid=n_other - 5 * (n_other > 0),
                         max_reqs=n_active + 4, max_blocks=6, pad_row=-1, window=window)
    if inactive_extend_one:
        b.extend_seq_lens.fill_(1)
    cases = make_canary_cases(rng, b.num_slots, n_contexts, n_sources=0 if mode == Mode.NONE else 2, mode=mode,
                              ring_capacity=_ring(b, n_contexts), stride=int(rng.choice([32, 40])), flag=flag)
    for c in cases:
        stamp_batch(rng, c, b, corrupt=0.2)
    rows = 0
    for short in (0, 2):
        tokens = make_write_tokens(rng, b, assert_on=assert_on, short=short, out_of_range=0.1, skip=0.1)
        inv = random_bytes(rng, (1,), torch.int32)
        state = (b, cases, tokens, inv)
        ref, got = to_device(state, "cpu"), to_device(state, "cpu")

        def kwargs(s):
            return dict(contexts=tuple(c.context() for c in s[1]), invalid_rows_out=s[3], **s[0].write_kwargs(True),
                        **s[2].kwargs())

        kc.launch_canary_write_from_table(**kwargs(ref))
        with emulated_cuda(monkeypatch, sms=sms) as emu, emu.cuda():
            kc.launch_canary_write_from_table(**kwargs(got))
        rows += _compare(ref[1], got[1])
        assert_same_bytes(ref[3], got[3], "invalid_rows_out")
        for c, c0 in zip(ref[1], cases):  # the batch stamps slots in every context
            assert int(c.log.slot_counter[0]) > int(c0.log.slot_counter[0])
    assert rows > 0
    assert int((b.extend_seq_lens == 1).sum()) >= n_active
    assert bool((b.extend_seq_lens == 1).all()) == (n_other == 0 or inactive_extend_one) and b.bs == n_active + n_other


@pytest.mark.parametrize("sms, n_active, n_other, inactive_extend_one, flag", [
    (7, 49, 0, False, 0), (7, 40, 9, False, 1), (6, 20, 9, True, 0), (3, 9, 0, False, 1), (3, 40, 9, False, 0)])
def test_write_table_emulated_decode_one_row_scan(monkeypatch, sms, n_active, n_other, inactive_extend_one, flag):
    """A batch of one row per thread (at most 256 rows: the row scan, kvc_wt_rows<1>) over G blocks: a decode
    batch (every row one token: the barrier that publishes the rows finds it so, and their offsets are their
    indices), one with padding and invalid rows (the barrier finds a row without one token and the block scan
    runs), inactive rows of extend 1, nine rows on three blocks; the chain position flags on (1) and off (0)."""
    _write_table_decode_case(monkeypatch, sms, 2 if n_other else 1, Mode.NONE, 0, True, n_active, n_other,
                             inactive_extend_one=inactive_extend_one, flag=flag)
    assert n_active + n_other <= 256


@pytest.mark.parametrize("sms, n_active, short", [(6, 30, 0), (6, 30, 90), (3, 4, 0)])
def test_write_table_emulated_mixed_one_row_scan(monkeypatch, sms, n_active, short):
    """Short, long, empty and one-token requests in a tile of one row per thread: both request loops run after the
    row scan. With token arrays 90 short, one-token rows whose index is inside the arrays start past them (the first
    publish took them for written; after the scan the warp loop logs them)."""
    with emulated_cuda(monkeypatch, sms=sms) as emu:
        b, rows, _ = _write_table_cycle(emu, rng_for("emu-write_table-one-row-scan", sms, n_active, short),
                                        extend_cycle=(1, 2, 33, 1, 0, 5), flag=1, max_blocks=4, pad_row=-1,
                                        n_active=n_active, max_reqs=n_active + 4, tokens=dict(short=short))
    assert rows > 0 and b.bs <= 256 and int(b.extend_seq_lens.max()) == 33


def test_write_table_emulated_one_token_tile_after_a_mixed_tile(monkeypatch):
    """A one-token tile after a mixed tile, on one block: the second tile (376 rows, more than one per thread, so
    the row scan rather than the check without it) has one token per row, but its tokens start two past their
    rows' indices (the first row has three), so the tokens each thread loaded at its row's index (its guess) are not
    its own and must be reloaded before the write (kvc_wt_single). Every other pair of slots is -1, so a token two
    places on is never stamped alike: records or counts from the guessed tokens would differ from the reference's."""
    def every_other_pair_unstamped(tokens):
        k = torch.arange(tokens.out_cache_loc.shape[0])
        tokens.out_cache_loc[(k // 2) % 2 == 0] = -1

    with emulated_cuda(monkeypatch, sms=1) as emu:
        b, _, stamped = _write_table_cycle(emu, rng_for("emu-write_table-one-token-tile-after-mixed"),
                                           extend_cycle=(3, 1) + (1,) * 1398, flag=1, max_blocks=4, pad_row=-1,
                                           n_active=1400, n_padding=0, n_invalid=0, max_reqs=1404, shuffle=False,
                                           tokens=dict(skip=0.0, out_of_range=0.0),
                                           edit_tokens=every_other_pair_unstamped)
    ext = b.extend_seq_lens.numpy()
    assert b.bs == 1400 and ext[0] == 3 and (ext[1:] == 1).all()
    assert stamped > 0

# ------------------------------------------------------------------------------- the SGLang-named ops


@pytest.mark.parametrize("paged, mode, max_extend, n_sources, stride", [
    (True, Mode.PARTIAL, 40, 2, 32), (False, Mode.NONE, 300, 2, 48), (True, Mode.ALL, 60, 4, 40)])
def test_plan_verify_write_emulated(emu, paged, mode, max_extend, n_sources, stride):
    """plan (block table or req_to_token), verify and write of the SGLang-named ops, sources covering fewer
    slots than the canary, requests on both the warp and the block path of the write."""
    rng = rng_for("emu-sglang", paged, int(mode))
    b = make_table_batch(rng, block_size=4, max_blocks=(max_extend + 64) // 4, n_active=6, max_reqs=10,
                         max_extend=max_extend, window=5 if paged else 0)
    case = make_canary_case(rng, b.num_slots, n_sources=n_sources, mode=mode, page_size=2, stride=stride,
                            source_rows=b.num_slots // 3, ring_capacity=_ring(b))
    stamp_batch(rng, case, b, corrupt=0.2)
    tokens = make_write_tokens(rng, b, assert_on=True)
    cap = 1 + int(b.prefix_lens.clamp(min=0).sum())
    plans = (random_bytes(rng, (cap,), torch.int64), random_bytes(rng, (b.bs + 3,), torch.int64))

    def step(s):
        bb, cc, tt, (vslots, woffs) = s
        vp = kc.VerifyPlan.allocate(verify_capacity=cap)
        vp.verify_slot_indices.copy_(vslots)
        wp = kc.WritePlan.allocate(write_req_capacity=b.bs + 2)
        wp.write_offsets.copy_(woffs)
        inv = torch.zeros(1, dtype=torch.int32)
        kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, verify_capacity=cap,
                                      invalid_rows_out=inv, **bb.plan_kwargs(paged))
        kc.launch_canary_verify_kernel(context=cc.context(), plan=vp, check_verify_expected_token=True)
        kc.launch_canary_write_kernel(context=cc.context(), plan=wp, **tt.kwargs())
        return vp, wp, inv

    ref_state, got_state = to_device((b, case, tokens, plans), "cpu"), to_device((b, case, tokens, plans), "cpu")
    ref = step(ref_state)
    with emu.cuda():
        got = step(got_state)
    for name in ("verify_slot_indices", "verify_expected_tokens", "verify_expected_positions",
                 "verify_prev_slot_indices", "verify_num_valid", "enable"):
        assert_same_bytes(getattr(ref[0], name), getattr(got[0], name), name)
    for name in ("write_offsets", "write_seed_slot_indices", "write_num_valid_reqs"):
        assert_same_bytes(getattr(ref[1], name), getattr(got[1], name), name)
    assert_same_bytes(ref[2], got[2], "invalid_rows")
    assert _compare([ref_state[1]], [got_state[1]]) > 0
    assert {n for n, _, _ in emu.launched} == {"kvc_plan_verify_offsets", "kvc_plan_verify_entries",
                                               "kvc_plan_write_meta", "kvc_verify", "kvc_write"}


# ----------------------------------------------------------------------------------------------- records


def test_records_emulated(emu):
    rng = rng_for("emu-records")
    case = make_records_case(rng, n=700, num_slots=500, stride=40, other_slots=800, other_stride=48)
    ops = [
        (kc.gather_canary_records, lambda c: dict(canary_buf=c.canary, slots=c.slots, records_out=c.records_out,
                                                  out_of_range_out=c.out_of_range)),
        (kc.scatter_canary_records, lambda c: dict(canary_buf=c.other, slots=c.dst_slots, records=c.records,
                                                   out_of_range_out=c.out_of_range)),
        (kc.copy_canary_records, lambda c: dict(src_canary_buf=c.canary, src_slots=c.slots, dst_slots=c.dst_slots,
                                                dst_canary_buf=c.other, out_of_range_out=c.out_of_range)),
    ]
    for op, kw in ops:
        ref, got = _run(emu, op, kw, case)
        for name in ("canary", "other", "records_out", "out_of_range"):
            assert_same_bytes(getattr(ref, name), getattr(got, name), f"{op.__name__}: {name}")
        assert int(ref.out_of_range[0]) > 0
    assert {n for n, _, _ in emu.launched} == {"kvc_gather_records", "kvc_scatter_records", "kvc_copy_records"}


def test_scatter_request_tokens_emulated(emu):
    rng = rng_for("emu-scatter")
    bs, cols = 40, 37
    rp = rng.permutation(np.arange(60))[:bs]
    lens = rng.integers(0, cols + 5, bs)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    flat = rng.integers(-(1 << 40), 1 << 40, int(offsets[-1]))
    pool = random_bytes(rng, (60, cols), torch.int32)
    state = (torch.from_numpy(flat), torch.from_numpy(offsets), torch.from_numpy(rp.astype(np.int64)), pool)
    ref, got = _run(emu, kc.launch_scatter_req_token_ids_kernel,
                    lambda s: dict(flat_in=s[0], offsets=s[1], req_pool_indices=s[2], pool_out=s[3]), state)
    assert_same_bytes(ref[3], got[3], "pool_out")


def _repeat_slots_within_requests(rng, b, tokens, k: int) -> int:
    """Make ``k`` tokens name the slot of an earlier token of the same request (the later token's record wins,
    every stamp counts). Returns the number of repeats made."""
    rows = b.active_rows()
    wl = np.maximum(b.extend_seq_lens.numpy()[rows], 0)
    starts = np.concatenate([[0], np.cumsum(wl)])
    loc = tokens.out_cache_loc.numpy()  # shares memory with the tensor
    n = len(loc)
    made = 0
    for _ in range(k):
        r = int(rng.integers(0, len(rows)))
        lo, hi = int(starts[r]), min(int(starts[r + 1]), n)
        if hi - lo < 2:
            continue
        i, j = sorted(rng.choice(np.arange(lo, hi), 2, replace=False))
        if loc[i] >= 0:
            loc[j] = loc[i]
            made += 1
    return made


@pytest.mark.parametrize("max_extend", [20, 300])
def test_write_repeated_slots_emulated(emu, max_extend):
    """Slots repeated inside a request, on the warp path (<= 32 tokens) and across and inside the tiles of the
    block path: the plan-free write (two contexts) and the SGLang-named write keep the later token's record."""
    rng = rng_for("emu-repeat", max_extend)
    b, cases = _setup(rng, block_size=4, window=0, pad_row=0, n_contexts=2, n_sources=1, mode=Mode.PARTIAL,
                      n_active=6, max_extend=max_extend, max_blocks=(max_extend + 64) // 4)
    tokens = make_write_tokens(rng, b, skip=0.0, out_of_range=0.0, misplaced=0.0)
    assert _repeat_slots_within_requests(rng, b, tokens, 60) > 10
    ref, got = _run(emu, kc.launch_canary_write_from_table,
                    lambda s: dict(contexts=tuple(c.context() for c in s[1]), **s[0].write_kwargs(True),
                                   **s[2].kwargs()), (b, cases, tokens))
    _compare(ref[1], got[1])

    def two_pass(s):
        bb, cc, tt = s
        vp = kc.VerifyPlan.allocate(verify_capacity=1 + int(b.prefix_lens.clamp(min=0).sum()))
        wp = kc.WritePlan.allocate(write_req_capacity=b.bs)
        kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, verify_capacity=vp.capacity,
                                      **bb.plan_kwargs(False))
        kc.launch_canary_write_kernel(context=cc[0].context(), plan=wp, **tt.kwargs())

    ref, got = to_device((b, cases, tokens), "cpu"), to_device((b, cases, tokens), "cpu")
    two_pass(ref)
    with emu.cuda():
        two_pass(got)
    _compare(ref[1][:1], got[1][:1])


def test_sglang_verify_relaunches_prepared_words_until_an_array_changes(emu):
    """The SGLang-named verify packs a (context, plan)'s words once and relaunches them while the validation cache
    reuses their views; a canary buffer swapped in place (``set_``: new address) is validated again and verified
    at its new address, never through the stale words. Each call is held against the reference on the same state."""
    from kvcanary.ops.cuda import launch as L

    rng = rng_for("emu-sglang-prepared")
    b = make_table_batch(rng, block_size=4, max_blocks=20, n_active=5, max_reqs=8, max_extend=20, window=0)
    case = make_canary_case(rng, b.num_slots, n_sources=1, mode=Mode.PARTIAL, page_size=2, stride=32,
                            source_rows=b.num_slots, ring_capacity=4 * _ring(b))
    stamp_batch(rng, case, b, corrupt=0.2)
    cap = 1 + int(b.prefix_lens.clamp(min=0).sum())
    vslots = random_bytes(rng, (cap,), torch.int64)
    swapped = random_bytes(rng, tuple(case.canary.shape), torch.uint8)

    def run(s, on_emu):
        bb, cc, vs, sw = s
        vp = kc.VerifyPlan.allocate(verify_capacity=cap)
        vp.verify_slot_indices.copy_(vs)
        kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=kc.WritePlan.allocate(
            write_req_capacity=bb.bs + 2), verify_capacity=cap, **bb.plan_kwargs(False))
        ctx = cc.context()  # one context object, reused as an engine would
        counts = []
        for i in range(3):
            if i == 2:
                cc.canary.set_(sw)  # the buffer replaced under the same tensor object
            if on_emu:
                with emu.cuda():
                    kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True)
                counts.append(len(L._prepared))
            else:
                kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True)
        return counts

    ref_state = to_device((b, case, vslots, swapped), "cpu")
    got_state = to_device((b, case, vslots, swapped), "cpu")
    run(ref_state, False)
    counts = run(got_state, True)
    assert counts == [1, 1, 2], counts  # packed once, reused, packed again for the new address
    assert sum(n == "kvc_verify" for n, _, _ in emu.launched) == 3
    assert _compare([ref_state[1]], [got_state[1]]) > 0
    assert_same_bytes(ref_state[1].canary, got_state[1].canary, "canary_buf (the swapped-in one)")
