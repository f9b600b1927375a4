"""SPEC §6 write on the CPU: hand-built cases worked out from SPEC's text, and a property test comparing the
op with the scalar model of ``spec_model`` on random inputs (bounds rows included)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcanary as kc
from kvcanary import CanaryLaunchTag as Tag
from support import spec_model as M
from support.canary_testlib import POISON_BYTE, PoolSource, Rig, write_plan

A = M.splitmix64(M.ANCHOR)  # slot_hash(-1)
TAG = int(Tag.TAIL_K_FULL)


def test_chain_head_stamps_token_position_and_chained_hash():
    rig = Rig.make(10, tag=TAG)
    rows = rig.write(write_plan([0, 3], [-1]), ids=[100, 101, 102], pos=[0, 1, 2], loc=[4, 9, 1])
    assert rows == []
    h0 = A
    h1 = M.mix3(h0, 100, 0)
    h2 = M.mix3(h1, 101, 1)
    recs = rig.recs()
    assert recs[4] == [100, 0, M.i64(h0), 0]
    assert recs[9] == [101, 1, M.i64(h1), 0]
    assert recs[1] == [102, 2, M.i64(h2), 0]
    for s in (0, 2, 3, 5, 6, 7, 8):
        assert recs[s] == [0, 0, 0, 0]
    assert (rig.kernel_runs, rig.slot_runs, rig.index) == (1, 3, 0)


def test_seed_continues_the_chain_from_the_seed_record():
    rig = Rig.make(10)
    rig.set_recs([[0] * 4] * 3 + [[55, 6, 1234567, 99]] + [[0] * 4] * 6)
    rig.write(write_plan([0, 2], [3]), ids=[56, 57], pos=[7, 8], loc=[5, 6])
    h0 = M.mix3(1234567, 55, 6)  # slot_hash(3) = mix3(prev_hash, token, position), real_kv_hash ignored
    assert rig.recs()[5] == [56, 7, M.i64(h0), 0]
    assert rig.recs()[6] == [57, 8, M.i64(M.mix3(h0, 56, 7)), 0]
    assert rig.rows() == []  # positions 7, 8 follow the seed's 6


def test_skipped_slots_neither_advance_the_chain_nor_count():
    rig = Rig.make(8)
    rig.write(write_plan([0, 4], [-1]), ids=[1, 2, 3, 4], pos=[0, 1, 2, 3], loc=[2, -1, -7, 3])
    assert rig.recs()[2] == [1, 0, M.i64(A), 0]
    # slot 3 follows slot 2 directly: the skipped tokens (2, 1) and (3, 2) are not in the chain.
    assert rig.recs()[3] == [4, 3, M.i64(M.mix3(A, 1, 0)), 0]
    assert rig.slot_runs == 2


def test_requests_have_independent_chains_and_empty_requests_are_fine():
    rig = Rig.make(12, flag=1)
    rig.set_recs([[0] * 4] * 11 + [[9, 4, 77, 0]])
    rig.write(write_plan([0, 2, 2, 3], [-1, 5, 11]), ids=[10, 11, 20], pos=[0, 1, 5], loc=[1, 2, 3])
    recs = rig.recs()
    assert recs[1][2] == M.i64(A)
    assert recs[2][2] == M.i64(M.mix3(A, 10, 0))
    assert recs[3][2] == M.i64(M.mix3(77, 9, 4))
    assert rig.rows() == []
    assert rig.slot_runs == 3


def test_input_assert_rows_have_exact_fields_and_the_chain_still_advances():
    rig = Rig.make(8, tag=TAG, flag=None)
    rows = rig.write(write_plan([0, 4], [-1]), ids=[5, 6, 7, 8], pos=[0, 1, 2, 3], loc=[1, 2, 3, 4],
                     exp_tok=[5, 60, 7, 80], exp_pos=[0, 1, 20, 30])
    h = [A]
    for tok, p in zip([5, 6, 7], [0, 1, 2]):
        h.append(M.mix3(h[-1], tok, p))
    assert rows == [
        (TAG, 2, 1, 6, 60, M.i64(h[1]), 1, int(kc.FailReason.WRITE_TOKEN_MISMATCH)),
        (TAG, 3, 2, 7, 7, M.i64(h[2]), 20, int(kc.FailReason.WRITE_POSITION_MISMATCH)),
        (TAG, 4, 3, 8, 80, M.i64(h[3]), 30, int(kc.FailReason.WRITE_TOKEN_MISMATCH | kc.FailReason.WRITE_POSITION_MISMATCH)),
    ]
    # The actual values are stamped, and the chain is built on them.
    assert rig.recs()[4] == [8, 3, M.i64(h[3]), 0]


def test_chain_position_assert_rows():
    rig = Rig.make(8, tag=TAG, flag=1)
    rig.set_recs([[0] * 4, [42, 4, 31337, 0]] + [[0] * 4] * 6)
    rows = rig.write(write_plan([0, 4], [1]), ids=[1, 2, 3, 4], pos=[5, 7, 8, 8], loc=[2, 3, 4, 5])
    h0 = M.mix3(31337, 42, 4)
    h1 = M.mix3(h0, 1, 5)
    h2 = M.mix3(h1, 2, 7)
    h3 = M.mix3(h2, 3, 8)
    W = int(kc.FailReason.WRITE_POSITION_MISMATCH)
    assert rows == [
        (TAG, 3, 7, 2, 2, M.i64(h1), 6, W),  # expected last_pos + 1 = 6
        (TAG, 5, 8, 4, 4, M.i64(h3), 9, W),  # last_pos follows the actual 7, then 8
    ]


def test_chain_position_assert_is_off_with_flag_zero_missing_flag_or_no_seed():
    for flag in (0, None):
        rig = Rig.make(8, flag=flag)
        rig.set_recs([[0] * 4, [42, 4, 31337, 0]] + [[0] * 4] * 6)
        assert rig.write(write_plan([0, 2], [1]), ids=[1, 2], pos=[9, 3], loc=[2, 3]) == []
    rig = Rig.make(8, flag=1)
    assert rig.write(write_plan([0, 2], [-1]), ids=[1, 2], pos=[9, 3], loc=[2, 3]) == []
    # The flag is read from the device array at launch time, not captured when the context was made.
    rig = Rig.make(8, flag=0)
    rig.set_recs([[0] * 4, [42, 4, 31337, 0]] + [[0] * 4] * 6)
    ctx = rig.ctx()
    rig.flag[0] = 1
    kc.launch_canary_write_kernel(context=ctx, plan=write_plan([0, 1], [1]), input_ids=torch.tensor([1]),
                                  positions=torch.tensor([9]), out_cache_loc=torch.tensor([2]),
                                  enable_write_input_assert=False, expected_input_tokens=None,
                                  expected_input_positions=None)
    assert rig.index == 1 and rig.rows()[0][6] == 5


def test_input_assert_and_position_assert_both_fire_in_that_order():
    rig = Rig.make(8, tag=TAG, flag=1)
    rig.set_recs([[0] * 4, [42, 4, 31337, 0]] + [[0] * 4] * 6)
    rows = rig.write(write_plan([0, 1], [1]), ids=[1], pos=[9], loc=[2], exp_tok=[1], exp_pos=[5])
    h0 = M.i64(M.mix3(31337, 42, 4))
    assert rows == [(TAG, 2, 9, 1, 1, h0, 5, 16), (TAG, 2, 9, 1, 1, h0, 5, 16)]


def test_counters_and_empty_launches():
    rig = Rig.make(4)
    for nvr in (0, -3):
        rig.write(write_plan([0, 2], [-1], num_valid_reqs=nvr), ids=[1, 2], pos=[0, 1], loc=[1, 2])
    assert (rig.kernel_runs, rig.slot_runs) == (2, 0)
    assert rig.recs() == [[0] * 4] * 4
    rig.write(write_plan([0, 0], [-1]), ids=[], pos=[], loc=[])
    assert (rig.kernel_runs, rig.slot_runs) == (3, 0)


def test_num_valid_reqs_is_clamped_to_capacity_and_padding_tail_is_ignored():
    rig = Rig.make(8)
    wp = write_plan([0, 1, 2], [-1, -1], num_valid_reqs=99)
    rig.write(wp, ids=[1, 2, 3, 4], pos=[0, 0, 0, 0], loc=[1, 2, 3, 4])
    assert rig.slot_runs == 2
    assert [r[0] for r in rig.recs()] == [0, 1, 2, 0, 0, 0, 0, 0]
    rig2 = Rig.make(8)
    rig2.write(write_plan([0, 1, 2], [-1, -1], num_valid_reqs=1), ids=[1, 2], pos=[0, 0], loc=[1, 2])
    assert [r[0] for r in rig2.recs()] == [0, 1, 0, 0, 0, 0, 0, 0]


def test_bytes_past_32_of_a_record_are_never_touched():
    rig = Rig.make(4, stride=48)
    rig.buf.fill_(POISON_BYTE)
    rig.write(write_plan([0, 3], [-1]), ids=[1, 2, 3], pos=[0, 1, 2], loc=[0, 1, 3])
    assert (rig.buf[:, 32:] == POISON_BYTE).all()
    assert (rig.buf[2] == POISON_BYTE).all()


def test_tag_goes_to_field_0():
    for tag in Tag:
        rig = Rig.make(4, tag=int(tag), flag=None)
        rows = rig.write(write_plan([0, 1], [-1]), ids=[1], pos=[0], loc=[1], exp_tok=[2], exp_pos=[0])
        assert rows[0][0] == int(tag)


# ------------------------------------------------------------------------------------------ property test


@st.composite
def write_cases(draw):
    num_slots = draw(st.integers(1, 10))
    R = draw(st.integers(1, 4))
    n = draw(st.integers(0, 12))
    if draw(st.integers(0, 3)) > 0:
        cuts = sorted(draw(st.lists(st.integers(0, n), min_size=R, max_size=R)))
        offsets = [draw(st.sampled_from([0, 0, 0, min(1, n)])), *cuts]
    else:
        offsets = draw(st.lists(st.integers(-3, n + 3), min_size=R + 1, max_size=R + 1))
    big = st.sampled_from([2**63 - 1, -(2**63), 2**62])
    ints = st.integers(-4, 40) | big
    base = draw(st.integers(-2, 10) | big)
    if draw(st.booleans()):
        pos = [M.i64(base + i + draw(st.sampled_from([0, 0, 0, 0, 1, -1]))) for i in range(n)]
    else:
        pos = draw(st.lists(ints, min_size=n, max_size=n))
    ids = draw(st.lists(ints, min_size=n, max_size=n))
    loc = draw(st.lists(st.integers(-2, num_slots + 1), min_size=n, max_size=n))
    assert_on = draw(st.booleans())
    exp_tok = [t if draw(st.integers(0, 3)) else M.i64(t + 1) for t in ids] if assert_on else None
    exp_pos = [p if draw(st.integers(0, 3)) else M.i64(p - 1) for p in pos] if assert_on else None
    recs = [[draw(st.integers(-3, 12)), draw(st.integers(-3, 12) | big), draw(ints), draw(ints)]
            for _ in range(num_slots)]
    ring = draw(st.integers(1, 6))
    index = draw(st.sampled_from([0, 0, 0, 1, ring - 1, ring, ring + 3, -2, 2**31 - 1]))
    n_pools = draw(st.integers(0, 4))
    pools = []
    for _ in range(n_pools):
        page = draw(st.integers(1, 4))
        nbpt = 16 * draw(st.integers(1, 3))
        pools.append(dict(page_size=page, num_bytes_per_token=nbpt, read_bytes=16 * draw(st.integers(1, nbpt // 16)),
                          rows=-(-num_slots // page) + draw(st.integers(0, 1)), slack=16 * draw(st.integers(0, 2)),
                          col_offset=16 * draw(st.integers(0, 1))))
    return dict(
        num_slots=num_slots, stride=draw(st.sampled_from([32, 40, 64])), offsets=offsets,
        seeds=draw(st.lists(st.integers(-2, num_slots + 1), min_size=R, max_size=R)),
        nvr=draw(st.integers(-1, R + 1)), ids=ids, pos=pos, loc=loc, exp_tok=exp_tok, exp_pos=exp_pos,
        flag=draw(st.sampled_from([None, 0, 1, 7])), recs=recs, ring=ring, index=index,
        counters=(draw(st.integers(0, 5) | big), draw(st.integers(0, 5))), tag=draw(st.integers(0, 11)),
        pools=pools, mode=draw(st.integers(0, 2)), seed=draw(st.integers(0, 2**31)),
    )


@given(write_cases())
def test_write_matches_scalar_model(case):
    g = torch.Generator().manual_seed(case["seed"])
    pools = [PoolSource.make(generator=g, **p) for p in case["pools"]]
    rig = Rig.make(case["num_slots"], stride=case["stride"], ring=case["ring"], tag=case["tag"], flag=case["flag"],
                   pools=pools, mode=case["mode"])
    rig.buf.random_(0, 256, generator=g)
    rig.set_recs(case["recs"])
    rig.log.violation_ring.fill_(-5)
    rig.log.violation_write_index[0] = case["index"]
    rig.log.slot_run_counter[0], rig.log.kernel_run_counter[0] = case["counters"]
    wp = write_plan(case["offsets"], case["seeds"], num_valid_reqs=case["nvr"])
    rig.write(wp, ids=case["ids"], pos=case["pos"], loc=case["loc"], exp_tok=case["exp_tok"], exp_pos=case["exp_pos"])
