"""SPEC §9 bounds rule: no op reads or writes outside an array whatever its input values; out-of-range values
are reported, never followed. The exact rows are the decisions documented in the docstrings of
``kvcanary/ops/reference/{verify,write,plan,scatter}.py``; every buffer here sits between guard regions of a larger
allocation, and the guards must stay untouched."""

from __future__ import annotations

import torch

import kvcanary as kc
from kvcanary import FailReason as F
from support import spec_model as M
from support.canary_testlib import Rig, run_plan, t32, t64, verify_plan, write_plan

OOR = int(F.SLOT_OUT_OF_RANGE)
A = M.splitmix64(M.ANCHOR)
TAG = 5
GUARD = 0x3C


def guarded_rig(num_slots: int, ring: int = 8, **kw) -> tuple[Rig, torch.Tensor, torch.Tensor]:
    """A rig whose canary buffer and ring are the middle of larger tensors (2 guard rows each side)."""
    rig = Rig.make(num_slots, ring=ring, tag=TAG, **kw)
    big_buf = torch.full((num_slots + 4, 32), GUARD, dtype=torch.uint8)
    big_ring = torch.full((ring + 4, 8), GUARD, dtype=torch.int64)
    big_buf[2:-2] = 0
    big_ring[2:-2] = 0
    rig.buf = big_buf[2:-2]
    log = rig.log
    rig.log = kc.ViolationLog(violation_ring=big_ring[2:-2], violation_write_index=log.violation_write_index,
                              slot_run_counter=log.slot_run_counter, kernel_run_counter=log.kernel_run_counter)
    return rig, big_buf, big_ring


def assert_guards(big_buf, big_ring):
    assert (big_buf[:2] == GUARD).all() and (big_buf[-2:] == GUARD).all()
    assert (big_ring[:2] == GUARD).all() and (big_ring[-2:] == GUARD).all()


def test_verify_out_of_range_slot_or_prev_gets_one_row_and_no_other_check():
    rig, big_buf, big_ring = guarded_rig(4)
    rig.set_recs([[0] * 4, [7, 0, M.i64(A), 0], [0] * 4, [0] * 4])
    plan = verify_plan(
        slots=[-1, -2, 4, 9, 1, 1, 0, 1],
        exp_tok=[5, 6, 7, 8, 9, 7, 1, 7],
        exp_pos=[10, 11, 12, 13, 14, 0, 0, 0],
        prev=[-1, 3, 0, 2, 4, -1, 99, -7],
    )
    rows = rig.verify(plan)
    assert rows == [
        (TAG, -1, 10, -1, 5, 0, -1, OOR),
        (TAG, -2, 11, -1, 6, 0, 3, OOR),
        (TAG, 4, 12, -1, 7, 0, 0, OOR),
        (TAG, 9, 13, -1, 8, 0, 2, OOR),
        (TAG, 1, 14, -1, 9, 0, 4, OOR),  # prev == num_slots
        # entry 5: valid slot, prev -1 = chain head: clean. entry 6: slot 0 skipped before any bounds check.
        # entry 7: a negative prev other than -1 is still a chain head: clean.
    ]
    assert rig.slot_runs == 8
    assert_guards(big_buf, big_ring)
    rows = rig.verify(verify_plan([4], [5], [6], [-1]), check_token=False)
    assert rows == [(TAG, 4, 6, -1, -1, 0, -1, OOR)]


def test_write_out_of_range_slot_is_reported_and_skipped():
    rig, big_buf, big_ring = guarded_rig(4, flag=1)
    rows = rig.write(write_plan([0, 4], [-1]), ids=[1, 2, 3, 4], pos=[0, 1, 2, 3], loc=[1, 4, 2, 100])
    h1 = M.mix3(A, 1, 0)
    h2 = M.mix3(h1, 3, 2)
    assert rows == [(TAG, 4, 1, 2, -1, M.i64(h1), -1, OOR), (TAG, 100, 3, 4, -1, M.i64(h2), -1, OOR)]
    # The chain skips the out-of-range token: slot 2 follows slot 1 directly.
    assert rig.recs()[2] == [3, 2, M.i64(h1), 0]
    assert rig.slot_runs == 2
    assert_guards(big_buf, big_ring)


def test_write_out_of_range_slot_is_not_position_checked_and_input_assert_is_skipped():
    rig, _big_buf, _big_ring = guarded_rig(4, flag=1)
    rig.set_recs([[0] * 4, [0] * 4, [0] * 4, [9, 5, 77, 0]])
    rows = rig.write(write_plan([0, 2], [3]), ids=[1, 2], pos=[50, 6], loc=[7, 1], exp_tok=[0, 2], exp_pos=[0, 6])
    h = M.mix3(77, 9, 5)
    assert rows == [(TAG, 7, 50, 1, -1, M.i64(h), -1, OOR)]  # then slot 1 at position 6 = 5 + 1: clean
    assert rig.recs()[1] == [2, 6, M.i64(h), 0]


def test_write_seed_out_of_range_reports_the_seed_and_stamps_nothing():
    rig, big_buf, big_ring = guarded_rig(4)
    rows = rig.write(write_plan([0, 2, 3], [4, -5]), ids=[1, 2, 3], pos=[0, 1, 0], loc=[1, 2, 3])
    assert rows == [(TAG, 4, -1, -1, -1, 0, -1, OOR)]
    recs = rig.recs()
    assert recs[1] == [0] * 4 and recs[2] == [0] * 4
    assert recs[3] == [3, 0, M.i64(A), 0]  # a negative seed still means "no prefix"
    assert rig.slot_runs == 1
    assert_guards(big_buf, big_ring)


def test_write_token_range_outside_the_token_arrays():
    rig, big_buf, big_ring = guarded_rig(8)
    # 4 tokens. request 0: [2, 5) ends past the tokens; request 1: [5, -1) is empty (its seed 99 is still
    # checked); request 2: [-1, 1) starts before 0; request 3: [1, 3) is fine.
    wp = write_plan([2, 5, -1, 1, 3], [-1, 99, -1, -1])
    rows = rig.write(wp, ids=[1, 2, 3, 4], pos=[0, 1, 2, 3], loc=[1, 2, 3, 4])
    assert rows == [(TAG, -1, 2, -1, -1, 0, 5, OOR), (TAG, 99, -1, -1, -1, 0, -1, OOR),
                    (TAG, -1, -1, -1, -1, 0, 1, OOR)]
    assert [r[0] for r in rig.recs()] == [0, 0, 2, 3, 0, 0, 0, 0]
    assert rig.slot_runs == 2
    assert_guards(big_buf, big_ring)


def test_write_range_check_comes_before_the_seed_check():
    rig, _, _ = guarded_rig(4)
    rows = rig.write(write_plan([0, 9], [77]), ids=[1], pos=[0], loc=[1])
    assert rows == [(TAG, -1, 0, -1, -1, 0, 9, OOR)]


def test_ring_write_index_negative_or_wrapping_never_writes_outside_the_ring():
    rig, big_buf, big_ring = guarded_rig(2, ring=3)
    rig.log.violation_write_index[0] = -2
    rig.verify(verify_plan([5, 6, 7], [0, 0, 0], [0, 0, 0], [-1, -1, -1]))
    assert rig.index == 1
    assert rig.log.violation_ring[0].tolist()[1] == 7  # only i = 0 lands in the ring
    assert (rig.log.violation_ring[1:] == 0).all()
    assert_guards(big_buf, big_ring)
    rig.log.violation_write_index[0] = 2**31 - 1
    rig.verify(verify_plan([5], [0], [0], [-1]))
    assert rig.index == -(2**31)
    assert_guards(big_buf, big_ring)


def test_plan_invalid_rows_contribute_nothing_and_are_counted():
    r2t = [[0] * 4] + [[10 * r + p + 1 for p in range(4)] for r in range(1, 3)]
    run = run_plan(rpi=[-1, 1, 3, 2, 0], prefix=[1, 2, 1, 5, 7], extend=[1, 1, 1, 1, 1], r2t=r2t, capacity=8,
                   req_capacity=5)
    assert int(run.invalid_rows[0]) == 4  # rpi -1, rpi 3 = max_reqs, prefix 5 > 4, padding row with prefix 7
    assert run.vp.verify_slot_indices[:2].tolist() == [11, 12] and int(run.vp.verify_num_valid[0]) == 2
    assert run.wp.write_offsets.tolist() == [0, 0, 1, 1, 1, 1]
    assert run.wp.write_seed_slot_indices.tolist() == [-1, 12, -1, -1, -1]
    run = run_plan(rpi=[2], prefix=[4], extend=[0], r2t=r2t, capacity=8)  # prefix == max_seq_len is fine
    assert int(run.invalid_rows[0]) == 0 and int(run.vp.verify_num_valid[0]) == 4


def test_plan_lut_out_of_range_yields_minus_two():
    r2t = [[0] * 3, [1, 3, 4]]
    run = run_plan(rpi=[1], prefix=[3], extend=[1], r2t=r2t, window=5, lut=[7, 8, 9, 10], capacity=4)
    assert run.vp.verify_slot_indices[:3].tolist() == [8, 10, -2]
    assert run.vp.verify_prev_slot_indices[:3].tolist() == [-1, 8, 10]
    assert run.wp.write_seed_slot_indices.tolist() == [-2]


def test_plan_outputs_in_guarded_memory():
    """Plan outputs as slices of larger tensors; huge prefix / index values must not move the writes."""
    big = torch.full((40,), 77, dtype=torch.int64)
    big32 = torch.full((10,), 77, dtype=torch.int32)
    vp = kc.VerifyPlan(verify_slot_indices=big[1:5], verify_expected_tokens=big[6:10], verify_expected_positions=big[11:15],
                       verify_prev_slot_indices=big[16:20], verify_num_valid=big32[1:2], enable=big32[3:4])
    wp = kc.WritePlan(write_offsets=big[21:24], write_seed_slot_indices=big[25:27], write_num_valid_reqs=big32[5:6])
    inv = big32[7:8]
    r2t = t32([[0] * 3, [1, 2, 3]])
    kc.launch_canary_plan_kernels(
        verify_plan_out=vp, write_plan_out=wp, req_pool_indices=t64([2**40, 1]), prefix_lens=t64([2**62, 2]),
        extend_seq_lens=t64([5, 1]), req_to_token=r2t, swa_window_size=0, full_to_swa_index_mapping=None,
        verify_capacity=4, req_to_verify_expected_tokens=t32([[1, 2], [3, 4]]),
        req_to_verify_expected_tokens_valid_lens=t64([9, 9]), kv_token_id_vs_position_offset=1,
        invalid_rows_out=inv)
    guards = [0, 5, 10, 15, 20, 24, 27, *list(range(28, 40))]
    assert all(int(big[i]) == 77 for i in guards)
    assert all(int(big32[i]) == 77 for i in (0, 2, 4, 6, 8, 9))
    assert big[1:3].tolist() == [1, 2] and big[6:8].tolist() == [4, -1]  # gather stops at max_context_len = 2
    assert int(inv[0]) == 1

