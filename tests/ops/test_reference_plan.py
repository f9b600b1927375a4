"""SPEC §5 plan on the CPU: hand-built batches worked out by hand, and a property test against the scalar model.

``run_plan`` poisons every output first and compares every output with ``spec_model.plan``; the hand-built
cases below additionally spell out the expected arrays literally.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcanary as kc
from support.canary_testlib import POISON, run_plan, t32, t64

P64 = POISON[torch.int64]
# req_to_token: row r, position p -> slot 10 * r + p + 1 (row 0 = padding row).
R2T = [[0] * 8] + [[10 * r + p + 1 for p in range(8)] for r in range(1, 4)]


def entries(run):
    vp = run.vp
    n = int(vp.verify_num_valid[0])
    return list(zip(vp.verify_slot_indices[:n].tolist(), vp.verify_expected_tokens[:n].tolist(),
                    vp.verify_expected_positions[:n].tolist(), vp.verify_prev_slot_indices[:n].tolist()))


def test_full_attention_batch_with_a_padding_row():
    run = run_plan(rpi=[1, 0, 2], prefix=[3, 5, 2], extend=[2, 4, 1], r2t=R2T, capacity=10, req_capacity=4)
    assert entries(run) == [
        (11, -1, 0, -1), (12, -1, 1, 11), (13, -1, 2, 12),  # request 1, positions 0..2
        (21, -1, 0, -1), (22, -1, 1, 21),  # request 2; the padding row has none
    ]
    assert int(run.vp.enable[0]) == 1
    assert run.wp.write_offsets.tolist() == [0, 2, 2, 3, 0]  # padding row writes nothing; tail zeroed
    assert run.wp.write_seed_slot_indices[:3].tolist() == [13, -1, 22]
    assert int(run.wp.write_num_valid_reqs[0]) == 3
    assert int(run.invalid_rows[0]) == 0


def test_seed_rules_negative_extend_and_empty_prefix():
    run = run_plan(rpi=[1, 2, 3, 1], prefix=[0, 4, 2, -3], extend=[3, -2, 0, 2], r2t=R2T, capacity=8)
    # prefix 0 / negative: no entries; request 2 has 4, request 3 has 2.
    assert [e[0] for e in entries(run)] == [21, 22, 23, 24, 31, 32]
    assert run.wp.write_offsets.tolist() == [0, 3, 3, 3, 5]
    # seed only with prefix > 0 and write_len > 0: request 1 has no prefix, 2 and 3 write nothing,
    # the last (negative prefix) has no prefix.
    assert run.wp.write_seed_slot_indices.tolist() == [-1, -1, -1, -1]


def test_swa_window_and_lut_translation():
    lut = [1000 + x for x in range(40)]
    run = run_plan(rpi=[1, 2], prefix=[5, 1], extend=[1, 1], r2t=R2T, window=2, lut=lut, capacity=8)
    # Request 1: window [3, 5); the window's first entry keeps its real (translated) predecessor.
    # Request 2: window [0, 1) starts at position 0 and is a chain head.
    assert entries(run) == [(1014, -1, 3, 1013), (1015, -1, 4, 1014), (1021, -1, 0, -1)]
    assert run.wp.write_seed_slot_indices.tolist() == [1015, 1021]


def test_window_larger_than_prefix_and_lut_without_window_effect():
    lut = [2 * x for x in range(40)]
    run = run_plan(rpi=[3], prefix=[3], extend=[0], r2t=R2T, window=100, lut=lut, capacity=4)
    assert entries(run) == [(62, -1, 0, -1), (64, -1, 1, 62), (66, -1, 2, 64)]


def test_lut_out_of_range_and_negative_slots():
    r2t = [row[:] for row in R2T]
    r2t[1][:4] = [5, 50, -1, 7]
    run = run_plan(rpi=[1], prefix=[4], extend=[1], r2t=r2t, window=8, lut=list(range(100, 110)), capacity=8)
    # T(5) = 105; T(50) = -2 (past the LUT); T(-1) = -1 (negative passes through); T(7) = 107.
    assert entries(run) == [(105, -1, 0, -1), (-2, -1, 1, 105), (-1, -1, 2, -2), (107, -1, 3, -1)]
    assert run.wp.write_seed_slot_indices.tolist() == [107]


def test_expected_token_gather_with_valid_lens():
    pool = [[0] * 6] + [[100 * r + c for c in range(6)] for r in range(1, 4)]
    run = run_plan(rpi=[1, 2], prefix=[4, 3], extend=[1, 1], r2t=R2T, pool=pool, valid_lens=[2, 6], capacity=8)
    assert [e[1] for e in entries(run)] == [100, 101, -1, -1, 200, 201, 202]


def test_expected_token_gather_with_eagle_offset():
    pool = [[0] * 6] + [[100 * r + c for c in range(6)] for r in range(1, 4)]
    run = run_plan(rpi=[1, 2], prefix=[4, 7], extend=[1, 1], r2t=R2T, pool=pool, valid_lens=[3, 99], offset=1,
                   capacity=16)
    # Request 1: pool[1][p + 1] while p + 1 < 3. Request 2: p + 1 < max_context_len = 6 (valid_lens is larger).
    assert [e[1] for e in entries(run)] == [101, 102, -1, -1, 201, 202, 203, 204, 205, -1, -1]
    run = run_plan(rpi=[1], prefix=[2], extend=[0], r2t=R2T, pool=pool, valid_lens=[5], offset=-1, capacity=4)
    assert [e[1] for e in entries(run)] == [-1, 100]


def test_pool_with_more_rows_than_req_to_token():
    pool = [[7 * r + c for c in range(3)] for r in range(9)]
    run = run_plan(rpi=[3], prefix=[2], extend=[0], r2t=R2T, pool=pool, valid_lens=[3], capacity=4)
    assert [e[1] for e in entries(run)] == [21, 22]


def test_capacity_exactly_fitting():
    run = run_plan(rpi=[1, 2], prefix=[3, 2], extend=[1, 1], r2t=R2T, capacity=5)
    assert int(run.vp.verify_num_valid[0]) == 5 and int(run.vp.enable[0]) == 1
    assert [e[0] for e in entries(run)] == [11, 12, 13, 21, 22]


def test_capacity_one_short_disables_the_step_and_writes_no_entry():
    run = run_plan(rpi=[1, 2], prefix=[3, 2], extend=[1, 4], r2t=R2T, capacity=4)
    assert int(run.vp.verify_num_valid[0]) == 4 and int(run.vp.enable[0]) == 0
    for a in (run.vp.verify_slot_indices, run.vp.verify_expected_tokens, run.vp.verify_expected_positions,
              run.vp.verify_prev_slot_indices):
        assert a.tolist() == [P64] * 4
    # The write plan is still produced.
    assert run.wp.write_offsets.tolist() == [0, 1, 5]
    assert run.wp.write_seed_slot_indices.tolist() == [13, 22]


def test_a_fitting_plan_re_enables_after_an_overflow():
    vp = kc.VerifyPlan.allocate(verify_capacity=2)
    wp = kc.WritePlan.allocate(write_req_capacity=1)
    for prefix, want in (([3], (2, 0)), ([2], (2, 1)), ([0], (0, 1))):
        kc.launch_canary_plan_kernels(
            verify_plan_out=vp, write_plan_out=wp, req_pool_indices=t64([1]), prefix_lens=t64(prefix),
            extend_seq_lens=t64([1]), req_to_token=t32(R2T), swa_window_size=0, full_to_swa_index_mapping=None,
            verify_capacity=2, req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0)
        assert (int(vp.verify_num_valid[0]), int(vp.enable[0])) == want


def test_empty_batch():
    run = run_plan(rpi=[], prefix=[], extend=[], r2t=R2T, capacity=3, req_capacity=2)
    assert int(run.vp.verify_num_valid[0]) == 0 and int(run.vp.enable[0]) == 1
    assert run.wp.write_offsets.tolist() == [0, 0, 0]
    assert int(run.wp.write_num_valid_reqs[0]) == 0


# ------------------------------------------------------------------------------------------ property test


@st.composite
def plan_cases(draw):
    max_reqs = draw(st.integers(1, 5))
    max_seq_len = draw(st.integers(1, 8))
    bs = draw(st.integers(0, 6))
    lut_len = draw(st.integers(1, 30))
    r2t = [[draw(st.integers(-2, lut_len + 2)) for _ in range(max_seq_len)] for _ in range(max_reqs)]
    window = draw(st.sampled_from([0, 0, 1, 2, 3, 100]))
    lut = [draw(st.integers(-1, 1000)) for _ in range(lut_len)] if window > 0 else None
    has_pool = draw(st.booleans())
    ctx = draw(st.integers(1, 10))
    pool = [[draw(st.integers(-3, 500)) for _ in range(ctx)] for _ in range(max_reqs + draw(st.integers(0, 2)))] \
        if has_pool else None
    return dict(
        rpi=draw(st.lists(st.integers(-1, max_reqs), min_size=bs, max_size=bs)),
        prefix=draw(st.lists(st.integers(-2, max_seq_len + 1), min_size=bs, max_size=bs)),
        extend=draw(st.lists(st.integers(-2, 6), min_size=bs, max_size=bs)),
        r2t=r2t, window=window, lut=lut, pool=pool,
        valid_lens=draw(st.lists(st.integers(-1, ctx + 2), min_size=bs, max_size=bs)) if has_pool else None,
        offset=draw(st.sampled_from([0, 0, 1, -1, 3])),
        capacity=draw(st.integers(1, 25)), req_capacity=bs + draw(st.integers(0, 2)) or 1,
    )


@given(plan_cases())
def test_plan_matches_scalar_model(case):
    run_plan(**case)
