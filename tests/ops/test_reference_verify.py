"""SPEC §7 verify on the CPU: hand-built cases from SPEC's text, and a property test against the scalar model."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from kvcanary import CanaryLaunchTag as Tag
from kvcanary import FailReason as F
from support import spec_model as M
from support.canary_testlib import PoolSource, Rig, single_chain_plan, verify_plan

A = M.splitmix64(M.ANCHOR)
TAG = int(Tag.HEAD_V_SWA)
SLOTS = [3, 5, 2]
TOKENS = [7, 8, 9]


def chain_rig(**kw) -> Rig:
    """Slots 3, 5, 2 hold tokens 7, 8, 9 at positions 0, 1, 2 as one chain from the anchor."""
    rig = Rig.make(8, tag=TAG, **kw)
    recs = [[0] * 4 for _ in range(8)]
    hashes = M.Chain().hashes(zip(TOKENS, [0, 1, 2]))
    for s, tok, p, h in zip(SLOTS, TOKENS, [0, 1, 2], hashes):
        recs[s] = [tok, p, h, 0]
    # Slot 0 (the padding slot) holds garbage: it must never be checked.
    recs[0] = [-9, -9, -9, -9]
    rig.set_recs(recs)
    return rig


def test_clean_chain_has_no_rows_and_counts():
    rig = chain_rig()
    assert rig.verify(single_chain_plan(SLOTS, [0, 1, 2], TOKENS)) == []
    assert (rig.kernel_runs, rig.slot_runs, rig.index) == (1, 3, 0)


def test_slot_zero_entries_are_skipped_but_counted():
    rig = chain_rig()
    plan = verify_plan([0, 3, 0], [123, 7, -1], [50, 0, 51], [7, -1, 3])
    assert rig.verify(plan) == []
    assert rig.slot_runs == 3


def test_prev_zero_means_unknown_predecessor_and_prev_minus_one_means_chain_head():
    rig = chain_rig()
    recs = rig.recs()
    # Slot 5 is position 1: with prev 0 its hash is not checked.
    assert rig.verify(verify_plan([5], [8], [1], [0])) == []
    # ... but a position mismatch still is, and expected_aux then carries the stored hash itself.
    rows = rig.verify(verify_plan([5], [8], [4], [0]))
    assert rows == [(TAG, 5, 1, 8, 8, recs[5][2], recs[5][2], int(F.VERIFY_POSITION_MISMATCH))]
    # With prev -1 slot 5 is checked against the anchor, which it does not hold.
    rows = rig.verify(verify_plan([5], [8], [1], [-1]))
    assert rows == [(TAG, 5, 1, 8, 8, recs[5][2], M.i64(A), int(F.VERIFY_CHAIN_HASH_MISMATCH))]
    # Any negative prev is a chain head (SPEC §9).
    assert rig.verify(verify_plan([3], [7], [0], [-5])) == []


def test_chain_mismatch_row():
    rig = chain_rig()
    recs = rig.recs()
    rows = rig.verify(verify_plan([2], [9], [2], [3]))  # slot 2 claims slot 3 as predecessor
    want_aux = M.i64(M.mix3(recs[3][2], 7, 0))
    assert rows == [(TAG, 2, 2, 9, 9, recs[2][2], want_aux, int(F.VERIFY_CHAIN_HASH_MISMATCH))]


def test_position_and_token_mismatch_rows():
    rig = chain_rig()
    recs = rig.recs()
    expected_chain = M.i64(M.mix3(recs[3][2], 7, 0))
    assert expected_chain == recs[5][2]
    rows = rig.verify(verify_plan([5], [8], [2], [3]))
    assert rows == [(TAG, 5, 1, 8, 8, recs[5][2], expected_chain, int(F.VERIFY_POSITION_MISMATCH))]
    rows = rig.verify(verify_plan([5], [80], [1], [3]))
    assert rows == [(TAG, 5, 1, 8, 80, recs[5][2], expected_chain, int(F.VERIFY_TOKEN_MISMATCH))]
    rows = rig.verify(verify_plan([5], [80], [9], [3]))
    assert rows == [(TAG, 5, 1, 8, 80, recs[5][2], expected_chain,
                     int(F.VERIFY_TOKEN_MISMATCH | F.VERIFY_POSITION_MISMATCH))]


def test_token_check_off_or_expected_minus_one_skips_the_token_and_reports_minus_one():
    rig = chain_rig()
    recs = rig.recs()
    assert rig.verify(verify_plan([5], [80], [1], [3]), check_token=False) == []
    assert rig.verify(verify_plan([5], [-1], [1], [3]), check_token=True) == []
    rows = rig.verify(verify_plan([5], [80], [9], [3]), check_token=False)
    assert rows == [(TAG, 5, 1, 8, -1, recs[5][2], recs[5][2], int(F.VERIFY_POSITION_MISMATCH))]


def test_real_kv_mismatch_in_none_mode_is_a_nonzero_stored_value():
    rig = chain_rig()
    rig.buf.numpy().view("int64")[5, 3] = 17
    recs = rig.recs()
    rows = rig.verify(single_chain_plan(SLOTS, [0, 1, 2], TOKENS))
    assert rows == [(TAG, 5, 1, 8, 8, recs[5][2], recs[5][2], int(F.VERIFY_REAL_KV_HASH_MISMATCH))]


def test_all_bits_at_once():
    rig = chain_rig()
    rig.buf.numpy().view("int64")[2, 3] = 1
    recs = rig.recs()
    rows = rig.verify(verify_plan([2], [1], [0], [-1]))
    assert rows == [(TAG, 2, 2, 9, 1, recs[2][2], M.i64(A), int(F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH
                                                              | F.VERIFY_REAL_KV_HASH_MISMATCH | F.VERIFY_TOKEN_MISMATCH))]


def test_enable_zero_skips_everything_but_the_kernel_counter():
    rig = chain_rig()
    plan = verify_plan([5, 2], [1, 1], [9, 9], [-1, -1], enable=0)
    assert rig.verify(plan) == []
    assert (rig.kernel_runs, rig.slot_runs) == (1, 0)
    plan.enable[0] = 1
    assert len(rig.verify(plan)) == 2
    assert (rig.kernel_runs, rig.slot_runs) == (2, 2)


def test_num_valid_is_clamped_to_capacity():
    rig = chain_rig()
    bad = verify_plan([5, 2], [1, 1], [9, 9], [-1, -1], num_valid=7)
    assert len(rig.verify(bad)) == 2 and rig.slot_runs == 2
    bad.verify_num_valid[0] = -4
    assert rig.verify(bad) == [] and rig.slot_runs == 2
    bad.verify_num_valid[0] = 1
    assert len(rig.verify(bad)) == 1 and rig.slot_runs == 3
    assert rig.kernel_runs == 3


def test_ring_fills_once_and_the_index_keeps_counting():
    rig = chain_rig(ring=2)
    plan = verify_plan([3, 5, 2, 3, 5], [7, 8, 9, 7, 8], [10, 11, 12, 13, 14], [-1, 3, 5, -1, 3])
    rows = rig.verify(plan)
    assert [r[1] for r in rows] == [3, 5]  # first two violations in entry order
    assert [r[2] for r in rows] == [0, 1]
    assert rig.index == 5
    ring_before = rig.log.violation_ring.clone()
    rig.verify(verify_plan([2], [9], [99], [5]))
    assert rig.index == 6
    assert torch.equal(rig.log.violation_ring, ring_before)


def test_rows_append_after_existing_rows():
    rig = chain_rig(ring=4)
    rig.log.violation_write_index[0] = 1
    rig.log.violation_ring[0] = 42
    rows = rig.verify(verify_plan([3, 5], [7, 8], [1, 1], [-1, 3]))
    assert rig.log.violation_ring[0].tolist() == [42] * 8
    assert [r[1] for r in rows] == [3] and rig.index == 2


# ------------------------------------------------------------------------------------------ property test


@st.composite
def verify_cases(draw):
    num_slots = draw(st.integers(1, 10))
    big = st.sampled_from([2**63 - 1, -(2**63)])
    ints = st.integers(-3, 20) | big
    recs = [[draw(ints), draw(ints), draw(ints), draw(st.sampled_from([0, 0, 1]) | big)] for _ in range(num_slots)]
    chain = draw(st.permutations(list(range(num_slots))))[: draw(st.integers(0, num_slots))]
    toks = [draw(st.integers(0, 20)) for _ in chain]
    for s, tok, p, h in zip(chain, toks, range(len(chain)), M.Chain().hashes(zip(toks, range(len(chain))))):
        recs[s][:3] = [tok, p, h]
    C = draw(st.integers(1, 12))
    entries = []
    for _ in range(draw(st.integers(0, C))):
        if chain and draw(st.booleans()):
            j = draw(st.integers(0, len(chain) - 1))
            slot, prev = chain[j], (chain[j - 1] if j else draw(st.sampled_from([-1, -1, 0, -3])))
            tok = draw(st.sampled_from([toks[j], toks[j], -1, toks[j] + 1]))
            pos = draw(st.sampled_from([j, j, j + 1]))
        else:
            slot, prev = draw(st.integers(-2, num_slots + 1)), draw(st.integers(-2, num_slots + 1))
            tok, pos = draw(ints), draw(ints)
        entries.append((slot, tok, pos, prev))
    return dict(
        num_slots=num_slots, recs=recs, chain=chain, C=C, entries=entries,
        num_valid=draw(st.sampled_from([len(entries)] * 4 + [-1, C + 2, 0])),
        enable=draw(st.sampled_from([1, 1, 1, 0, 3])), check=draw(st.booleans()), tag=draw(st.integers(0, 11)),
        ring=draw(st.integers(1, 5)), index=draw(st.sampled_from([0, 0, 2, 7, 2**31 - 1])),
        mode=draw(st.integers(0, 2)), n_pools=draw(st.integers(0, 4)), fix_rkv=draw(st.booleans()),
        page=draw(st.integers(1, 3)), seed=draw(st.integers(0, 2**31)), stride=draw(st.sampled_from([32, 48, 64])),
    )


@given(verify_cases())
def test_verify_matches_scalar_model(case):
    g = torch.Generator().manual_seed(case["seed"])
    n = case["num_slots"]
    pools = [PoolSource.make(rows=-(-n // case["page"]), page_size=case["page"], num_bytes_per_token=32,
                             read_bytes=16 * (1 + k % 2), slack=16 * (k % 2), generator=g)
             for k in range(case["n_pools"])]
    rig = Rig.make(n, stride=case["stride"], ring=case["ring"], tag=case["tag"], pools=pools, mode=case["mode"])
    rig.buf.random_(0, 256, generator=g)  # bytes past 32 hold garbage that must be ignored and kept
    recs = case["recs"]
    if case["fix_rkv"]:
        fp = rig.fp()
        for s in case["chain"]:
            recs[s][3] = M.i64(fp(s))
    rig.set_recs(recs)
    rig.log.violation_write_index[0] = case["index"]
    e = case["entries"]
    plan = verify_plan([x[0] for x in e], [x[1] for x in e], [x[2] for x in e], [x[3] for x in e],
                       num_valid=case["num_valid"], enable=case["enable"], capacity=case["C"])
    rig.verify(plan, check_token=case["check"])
