"""Argument validation for every public op (SPEC §9), producing backend-neutral launch records.

Each ``validate_*`` function checks dtypes, ranks, lengths, contiguity, devices, capacities, sentinel and
presence rules *before anything is written*, and returns a frozen launch record of :class:`ArrayView`
objects and plain ints. Both backends (``kvcanary.ops.reference`` and ``kvcanary.ops.cuda``) take these records,
so a backend never sees an argument that was not checked.

Order of checks: each scalar's own range, then each array's own dtype/rank/contiguity/length, then the
consistency between arguments, then the device. So a negative ``verify_capacity`` is reported as
negative, not as a mismatch.
"""

from __future__ import annotations

from typing import Any

from kvcanary import consts
from kvcanary.consts import CanaryLaunchTag, RealKvHashMode
from kvcanary.errors import invalid, wrong_dtype
from kvcanary.ops.checks import check_bool, check_int, check_non_negative
from kvcanary.ops.interop import ArrayView, Device, common_device, view
from kvcanary.ops.launches import (
    ContextViews,
    PlanLaunch,
    RealKvSourceView,
    ScatterLaunch,
    TableViews,
    VerifyLaunch,
    VerifyPlanViews,
    WriteLaunch,
    WritePlanViews,
)
from kvcanary.ops.structs import RealKvSource, VerifyOrWriteContext, VerifyPlan, WritePlan

# ----------------------------------------------------------------------------------------------------------
# Small checks


def check_capacities(*, verify_capacity: Any, write_req_capacity: Any) -> tuple[int, int]:
    """Planner-level capacity checks (the host checks of SGLang's offsets kernel)."""
    c = check_non_negative("verify_capacity", verify_capacity)
    r = check_non_negative("write_req_capacity", write_req_capacity)
    return c, r


def array(
    name: str,
    x: Any,
    dtype: str,
    *,
    ndim: int = 1,
    length: int | None = None,
    min_length: int | None = None,
) -> ArrayView:
    """Describe ``x`` and check dtype, rank, contiguity and (first-dimension) length."""
    if x is None:
        raise TypeError(f"kv-canary: {name} must be an array, got None")
    v = view(name, x)
    if v.dtype != dtype:
        raise wrong_dtype(name, dtype, v.dtype)
    if v.ndim != ndim:
        raise invalid(f"{name} must be {ndim}-D, got shape {v.shape}")
    if not v.is_contiguous():
        raise invalid(f"{name} must be contiguous")
    if length is not None and v.shape[0] != length:
        raise invalid(f"{name} length must be {length}, got {v.shape[0]}")
    if min_length is not None and v.shape[0] < min_length:
        raise invalid(f"{name} length must be at least {min_length}, got {v.shape[0]}")
    return v


_TORCH_DTYPES: dict[str, Any] = {}


def _torch_dtype(name: str) -> Any:
    dt = _TORCH_DTYPES.get(name)
    if dt is None:
        import torch  # a dependency; imported on first use to keep this module light

        dt = _TORCH_DTYPES[name] = getattr(torch, name)
    return dt


def array_on(name: str, x: Any, dtype: str, device: Device, *, ndim: int = 1, length: int | None = None) -> ArrayView:
    """:func:`array` plus "lives on ``device``", for arguments passed anew on every call of a hot path.

    A contiguous torch tensor of the right dtype, rank and length on ``device`` is described with a handful of
    attribute reads; anything else goes through :func:`array` (any ``__dlpack__`` array, and the exact SPEC §9
    error for a bad one).
    """
    if (type(x).__name__ == "Tensor" and x.dtype is _torch_dtype(dtype) and x.dim() == ndim and x.is_contiguous()
            and x.get_device() == device.index):
        shape = tuple(x.shape)
        if length is None or shape[0] == length:
            return ArrayView(name, x, dtype, x.element_size(), shape, x.stride(), device, x.data_ptr())
    v = array(name, x, dtype, ndim=ndim, length=length)
    if v.device != device:
        raise invalid(f"{name} must be on {device}, got {v.device}")
    return v


def _same_device(op: str, *views: ArrayView | None) -> Device:
    return common_device(op, [v for v in views if v is not None])


# ----------------------------------------------------------------------------------------------------------
# Plans and context


def verify_plan_views(plan: Any, owner: str = "verify_plan_out") -> VerifyPlanViews:
    if not isinstance(plan, VerifyPlan):
        raise TypeError(f"kv-canary: {owner} must be a VerifyPlan, got {type(plan).__name__}")
    slots = array(f"{owner}.verify_slot_indices", plan.verify_slot_indices, "int64")
    c = slots.shape[0]
    if c <= 0:
        raise invalid(f"VerifyPlan verify_capacity must be positive, got {c}")
    return VerifyPlanViews(
        slot_indices=slots,
        expected_tokens=array(f"{owner}.verify_expected_tokens", plan.verify_expected_tokens, "int64", length=c),
        expected_positions=array(f"{owner}.verify_expected_positions", plan.verify_expected_positions, "int64",
                                 length=c),
        prev_slot_indices=array(f"{owner}.verify_prev_slot_indices", plan.verify_prev_slot_indices, "int64",
                                length=c),
        num_valid=array(f"{owner}.verify_num_valid", plan.verify_num_valid, "int32", length=1),
        enable=array(f"{owner}.enable", plan.enable, "int32", length=1),
    )


def write_plan_views(plan: Any, owner: str = "write_plan_out") -> WritePlanViews:
    if not isinstance(plan, WritePlan):
        raise TypeError(f"kv-canary: {owner} must be a WritePlan, got {type(plan).__name__}")
    seeds = array(f"{owner}.write_seed_slot_indices", plan.write_seed_slot_indices, "int64")
    r = seeds.shape[0]
    if r <= 0:
        raise invalid(f"WritePlan write_req_capacity must be positive, got {r}")
    offsets = array(f"{owner}.write_offsets", plan.write_offsets, "int64")
    n = offsets.shape[0]
    if n <= 0:
        raise invalid(f"write_offsets_len must be positive, got {n}")
    if n != r + 1:
        raise invalid(f"write_offsets_len must equal write_req_capacity + 1, got {n} and {r}")
    return WritePlanViews(
        offsets=offsets,
        seed_slot_indices=seeds,
        num_valid_reqs=array(f"{owner}.write_num_valid_reqs", plan.write_num_valid_reqs, "int32", length=1),
    )


def context_views(context: Any, *, max_sources: int | None = consts.MAX_REAL_KV_SOURCES) -> ContextViews:
    """Validate a :class:`~kvcanary.VerifyOrWriteContext` (SPEC §4, §9). ``max_sources``: the most real-KV
    sources allowed (the SGLang-named ops: 4; kvcanary's own entry points: ``None``, any number)."""
    if not isinstance(context, VerifyOrWriteContext):
        raise TypeError(f"kv-canary: context must be a VerifyOrWriteContext, got {type(context).__name__}")
    tag = check_int("context.kernel_kind", context.kernel_kind)
    if tag not in set(CanaryLaunchTag):
        raise invalid(f"context.kernel_kind must be a CanaryLaunchTag (0..11), got {tag}")
    mode = check_int("context.real_kv_hash_mode", context.real_kv_hash_mode)
    if mode not in set(RealKvHashMode):
        raise invalid(f"context.real_kv_hash_mode must be a RealKvHashMode (0, 1 or 2), got {mode}")
    buf = array("context.canary_buf", context.canary_buf, "uint8", ndim=2)
    num_slots, stride = buf.shape
    if num_slots <= 0:
        raise invalid(f"context.canary_buf must have at least one slot, got shape {buf.shape}")
    if stride < consts.CANARY_SLOT_BYTES or stride % 8:
        raise invalid(f"context.canary_buf slot_stride_bytes must be a multiple of 8 and >= 32, got {stride}")
    if buf.ptr % 8:
        raise invalid(f"context.canary_buf data pointer must be 8-byte aligned, got {buf.ptr:#x}")
    ring = array("context.violation_ring", context.violation_ring, "int64", ndim=2)
    if ring.shape[1] != consts.VIOLATION_FIELDS:
        raise invalid(f"context.violation_ring must have shape [ring_capacity, 8], got {ring.shape}")
    if ring.shape[0] <= 0:
        raise invalid(f"context.violation_ring ring_capacity must be positive, got {ring.shape[0]}")
    sources = context.real_kv_sources
    if not isinstance(sources, (tuple, list)):
        raise TypeError(f"kv-canary: context.real_kv_sources must be a tuple, got {type(sources).__name__}")
    if max_sources is not None and len(sources) > max_sources:
        raise invalid(f"context.real_kv_sources may hold at most {consts.MAX_REAL_KV_SOURCES} sources, "
                      f"got {len(sources)}")
    source_views = []
    for i, src in enumerate(sources):
        if not isinstance(src, RealKvSource):
            raise TypeError(f"kv-canary: context.real_kv_sources[{i}] must be a RealKvSource, "
                            f"got {type(src).__name__}")
        if src.num_slots < num_slots:
            raise invalid(f"context.real_kv_sources[{i}] covers {src.num_slots} slots, fewer than "
                          f"canary_buf's num_slots={num_slots}")
        t = view(f"context.real_kv_sources[{i}].tensor", src.tensor)
        source_views.append(RealKvSourceView(tensor=t, page_size=src.page_size,
                                             num_bytes_per_token=src.num_bytes_per_token, read_bytes=src.read_bytes,
                                             row_bytes=src.row_bytes, row_stride_bytes=src.row_stride_bytes,
                                             num_rows=t.shape[0]))
    flag = None
    if context.enable_chain_position_assert is not None:
        flag = array("context.enable_chain_position_assert", context.enable_chain_position_assert, "int32",
                     length=1)
    return ContextViews(
        canary_buf=buf,
        num_slots=num_slots,
        slot_stride_bytes=stride,
        kernel_kind=tag,
        violation_ring=ring,
        ring_capacity=ring.shape[0],
        violation_write_index=array("context.violation_write_index", context.violation_write_index, "int32",
                                    length=1),
        slot_run_counter=array("context.slot_run_counter", context.slot_run_counter, "int64", length=1),
        kernel_run_counter=array("context.kernel_run_counter", context.kernel_run_counter, "int64", length=1),
        real_kv_sources=tuple(source_views),
        real_kv_hash_mode=mode,
        chain_position_flag=flag,
    )


# ----------------------------------------------------------------------------------------------------------
# Validators

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
) -> PlanLaunch:
    c_arg = check_non_negative("verify_capacity", verify_capacity)
    window = check_non_negative("swa_window_size", swa_window_size)
    token_offset = check_int("kv_token_id_vs_position_offset", kv_token_id_vs_position_offset)

    vplan = verify_plan_views(verify_plan_out)
    wplan = write_plan_views(write_plan_out)
    rpi = array("req_pool_indices", req_pool_indices, "int64")
    bs = rpi.shape[0]
    prefix = array("prefix_lens", prefix_lens, "int64", length=bs)
    extend = array("extend_seq_lens", extend_seq_lens, "int64", length=bs)
    r2t = array("req_to_token", req_to_token, "int32", ndim=2)
    if r2t.shape[0] <= 0:
        raise invalid(f"req_to_token must have at least one row (row 0 is padding), got shape {r2t.shape}")
    if r2t.shape[1] <= 0:
        raise invalid(f"req_to_token_stride0 must be positive, got {r2t.shape[1]}")

    lut = None
    if window > 0:
        if full_to_swa_index_mapping is None:
            raise invalid(f"{_PLAN} requires full_to_swa_index_mapping when swa_window_size > 0")
        lut = array("full_to_swa_index_mapping", full_to_swa_index_mapping, "int64")
        if lut.shape[0] <= 0:
            raise invalid("lut_len must be positive when has_swa_lut is True")
    elif full_to_swa_index_mapping is not None:
        raise invalid(f"{_PLAN} full_to_swa_index_mapping must be None when swa_window_size == 0")

    pool = valid_lens = None
    has_pool = req_to_verify_expected_tokens is not None
    has_lens = req_to_verify_expected_tokens_valid_lens is not None
    if has_pool != has_lens:
        raise invalid(
            f"{_PLAN} requires req_to_verify_expected_tokens and req_to_verify_expected_tokens_valid_lens "
            f"together, got only {'req_to_verify_expected_tokens' if has_pool else 'the valid lens'}"
        )
    if has_pool:
        pool = array("req_to_verify_expected_tokens", req_to_verify_expected_tokens, "int32", ndim=2)
        valid_lens = array("req_to_verify_expected_tokens_valid_lens", req_to_verify_expected_tokens_valid_lens,
                           "int64", length=bs)
        if pool.shape[0] < r2t.shape[0]:
            raise invalid(f"req_to_verify_expected_tokens must have at least req_to_token's "
                          f"{r2t.shape[0]} rows, got {pool.shape[0]}")

    invalid_rows = None
    if invalid_rows_out is not None:
        invalid_rows = array("invalid_rows_out", invalid_rows_out, "int32", length=1)

    if c_arg != vplan.capacity:
        raise invalid(f"{_PLAN} verify_capacity={c_arg} does not match "
                      f"verify_plan_out.verify_slot_indices.shape[0]={vplan.capacity}")
    if bs > wplan.capacity:
        raise invalid(f"bs={bs} exceeds write_req_capacity={wplan.capacity}")

    device = _same_device(_PLAN, *vplan.all(), *wplan.all(), rpi, prefix, extend, r2t, lut, pool, valid_lens,
                          invalid_rows)
    table = TableViews(req_to_token=r2t, block_table=None, block_size=1, pad_row=consts.REQ_POOL_IDX_PADDING)
    return PlanLaunch(device=device, verify=vplan, write=wplan, req_pool_indices=rpi, prefix_lens=prefix,
                      extend_seq_lens=extend, table=table, swa_window_size=window, lut=lut,
                      expected_tokens_pool=pool, expected_tokens_valid_lens=valid_lens, token_offset=token_offset,
                      invalid_rows=invalid_rows)


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
    ctx = context_views(context)
    wplan = write_plan_views(plan, "plan")
    ids = array("input_ids", input_ids, "int64")
    n = ids.shape[0]
    pos = array("positions", positions, "int64", length=n)
    loc = array("out_cache_loc", out_cache_loc, "int64", length=n)
    exp_tok = exp_pos = None
    for name, value in (("expected_input_tokens", expected_input_tokens),
                        ("expected_input_positions", expected_input_positions)):
        if assert_on and value is None:
            raise invalid(f"{_WRITE} requires {name} when enable_write_input_assert is True")
        if not assert_on and value is not None:
            raise invalid(f"{_WRITE} {name} must be None when enable_write_input_assert is False")
    if assert_on:
        exp_tok = array("expected_input_tokens", expected_input_tokens, "int64", length=n)
        exp_pos = array("expected_input_positions", expected_input_positions, "int64", length=n)
    device = _same_device(_WRITE, *ctx.all(), *wplan.all(), ids, pos, loc, exp_tok, exp_pos)
    return WriteLaunch(device=device, ctx=ctx, plan=wplan, input_ids=ids, positions=pos, out_cache_loc=loc,
                       expected_input_tokens=exp_tok, expected_input_positions=exp_pos)


def validate_verify(*, context: Any, plan: Any, check_verify_expected_token: Any) -> VerifyLaunch:
    check = check_bool("check_verify_expected_token", check_verify_expected_token)
    ctx = context_views(context)
    vplan = verify_plan_views(plan, "plan")
    device = _same_device(_VERIFY, *ctx.all(), *vplan.all())
    return VerifyLaunch(device=device, ctx=ctx, plan=vplan, check_expected_token=check)


def validate_scatter(*, flat_in: Any, offsets: Any, req_pool_indices: Any, pool_out: Any) -> ScatterLaunch:
    flat = array("flat_in", flat_in, "int64")
    rpi = array("req_pool_indices", req_pool_indices, "int64")
    offs = array("offsets", offsets, "int64", length=rpi.shape[0] + 1)
    pool = array("pool_out", pool_out, "int32", ndim=2)
    device = _same_device(_SCATTER, flat, offs, rpi, pool)
    return ScatterLaunch(device=device, flat_in=flat, offsets=offs, req_pool_indices=rpi, pool_out=pool)
