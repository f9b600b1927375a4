"""SPEC §11, §12: plan-free verify and write straight from the table, on the CPU.

Every random launch runs on fresh random batches (``support.table_cases``: both table forms, padding rows with
``pad_row`` 0 and -1, invalid rows, out-of-range and negative block ids, SWA windows with a LUT and LUT misses,
expected tokens with the EAGLE +1 offset) over poisoned canary buffers and logs, and is compared byte for byte
with the scalar model (``spec_model.verify_from_table`` / ``write_from_table``), and with the two-pass ops
(plan -> verify, plan -> write) on a copy of the same state (rows as a multiset, records and counters byte for
byte).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcanary as kc
from kvcanary import FailReason as F
from kvcanary import RealKvHashMode as Mode
from kvcanary.ops import backends
from support import spec_model as M
from support.canary_testlib import t32, t64
from support.gpu_util import rng_for
from support.table_cases import (
    TableBatch,
    WriteTokens,
    make_canary_case,
    make_canary_cases,
    make_table_batch,
    make_write_tokens,
    stamp_batch,
)
from support.table_testlib import (
    assert_same_state,
    copies,
    run_verify_from_table,
    run_write_from_table,
    two_pass_verify,
    two_pass_write,
)

TOK, POS, CHAIN, RKV, OOR = (int(F.VERIFY_TOKEN_MISMATCH), int(F.VERIFY_POSITION_MISMATCH),
                             int(F.VERIFY_CHAIN_HASH_MISMATCH), int(F.VERIFY_REAL_KV_HASH_MISMATCH),
                             int(F.SLOT_OUT_OF_RANGE))


def random_setup(rng, *, block_size, window, pad_row, n_contexts=2, shared_log=False, n_sources=None, mode=None,
                 **batch_kw):
    b = make_table_batch(rng, block_size=block_size, max_blocks=max(2, 96 // block_size), pad_row=pad_row,
                         window=window, token_offset=int(rng.integers(0, 2)), **batch_kw)
    mode = int(rng.integers(0, 3)) if mode is None else mode
    n_sources = int(rng.integers(0, 4)) if n_sources is None else n_sources
    cases = make_canary_cases(rng, b.num_slots, n_contexts, n_sources=n_sources, mode=mode, shared_log=shared_log,
                              stride=int(rng.choice([32, 48])), ring_capacity=int(rng.choice([8, 512])),
                              flag=int(rng.choice([0, 1])))
    for c in cases:
        stamp_batch(rng, c, b)
    return b, cases


PARAMS = [(bsz, w, pad) for bsz in (1, 16, 64) for w in (0, 9) for pad in (0, -1)]


# ----------------------------------------------------------------------------------------------- verify


@pytest.mark.parametrize("block_size, window, pad_row", PARAMS)
def test_verify_from_table_matches_the_model_in_both_table_forms(block_size, window, pad_row):
    for seed in range(2):
        rng = rng_for(block_size, window, pad_row, seed, 1)
        b, cases = random_setup(rng, block_size=block_size, window=window, pad_row=pad_row,
                                shared_log=bool(seed))
        flat = copies(cases)
        inv = run_verify_from_table(b, cases, paged=True, check_token=bool(seed), rng=rng)
        run_verify_from_table(b, flat, paged=False, check_token=bool(seed), rng=rng)
        assert_same_state(cases, flat)
        assert inv >= 2


@pytest.mark.parametrize("block_size, window, pad_row", PARAMS)
def test_verify_from_table_equals_plan_then_verify(block_size, window, pad_row):
    reported = 0
    for seed in range(3):
        rng = rng_for(block_size, window, pad_row, seed, 2)
        b, cases = random_setup(rng, block_size=block_size, window=window, pad_row=pad_row, n_contexts=3,
                                shared_log=seed == 2)
        for paged in (True, False):
            a, two = copies(cases), copies(cases)
            kc.launch_canary_verify_from_table(contexts=[c.context() for c in a], **b.verify_kwargs(paged))
            two_pass_verify(b, two, paged=paged)
            assert_same_state(a, two)
            reported += sum(int(c.log.index[0]) for c in a)
    assert reported > 0  # the cases do report something


def test_verify_reports_what_the_batch_holds():
    """One worked launch: a clean chain, a LUT miss, a token mismatch found through the EAGLE offset."""
    rig_buf = kc.allocate_canary_buffer(16)
    log = kc.ViolationLog.allocate(ring_capacity=8)
    ctx = log.context(canary_buf=rig_buf, kernel_kind=int(kc.CanaryLaunchTag.HEAD_K_SWA))
    recs = rig_buf.numpy().view(np.int64)
    # Request row 1, block size 2: blocks 3, 4 -> full indices 6, 7, 8, 9; the LUT sends them to slots 5, 6, 7
    # and 9 is past the LUT (-2).
    lut = t64([0, 0, 0, 0, 0, 0, 5, 6, 7])
    tokens = [70, 71, 72]
    hashes = M.Chain().hashes(zip(tokens, [0, 1, 2]))
    for s, tok, p, h in zip([5, 6, 7], tokens, [0, 1, 2], hashes):
        recs[s, :4] = (tok, p, h, 0)
    # EAGLE draft pool: the KV at position p holds token p + 1; the pool stores the tokens by position.
    pool = t32([[0] * 6, [69, 70, 71, 99, 73, 74]])
    inv = torch.full((1,), 7, dtype=torch.int32)
    kc.launch_canary_verify_from_table(
        contexts=(ctx,), req_pool_indices=t64([1, 0, 5]), prefix_lens=t64([4, 3, 1]),
        block_table=t32([[0, 0], [3, 4]]), block_size=2, swa_window_size=3, full_to_swa_index_mapping=lut,
        req_to_verify_expected_tokens=pool, req_to_verify_expected_tokens_valid_lens=t64([6, 0, 0]),
        kv_token_id_vs_position_offset=1, check_verify_expected_token=True, invalid_rows_out=inv)
    tag = int(kc.CanaryLaunchTag.HEAD_K_SWA)
    # Window [1, 4): position 1 (slot 6, expected pool[1][2] = 71: clean), position 2 (slot 7, expected
    # pool[1][3] = 99: token mismatch), position 3 (-2, a LUT miss: out of range, expected pool[1][4] = 73).
    assert log.violation_ring[: int(log.violation_write_index[0])].tolist() == [
        [tag, 7, 2, 72, 99, hashes[2], hashes[2], TOK],
        [tag, -2, 3, -1, 73, 0, 7, OOR],
    ]
    assert int(inv[0]) == 1  # row index 5 is outside [0, 2)
    assert int(log.slot_run_counter[0]) == 3 and int(log.kernel_run_counter[0]) == 1


def test_verify_with_one_context_equals_each_context_alone():
    rng = rng_for(5)
    b, cases = random_setup(rng, block_size=16, window=0, pad_row=0, n_contexts=3, n_sources=2, mode=Mode.ALL)
    alone = copies(cases)
    kc.launch_canary_verify_from_table(contexts=tuple(c.context() for c in cases), **b.verify_kwargs(True))
    for c in alone:
        kc.launch_canary_verify_from_table(contexts=[c.context()], **b.verify_kwargs(True))
    assert_same_state(cases, alone)


def _verify_lines_run(bs: int, seq: int) -> tuple[int, int]:
    """Lines of kvcanary's own Python executed by one verify from the table of ``bs`` rows of ``seq`` cached
    positions (every record zero: every entry fails), and the violations it counted."""
    rng = np.random.default_rng(9)
    num_slots = bs * seq + 1
    r2t = torch.from_numpy((rng.permutation(num_slots - 1)[: bs * seq] + 1).reshape(bs, seq).astype(np.int32))
    r2t = torch.cat([torch.zeros((1, seq), dtype=torch.int32), r2t])
    log = kc.ViolationLog.allocate(ring_capacity=16)
    ctx = log.context(canary_buf=kc.allocate_canary_buffer(num_slots), kernel_kind=0)
    kw = dict(contexts=(ctx,), req_pool_indices=torch.arange(1, bs + 1), prefix_lens=torch.full((bs,), seq),
              req_to_token=r2t)
    kc.launch_canary_verify_from_table(**kw)  # warm-up: imports and first-call caches are not counted
    package = str(Path(kc.__file__).resolve().parent)
    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if not frame.f_code.co_filename.startswith(package):
            return None
        if event == "line":
            lines += 1
        return tracer

    sys.settrace(tracer)
    try:
        kc.launch_canary_verify_from_table(**kw)
    finally:
        sys.settrace(None)
    return lines, int(log.violation_write_index[0])


def test_verify_from_table_reference_is_vectorized():
    """The CPU reference runs as many lines of Python for 16 times the entries (same rows, longer prefixes): no
    per-entry Python loop, whatever the machine's speed (a per-entry loop would take minutes at 1 M entries)."""
    small, n_small = _verify_lines_run(64, 32)
    large, n_large = _verify_lines_run(64, 512)
    assert n_small == 2 * 64 * 32 and n_large == 2 * 64 * 512  # every entry checked (and failed) in both runs
    assert small > 0 and large == small, (small, large)


# ----------------------------------------------------------------------------------------------- write


@pytest.mark.parametrize("block_size, window, pad_row", PARAMS)
def test_write_from_table_matches_the_model_in_both_table_forms(block_size, window, pad_row):
    for seed in range(2):
        rng = rng_for(block_size, window, pad_row, seed, 3)
        b, cases = random_setup(rng, block_size=block_size, window=window, pad_row=pad_row, shared_log=bool(seed))
        tokens = make_write_tokens(rng, b, assert_on=bool(seed), short=2 if seed else 0)
        flat = copies(cases)
        run_write_from_table(b, cases, tokens, paged=True, rng=rng)
        run_write_from_table(b, flat, tokens, paged=False, rng=rng)
        assert_same_state(cases, flat)


@pytest.mark.parametrize("block_size, window, pad_row", PARAMS)
def test_write_from_table_equals_plan_then_write(block_size, window, pad_row):
    changed = 0
    for seed in range(3):
        rng = rng_for(block_size, window, pad_row, seed, 4)
        b, cases = random_setup(rng, block_size=block_size, window=window, pad_row=pad_row, n_contexts=2,
                                shared_log=seed == 1)
        tokens = make_write_tokens(rng, b, assert_on=seed == 2, short=3 if seed == 1 else 0)
        for paged in (True, False):
            a, two = copies(cases), copies(cases)
            kc.launch_canary_write_from_table(contexts=[c.context() for c in a], **b.write_kwargs(paged),
                                              **tokens.kwargs())
            two_pass_write(b, two, tokens, paged=paged)
            assert_same_state(a, two)
            changed += sum(x.canary.numpy().tobytes() != y.canary.numpy().tobytes() for x, y in zip(a, cases))
    assert changed > 0  # the cases do stamp something


def test_write_token_offsets_skip_padding_and_invalid_rows():
    """Request r's tokens start at the sum of write_len of the rows before it; padding and invalid rows
    (even with a positive extend) consume none."""
    buf = kc.allocate_canary_buffer(32)
    log = kc.ViolationLog.allocate(ring_capacity=8)
    ctx = log.context(canary_buf=buf, kernel_kind=0)
    r2t = t32([[0] * 8, [10 + p for p in range(8)], [20 + p for p in range(8)]])
    inv = torch.full((1,), 99, dtype=torch.int32)
    kc.launch_canary_write_from_table(
        contexts=(ctx,), req_pool_indices=t64([1, 0, 7, 2]), prefix_lens=t64([0, 0, 0, 0]),
        extend_seq_lens=t64([2, 5, 5, 1]), req_to_token=r2t, input_ids=t64([11, 12, 21, 99]),
        positions=t64([0, 1, 0, 9]), out_cache_loc=t64([10, 11, 20, 31]), invalid_rows_out=inv)
    recs = buf.numpy().view(np.int64)
    c = M.Chain()
    h1 = c.hashes([(11, 0), (12, 1)])
    h2 = M.Chain().hashes([(21, 0)])
    assert recs[10].tolist() == [11, 0, h1[0], 0] and recs[11].tolist() == [12, 1, h1[1], 0]
    assert recs[20].tolist() == [21, 0, h2[0], 0]
    assert not recs[31].any()  # the token past the three requests is not part of any request
    assert int(inv[0]) == 1 and int(log.slot_run_counter[0]) == 3 and int(log.kernel_run_counter[0]) == 1


def test_write_seed_is_translated_by_the_lut():
    buf = kc.allocate_canary_buffer(16)
    log = kc.ViolationLog.allocate(ring_capacity=8)
    ctx = log.context(canary_buf=buf, kernel_kind=0, enable_chain_position_assert=kc.allocate_chain_position_flag(1))
    recs = buf.numpy().view(np.int64)
    anchor = M.splitmix64(M.ANCHOR)
    recs[3, :4] = (5, 0, M.i64(anchor), 0)
    # RT(1, p) = 1 * 2 + p: position 0 is full index 2 -> slot 3 (the seed), position 1 full index 3 -> slot 4.
    lut = t64([0, 0, 3, 4])
    kc.launch_canary_write_from_table(
        contexts=(ctx,), req_pool_indices=t64([1]), prefix_lens=t64([1]), extend_seq_lens=t64([1]),
        block_table=t32([[0], [1]]), block_size=2, swa_window_size=4, full_to_swa_index_mapping=lut,
        input_ids=t64([6]), positions=t64([1]), out_cache_loc=t64([4]))
    assert recs[4, :4].tolist() == [6, 1, M.i64(M.mix3(anchor, 5, 0)), 0]
    assert int(log.violation_write_index[0]) == 0  # position 1 follows the seed's position 0


def test_several_contexts_write_their_own_chains_and_fingerprints():
    rng = rng_for(21)
    b, cases = random_setup(rng, block_size=16, window=0, pad_row=0, n_contexts=2, n_sources=2, mode=Mode.PARTIAL,
                            bad_blocks=0)
    tokens = make_write_tokens(rng, b, skip=0, out_of_range=0, misplaced=0)
    alone = copies(cases)
    run_write_from_table(b, cases, tokens, paged=True)
    for c in alone:
        kc.launch_canary_write_from_table(contexts=[c.context()], **b.write_kwargs(True), **tokens.kwargs())
    assert_same_state(cases, alone)
    loc = tokens.out_cache_loc[tokens.out_cache_loc > 0]
    k, v = (c.canary.numpy().view(np.int64)[loc.numpy()] for c in cases)
    assert (k[:, 3] != v[:, 3]).all()  # each context folds its own sources


def test_overlapping_canary_buffers_are_refused_for_a_write():
    log = kc.ViolationLog.allocate(ring_capacity=4)
    big = kc.allocate_canary_buffer(16)
    ctxs = (log.context(canary_buf=big[:8], kernel_kind=0), log.context(canary_buf=big[4:12], kernel_kind=1))
    args = dict(req_pool_indices=t64([1]), prefix_lens=t64([0]), extend_seq_lens=t64([1]),
                req_to_token=t32([[0, 0], [1, 2]]), input_ids=t64([1]), positions=t64([0]), out_cache_loc=t64([1]))
    with pytest.raises(ValueError) as e:
        kc.launch_canary_write_from_table(contexts=ctxs, **args)
    assert str(e.value) == ("kv-canary: launch_canary_write_from_table contexts[1].canary_buf overlaps "
                            "contexts[0].canary_buf; each context of a write needs its own canary buffer")
    assert not big.any() and int(log.kernel_run_counter[0]) == 0
    # The verify only reads the buffers: the same contexts are fine there.
    kc.launch_canary_verify_from_table(contexts=ctxs, req_pool_indices=t64([1]), prefix_lens=t64([2]),
                                       req_to_token=t32([[0, 0], [1, 2]]))
    assert int(log.kernel_run_counter[0]) == 2


# ----------------------------------------------------------------------------------------------- a pipeline


@pytest.mark.parametrize("paged", [True, False], ids=["block_table", "req_to_token"])
def test_prefill_and_decode_from_the_table_verify_clean_and_catch_corruption(paged):
    """A paged engine: two requests prefill then decode for a few steps (verify, then write, per step); K and V
    contexts in one launch each. Clean steps report nothing; a corrupted record is then reported."""
    bsz, max_blocks, steps = 4, 6, 5
    rng = np.random.default_rng(31)
    num_slots = 64
    blocks = torch.full((3, max_blocks), -1, dtype=torch.int32)
    blocks[1] = t32([3, 7, 2, 9, 5, 11])
    blocks[2] = t32([4, 8, 1, 6, 10, 12])
    log = kc.ViolationLog.allocate(ring_capacity=32)
    bufs = [kc.allocate_canary_buffer(num_slots) for _ in range(2)]
    kv = [torch.from_numpy(rng.integers(0, 256, (num_slots, 32), dtype=np.uint8)) for _ in range(2)]
    srcs = [kc.RealKvSource(tensor=p, page_size=1, num_bytes_per_token=32, read_bytes=32) for p in kv]
    ctxs = [log.context(canary_buf=bufs[i], kernel_kind=i, real_kv_sources=(srcs[i],),
                        real_kv_hash_mode=Mode.PARTIAL, enable_chain_position_assert=kc.allocate_chain_position_flag(1))
            for i in range(2)]

    def slot(rp, p):
        return int(blocks[rp, p // bsz]) * bsz + p % bsz

    table = dict(block_table=blocks, block_size=bsz) if paged else dict(
        req_to_token=t32([[slot(r, p) if r else 0 for p in range(max_blocks * bsz)] for r in range(3)]))
    prefix = [0, 0]
    extend = [7, 3]  # prefill
    for step in range(steps):
        rpi, pre, ext = t64([1, 2]), t64(prefix), t64(extend)
        kc.launch_canary_verify_from_table(contexts=ctxs, req_pool_indices=rpi, prefix_lens=pre, **table)
        ids = [int(x) for x in rng.integers(0, 1000, sum(extend))]
        pos = [p for r in range(2) for p in range(prefix[r], prefix[r] + extend[r])]
        loc = [slot(r + 1, p) for r in range(2) for p in range(prefix[r], prefix[r] + extend[r])]
        kc.launch_canary_write_from_table(contexts=ctxs, req_pool_indices=rpi, prefix_lens=pre, extend_seq_lens=ext,
                                          input_ids=t64(ids), positions=t64(pos), out_cache_loc=t64(loc), **table)
        prefix = [prefix[r] + extend[r] for r in range(2)]
        extend = [1, 1]
        assert int(log.violation_write_index[0]) == 0, f"step {step}"
    assert int(log.kernel_run_counter[0]) == 4 * steps
    victim = slot(2, 2)
    bufs[1].numpy().view(np.int64)[victim, 0] ^= 1
    kv[0][slot(1, 5), 3] ^= 0x10
    kc.launch_canary_verify_from_table(contexts=ctxs, req_pool_indices=t64([1, 2]), prefix_lens=t64(prefix), **table)
    rows = log.violation_ring[: int(log.violation_write_index[0])].tolist()
    assert [(r[0], r[1], r[7]) for r in rows] == [(0, slot(1, 5), RKV), (1, slot(2, 3), CHAIN)]


# ----------------------------------------------------------------------------------------------- dispatch


def test_the_new_ops_dispatch_to_the_backend_of_their_device(monkeypatch):
    """All-CUDA arrays go to the CUDA backend's methods of the same names (faked here: no GPU needed)."""
    from kvcanary.ops.interop import Device, view

    calls = []
    fake_backend = types.SimpleNamespace(**{name: (lambda launch, stream, name=name: calls.append((name, launch, stream)))
                                           for name in ("verify_from_table", "write_from_table", "gather_records",
                                                        "scatter_records", "copy_records")})
    monkeypatch.setitem(backends._backends, "cuda", fake_backend)
    cuda = Device("cuda", 0)

    def fake(x, name="x"):
        return view(name, x)._replace(device=cuda)

    buf = kc.allocate_canary_buffer(8)
    log = kc.ViolationLog.allocate(ring_capacity=2)
    ctx = kc.VerifyOrWriteContext(canary_buf=fake(buf), kernel_kind=0, violation_ring=fake(log.violation_ring),
                                  violation_write_index=fake(log.violation_write_index),
                                  slot_run_counter=fake(log.slot_run_counter),
                                  kernel_run_counter=fake(log.kernel_run_counter))
    r2t = fake(t32([[0, 0], [1, 2]]))
    kc.launch_canary_verify_from_table(contexts=(ctx,), req_pool_indices=fake(t64([1])), prefix_lens=fake(t64([2])),
                                       req_to_token=r2t, stream=5)
    kc.launch_canary_write_from_table(contexts=(ctx,), req_pool_indices=fake(t64([1])), prefix_lens=fake(t64([0])),
                                      extend_seq_lens=fake(t64([1])), req_to_token=r2t, input_ids=fake(t64([1])),
                                      positions=fake(t64([0])), out_cache_loc=fake(t64([1])), stream=6)
    slots = fake(t64([1]))
    kc.gather_canary_records(canary_buf=fake(buf), slots=slots, records_out=fake(torch.zeros((1, 4), dtype=torch.int64)))
    kc.scatter_canary_records(canary_buf=fake(buf), slots=slots, records=fake(torch.zeros((1, 4), dtype=torch.int64)))
    kc.copy_canary_records(src_canary_buf=fake(buf), src_slots=slots, dst_slots=slots)
    assert [c[0] for c in calls] == ["verify_from_table", "write_from_table", "gather_records", "scatter_records",
                                     "copy_records"]
    assert [c[2] for c in calls] == [5, 6, None, None, None]
    assert all(c[1].device == cuda for c in calls)
    assert not buf.any() and int(log.kernel_run_counter[0]) == 0  # the CPU reference did not run


# ----------------------------------------------------------------------------------------------- arbitrary inputs


@given(st.data())
def test_from_table_ops_match_the_model_on_arbitrary_small_inputs(data):
    """Any values: negative prefixes and extends, table values past the canary, negative block ids, pad_row -1,
    0 or 1, LUTs shorter than the table's values, small rings that overflow, sources smaller than the canary."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    ints = st.integers
    max_reqs, max_blocks, bsz = data.draw(ints(1, 4)), data.draw(ints(1, 3)), data.draw(ints(1, 4))
    max_seq_len = max_blocks * bsz
    num_slots = data.draw(ints(1, 24))
    blocks = [[data.draw(ints(-3, num_slots // bsz + 2)) for _ in range(max_blocks)] for _ in range(max_reqs)]
    r2t = [[-1 if row[p // bsz] < 0 else row[p // bsz] * bsz + p % bsz for p in range(max_seq_len)] for row in blocks]
    bs = data.draw(ints(0, 4))
    rpi = [data.draw(ints(-2, max_reqs)) for _ in range(bs)]
    prefix = [data.draw(ints(-1, max_seq_len + 1)) for _ in range(bs)]
    extend = [data.draw(ints(-1, 3)) for _ in range(bs)]
    window = data.draw(st.sampled_from([0, 1, 3]))
    lut = None
    if window:
        lut = t64([data.draw(ints(-1, num_slots + 1)) for _ in range(data.draw(ints(1, num_slots + bsz * 3)))])
    pool = lens = None
    if data.draw(st.booleans()):
        pool = t32(rng.integers(0, 50, (max_reqs + data.draw(ints(0, 1)), data.draw(ints(1, max_seq_len + 2)))))
        lens = t64([data.draw(ints(-1, max_seq_len + 2)) for _ in range(bs)])
    b = TableBatch(req_pool_indices=t64(rpi), prefix_lens=t64(prefix), extend_seq_lens=t64(extend),
                   block_table=t32(blocks), block_size=bsz, req_to_token=t32(r2t),
                   pad_row=data.draw(st.sampled_from([-1, 0] + ([1] if max_reqs > 1 else []))), swa_window_size=window,
                   lut=lut, expected_tokens=pool, expected_valid_lens=lens,
                   token_offset=data.draw(st.sampled_from([0, 1, -1])), num_slots=num_slots,
                   tokens=np.zeros((max_reqs, max_seq_len), np.int64))
    mode = data.draw(st.sampled_from(list(Mode)))
    n_sources = data.draw(ints(0, 2))
    cases = [make_canary_case(rng, num_slots, n_sources=n_sources, mode=mode, ring_capacity=data.draw(ints(1, 6)),
                              start_index=data.draw(ints(0, 3)), flag=data.draw(st.sampled_from([None, 0, 1])),
                              source_rows=data.draw(st.sampled_from([None, num_slots // 2])), page_size=1)
             for _ in range(data.draw(ints(1, 2)))]
    for c in cases:  # small token and position values, so that records sometimes verify
        c.canary.numpy().view(np.int64)[:, :2] = rng.integers(-1, 6, (num_slots, 2))
    paged = data.draw(st.booleans())
    run_verify_from_table(b, cases, paged=paged, check_token=data.draw(st.booleans()), rng=rng)
    n = data.draw(ints(0, 10))
    assert_on = data.draw(st.booleans())
    tokens = WriteTokens(input_ids=t64(rng.integers(0, 5, n)), positions=t64(rng.integers(-1, 6, n)),
                         out_cache_loc=t64(rng.integers(-1, num_slots + 2, n)),
                         expected_input_tokens=t64(rng.integers(0, 5, n)) if assert_on else None,
                         expected_input_positions=t64(rng.integers(-1, 6, n)) if assert_on else None)
    run_write_from_table(b, cases, tokens, paged=paged, rng=rng)


def test_the_new_ops_are_public():
    import kvcanary.ops

    names = ["launch_canary_verify_from_table", "launch_canary_write_from_table", "gather_canary_records",
             "scatter_canary_records", "copy_canary_records"]
    for name in names:
        assert name in kc.__all__ and name in kvcanary.ops.__all__
        assert getattr(kc, name) is getattr(kvcanary.ops, name)
        assert getattr(kc, name).__doc__
