"""Write (SPEC §6) on the GPU vs the CPU reference, on fresh random batches.

Requests with and without a seed (a slot written by an earlier step), zero-length requests, skipped (-1)
tokens, position and input-assert mismatches, the chain-position flag absent / 0 / 1, real-KV modes
NONE/PARTIAL/ALL with 1-4 sources and page sizes 1 and > 1, and the bounds rule (out-of-range tokens,
seeds and token ranges), slots repeated within a request. The canary is compared byte for byte; the log
as a multiset (the kernel's rows come from several threads even for a single request: SPEC §4 leaves
their order unspecified). Sizes: a 32,768-token chain, 20,000 requests, ring overflow with thousands of
violations.
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
    make_log,
    make_source,
    random_bytes,
    rng_for,
    size,
    sort_rows,
    t,
)

NONE, PARTIAL, ALL = RealKvHashMode.NONE, RealKvHashMode.PARTIAL, RealKvHashMode.ALL
WILD = np.array([1 << 62, (1 << 63) - 1, 1 << 40], np.int64)


def make_case(rng, *, num_slots, lens, stride=32, input_assert=False, flag=1, mode=NONE, source_cfgs=(),
              oor=True, bad_range=0, seed_frac=0.6, skip_frac=0.03, mismatch=0.02, ring_cap=None,
              start_index=0, extra_reqs=3, num_valid_reqs=None):
    lens = np.asarray(lens, np.int64)
    n_req, total = len(lens), int(lens.sum())
    assert n_req + total < num_slots
    canary = random_bytes(rng, (num_slots, stride), torch.uint8)
    recs = canary.numpy().view(np.int64)
    sources = [make_source(rng, num_slots, **cfg) for cfg in source_cfgs]
    perm = rng.permutation(np.arange(1, num_slots))
    seed_slots, tok_slots = perm[:n_req], perm[n_req:n_req + total]
    seeds = np.where(rng.random(n_req) < seed_frac, seed_slots, -1)
    seed_pos = rng.integers(0, 1000, n_req)
    recs[seed_slots, 1] = seed_pos
    if oor and n_req > 3:
        k = max(1, n_req // 50)
        seeds[rng.choice(n_req, k, replace=False)] = num_slots + rng.integers(0, 1 << 40, k)
    r_cap = n_req + extra_reqs
    offsets = np.zeros(r_cap + 1, np.int64)
    offsets[1:n_req + 1] = np.cumsum(lens)
    starts = np.repeat(offsets[:n_req], lens)
    start_pos = np.where(seeds >= 0, seed_pos + 1, 0)
    positions = np.repeat(start_pos, lens) + (np.arange(total) - starts)
    bump = rng.random(total) < mismatch
    positions[bump] += rng.integers(-3, 4, bump.sum())
    ids = rng.integers(-(1 << 62), 1 << 62, total)
    loc = tok_slots.copy()
    loc[rng.random(total) < skip_frac] = -1
    if oor:
        bad = rng.random(total) < 0.01
        loc[bad] = num_slots + rng.choice(WILD, bad.sum()) % (1 << 62)
    exp_tok, exp_pos = ids.copy(), positions.copy()
    wrong = rng.random(total) < mismatch
    exp_tok[wrong] ^= 1
    wrong = rng.random(total) < mismatch
    exp_pos[wrong] += 1
    n_tok = total - bad_range
    # Seeds past the batch: garbage a clamped write_num_valid_reqs may reach (their requests are empty).
    seeds = np.concatenate([seeds, rng.integers(-1, num_slots + 5, extra_reqs)])
    plan = dict(write_offsets=t(offsets), write_seed_slot_indices=t(seeds),
                write_num_valid_reqs=torch.tensor([n_req if num_valid_reqs is None else num_valid_reqs],
                                                  dtype=torch.int32))
    tokens = dict(input_ids=t(ids[:n_tok]), positions=t(positions[:n_tok]), out_cache_loc=t(loc[:n_tok]),
                  expected_input_tokens=t(exp_tok[:n_tok]) if input_assert else None,
                  expected_input_positions=t(exp_pos[:n_tok]) if input_assert else None)
    flag_t = None if flag is None else torch.tensor([flag], dtype=torch.int32)
    log = make_log(rng, ring_cap if ring_cap is not None else 3 * total + n_req + 16, start_index)
    return dict(canary=canary, sources=sources, mode=mode, plan=plan, tokens=tokens, flag=flag_t, log=log,
                input_assert=input_assert)


def run_write(case, *, tag=2, cpu_log=None):
    out = {}
    for dev in ("cpu", "cuda"):
        lg = (cpu_log if (cpu_log is not None and dev == "cpu") else case["log"]).to(dev)
        buf = case["canary"].to(dev).clone()
        bases = [s.base.to(dev).clone() for s in case["sources"]]
        flag = case["flag"].to(dev).clone() if case["flag"] is not None else None
        ctx = context(buf, lg, tag=tag, sources=case["sources"], source_bases=bases, mode=case["mode"], flag=flag)
        wp = kc.WritePlan(**{k: v.to(dev).clone() for k, v in case["plan"].items()})
        tok = {k: (v.to(dev).clone() if v is not None else None) for k, v in case["tokens"].items()}
        kc.launch_canary_write_kernel(context=ctx, plan=wp, enable_write_input_assert=case["input_assert"], **tok)
        out[dev] = (buf, lg)
    torch.cuda.synchronize()
    return out


def check_same(out):
    (cbuf, clog), (gbuf, glog) = out["cpu"], out["cuda"]
    assert_same_bytes(cbuf, gbuf, "canary_buf")
    return compare_logs(clog, glog)


SOURCE_CASES = [
    ("none", NONE, []),
    ("partial-1-page1", PARTIAL, [dict(page_size=1, num_bytes_per_token=256, read_bytes=256)]),
    ("partial-1-page16-bf16-3d", PARTIAL, [dict(page_size=16, num_bytes_per_token=64, read_bytes=32,
                                                dtype=torch.bfloat16, extra_row_bytes=16, stride_pad=32,
                                                three_d=True)]),
    ("all-4-mixed", ALL, [dict(page_size=4, num_bytes_per_token=32, read_bytes=32),
                          dict(page_size=1, num_bytes_per_token=128, read_bytes=112, dtype=torch.float16),
                          dict(page_size=8, num_bytes_per_token=48, read_bytes=16, extra_row_bytes=16),
                          dict(page_size=2, num_bytes_per_token=16, read_bytes=16, stride_pad=32)]),
]


@pytest.mark.parametrize("flag", [None, 0, 1])
@pytest.mark.parametrize("input_assert", [False, True])
@pytest.mark.parametrize("name,mode,cfgs", SOURCE_CASES, ids=[c[0] for c in SOURCE_CASES])
def test_write_differential(cuda_ready, name, mode, cfgs, input_assert, flag):
    rng = rng_for("write", name, input_assert, flag)
    n_req = size(200, 40)
    lens = rng.integers(0, 40, n_req)
    stride = [32, 40, 64, 48][SOURCE_CASES.index((name, mode, cfgs))]
    case = make_case(rng, num_slots=n_req + int(lens.sum()) + 5000, lens=lens, stride=stride,
                     input_assert=input_assert, flag=flag, mode=mode, source_cfgs=cfgs)
    out = run_write(case)
    rows = check_same(out)
    assert rows > 0  # out-of-range tokens and seeds at least


@pytest.mark.parametrize("mode", [NONE, PARTIAL])
def test_write_single_long_chain(cuda_ready, mode):
    """One request of 32,768 tokens (128 tiles of the block path), every kind of row."""
    rng = rng_for("write-long", mode)
    n = size(32768, 2048)
    cfgs = [dict(page_size=1, num_bytes_per_token=256, read_bytes=256)] if mode == PARTIAL else []
    case = make_case(rng, num_slots=n + 1000, lens=[n], input_assert=True, flag=1, mode=mode, source_cfgs=cfgs,
                     seed_frac=1.0, mismatch=0.003, skip_frac=0.002)
    out = run_write(case)
    rows = check_same(out)
    assert rows > 0


def test_write_repeated_slots_and_tile_edges(cuda_ready):
    """Requests on both sides of the warp / block paths and of tile boundaries, whose slots repeat within
    the request (inside a warp, inside a tile and across tiles): the later token's record wins, as in the
    reference, and every stamp counts."""
    rng = rng_for("write-repeat")
    lens = np.array([1, 5, 31, 32, 33, 64, 255, 256, 257, 300, 520, 0, 2], np.int64)
    cfgs = [dict(page_size=2, num_bytes_per_token=64, read_bytes=64)]
    case = make_case(rng, num_slots=int(lens.sum()) + 2000, lens=lens, input_assert=True, flag=1, mode=PARTIAL,
                     source_cfgs=cfgs)
    loc = case["tokens"]["out_cache_loc"].numpy()  # shares memory with the tensor: edited in place
    offsets = case["plan"]["write_offsets"].numpy()
    repeated = 0
    for r, n in enumerate(lens):
        if n < 2:
            continue
        s = int(offsets[r])
        k = max(1, int(n) // 8)
        src, dst = s + rng.integers(0, n, k), s + rng.integers(0, n, k)
        loc[dst] = loc[src]
        repeated += int(((loc[src] >= 0) & (src != dst)).sum())
    assert repeated > 0
    out = run_write(case)
    check_same(out)


def test_write_many_requests(cuda_ready):
    rng = rng_for("write-many")
    n_req = size(20000, 2000)
    lens = rng.integers(0, 4, n_req)
    case = make_case(rng, num_slots=n_req + int(lens.sum()) + 100, lens=lens, extra_reqs=0, flag=1)
    out = run_write(case)
    check_same(out)


def test_write_ring_overflow(cuda_ready):
    rng = rng_for("write-overflow")
    lens = rng.integers(50, 150, 60)
    case = make_case(rng, num_slots=int(lens.sum()) + 1000, lens=lens, input_assert=True, mismatch=0.4,
                     ring_cap=500, start_index=3)
    big = LogState(torch.zeros((4 * int(lens.sum()) + 100, 8), dtype=torch.int64), case["log"].index.clone(),
                   case["log"].slot_counter.clone(), case["log"].kernel_counter.clone())
    out = run_write(case, cpu_log=big)
    (cbuf, clog), (gbuf, glog) = out["cpu"], out["cuda"]
    assert_same_bytes(cbuf, gbuf, "canary_buf")
    for name in ("index", "slot_counter", "kernel_counter"):
        assert_same_bytes(getattr(clog, name), getattr(glog, name), name)
    total = int(clog.index[0])
    assert total - 3 >= 2000, "expected thousands of violations"
    assert_same_bytes(case["log"].ring[:3], glog.ring[:3], "rows before the start index")
    ref = Counter(tuple(r) for r in sort_rows(clog.ring.numpy()[3:total]))
    got = Counter(tuple(r) for r in glog.ring.cpu().numpy()[3:])
    assert not (got - ref), "GPU ring rows that are not reference rows"


@pytest.mark.parametrize("variant", ["bad_range", "num_valid_above_capacity", "num_valid_short", "num_valid_negative"])
def test_write_bounds_and_active_count(cuda_ready, variant):
    rng = rng_for("write-bounds", variant)
    lens = rng.integers(0, 30, 50)
    kw = dict(num_slots=int(lens.sum()) + 500, lens=lens, input_assert=True)
    if variant == "bad_range":
        kw["bad_range"] = int(lens[-3:].sum()) + 1
    elif variant == "num_valid_above_capacity":
        kw["num_valid_reqs"] = 10_000
    elif variant == "num_valid_short":
        kw["num_valid_reqs"] = 20
    else:
        kw["num_valid_reqs"] = -4
    case = make_case(rng, **kw)
    out = run_write(case)
    rows = check_same(out)
    if variant == "bad_range":
        got = out["cuda"][1].ring.cpu().numpy()[:rows]
        assert ((got[:, 1] == -1) & (got[:, 7] == int(FailReason.SLOT_OUT_OF_RANGE))).sum() >= 1
