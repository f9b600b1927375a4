"""Validators of the long-lived objects of :mod:`kvcanary.ops.structs` (SPEC §2, §4, §5, §9): plans, canary
buffers and launch contexts, with the caches that keep their views while nothing under them changed."""

from __future__ import annotations

from typing import Any

from kvcanary import consts
from kvcanary.consts import CanaryLaunchTag, RealKvHashMode
from kvcanary.errors import invalid
from kvcanary.ops.checks import check_int
from kvcanary.ops.launches import CanaryBufferView, ContextViews, VerifyPlanViews, WritePlanViews
from kvcanary.ops.structs import RealKvSource, VerifyOrWriteContext, VerifyPlan, WritePlan
from kvcanary.ops.validation.arrays import array
from kvcanary.ops.validation.cache import ValidatedCache

_TAGS = frozenset(int(t) for t in CanaryLaunchTag)
_MODES = frozenset(int(m) for m in RealKvHashMode)


def verify_plan_views(plan: Any, owner: str = "verify_plan_out") -> VerifyPlanViews:
    """A :class:`~kvcanary.VerifyPlan` (SPEC §5): int64 ``[C]`` slot indices, expected tokens, expected positions
    and predecessor slots, int32 ``[1]`` ``verify_num_valid`` and ``enable``, with ``C >= 1``, all contiguous;
    ``owner`` (the argument's name) prefixes the messages."""
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
    """A :class:`~kvcanary.WritePlan` (SPEC §5): int64 ``write_offsets [R + 1]`` and ``write_seed_slot_indices
    [R]``, int32 ``write_num_valid_reqs [1]``, with ``R >= 1``, all contiguous; ``owner`` prefixes the messages."""
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


def canary_buffer_view(name: str, buf: Any) -> CanaryBufferView:
    """A canary buffer: uint8 ``[num_slots, slot_stride_bytes]``, contiguous, ``num_slots >= 1``,
    ``slot_stride_bytes >= 32`` and a multiple of 8, data pointer 8-byte aligned (SPEC §2)."""
    v = array(name, buf, "uint8", ndim=2)
    num_slots, stride = v.shape
    if num_slots <= 0:
        raise invalid(f"{name} must have at least one slot, got shape {v.shape}")
    if stride < consts.CANARY_SLOT_BYTES or stride % 8:
        raise invalid(f"{name} slot_stride_bytes must be a multiple of 8 and >= 32, got {stride}")
    if v.ptr % 8:
        raise invalid(f"{name} data pointer must be 8-byte aligned, got {v.ptr:#x}")
    return CanaryBufferView(buf=v, num_slots=num_slots, slot_stride_bytes=stride)


def context_views(context: Any, *, name: str = "context", max_sources: int | None = None) -> ContextViews:
    """Validate one :class:`~kvcanary.VerifyOrWriteContext`; ``name`` prefixes every message.

    ``max_sources``: the most real-KV sources accepted (the SGLang-named ops pass ``MAX_REAL_KV_SOURCES``);
    ``None`` = any number (SPEC §13). A source may cover fewer slots than the canary buffer (SPEC §9).
    """
    if not isinstance(context, VerifyOrWriteContext):
        raise TypeError(f"kv-canary: {name} must be a VerifyOrWriteContext, got {type(context).__name__}")
    tag = check_int(f"{name}.kernel_kind", context.kernel_kind)
    if tag not in _TAGS:
        raise invalid(f"{name}.kernel_kind must be a CanaryLaunchTag (0..11), got {tag}")
    mode = check_int(f"{name}.real_kv_hash_mode", context.real_kv_hash_mode)
    if mode not in _MODES:
        raise invalid(f"{name}.real_kv_hash_mode must be a RealKvHashMode (0, 1 or 2), got {mode}")
    canary = canary_buffer_view(f"{name}.canary_buf", context.canary_buf)
    ring = array(f"{name}.violation_ring", context.violation_ring, "int64", ndim=2)
    if ring.shape[1] != consts.VIOLATION_FIELDS:
        raise invalid(f"{name}.violation_ring must have shape [ring_capacity, 8], got {ring.shape}")
    if ring.shape[0] <= 0:
        raise invalid(f"{name}.violation_ring ring_capacity must be positive, got {ring.shape[0]}")
    sources = context.real_kv_sources
    if not isinstance(sources, (tuple, list)):
        raise TypeError(f"kv-canary: {name}.real_kv_sources must be a tuple, got {type(sources).__name__}")
    if max_sources is not None and len(sources) > max_sources:
        # SGLang's callers match on "at most 4 RealKvSource".
        raise invalid(f"{name}.real_kv_sources may hold at most {max_sources} RealKvSource, got {len(sources)}")
    source_views = []
    for i, src in enumerate(sources):
        if not isinstance(src, RealKvSource):
            raise TypeError(f"kv-canary: {name}.real_kv_sources[{i}] must be a RealKvSource, "
                            f"got {type(src).__name__}")
        # Re-checked as it is now: the engine may have re-allocated or resized its pool since construction.
        source_views.append(src.describe(f"{name}.real_kv_sources[{i}]"))
    flag = None
    if context.enable_chain_position_assert is not None:
        flag = array(f"{name}.enable_chain_position_assert", context.enable_chain_position_assert, "int32",
                     length=1)
    return ContextViews(
        canary_buf=canary.buf,
        num_slots=canary.num_slots,
        slot_stride_bytes=canary.slot_stride_bytes,
        kernel_kind=tag,
        violation_ring=ring,
        ring_capacity=ring.shape[0],
        violation_write_index=array(f"{name}.violation_write_index", context.violation_write_index, "int32",
                                    length=1),
        slot_run_counter=array(f"{name}.slot_run_counter", context.slot_run_counter, "int64", length=1),
        kernel_run_counter=array(f"{name}.kernel_run_counter", context.kernel_run_counter, "int64", length=1),
        real_kv_sources=tuple(source_views),
        real_kv_hash_mode=mode,
        chain_position_flag=flag,
    )


CONTEXT_CACHE = ValidatedCache()        # SGLang-named ops: at most MAX_REAL_KV_SOURCES sources
TABLE_CONTEXT_CACHE = ValidatedCache()  # plan-free ops: any number of sources
PLAN_CACHE = ValidatedCache()  # the SGLang-named write's and verify's plans


def _context_tensors(context: Any) -> tuple:
    return (context.canary_buf, context.violation_ring, context.violation_write_index, context.slot_run_counter,
            context.kernel_run_counter, context.enable_chain_position_assert,
            *(s.tensor for s in context.real_kv_sources))


def cached_context_views(context: Any, *, name: str = "context",
                         max_sources: int | None = consts.MAX_REAL_KV_SOURCES) -> ContextViews:
    """:func:`context_views`, reusing the views of a context seen before when none of its arrays changed
    (:class:`ValidatedCache`); the errors are exactly :func:`context_views`'s."""
    cache = CONTEXT_CACHE if max_sources is not None else TABLE_CONTEXT_CACHE
    views = cache.hit(context, _context_tensors, name)  # a context validated before: its fields were checked then
    if views is not None:
        return views
    if (not isinstance(context, VerifyOrWriteContext) or not isinstance(context.real_kv_sources, tuple)
            or not all(isinstance(s, RealKvSource) for s in context.real_kv_sources)):
        return context_views(context, name=name, max_sources=max_sources)  # the error path
    return cache.get(context, _context_tensors(context),
                     lambda: context_views(context, name=name, max_sources=max_sources), name)


def contexts_views(contexts: Any) -> tuple[ContextViews, ...]:
    """The ``contexts`` of a plan-free op (SPEC §11, §12): a non-empty tuple (or list) of
    :class:`~kvcanary.VerifyOrWriteContext` sharing one slot space (equal ``num_slots``), any number of
    real-KV sources each."""
    what = "contexts must be a non-empty tuple of VerifyOrWriteContext"
    if not isinstance(contexts, (tuple, list)):
        raise TypeError(f"kv-canary: {what}, got {type(contexts).__name__}")
    if not contexts:
        raise invalid(f"{what}, got an empty {type(contexts).__name__}")
    views = tuple(cached_context_views(c, name=f"contexts[{i}]", max_sources=None) for i, c in enumerate(contexts))
    n0 = views[0].num_slots
    for i, v in enumerate(views[1:], start=1):
        if v.num_slots != n0:
            raise invalid(f"contexts[{i}].canary_buf must have num_slots={n0} like contexts[0], got {v.num_slots}")
    return views
