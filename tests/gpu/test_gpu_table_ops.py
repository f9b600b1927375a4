"""Plan-free verify and write (SPEC §11, §12) on the GPU vs the CPU reference, byte for byte, on fresh random
batches (``support.table_cases``: both table forms, block sizes 1 / 16 / 64, padding rows with ``pad_row`` 0 and
-1, invalid rows, out-of-range and negative block ids, SWA windows with a LUT and LUT misses, expected tokens with
the EAGLE +1 offset), poisoned canary buffers and logs, several contexts (more than one launch's four are split),
any number of real-KV sources (64 included), sources covering fewer slots than the canary. Rows are compared as
a multiset (many GPU threads append), everything else byte for byte; the from-table ops are also compared with
plan -> verify and plan -> write on the GPU, and a block table with the ``req_to_token`` it expands to.

Test names carry the kernel family (``verify_table``, ``write_table``) so run_all.sh's racecheck pass selects them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary import RealKvHashMode as Mode
from support.gpu_util import SMALL, assert_same_bytes, compare_logs, random_bytes, rng_for, size
from support.table_cases import (
    CanaryCase,
    TableBatch,
    WriteTokens,
    make_canary_case,
    make_canary_cases,
    make_table_batch,
    make_write_tokens,
    record_stride,
    stamp_batch,
    to_device,
)


def ring_for(batch: TableBatch, n_contexts: int = 1, extra_tokens: int = 0) -> int:
    """A ring big enough for every row a launch may append (which rows land in a full ring is unspecified)."""
    entries = int(batch.prefix_lens.clamp(min=0).sum()) + 3 * int(batch.extend_seq_lens.clamp(min=0).sum())
    return n_contexts * (entries + 3 * extra_tokens + batch.bs) + 64


def setup(rng, *, block_size, window, pad_row, n_contexts=2, shared_log=False, n_sources=1, mode=Mode.PARTIAL,
          n_active=None, max_blocks=None, max_extend=8, source_rows=None, corrupt=0.2, stride=None, **kw):
    n_active = n_active if n_active is not None else size(40, 8)
    b = make_table_batch(rng, block_size=block_size, max_blocks=max_blocks or max(2, size(512, 96) // block_size),
                         pad_row=pad_row, window=window, token_offset=int(rng.integers(0, 2)), n_active=n_active,
                         max_reqs=n_active + 4, max_extend=max_extend, **kw)
    cases = make_canary_cases(rng, b.num_slots, n_contexts, n_sources=n_sources, mode=mode, shared_log=shared_log,
                              stride=stride or record_stride(rng), ring_capacity=ring_for(b, n_contexts, 64),
                              flag=int(rng.choice([0, 1])), source_rows=source_rows)
    for c in cases:
        stamp_batch(rng, c, b, corrupt=corrupt)
    return b, cases


def compare_cases(cpu: list[CanaryCase], gpu: list[CanaryCase]) -> int:
    """Canary bytes equal; each distinct log equal (rows as a multiset). Returns the rows appended."""
    rows, seen = 0, set()
    for c, g in zip(cpu, gpu):
        assert_same_bytes(c.canary, g.canary, "canary_buf")
        if id(c.log) in seen:
            continue
        seen.add(id(c.log))
        assert int(c.log.index[0]) <= c.log.ring.shape[0], "test ring too small: which rows land is unspecified"
        rows += compare_logs(c.log, g.log)
    return rows


def run_verify_table(b: TableBatch, cases: list[CanaryCase], *, paged: bool, check_token: bool = True,
                     rng=None) -> tuple[list[CanaryCase], int]:
    """The op on CPU copies (reference) and on GPU copies; compared. Returns the GPU cases and rows."""
    rng = rng if rng is not None else np.random.default_rng(0)
    inv = random_bytes(rng, (1,), torch.int32)
    out = {}
    for dev in ("cpu", "cuda"):
        bb, cc, ii = to_device((b, cases, inv), dev)
        kc.launch_canary_verify_from_table(contexts=tuple(c.context() for c in cc), invalid_rows_out=ii,
                                           **bb.verify_kwargs(paged, check_token=check_token))
        out[dev] = (cc, ii)
    torch.cuda.synchronize()
    rows = compare_cases(to_device(out["cpu"][0], "cpu"), to_device(out["cuda"][0], "cpu"))
    assert_same_bytes(out["cpu"][1], out["cuda"][1], "invalid_rows_out")
    for before, g in zip(cases, out["cuda"][0]):
        assert_same_bytes(before.canary, g.canary, "verify must not write the canary buffer")
    return out["cuda"][0], rows


def run_write_table(b: TableBatch, cases: list[CanaryCase], tokens: WriteTokens, *, paged: bool,
                    rng=None) -> tuple[list[CanaryCase], int]:
    rng = rng if rng is not None else np.random.default_rng(0)
    inv = random_bytes(rng, (1,), torch.int32)
    out = {}
    for dev in ("cpu", "cuda"):
        bb, cc, tt, ii = to_device((b, cases, tokens, inv), dev)
        kc.launch_canary_write_from_table(contexts=tuple(c.context() for c in cc), invalid_rows_out=ii,
                                          **bb.write_kwargs(paged), **tt.kwargs())
        out[dev] = (cc, ii)
    torch.cuda.synchronize()
    rows = compare_cases(to_device(out["cpu"][0], "cpu"), to_device(out["cuda"][0], "cpu"))
    assert_same_bytes(out["cpu"][1], out["cuda"][1], "invalid_rows_out")
    return out["cuda"][0], rows


PARAMS = [(bsz, w, pad) for bsz in (1, 16, 64) for w, pad in ((0, 0), (9, -1))] + [(16, 0, -1), (16, 37, 0)]


# ----------------------------------------------------------------------------------------------- verify


@pytest.mark.parametrize("block_size, window, pad_row", PARAMS)
def test_verify_table_matches_reference(cuda_ready, vt_flat32, block_size, window, pad_row):
    rng = rng_for("verify_table", block_size, window, pad_row)
    mode = [Mode.NONE, Mode.PARTIAL, Mode.ALL][int(rng.integers(0, 3))]
    b, cases = setup(rng, block_size=block_size, window=window, pad_row=pad_row, n_contexts=int(rng.integers(1, 4)),
                     shared_log=bool(rng.integers(0, 2)), n_sources=int(rng.integers(0, 3)), mode=mode,
                     stride=record_stride(rng, aligned=vt_flat32))
    rows = 0
    for paged in (True, False):
        for check in (True, False):
            rows += run_verify_table(b, cases, paged=paged, check_token=check, rng=rng)[1]
    assert rows > 0  # the corrupted records and bad table values were reported


@pytest.mark.parametrize("mode, n_active, max_blocks", [(Mode.PARTIAL, 600, 64), (Mode.NONE, 300, 256)])
def test_verify_table_many_rows_and_long_prefixes(cuda_ready, vt_flat32, mode, n_active, max_blocks):
    """More rows than one tile of the kernel (256), so it walks all rows for the total first, and prefixes long
    enough that a warp's range spans several steps (NONE: about 600 K entries, over 100 per warp of an H200's
    grid, so lane 0 takes its predecessor from the warp's previous step). The block table with the 64-bit
    modules; its per-position expansion with the 32-bit ones."""
    rng = rng_for("verify_table-big", mode)
    b, cases = setup(rng, block_size=16, window=0, pad_row=0, n_contexts=2, n_active=size(n_active, 300),
                     max_blocks=size(max_blocks, 8), n_sources=1, mode=mode, stride=record_stride(rng, aligned=vt_flat32))
    _, rows = run_verify_table(b, cases, paged=not vt_flat32, rng=rng)
    assert rows > 0


@pytest.mark.parametrize("n_contexts", [1, 4, 5, 9])
def test_verify_table_contexts_split_into_launches(cuda_ready, n_contexts):
    """Up to four contexts per launch: a longer tuple is several launches with the same result."""
    rng = rng_for("verify_table-contexts", n_contexts)
    b, cases = setup(rng, block_size=4, window=0, pad_row=0, n_contexts=n_contexts, n_active=size(12, 5),
                     max_blocks=16, n_sources=int(rng.integers(0, 2)), mode=Mode.ALL)
    got, rows = run_verify_table(b, cases, paged=bool(n_contexts % 2), rng=rng)
    assert rows > 0
    # one kernel run per context
    for before, g in zip(cases, got):
        if sum(c.log is before.log for c in cases) == 1:
            assert int(g.log.kernel_counter[0]) == int(before.log.kernel_counter[0]) + 1


@pytest.mark.parametrize("block_size, window, pad_row", PARAMS[:4])
def test_verify_table_equals_plan_then_verify_on_gpu(cuda_ready, vt_flat32, block_size, window, pad_row):
    rng = rng_for("verify_table-two-pass", block_size, window, pad_row)
    b, cases = setup(rng, block_size=block_size, window=window, pad_row=pad_row, n_contexts=2,
                     stride=record_stride(rng, aligned=vt_flat32))
    gb, gc = to_device((b, cases), "cuda")
    a, two = to_device(gc, "cuda"), to_device(gc, "cuda")
    # The block table with the 64-bit modules, its per-position expansion with the 32-bit ones.
    kc.launch_canary_verify_from_table(contexts=[c.context() for c in a], **gb.verify_kwargs(not vt_flat32))
    cap = max(1, int(b.prefix_lens.clamp(min=0).sum()))
    vp = kc.VerifyPlan.allocate(verify_capacity=cap, device="cuda")
    wp = kc.WritePlan.allocate(write_req_capacity=max(b.bs, 1), device="cuda")
    kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, verify_capacity=cap, **gb.plan_kwargs(True))
    for c in two:
        kc.launch_canary_verify_kernel(context=c.context(), plan=vp, check_verify_expected_token=True)
    torch.cuda.synchronize()
    assert int(vp.enable[0]) == 1
    assert compare_cases(to_device(a, "cpu"), to_device(two, "cpu")) > 0


def test_verify_table_block_table_equals_req_to_token_on_gpu(cuda_ready, vt_flat32):
    rng = rng_for("verify_table-forms")
    b, cases = setup(rng, block_size=16, window=9, pad_row=-1, n_contexts=2, shared_log=True, corrupt=0.3,
                     stride=record_stride(rng, aligned=vt_flat32))
    gb, gc = to_device((b, cases), "cuda")
    outs = []
    for paged in (True, False):
        cc = to_device(gc, "cuda")
        kc.launch_canary_verify_from_table(contexts=[c.context() for c in cc], **gb.verify_kwargs(paged))
        outs.append(to_device(cc, "cpu"))
    torch.cuda.synchronize()
    assert compare_cases(*outs) > 0


@pytest.mark.skipif(SMALL, reason="2**31 entries: too slow under compute-sanitizer")
def test_verify_table_32_bit_modules_on_a_batch_of_more_than_2_to_the_31_entries(cuda_ready, monkeypatch):
    """260 rows of the 32-bit modules' longest row (KVC_VT_FLAT32_MAX_SEQ_LEN positions): over 2**31 verify entries,
    so batch-wide offsets pass 2**31 while each tile's stay below it (the kernel clamps a warp's range to the tile
    before it narrows it to an int). The table is slot 0 (skipped) but for isolated planted slots, spread over
    every row and crowded into the last two (whose entries straddle or start past 2**31); a fifth store a wrong position. The
    32-bit modules report exactly what the 64-bit ones report: one POSITION_MISMATCH row per bad slot."""
    from kvcanary.ops.cuda import specs
    from kvcanary.ops.cuda import verify_table as cuda_vt
    from kvcanary.ops.cuda.specs import int_define

    L = int_define("verify_table.cu", "KVC_VT_FLAT32_MAX_SEQ_LEN")
    rows = 2**31 // L + 2
    assert (rows - 1) * L > 2**31  # the last row's entries start past 2**31
    free, _ = torch.cuda.mem_get_info()
    if free < (rows + 1) * L * 4 + (2 << 30):
        pytest.skip(f"needs {(rows + 1) * L * 4 / 2**30:.1f} GiB of GPU memory for the table, {free / 2**30:.1f} free")
    rng = rng_for("verify_table-2^31")
    num_slots, n = 1 << 16, 300
    where = set()
    while len(where) < n:  # even positions only: no two planted slots are neighbours (no chain check between them)
        r = int(rng.integers(1, rows + 1)) if len(where) < 200 else int(rng.integers(rows - 1, rows + 1))
        where.add((r, 2 * int(rng.integers(1, L // 2))))
    rp, pos = (torch.tensor(x, dtype=torch.int64) for x in zip(*sorted(where)))
    slots = torch.from_numpy(rng.choice(np.arange(1, num_slots), size=n, replace=False))
    bad = torch.from_numpy(rng.random(n) < 0.2)
    case = make_canary_case(rng, num_slots, stride=32, ring_capacity=n + 64)
    records = case.canary.view(torch.int64)  # [num_slots, 4]: token, position, prev_hash, real_kv_hash
    records[slots, 1] = pos + bad.long()
    records[slots, 3] = 0  # NONE mode: no fingerprint
    table = torch.zeros((rows + 1, L), dtype=torch.int32, device="cuda")  # row 0: the padding row
    table[rp.cuda(), pos.cuda()] = slots.to(torch.int32).cuda()
    req_pool_indices = torch.arange(1, rows + 1, dtype=torch.int64, device="cuda")
    prefix_lens = torch.full((rows,), L, dtype=torch.int64, device="cuda")
    flags: list[bool] = []
    real = cuda_vt.function
    monkeypatch.setattr(cuda_vt, "function", lambda *a: flags.append(a[-1]) or real(*a))
    out = []
    for flat32 in (False, True):
        monkeypatch.setattr(specs, "FLAT32", flat32)
        c = to_device(case, "cuda")
        kc.launch_canary_verify_from_table(contexts=(c.context(),), req_pool_indices=req_pool_indices,
                                           prefix_lens=prefix_lens, req_to_token=table)
        out.append(to_device(c, "cpu"))
    torch.cuda.synchronize()
    del table
    assert flags == [False, True]
    assert compare_logs(out[0].log, out[1].log) == int(bad.sum()) > 0
    got = out[1].log.ring[:int(bad.sum())]
    assert sorted(got[:, 1].tolist()) == sorted(slots[bad].tolist())
    assert bool((got[:, 7] == kc.FailReason.VERIFY_POSITION_MISMATCH).all())
    assert int(out[1].log.slot_counter[0]) - int(case.log.slot_counter[0]) == rows * L


def test_verify_table_sources_smaller_than_the_canary(cuda_ready):
    rng = rng_for("verify_table-coverage")
    for mode in (Mode.NONE, Mode.PARTIAL, Mode.ALL):
        b = make_table_batch(rng, block_size=8, max_blocks=8, n_active=6, max_reqs=10)
        cases = [make_canary_case(rng, b.num_slots, n_sources=2, mode=mode, page_size=4,
                                  source_rows=b.num_slots // 8, ring_capacity=ring_for(b)) for _ in range(2)]
        for c in cases:
            stamp_batch(rng, c, b)
        assert cases[0].covered() < b.num_slots or mode == Mode.NONE
        _, rows = run_verify_table(b, cases, paged=True, rng=rng)
        assert rows > 0


@pytest.mark.parametrize("mode", [Mode.PARTIAL, Mode.ALL])
def test_verify_table_and_write_table_sixty_four_sources(cuda_ready, mode):
    """32 layers x K/V: two contexts of 32 sources, and one context of 64 sources."""
    rng = rng_for("verify_table-64", int(mode))
    b = make_table_batch(rng, block_size=4, max_blocks=8, n_active=5, max_reqs=8)
    cases = [make_canary_case(rng, b.num_slots, n_sources=32, mode=mode, num_bytes_per_token=32, tag=tag,
                              ring_capacity=ring_for(b, 1, 64)) for tag in (2, 3)]
    for c in cases:
        stamp_batch(rng, c, b)
    run_verify_table(b, cases, paged=True, rng=rng)
    run_write_table(b, cases, make_write_tokens(rng, b), paged=False, rng=rng)
    one = make_canary_case(rng, b.num_slots, n_sources=64, mode=mode, num_bytes_per_token=16,
                           ring_capacity=ring_for(b, 1, 64))
    stamp_batch(rng, one, b, corrupt=0.3)   # enough corruption that some entry fails on every seed
    _, rows = run_verify_table(b, [one], paged=False, rng=rng)
    assert rows > 0


# ----------------------------------------------------------------------------------------------- write


@pytest.mark.parametrize("block_size, window, pad_row", PARAMS)
def test_write_table_matches_reference(cuda_ready, block_size, window, pad_row):
    rng = rng_for("write_table", block_size, window, pad_row)
    mode = [Mode.NONE, Mode.PARTIAL, Mode.ALL][int(rng.integers(0, 3))]
    b, cases = setup(rng, block_size=block_size, window=window, pad_row=pad_row, n_contexts=int(rng.integers(1, 4)),
                     shared_log=bool(rng.integers(0, 2)), n_sources=int(rng.integers(0, 3)), mode=mode,
                     max_extend=40)
    rows = 0
    for paged, assert_on in ((True, False), (False, True)):
        tokens = make_write_tokens(rng, b, assert_on=assert_on, short=int(rng.integers(0, 3)))
        rows += run_write_table(b, cases, tokens, paged=paged, rng=rng)[1]
    assert rows > 0  # out-of-range tokens, misplaced positions, short token arrays


def test_write_table_long_requests_several_contexts(cuda_ready):
    """Requests longer than a warp's 32 tokens (the block path, several tiles) with 1..5 contexts."""
    rng = rng_for("write_table-long")
    for n_contexts in (1, 3, 5):
        b, cases = setup(rng, block_size=16, window=0, pad_row=0, n_contexts=n_contexts, n_active=size(6, 3),
                         max_blocks=size(40, 24), max_extend=size(500, 200), n_sources=1, mode=Mode.PARTIAL)
        tokens = make_write_tokens(rng, b, assert_on=True, skip=0.02, out_of_range=0.01, misplaced=0.01)
        run_write_table(b, cases, tokens, paged=True, rng=rng)


@pytest.mark.parametrize("rows", [200, 300, 700, 1300])
def test_write_table_many_rows(cuda_ready, rows):
    """Short requests (decode-like) in batches that take 1 to 4 rows per thread of the kernel's row scan (256
    threads), and more rows than one tile (1024)."""
    rng = rng_for("write_table-rows", rows)
    n = size(rows, min(rows, 300))
    b, cases = setup(rng, block_size=1, window=0, pad_row=-1, n_contexts=2, n_active=n, max_blocks=40,
                     max_extend=3, n_sources=1, mode=Mode.PARTIAL)
    run_write_table(b, cases, make_write_tokens(rng, b), paged=False, rng=rng)


@pytest.mark.parametrize("rows, n_contexts, mode, assert_on, padded", [
    (256, 1, Mode.NONE, False, True), (256, 2, Mode.PARTIAL, True, True), (1000, 1, Mode.NONE, True, True),
    (1000, 5, Mode.ALL, False, True), (2500, 2, Mode.NONE, False, True), (1000, 2, Mode.PARTIAL, True, False),
    (2500, 1, Mode.NONE, True, False)])
def test_write_table_decode_batches(cuda_ready, rows, n_contexts, mode, assert_on, padded):
    """Decode batches (one token per active row), with padding and invalid rows among them (``padded``) or without:
    the one-token rows are written by the thread that loaded them, from token loads at the row's index (right until
    the first row without a token, reloaded after) and seed records loaded during the row scan; rows with a bad
    seed or a token range past the arrays (``short``) take the warp loop. 1, 4 and 4 rows per thread (2500:
    several tiles). Unpadded with more than one row per thread, each tile is checked for one token per row without
    the scan and a block's own rows are written by its first threads (kvc_wt_decode_rows)."""
    rng = rng_for("write_table-decode", rows, n_contexts, int(mode), assert_on, padded)
    n = size(rows, min(rows, 300))
    b, cases = setup(rng, block_size=16, window=int(rng.choice([0, 9])), pad_row=-1, n_contexts=n_contexts,
                     n_active=n, max_blocks=8, extend_cycle=(1,), n_padding=max(2, n // 50) if padded else 0,
                     n_invalid=max(2, n // 60) if padded else 0, n_sources=0 if mode == Mode.NONE else 2, mode=mode)
    assert bool((b.extend_seq_lens == 1).all()) != padded
    written = 0
    for short in (0, 3):
        tokens = make_write_tokens(rng, b, assert_on=assert_on, short=short, out_of_range=0.05, skip=0.05)
        gpu, _ = run_write_table(b, cases, tokens, paged=bool(short), rng=rng)
        written += sum(int(g.log.slot_counter[0]) - int(c.log.slot_counter[0]) for g, c in zip(gpu, cases))
    assert written > n_contexts * n // 2  # every context stamped most rows' tokens


@pytest.mark.parametrize("rows, extend_cycle, n_invalid, n_contexts, mode", [
    (256, (1,), 0, 1, Mode.NONE), (1024, (1,), 0, 2, Mode.PARTIAL), (2500, (1,) * 1024 + (3, 1), 2, 1, Mode.NONE),
    (2100, (3, 1) + (1,) * 2098, 0, 2, Mode.PARTIAL)])
def test_write_table_one_token_tiles(cuda_ready, rows, extend_cycle, n_invalid, n_contexts, mode):
    """Tiles whose rows all have one token (a decode batch without padding or invalid rows) take their token
    offsets from the rows' indices, with no block scan: whole batches of 1 and 4 rows per thread, and tiles of
    one-token rows after and before mixed ones (tiles of 1024 rows; the rows in order, not shuffled)."""
    rng = rng_for("write_table-ones", rows, len(extend_cycle), n_contexts)
    b, cases = setup(rng, block_size=16, window=0, pad_row=-1, n_contexts=n_contexts, n_active=rows, max_blocks=8,
                     extend_cycle=extend_cycle, n_padding=0, n_invalid=n_invalid, shuffle=False,
                     n_sources=0 if mode == Mode.NONE else 2, mode=mode)
    ext = b.extend_seq_lens.numpy()
    tiles = [(ext[i:i + 1024] == 1).all() for i in range(0, b.bs, 1024)]
    assert tiles[0] == (extend_cycle[0] == 1) and (len(tiles) == 1 or not all(tiles))
    gpu, _ = run_write_table(b, cases, make_write_tokens(rng, b, skip=0.05), paged=False, rng=rng)
    assert all(int(g.log.slot_counter[0]) - int(c.log.slot_counter[0]) > rows // 2 for g, c in zip(gpu, cases))


def test_write_table_equals_plan_then_write_on_gpu(cuda_ready):
    rng = rng_for("write_table-two-pass")
    for block_size, window, pad_row in PARAMS[:4]:
        b, cases = setup(rng, block_size=block_size, window=window, pad_row=pad_row, n_contexts=2, max_extend=40)
        tokens = make_write_tokens(rng, b)
        gb, gc, gt = to_device((b, cases, tokens), "cuda")
        a, two = to_device(gc, "cuda"), to_device(gc, "cuda")
        kc.launch_canary_write_from_table(contexts=[c.context() for c in a], **gb.write_kwargs(True), **gt.kwargs())
        vp = kc.VerifyPlan.allocate(verify_capacity=1 + int(b.prefix_lens.clamp(min=0).sum()), device="cuda")
        wp = kc.WritePlan.allocate(write_req_capacity=max(b.bs, 1), device="cuda")
        kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, verify_capacity=vp.capacity,
                                      **gb.plan_kwargs(True))
        for c in two:
            kc.launch_canary_write_kernel(context=c.context(), plan=wp, **gt.kwargs())
        torch.cuda.synchronize()
        compare_cases(to_device(a, "cpu"), to_device(two, "cpu"))


def test_write_table_sources_smaller_than_the_canary(cuda_ready):
    rng = rng_for("write_table-coverage")
    for mode in (Mode.PARTIAL, Mode.ALL):
        b = make_table_batch(rng, block_size=8, max_blocks=8, n_active=6, max_reqs=10, max_extend=40)
        cases = [make_canary_case(rng, b.num_slots, n_sources=2, mode=mode, page_size=4,
                                  source_rows=b.num_slots // 8, ring_capacity=ring_for(b, 1, 64)) for _ in range(2)]
        _, rows = run_write_table(b, cases, make_write_tokens(rng, b), paged=True, rng=rng)
        assert rows > 0


# ------------------------------------------------------------------------------- the SGLang-named ops


def test_write_and_verify_sglang_ops_with_sources_smaller_than_the_canary(cuda_ready):
    """The SGLang-named kernels apply the same coverage rule (SPEC §9) with their by-value sources."""
    rng = rng_for("sglang-coverage")
    b = make_table_batch(rng, block_size=4, max_blocks=16, n_active=6, max_reqs=10, max_extend=40)
    case = make_canary_case(rng, b.num_slots, n_sources=2, mode=Mode.PARTIAL, page_size=2,
                            source_rows=b.num_slots // 3, ring_capacity=ring_for(b, 1, 64))
    stamp_batch(rng, case, b)
    tokens = make_write_tokens(rng, b)
    out = {}
    for dev in ("cpu", "cuda"):
        bb, cc, tt = to_device((b, case, tokens), dev)
        cap = 1 + int(b.prefix_lens.clamp(min=0).sum())
        vp = kc.VerifyPlan.allocate(verify_capacity=cap, device=dev)
        wp = kc.WritePlan.allocate(write_req_capacity=b.bs, device=dev)
        kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, verify_capacity=cap,
                                      **bb.plan_kwargs(True))
        kc.launch_canary_verify_kernel(context=cc.context(), plan=vp, check_verify_expected_token=True)
        kc.launch_canary_write_kernel(context=cc.context(), plan=wp, **tt.kwargs())
        out[dev] = cc
    torch.cuda.synchronize()
    assert compare_cases([out["cpu"]], [to_device(out["cuda"], "cpu")]) > 0


def test_sglang_ops_refuse_five_sources_on_gpu(cuda_ready):
    rng = rng_for("five-sources")
    case = make_canary_case(rng, 64, n_sources=5, mode=Mode.PARTIAL, page_size=1).to("cuda")
    before = case.canary.clone()
    runs = int(case.log.kernel_counter[0])
    vp = kc.VerifyPlan.allocate(verify_capacity=4, device="cuda")
    wp = kc.WritePlan.allocate(write_req_capacity=1, device="cuda")
    z = torch.zeros(1, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="at most 4 RealKvSource"):
        kc.launch_canary_verify_kernel(context=case.context(), plan=vp, check_verify_expected_token=False)
    with pytest.raises(ValueError, match="at most 4 RealKvSource"):
        kc.launch_canary_write_kernel(context=case.context(), plan=wp, input_ids=z, positions=z, out_cache_loc=z,
                                      enable_write_input_assert=False, expected_input_tokens=None,
                                      expected_input_positions=None)
    torch.cuda.synchronize()
    assert torch.equal(before, case.canary) and int(case.log.kernel_counter[0]) == runs  # nothing launched
    # ... while kvcanary's own op takes them (a padding row: no entries, one kernel run).
    kc.launch_canary_verify_from_table(contexts=(case.context(),), req_pool_indices=z,
                                       prefix_lens=torch.zeros(1, dtype=torch.int64, device="cuda"),
                                       req_to_token=torch.zeros((2, 4), dtype=torch.int32, device="cuda"))
    torch.cuda.synchronize()
    assert int(case.log.kernel_counter[0]) == runs + 1


# ----------------------------------------------------------------------------------------------- launch paths


def test_driver_launch_and_cupy_function_launch_give_identical_results(cuda_ready, monkeypatch):
    """Kernels are launched through CuPy's cuLaunchKernel binding with a reusable argument buffer (the plan-free
    ones, on sm_90+, through cuLaunchKernelEx with programmatic dependent launch: kvcanary/ops/cuda/pdl.py); CuPy's
    Function call is the fallback. Every path must hand the kernel the same struct: same outputs, byte for byte (the
    reference is checked in every run, so a wrong argument in any path fails)."""
    from kvcanary.ops.cuda import launch as L
    from kvcanary.ops.cuda import pdl

    assert L.launch_path() == "cuLaunchKernel", "this CuPy should have the driver binding"
    rng = rng_for("launch-paths")
    b, cases = setup(rng, block_size=16, window=9, pad_row=-1, n_contexts=2, n_sources=2, mode=Mode.PARTIAL)
    tokens = make_write_tokens(rng, b)
    runs = []
    for path in ("as shipped", "cuLaunchKernel", "cupy Function"):
        if path == "cuLaunchKernel":
            monkeypatch.setattr(pdl, "functions", set())
        if path == "cupy Function":
            monkeypatch.setattr(L, "_driver_launch", False)
            assert L.launch_path() == "cupy Function"
        v, rows_v = run_verify_table(b, cases, paged=True, rng=np.random.default_rng(1))
        w, rows_w = run_write_table(b, cases, tokens, paged=False, rng=np.random.default_rng(2))
        runs.append((v + w, rows_v, rows_w))
    first, rows_v, rows_w = runs[0]
    assert rows_v > 0
    for other, rows_v2, rows_w2 in runs[1:]:
        assert (rows_v2, rows_w2) == (rows_v, rows_w)
        for f, s in zip(first, other):
            assert_same_bytes(f.canary, s.canary, "canary_buf")
            compare_logs(to_device([f], "cpu")[0].log, to_device([s], "cpu")[0].log)
