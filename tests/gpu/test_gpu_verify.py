"""Verify (SPEC §7) on the GPU vs the CPU reference, on fresh random canaries.

Each case stamps clean chains (vectorized here, from SPEC §3), then corrupts a random share of them: record
fields, expected tokens/positions, prev 0 / negative prevs, skipped slot-0 entries and out-of-range slots and
prevs (the bounds rule). Both backends verify identical copies; the log is compared as a multiset (many
threads append), everything else byte for byte. Covers both specializations of the token check, real-KV modes
NONE/PARTIAL/ALL with 1-4 sources and page sizes 1 and > 1, canary strides with and without 16-byte
alignment, more than 4,000,000 entries, and ring overflow with thousands of violations.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary.consts import FailReason, RealKvHashMode
from support.gpu_util import (
    LogState,
    assert_same_bytes,
    compare_logs,
    context,
    make_verify_case,
    rng_for,
    size,
    sort_rows,
    t,
)

NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL


def run_verify(case, *, check, tag=3, cpu_log=None):
    canary, sources, plan, log, mode = case
    out = {}
    for dev in ("cpu", "cuda"):
        lg = (cpu_log or log) if dev == "cpu" else log
        lg = lg.to(dev)
        buf = canary.to(dev).clone()
        bases = [s.base.to(dev).clone() for s in sources]
        ctx = context(buf, lg, tag=tag, sources=sources, source_bases=bases, mode=mode)
        vp = kc.VerifyPlan(**{k: v.to(dev).clone() for k, v in plan.items()})
        kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=check)
        out[dev] = (buf, lg, vp)
    torch.cuda.synchronize()
    return out


def check_same(out, canary):
    (cbuf, clog, cvp), (gbuf, glog, gvp) = out["cpu"], out["cuda"]
    assert_same_bytes(canary, gbuf, "canary_buf (verify must not write it)")
    assert_same_bytes(cbuf, gbuf, "canary_buf")
    for field in ("verify_slot_indices", "verify_expected_tokens", "verify_expected_positions",
                  "verify_prev_slot_indices", "verify_num_valid", "enable"):  # verify reads its plan only
        assert_same_bytes(getattr(cvp, field), getattr(gvp, field), field)
    return compare_logs(clog, glog)


SOURCE_CASES = [
    ("none", NONE, []),
    ("none-with-sources", NONE, [dict(page_size=1, num_bytes_per_token=64, read_bytes=64)]),
    ("partial-1-page1", PARTIAL, [dict(page_size=1, num_bytes_per_token=256, read_bytes=256)]),
    ("partial-1-page16-bf16-3d", PARTIAL, [dict(page_size=16, num_bytes_per_token=128, read_bytes=64,
                                                dtype=torch.bfloat16, extra_row_bytes=32, stride_pad=48,
                                                three_d=True)]),
    ("partial-2", PARTIAL, [dict(page_size=1, num_bytes_per_token=32, read_bytes=16),
                            dict(page_size=64, num_bytes_per_token=16, read_bytes=16, stride_pad=16)]),
    ("all-1-page1", ALL, [dict(page_size=1, num_bytes_per_token=96, read_bytes=80)]),
    ("all-4-mixed", ALL, [dict(page_size=4, num_bytes_per_token=32, read_bytes=32),
                          dict(page_size=1, num_bytes_per_token=128, read_bytes=128, dtype=torch.float16),
                          dict(page_size=8, num_bytes_per_token=48, read_bytes=16, extra_row_bytes=16),
                          dict(page_size=2, num_bytes_per_token=16, read_bytes=16, stride_pad=32)]),
]


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("name,mode,cfgs", SOURCE_CASES, ids=[c[0] for c in SOURCE_CASES])
def test_verify_differential(cuda_ready, name, mode, cfgs, check):
    rng = rng_for("verify", name, check)
    stride = [32, 40, 64][SOURCE_CASES.index((name, mode, cfgs)) % 3]
    case = make_verify_case(rng, num_slots=size(60_000, 6_000), n_chains=size(300, 40), len_lo=1, len_hi=size(300, 200),
                     stride=stride, mode=mode, source_cfgs=cfgs)
    out = run_verify(case, check=check)
    rows = check_same(out, case[0])
    assert rows > 0  # the corruptions were detected


def test_verify_four_million_entries(cuda_ready):
    rng = rng_for("verify-4m")
    n_chains = size(1024, 32)
    case = make_verify_case(rng, num_slots=size(4_400_000, 150_000), n_chains=n_chains, len_lo=size(3950, 3000),
                     len_hi=size(4250, 4000), corrupt=0.001, windowed=False)
    n = int(case[2]["verify_num_valid"][0])
    if n_chains == 1024:
        assert n >= 4_000_000
    out = run_verify(case, check=True)
    rows = check_same(out, case[0])
    assert rows > 0


def test_verify_ring_overflow(cuda_ready):
    rng = rng_for("verify-overflow")
    case = make_verify_case(rng, num_slots=40_000, n_chains=100, len_lo=100, len_hi=300, corrupt=0.25, ring_cap=700,
                     start_index=5)
    _canary, _sources, plan, log, _mode = case
    big = LogState(torch.zeros((len(plan["verify_slot_indices"]) * 2 + 10, 8), dtype=torch.int64),
                   log.index.clone(), log.slot_counter.clone(), log.kernel_counter.clone())
    out = run_verify(case, check=True, cpu_log=big)
    (_, clog, _), (_, glog, _) = out["cpu"], out["cuda"]
    total = int(clog.index[0])
    assert total - 5 >= 2000, "expected thousands of violations"
    assert_same_bytes(clog.index, glog.index, "violation_write_index")
    assert_same_bytes(clog.slot_counter, glog.slot_counter, "slot_run_counter")
    assert_same_bytes(clog.kernel_counter, glog.kernel_counter, "kernel_run_counter")
    # The GPU ring holds rows 5..699 of the total; each is one of the reference's rows (as a multiset).
    gpu_rows = glog.ring.cpu().numpy()
    assert_same_bytes(log.ring[:5], glog.ring[:5].cpu(), "rows before the start index")
    ref = sort_rows(clog.ring.numpy()[5:total])
    got = sort_rows(gpu_rows[5:])
    missing = Counter(tuple(r) for r in got) - Counter(tuple(r) for r in ref)
    assert not missing, f"{sum(missing.values())} GPU rows are not reference rows"


@pytest.mark.parametrize("variant", ["disabled", "num_valid_above_capacity", "num_valid_negative", "empty"])
def test_verify_active_count_on_device(cuda_ready, variant):
    rng = rng_for("verify-count", variant)
    case = make_verify_case(rng, num_slots=5000, n_chains=20, len_lo=10, len_hi=100, corrupt=0.1, extra_capacity=0)
    plan = case[2]
    if variant == "disabled":
        plan["enable"][0] = 0
    elif variant == "num_valid_above_capacity":
        plan["verify_num_valid"][0] = len(plan["verify_slot_indices"]) + 1000
    elif variant == "num_valid_negative":
        plan["verify_num_valid"][0] = -7
    else:
        plan["verify_num_valid"][0] = 0
    out = run_verify(case, check=False)
    check_same(out, case[0])
    glog = out["cuda"][1]
    assert int(glog.kernel_counter[0]) == int(case[3].kernel_counter[0]) + 1


def test_verify_bounds_no_fault(cuda_ready):
    """Wild slots and prevs (far outside the buffer, either sign) are reported, never followed."""
    rng = rng_for("verify-bounds")
    case = make_verify_case(rng, num_slots=3000, n_chains=20, len_lo=20, len_hi=100, corrupt=0.0)
    plan = case[2]
    n = int(plan["verify_num_valid"][0])
    pick = rng.choice(n, n // 2, replace=False)
    wild = np.array([1 << 62, -(1 << 62), 3000, 3001, -1, (1 << 63) - 1, -(1 << 63)], np.int64)
    plan["verify_slot_indices"][pick[: len(pick) // 2]] = t(rng.choice(wild, len(pick) // 2))
    plan["verify_prev_slot_indices"][pick[len(pick) // 2:]] = t(
        rng.choice(wild[wild >= 3000], len(pick) - len(pick) // 2))
    out = run_verify(case, check=True)
    rows = check_same(out, case[0])
    got = out["cuda"][1].ring.cpu().numpy()[:rows]
    assert rows == len(pick) and (got[:, 7] == int(FailReason.SLOT_OUT_OF_RANGE)).all()
