"""Phase order of KVCanary.step: HEAD before TAIL in every forward, nested forwards, aborted forwards."""

from __future__ import annotations

import pytest
import torch

import kvcanary as kc
from kvcanary.runtime.phases import PhaseOrder


def t64(xs):
    return torch.tensor(xs, dtype=torch.int64)


def canary():
    return kc.KVCanary(num_slots=32, max_batch_size=2, mode="quiet")


def batch(prefix: int, token: int, slot: int):
    r2t = torch.zeros((2, 16), dtype=torch.int32)
    r2t[1, : prefix + 1] = torch.arange(1, prefix + 2, dtype=torch.int32)
    return dict(req_pool_indices=t64([1]), prefix_lens=t64([prefix]), extend_seq_lens=t64([1]), req_to_token=r2t,
                input_ids=t64([token]), positions=t64([prefix]), out_cache_loc=t64([slot]))


def test_double_head_and_tail_without_head_raise_and_launch_nothing():
    c = canary()
    with pytest.raises(ValueError, match=r"kv-canary: KVCanary 'kv': step\('tail'\) called without a step\('head'\)"):
        c.step("tail", **batch(0, 5, 1))
    c.step("head", **batch(0, 5, 1))
    runs = c.health().tags[kc.CanaryLaunchTag.HEAD_K_FULL].kernel_runs
    with pytest.raises(ValueError, match=r"step\('head'\) called twice without step\('tail'\) in between"):
        c.step("head", **batch(0, 5, 1))
    assert c.health().tags[kc.CanaryLaunchTag.HEAD_K_FULL].kernel_runs == runs  # the refused HEAD launched nothing
    c.step("tail", **batch(0, 5, 1))
    with pytest.raises(ValueError, match="called without a step"):
        c.step("tail", **batch(0, 5, 1))
    # A well-ordered sequence keeps working.
    for p in range(1, 4):
        c.step("head", **batch(p, 5 + p, p + 1))
        c.step("tail", **batch(p, 5 + p, p + 1))
    assert c.poll(sync=True) == []
    assert c.health().steps["head"] == c.health().steps["tail"] == 4


def test_nested_forward_allows_one_inner_pair():
    c = canary()
    c.step("head", **batch(0, 5, 1))
    with c.nested_forward():
        c.step("head", **batch(1, 6, 2))
        with pytest.raises(ValueError, match="called twice"):  # two levels, not three
            c.step("head", **batch(1, 6, 2))
        c.step("tail", **batch(1, 6, 2))
    c.step("tail", **batch(0, 5, 1))
    with pytest.raises(ValueError, match="called without a step"):
        c.step("tail", **batch(0, 5, 1))


def test_abort_forward_closes_a_head_whose_tail_never_comes():
    c = canary()
    c.step("head", **batch(0, 5, 1))
    c.abort_forward()
    c.step("head", **batch(0, 5, 1))
    c.step("tail", **batch(0, 5, 1))


def test_a_refused_step_leaves_the_order_unchanged():
    c = canary()
    bad = batch(0, 5, 1)
    bad["req_to_token"] = bad["req_to_token"].to(torch.int64)
    with pytest.raises(kc.KvCanaryDTypeError):
        c.step("head", **bad)
    with pytest.raises(ValueError, match="called without a step"):  # the refused HEAD did not open a forward
        c.step("tail", **batch(0, 5, 1))
    c.step("head", **batch(0, 5, 1))
    with pytest.raises(kc.KvCanaryDTypeError):
        c.step("tail", **bad)
    c.step("tail", **batch(0, 5, 1))  # the refused TAIL did not close it


def test_phase_order_unit():
    po = PhaseOrder("x")
    po.check("head")
    po.commit("head")
    with pytest.raises(ValueError, match="twice"):
        po.check("head")
    with po.nested():
        po.check("head")
    with pytest.raises(ValueError, match="twice"):
        po.check("head")
    po.check("tail")
    po.commit("tail")
    with pytest.raises(ValueError, match="without"):
        po.check("tail")
