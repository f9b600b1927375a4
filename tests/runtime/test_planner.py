"""CanaryPlanner: capacity validation, allocation, grid sizing, plan() and the one-step-late warnings."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

import kvcanary as kc
from kvcanary.ops.cuda import grids
from kvcanary.ops.cuda.specs import int_define
from kvcanary.runtime import planner as planner_mod
from kvcanary.runtime.planner import CanaryPlanner


def t64(xs):
    return torch.tensor(xs, dtype=torch.int64)


# ------------------------------------------------------------------------------------------ validation


def test_issue_example_negative_verify_capacity():
    with pytest.raises(ValueError) as e:
        CanaryPlanner(max_batch_size=4, verify_capacity=-3, device="cpu")
    assert str(e.value) == "kv-canary: verify_capacity must be non-negative, got -3"


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(max_batch_size=-1, verify_capacity=8), ValueError, "kv-canary: max_batch_size must be non-negative, got -1"),
    (dict(max_batch_size=0, verify_capacity=8), ValueError, "kv-canary: max_batch_size must be positive, got 0"),
    (dict(max_batch_size=4, verify_capacity=0), ValueError, "kv-canary: verify_capacity must be positive, got 0"),
    (dict(max_batch_size=4.0, verify_capacity=8), TypeError, "kv-canary: max_batch_size must be an int, got float"),
    (dict(max_batch_size=True, verify_capacity=8), TypeError, "kv-canary: max_batch_size must be an int, got bool"),
    (dict(max_batch_size=4, verify_capacity=8, max_tokens_per_step=-2), ValueError,
     "kv-canary: max_tokens_per_step must be non-negative, got -2"),
    (dict(max_batch_size=4, verify_capacity=8, swa_window_size=-1), ValueError,
     "kv-canary: swa_window_size must be non-negative, got -1"),
    (dict(max_batch_size=4, verify_capacity=8, expected_tokens_shape=(4,)), ValueError,
     "kv-canary: expected_tokens_shape must be (max_reqs, max_context_len), got (4,)"),
    (dict(max_batch_size=4, verify_capacity=8, expected_tokens_shape=(4, 0)), ValueError,
     "kv-canary: expected_tokens_shape[1] (max_context_len) must be positive, got 0"),
    (dict(max_batch_size=4, verify_capacity=8, device="tpu"), ValueError, "kv-canary: device must be"),
])
def test_capacity_errors(kwargs, exc, message):
    with pytest.raises(exc) as e:
        CanaryPlanner(**{"device": "cpu", **kwargs})
    assert str(e.value).startswith(message)


def test_logs_capacities_and_bytes_and_allocates_them(caplog):
    with caplog.at_level(logging.INFO, logger="kvcanary"):
        p = CanaryPlanner(max_batch_size=5, verify_capacity=33, device="cpu", name="full")
    msg = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert "max_batch_size=5" in msg and "verify_capacity=33" in msg
    vp, wp = p.verify_plan, p.write_plan
    tensors = [vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
               vp.verify_prev_slot_indices, vp.verify_num_valid, vp.enable, wp.write_offsets,
               wp.write_seed_slot_indices, wp.write_num_valid_reqs, p.invalid_rows, p._stats]
    actual = sum(t.numel() * t.element_size() for t in tensors)
    assert p.allocated_bytes == actual
    assert f"allocated {actual} device bytes" in msg
    assert vp.capacity == 33 and wp.capacity == 5


# ------------------------------------------------------------------------------------------ grid sizing


def test_cpu_planner_has_no_grid():
    p = CanaryPlanner(max_batch_size=4, verify_capacity=10_000, device="cpu")
    assert p.sm_count == 0 and p.grids == {}


def test_grid_functions_follow_capacities_and_sm_count():
    # Persistent grids: enough blocks for the capacity, capped per SM by the kernel's own #define.
    t = int_define("verify.cu", "KVC_VERIFY_THREADS")
    per_block = t * int_define("verify.cu", "KVC_VERIFY_UNROLL")
    cap_per_sm = int_define("verify.cu", "KVC_VERIFY_BLOCKS_PER_SM")
    assert grids.verify_grid(1, False, 132) == grids.Grid(1, t)
    assert grids.verify_grid(per_block * 3, False, 132) == grids.Grid(3, t)
    assert grids.verify_grid(per_block * 3 + 1, False, 132) == grids.Grid(4, t)
    assert grids.verify_grid(10**9, False, 132) == grids.Grid(cap_per_sm * 132, t)
    assert grids.verify_grid(10**9, False, 16) == grids.Grid(cap_per_sm * 16, t)
    assert grids.write_grid(5, 132).blocks == 5
    assert grids.write_grid(10**6, 2).blocks == 2 * int_define("write.cu", "KVC_WRITE_BLOCKS_PER_SM")
    plan = grids.plan_grids(10**9, 132)
    assert plan["verify_offsets"].blocks == plan["write_meta"].blocks == 1
    assert plan["verify_entries"].blocks == 132 * int_define("plan.cu", "KVC_ENTRY_BLOCKS_PER_SM")


def test_cuda_planner_reports_the_backend_grids_and_queries_sm_count_once(monkeypatch):
    calls = []

    def fake_sm_count(index):
        calls.append(index)
        return 132 if index == 0 else 16

    monkeypatch.setattr(grids, "sm_count", functools.lru_cache(maxsize=None)(fake_sm_count))
    for index, sms in ((0, 132), (1, 16), (0, 132)):
        got_sms, got = planner_mod.launch_grids(torch.device("cuda", index), verify_capacity=10**6,
                                                write_req_capacity=64)
        assert got_sms == sms
        assert got["verify"] == grids.verify_grid(10**6, False, sms)
        assert got["verify_real_kv"] == grids.verify_grid(10**6, True, sms)
        assert got["write"] == grids.write_grid(64, sms)
        assert got["plan_verify_entries"] == grids.plan_grids(10**6, sms)["verify_entries"]
    assert calls == [0, 1]


# ------------------------------------------------------------------------------------------ pool geometry


def test_capacities_from_pool_geometry():
    caps = CanaryPlanner.capacities_from_pool_geometry(pool_slots=1000, max_running_requests=8,
                                                       max_prefill_tokens=256, num_draft_tokens=3)
    assert caps.verify_capacity == 3000
    assert caps.max_batch_size == 9
    assert caps.max_tokens_per_step == 256 + 8 * 4
    p = CanaryPlanner.from_pool_geometry(pool_slots=1000, max_running_requests=8, max_prefill_tokens=256,
                                         device="cpu", verify_capacity=123)
    assert (p.verify_capacity, p.max_batch_size, p.max_tokens_per_step) == (123, 9, 264)
    with pytest.raises(ValueError, match="kv-canary: pool_slots must be positive, got 0"):
        CanaryPlanner.capacities_from_pool_geometry(pool_slots=0, max_running_requests=1, max_prefill_tokens=1)


# ------------------------------------------------------------------------------------------ plan()


def _batch(gen, bs=4, max_reqs=6, max_seq=20, num_slots=200):
    r2t = torch.randint(1, num_slots, (max_reqs, max_seq), generator=gen, dtype=torch.int32)
    rpi = torch.randint(0, max_reqs, (bs,), generator=gen, dtype=torch.int64)
    prefix = torch.randint(0, max_seq + 1, (bs,), generator=gen, dtype=torch.int64)
    extend = torch.randint(0, 4, (bs,), generator=gen, dtype=torch.int64)
    return dict(req_pool_indices=rpi, prefix_lens=prefix, extend_seq_lens=extend, req_to_token=r2t)


def test_plan_matches_the_op_on_fresh_plans_and_keeps_addresses(gen):
    p = CanaryPlanner(max_batch_size=6, verify_capacity=200, device="cpu")
    ptrs = [t.data_ptr() for t in (p.verify_plan.verify_slot_indices, p.write_plan.write_offsets)]
    for _ in range(20):
        b = _batch(gen)
        vp, wp = p.plan(**b)
        assert vp is p.verify_plan and wp is p.write_plan
        ref_v = kc.VerifyPlan.allocate(verify_capacity=200)
        ref_w = kc.WritePlan.allocate(write_req_capacity=6)
        kc.launch_canary_plan_kernels(verify_plan_out=ref_v, write_plan_out=ref_w, swa_window_size=0,
                                      full_to_swa_index_mapping=None, verify_capacity=200,
                                      req_to_verify_expected_tokens=None,
                                      req_to_verify_expected_tokens_valid_lens=None,
                                      kv_token_id_vs_position_offset=0, **b)
        n = int(ref_v.verify_num_valid[0])
        assert int(vp.verify_num_valid[0]) == n and int(vp.enable[0]) == int(ref_v.enable[0])
        if int(ref_v.enable[0]):
            for f in ("verify_slot_indices", "verify_expected_tokens", "verify_expected_positions",
                      "verify_prev_slot_indices"):
                assert torch.equal(getattr(vp, f)[:n], getattr(ref_v, f)[:n])
        bs = b["req_pool_indices"].shape[0]
        assert torch.equal(wp.write_offsets[:bs + 1], ref_w.write_offsets[:bs + 1])
        assert torch.equal(wp.write_seed_slot_indices[:bs], ref_w.write_seed_slot_indices[:bs])
    assert ptrs == [t.data_ptr() for t in (p.verify_plan.verify_slot_indices, p.write_plan.write_offsets)]


def test_plan_rejects_a_batch_over_capacity_and_a_wrong_pool_shape(gen):
    p = CanaryPlanner(max_batch_size=3, verify_capacity=50, device="cpu", expected_tokens_shape=(6, 20))
    b = _batch(gen, bs=4)
    with pytest.raises(ValueError, match="kv-canary: planner 'full': batch size 4 exceeds max_batch_size=3"):
        p.plan(**b)
    b = _batch(gen, bs=3)
    with pytest.raises(ValueError, match=r"expected_tokens must have expected_tokens_shape=\(6, 20\), got \(6, 21\)"):
        p.plan(**b, expected_tokens=torch.zeros((6, 21), dtype=torch.int32),
               expected_tokens_valid_lens=torch.zeros(3, dtype=torch.int64))


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_overflow_and_invalid_rows_are_warned_one_step_late(caplog):
    p = CanaryPlanner(max_batch_size=4, verify_capacity=5, device="cpu")
    r2t = torch.arange(1, 41, dtype=torch.int32).reshape(4, 10)
    ok = dict(req_pool_indices=t64([1, 2]), prefix_lens=t64([2, 2]), extend_seq_lens=t64([1, 1]), req_to_token=r2t)
    over = dict(ok, prefix_lens=t64([3, 3]))                    # 6 entries > 5
    bad = dict(ok, req_pool_indices=t64([1, 9]))                # row index 9 >= max_reqs = 4
    with caplog.at_level(logging.WARNING, logger="kvcanary"):
        p.plan(**ok)
        assert p.end_step() is None           # nothing staged before: nothing to read yet
        p.plan(**over)
        assert int(p.verify_plan.enable[0]) == 0
        stats = p.end_step()                  # reads the copy of step 1 (clean)
        assert stats == planner_mod.PlanStats(plans=1, overflows=0, invalid_rows=0)
        assert _warnings(caplog) == []
        p.plan(**bad)
        stats = p.end_step()                  # reads step 2: the overflow
        assert stats.overflows == 1
        w = _warnings(caplog)
        assert len(w) == 1 and "more verify entries than verify_capacity=5" in w[0]
        p.plan(**ok)
        stats = p.end_step()                  # reads step 3: the invalid row
        w = _warnings(caplog)
        assert len(w) == 2 and "1 batch row(s) had req_pool_indices outside" in w[1]
        assert stats == planner_mod.PlanStats(plans=3, overflows=1, invalid_rows=1)
        assert p.flush() == planner_mod.PlanStats(plans=4, overflows=1, invalid_rows=1)
        assert len(_warnings(caplog)) == 2     # nothing new: not warned twice
    assert p.stats() == planner_mod.PlanStats(plans=4, overflows=1, invalid_rows=1)


def test_flush_warns_at_once(caplog):
    p = CanaryPlanner(max_batch_size=4, verify_capacity=1, device="cpu")
    r2t = torch.arange(1, 41, dtype=torch.int32).reshape(4, 10)
    with caplog.at_level(logging.WARNING, logger="kvcanary"):
        p.plan(req_pool_indices=t64([1]), prefix_lens=t64([3]), extend_seq_lens=t64([1]), req_to_token=r2t)
        p.end_step()
        assert _warnings(caplog) == []
        p.flush()
        assert len(_warnings(caplog)) == 1
