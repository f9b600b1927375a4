"""The ops reuse the validated views of a context or plan they saw before - but only while nothing under it
changed: an array resized, re-strided or moved to new storage in place is validated again (and refused if it
became invalid), never launched stale."""

from __future__ import annotations

import pytest
import torch

import kvcanary as kc
from kvcanary.ops import validation


def t64(xs):
    return torch.tensor(xs, dtype=torch.int64)


def setup():
    log = kc.ViolationLog.allocate(ring_capacity=8)
    buf = kc.allocate_canary_buffer(16)
    ctx = log.context(canary_buf=buf, kernel_kind=kc.CanaryLaunchTag.HEAD_K_FULL,
                      enable_chain_position_assert=kc.allocate_chain_position_flag(1))
    plan = kc.VerifyPlan.allocate(verify_capacity=4)
    plan.verify_num_valid.fill_(0)
    return log, buf, ctx, plan


def verify(ctx, plan):
    kc.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)


def test_views_are_reused_while_nothing_changed():
    _, _, ctx, _ = setup()
    a = validation.cached_context_views(ctx)
    assert validation.cached_context_views(ctx) is a


def test_a_canary_buffer_resized_in_place_is_revalidated_and_refused():
    _, buf, ctx, plan = setup()
    verify(ctx, plan)
    buf.resize_(16, 24)   # same object, now an invalid stride
    with pytest.raises(ValueError, match="slot_stride_bytes must be a multiple of 8 and >= 32, got 24"):
        verify(ctx, plan)


def test_a_plan_array_shrunk_in_place_is_revalidated_and_refused():
    _, _, ctx, plan = setup()
    verify(ctx, plan)
    plan.verify_expected_tokens.resize_(3)
    with pytest.raises(ValueError, match=r"plan\.verify_expected_tokens length must be 4, got 3"):
        verify(ctx, plan)


def test_a_buffer_moved_to_new_storage_is_used_there():
    _, buf, ctx, plan = setup()
    verify(ctx, plan)
    before = validation.cached_context_views(ctx)
    buf.set_(torch.zeros((32, 32), dtype=torch.uint8))   # re-allocated, bigger
    views = validation.cached_context_views(ctx)
    assert views is not before and views.canary_buf.ptr == buf.data_ptr() and views.num_slots == 32


def test_a_real_kv_source_resized_in_place_is_rechecked():
    pool = torch.zeros((4, 2, 16), dtype=torch.int16)   # 8 slots x 32 bytes, rows of 64 bytes
    src = kc.RealKvSource(tensor=pool, page_size=2, num_bytes_per_token=32, read_bytes=32)
    log, buf, _, plan = setup()
    ctx = log.context(canary_buf=buf, kernel_kind=kc.CanaryLaunchTag.TAIL_K_FULL, real_kv_sources=(src,),
                      real_kv_hash_mode=kc.RealKvHashMode.ALL)
    verify(ctx, plan)
    pool.resize_(4, 1, 16)  # rows now 32 bytes: narrower than page_size * num_bytes_per_token
    with pytest.raises(ValueError, match="rows must be at least page_size \\* num_bytes_per_token = 64 bytes wide, "
                                         "got 32"):
        verify(ctx, plan)


def test_the_verify_launch_record_is_reused_while_nothing_changed_and_rebuilt_after():
    _, _, ctx, plan = setup()
    kw = dict(context=ctx, plan=plan, check_verify_expected_token=False)
    first = validation.validate_verify(**kw)
    assert first.kept and validation.validate_verify(**kw) is first   # same views, same device: the same record
    assert validation.validate_verify(**{**kw, "check_verify_expected_token": True}) is not first
    plan.verify_slot_indices.set_(torch.zeros(4, dtype=torch.int64))   # new storage, same tensor object
    again = validation.validate_verify(**kw)
    assert again is not first and again.plan.slot_indices.ptr == plan.verify_slot_indices.data_ptr()
    assert again.ctx is first.ctx   # the context did not change


def test_a_verify_launch_of_arrays_that_are_not_torch_tensors_is_not_kept():
    # Views of other arrays (here NumPy, through DLPack) are built anew on every call: keeping their launch records
    # would only hold the arrays alive.
    log = kc.ViolationLog.allocate(ring_capacity=8)
    buf = kc.allocate_canary_buffer(16).numpy()
    ctx = log.context(canary_buf=buf, kernel_kind=kc.CanaryLaunchTag.HEAD_K_FULL)
    plan = kc.VerifyPlan.allocate(verify_capacity=4)
    plan.verify_num_valid.fill_(0)
    before = len(validation.sglang_ops._VERIFY_LAUNCHES)
    a = validation.validate_verify(context=ctx, plan=plan, check_verify_expected_token=False)
    b = validation.validate_verify(context=ctx, plan=plan, check_verify_expected_token=False)
    assert a is not b and a.ctx.canary_buf.ptr == b.ctx.canary_buf.ptr
    assert not a.kept and not b.kept   # so no backend attaches work to them either
    assert len(validation.sglang_ops._VERIFY_LAUNCHES) == before
