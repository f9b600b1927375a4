"""Validators of SGLang's two-pass ops (SPEC §5-§8): plan, write, verify and scatter, each turning the op's arguments
into its launch record (:mod:`kvcanary.ops.launches`)."""

from __future__ import annotations

from typing import Any

from kvcanary import consts
from kvcanary.errors import invalid
from kvcanary.ops.checks import check_bool, check_int, check_non_negative
from kvcanary.ops.launches import PlanLaunch, ScatterLaunch, VerifyLaunch, WriteLaunch
from kvcanary.ops.structs import VerifyPlan, WritePlan
from kvcanary.ops.validation.arguments import (
    batch_rows,
    expected_tokens_pool,
    invalid_rows_view,
    table_and_lut,
    write_tokens,
)
from kvcanary.ops.validation.arrays import array, same_device
from kvcanary.ops.validation.structs import (
    CONTEXT_CACHE,
    PLAN_CACHE,
    cached_context_views,
    verify_plan_views,
    write_plan_views,
)

_PLAN = "launch_canary_plan_kernels"
_WRITE = "launch_canary_write_kernel"
_VERIFY = "launch_canary_verify_kernel"
_SCATTER = "launch_scatter_req_token_ids_kernel"


def validate_plan(
    *,
    verify_plan_out: Any,
    write_plan_out: Any,
    req_pool_indices: Any,
    prefix_lens: Any,
    extend_seq_lens: Any,
    req_to_token: Any,
    swa_window_size: Any,
    full_to_swa_index_mapping: Any,
    verify_capacity: Any,
    req_to_verify_expected_tokens: Any,
    req_to_verify_expected_tokens_valid_lens: Any,
    kv_token_id_vs_position_offset: Any,
    invalid_rows_out: Any = None,
    block_table: Any = None,
    block_size: Any = None,
    pad_row: Any = consts.REQ_POOL_IDX_PADDING,
) -> PlanLaunch:
    c_arg = check_non_negative("verify_capacity", verify_capacity)
    window = check_non_negative("swa_window_size", swa_window_size)
    token_offset = check_int("kv_token_id_vs_position_offset", kv_token_id_vs_position_offset)

    vplan = verify_plan_views(verify_plan_out)
    wplan = write_plan_views(write_plan_out)
    rpi, prefix = batch_rows(req_pool_indices, prefix_lens)
    bs = rpi.shape[0]
    extend = array("extend_seq_lens", extend_seq_lens, "int64", length=bs)
    table, lut = table_and_lut(_PLAN, req_to_token=req_to_token, block_table=block_table, block_size=block_size,
                               pad_row=pad_row, window=window, full_to_swa_index_mapping=full_to_swa_index_mapping)
    pool, valid_lens = expected_tokens_pool(_PLAN, req_to_verify_expected_tokens,
                                             req_to_verify_expected_tokens_valid_lens, bs, table)
    invalid_rows = invalid_rows_view(invalid_rows_out)

    if c_arg != vplan.capacity:
        raise invalid(f"{_PLAN} verify_capacity={c_arg} does not match "
                      f"verify_plan_out.verify_slot_indices.shape[0]={vplan.capacity}")
    if bs > wplan.capacity:
        raise invalid(f"bs={bs} exceeds write_req_capacity={wplan.capacity}")

    device = same_device(_PLAN, *vplan.all(), *wplan.all(), rpi, prefix, extend, table.array, lut, pool,
                          valid_lens, invalid_rows)
    return PlanLaunch(device=device, verify=vplan, write=wplan, req_pool_indices=rpi, prefix_lens=prefix,
                      extend_seq_lens=extend, table=table, swa_window_size=window, lut=lut,
                      expected_tokens_pool=pool, expected_tokens_valid_lens=valid_lens, token_offset=token_offset,
                      invalid_rows=invalid_rows)


def _write_plan_arrays(plan: WritePlan) -> tuple:
    """The arrays of a write plan, the key its cached views are kept under (as :func:`_verify_plan_arrays`)."""
    return (plan.write_offsets, plan.write_seed_slot_indices, plan.write_num_valid_reqs)


def validate_write(
    *,
    context: Any,
    plan: Any,
    input_ids: Any,
    positions: Any,
    out_cache_loc: Any,
    enable_write_input_assert: Any,
    expected_input_tokens: Any,
    expected_input_positions: Any,
) -> WriteLaunch:
    assert_on = check_bool("enable_write_input_assert", enable_write_input_assert)
    ctx = cached_context_views(context)
    if not isinstance(plan, WritePlan):
        write_plan_views(plan, "plan")  # raises the type error
    wplan = PLAN_CACHE.get(plan, _write_plan_arrays(plan), lambda: write_plan_views(plan, "plan"))
    ids, pos, loc, exp_tok, exp_pos = write_tokens(
        _WRITE, input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc, assert_on=assert_on,
        expected_input_tokens=expected_input_tokens, expected_input_positions=expected_input_positions)
    device = same_device(_WRITE, *ctx.all(), *wplan.all(), ids, pos, loc, exp_tok, exp_pos)
    return WriteLaunch(device=device, ctx=ctx, plan=wplan, input_ids=ids, positions=pos, out_cache_loc=loc,
                       expected_input_tokens=exp_tok, expected_input_positions=exp_pos)


# The launch records of the SGLang-named verify for (context views, plan views, flag) seen before: while the caches
# hand back the same views (nothing under them changed), the device check and the record come out the same.
_VERIFY_LAUNCHES: dict[tuple[int, int, bool], VerifyLaunch] = {}


def _verify_plan_arrays(plan: VerifyPlan) -> tuple:
    """The arrays of a verify plan, the key its cached views are kept under."""
    return (plan.verify_slot_indices, plan.verify_expected_tokens, plan.verify_expected_positions,
            plan.verify_prev_slot_indices, plan.verify_num_valid, plan.enable)


def validate_verify(*, context: Any, plan: Any, check_verify_expected_token: Any) -> VerifyLaunch:
    check = check_bool("check_verify_expected_token", check_verify_expected_token)
    ctx = cached_context_views(context)
    if not isinstance(plan, VerifyPlan):
        verify_plan_views(plan, "plan")  # raises the type error
    vplan = PLAN_CACHE.get(plan, _verify_plan_arrays(plan), lambda: verify_plan_views(plan, "plan"))
    key = (id(ctx), id(vplan), check)
    rec = _VERIFY_LAUNCHES.get(key)
    if rec is not None and rec.ctx is ctx and rec.plan is vplan:
        return rec
    device = same_device(_VERIFY, *ctx.all(), *vplan.all())
    # Views a later call gets again: only then is the record kept.
    kept = CONTEXT_CACHE.holds(context, ctx, "context") and PLAN_CACHE.holds(plan, vplan)
    rec = VerifyLaunch(device=device, ctx=ctx, plan=vplan, check_expected_token=check, kept=kept)
    if kept:
        if len(_VERIFY_LAUNCHES) >= PLAN_CACHE.capacity:
            _VERIFY_LAUNCHES.pop(next(iter(_VERIFY_LAUNCHES)))
        _VERIFY_LAUNCHES[key] = rec
    return rec


def validate_scatter(*, flat_in: Any, offsets: Any, req_pool_indices: Any, pool_out: Any) -> ScatterLaunch:
    flat = array("flat_in", flat_in, "int64")
    rpi = array("req_pool_indices", req_pool_indices, "int64")
    offs = array("offsets", offsets, "int64", length=rpi.shape[0] + 1)
    pool = array("pool_out", pool_out, "int32", ndim=2)
    device = same_device(_SCATTER, flat, offs, rpi, pool)
    return ScatterLaunch(device=device, flat_in=flat, offsets=offs, req_pool_indices=rpi, pool_out=pool)
