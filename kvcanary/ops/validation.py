"""Argument validation for every public op (SPEC §9), producing backend-neutral launch records.

Each ``validate_*`` function checks dtypes, ranks, lengths, contiguity, devices, capacities, sentinel and
presence rules *before anything is written*, and returns a frozen launch record of :class:`ArrayView`
objects and plain ints (:mod:`kvcanary.ops.launches`). Both backends (``kvcanary.ops.reference`` and
``kvcanary.ops.cuda``) take these records, so a backend never sees an argument that was not checked.

Shared validators, one per kind of argument, so every op that takes one checks it the same way:
:func:`canary_buffer_view` (a canary buffer: contexts and the record ops of SPEC §13), :func:`context_views`
and :func:`contexts_views` (launch contexts), :func:`table_views` (the table of SPEC §10 in either form, with
``pad_row``; used by the plan and by the plan-free ops of SPEC §11, §12).

Order of checks: each scalar's own range, then each array's own dtype/rank/contiguity/length, then the
consistency between arguments, then the device. So a negative ``verify_capacity`` is reported as
negative, not as a mismatch.

Real-KV sources (SPEC §9, §13): a source may cover fewer slots than the canary buffer (the backends report a
touched slot it does not cover); the SGLang-named write and verify take at most ``MAX_REAL_KV_SOURCES`` sources
per context, kvcanary's own ops any number.
"""

from __future__ import annotations

from typing import Any

from kvcanary import consts
from kvcanary.consts import CanaryLaunchTag, RealKvHashMode
from kvcanary.errors import invalid, wrong_dtype
from kvcanary.ops.checks import check_bool, check_int, check_non_negative, check_positive
from kvcanary.ops.interop import CPU, ArrayView, Device, common_device, view
from kvcanary.ops.launches import (
    CanaryBufferView,
    ContextViews,
    PlanLaunch,
    RecordCopyLaunch,
    RecordGatherLaunch,
    RecordScatterLaunch,
    ScatterLaunch,
    TableViews,
    VerifyLaunch,
    VerifyPlanViews,
    VerifyTableLaunch,
    WriteLaunch,
    WritePlanViews,
    WriteTableLaunch,
)
from kvcanary.ops.structs import RealKvSource, VerifyOrWriteContext, VerifyPlan, WritePlan

# ----------------------------------------------------------------------------------------------------------
# Small checks


def check_capacities(*, verify_capacity: Any, write_req_capacity: Any) -> tuple[int, int]:
    """Planner-level capacity checks (the host checks of SGLang's offsets kernel)."""
    c = check_non_negative("verify_capacity", verify_capacity)
    r = check_non_negative("write_req_capacity", write_req_capacity)
    return c, r


_TAGS = frozenset(int(t) for t in CanaryLaunchTag)
_MODES = frozenset(int(m) for m in RealKvHashMode)
_TORCH_DTYPES: dict[str, Any] = {}
_CUDA_DEVICES: dict[int, Device] = {}
_TENSOR_TYPE: Any = None  # torch.Tensor, once torch is imported (the fast path of batch_array compares with it)


def _torch_dtype(name: str) -> Any:
    global _TENSOR_TYPE
    dt = _TORCH_DTYPES.get(name)
    if dt is None:
        import torch  # a dependency; imported on first use to keep this module light

        _TENSOR_TYPE = torch.Tensor
        dt = _TORCH_DTYPES[name] = getattr(torch, name, None)
    return dt


def _checked_torch_view(name: str, x: Any, dtype: str, ndim: int) -> ArrayView | None:
    """The view of a plain torch tensor that passes every check of :func:`array` but the length, built from a
    handful of attribute reads (the same description :func:`~kvcanary.ops.interop.view` gives it); None for
    anything else (which then takes the general path and, if bad, gets its exact error)."""
    if type(x).__name__ != "Tensor" or x.dtype is not _torch_dtype(dtype) or x.dim() != ndim or not x.is_contiguous():
        return None
    if x.is_cuda:
        index = x.get_device()
        device = _CUDA_DEVICES.get(index)
        if device is None:
            device = _CUDA_DEVICES[index] = Device("cuda", index)
    elif x.is_cpu:
        device = CPU
    else:
        return None
    return ArrayView(name, x, dtype, x.element_size(), tuple(x.shape), x.stride(), device, x.data_ptr())


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
    v = _checked_torch_view(name, x, dtype, ndim)
    if v is None:
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


def array_on(name: str, x: Any, dtype: str, device: Device, *, ndim: int = 1, length: int | None = None) -> ArrayView:
    """:func:`array` plus "lives on ``device``", for arguments passed anew on every call of a hot path."""
    v = array(name, x, dtype, ndim=ndim, length=length)
    if v.device != device:
        raise invalid(f"{name} must be on {device}, got {v.device}")
    return v


def batch_array(name: str, x: Any, dtype: str, device: Device, *, ndim: int = 1, length: int | None = None) -> Any:
    """The checks of :func:`array_on` at the least host cost, for the arrays a hot path is passed on every call
    (a canary step checks seven per call).

    Returns ``x`` itself when it is a plain torch tensor that passes every check (dtype, rank, contiguity, length,
    device: a handful of attribute reads, no view built); anything else takes :func:`array_on` and returns its
    :class:`ArrayView`, or raises its exact error. Either way the result has ``.shape`` and ``.data_ptr()``
    (see :func:`as_view` for an :class:`ArrayView` of it).
    """
    if type(x) is _TENSOR_TYPE and x.dtype is _TORCH_DTYPES.get(dtype) and x.is_contiguous():
        shape = x.shape
        if (len(shape) == ndim and (length is None or shape[0] == length)
                and (x.get_device() == device.index if x.is_cuda else (x.is_cpu and device.kind == "cpu"))):
            return x
    v = array_on(name, x, dtype, device, ndim=ndim, length=length)
    return x if type(x) is _TENSOR_TYPE else v   # a torch tensor seen before torch's dtypes were looked up


def as_view(name: str, a: Any) -> ArrayView:
    """The :class:`ArrayView` of an array :func:`batch_array` accepted (itself if it is one already)."""
    return view(name, a)


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


_UNCACHEABLE = object()


def _same_signature(sig: tuple, arrays: tuple) -> bool:
    """Whether ``arrays`` still have the signatures ``sig`` (of :func:`tensor_signature`), compared array by
    array without building new tuples (the SGLang-named ops check a context's and a plan's on every call)."""
    if len(sig) != len(arrays):
        return False
    for s, a in zip(sig, arrays):
        if a is None:
            if s != ():
                return False
        elif (type(a) is not _TENSOR_TYPE or not s or a.data_ptr() != s[0] or a.shape != s[1]
              or a.stride() != s[2] or a.dtype is not s[3] or a.get_device() != s[4]):
            return False
    return True


def tensor_signature(x: Any) -> Any:
    """What a validated view of ``x`` depends on that can change in place: a torch tensor's address, shape,
    strides, dtype and device index (``set_``, ``resize_`` and ``.data =`` change them); ``()`` for an absent
    optional array; a marker that disables caching for anything else."""
    if x is None:
        return ()
    if type(x).__name__ != "Tensor":
        return _UNCACHEABLE
    return (x.data_ptr(), x.shape, x.stride(), x.dtype, x.get_device())


class ValidatedCache:
    """Validated views of long-lived objects (contexts, plans, a canary's tables), reused while nothing under them
    changed.

    The SGLang-named ops receive the same context and plan objects every step; re-deriving their views is most
    of an op's host time. An entry is reused only for the *same* object (kept alive by the entry, so its id is
    not recycled) whose arrays all still have the signature (:func:`tensor_signature`) they were validated
    with; the objects are frozen, so nothing else can change. Anything not a plain torch tensor is validated on
    every call.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._entries: dict[tuple[int, str], tuple[Any, tuple, Any]] = {}

    def hit(self, obj: Any, arrays: Any, name: str = "") -> Any:
        """The views kept for this very ``obj`` if ``arrays(obj)`` (called only when there is an entry) still have
        their signatures, else None: the fast path for callers whose argument checks are needed only on a miss
        (the objects are frozen, so the same object holds the same, already checked, fields)."""
        entry = self._entries.get((id(obj), name))
        if entry is not None and entry[0] is obj and _same_signature(entry[1], arrays(obj)):
            return entry[2]
        return None

    def holds(self, obj: Any, views: Any, name: str = "") -> bool:
        """Whether ``views`` are the ones kept for ``obj`` (a later call with ``obj`` may return them again)."""
        entry = self._entries.get((id(obj), name))
        return entry is not None and entry[0] is obj and entry[2] is views

    def get(self, obj: Any, arrays: tuple, build: Any, name: str = "") -> Any:
        """The views ``build()`` returns for ``obj`` (validated under ``name``, which their messages use)."""
        views = self.hit(obj, lambda _obj: arrays, name)
        if views is not None:
            return views
        sig = tuple(tensor_signature(a) for a in arrays)
        views = build()
        if _UNCACHEABLE not in sig:
            if len(self._entries) >= self.capacity:
                self._entries.pop(next(iter(self._entries)))
            self._entries[(id(obj), name)] = (obj, sig, views)
        return views


_CONTEXTS = ValidatedCache()        # SGLang-named ops: at most MAX_REAL_KV_SOURCES sources
_TABLE_CONTEXTS = ValidatedCache()  # plan-free ops: any number of sources
_PLANS = ValidatedCache()


def _context_tensors(context: Any) -> tuple:
    return (context.canary_buf, context.violation_ring, context.violation_write_index, context.slot_run_counter,
            context.kernel_run_counter, context.enable_chain_position_assert,
            *(s.tensor for s in context.real_kv_sources))


def cached_context_views(context: Any, *, name: str = "context",
                         max_sources: int | None = consts.MAX_REAL_KV_SOURCES) -> ContextViews:
    """:func:`context_views`, reusing the views of a context seen before when none of its arrays changed
    (:class:`ValidatedCache`); the errors are exactly :func:`context_views`'s."""
    cache = _CONTEXTS if max_sources is not None else _TABLE_CONTEXTS
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


# RT(rp, p) is computed in 64 bits: block ids are int32, so block_size <= 2**32 keeps
# block_id * block_size + p % block_size inside int64 for every block id.
MAX_BLOCK_SIZE = 1 << 32


def table_views(op: str, *, req_to_token: Any, block_table: Any, block_size: Any, pad_row: Any) -> TableViews:
    """The per-position table of SPEC §10: exactly one of ``req_to_token`` (int32 ``[max_reqs, max_seq_len]``)
    and ``block_table`` (int32 ``[max_reqs, max_blocks]`` with ``1 <= block_size <= 2**32``), both contiguous
    with at least one row and one column; ``block_size`` must be None with ``req_to_token``.

    ``pad_row``: -1 (no padding row) or a row of the table (default 0, SGLang's padding row). Every op that
    reads a table validates it here.
    """
    pad = check_int("pad_row", pad_row)
    has_r2t, has_bt = req_to_token is not None, block_table is not None
    if has_r2t == has_bt:
        raise invalid(f"{op} needs exactly one of req_to_token and block_table, got {'both' if has_r2t else 'neither'}")
    if has_bt:
        if block_size is None:
            raise invalid(f"{op} requires block_size when block_table is given")
        bsz = check_positive("block_size", block_size)
        if bsz > MAX_BLOCK_SIZE:
            raise invalid(f"block_size must be at most 2**32 = {MAX_BLOCK_SIZE}, got {bsz}")
        bt = array("block_table", block_table, "int32", ndim=2)
        if bt.shape[0] <= 0:
            raise invalid(f"block_table must have at least one row, got shape {bt.shape}")
        if bt.shape[1] <= 0:
            raise invalid(f"block_table must have at least one block per row, got shape {bt.shape}")
        table = TableViews(req_to_token=None, block_table=bt, block_size=bsz, pad_row=pad)
    else:
        if block_size is not None:
            raise invalid(f"{op} block_size must be None when req_to_token is given")
        r2t = array("req_to_token", req_to_token, "int32", ndim=2)
        if r2t.shape[0] <= 0:
            raise invalid(f"req_to_token must have at least one row (row 0 is padding), got shape {r2t.shape}")
        if r2t.shape[1] <= 0:
            raise invalid(f"req_to_token_stride0 must be positive, got {r2t.shape[1]}")
        table = TableViews(req_to_token=r2t, block_table=None, block_size=1, pad_row=pad)
    if not -1 <= pad < table.max_reqs:
        raise invalid(f"pad_row must be -1 or a row of the table in [0, {table.max_reqs}), got {pad}")
    return table


def _lut(op: str, window: int, full_to_swa_index_mapping: Any) -> ArrayView | None:
    """SPEC §5: the LUT is required iff ``swa_window_size > 0``."""
    if window > 0:
        if full_to_swa_index_mapping is None:
            raise invalid(f"{op} requires full_to_swa_index_mapping when swa_window_size > 0")
        lut = array("full_to_swa_index_mapping", full_to_swa_index_mapping, "int64")
        if lut.shape[0] <= 0:
            raise invalid("lut_len must be positive when has_swa_lut is True")
        return lut
    if full_to_swa_index_mapping is not None:
        raise invalid(f"{op} full_to_swa_index_mapping must be None when swa_window_size == 0")
    return None


def _expected_tokens_pool(op: str, pool: Any, valid_lens: Any, bs: int,
                          table: TableViews) -> tuple[ArrayView | None, ArrayView | None]:
    """SPEC §5: the expected-token pool and its valid lengths, together or not at all."""
    has_pool, has_lens = pool is not None, valid_lens is not None
    if has_pool != has_lens:
        raise invalid(
            f"{op} requires req_to_verify_expected_tokens and req_to_verify_expected_tokens_valid_lens "
            f"together, got only {'req_to_verify_expected_tokens' if has_pool else 'the valid lens'}"
        )
    if not has_pool:
        return None, None
    p = array("req_to_verify_expected_tokens", pool, "int32", ndim=2)
    lens = array("req_to_verify_expected_tokens_valid_lens", valid_lens, "int64", length=bs)
    if p.shape[0] < table.max_reqs:
        form = "block_table" if table.paged else "req_to_token"
        raise invalid(f"req_to_verify_expected_tokens must have at least {form}'s "
                      f"{table.max_reqs} rows, got {p.shape[0]}")
    return p, lens


def _invalid_rows(invalid_rows_out: Any) -> ArrayView | None:
    return None if invalid_rows_out is None else array("invalid_rows_out", invalid_rows_out, "int32", length=1)


def _input_assert(op: str, assert_on: bool, n: int, expected_input_tokens: Any,
                  expected_input_positions: Any) -> tuple[ArrayView | None, ArrayView | None]:
    """SPEC §6: the expected input arrays are given iff the input assert is on."""
    for name, value in (("expected_input_tokens", expected_input_tokens),
                        ("expected_input_positions", expected_input_positions)):
        if assert_on and value is None:
            raise invalid(f"{op} requires {name} when enable_write_input_assert is True")
        if not assert_on and value is not None:
            raise invalid(f"{op} {name} must be None when enable_write_input_assert is False")
    if not assert_on:
        return None, None
    return (array("expected_input_tokens", expected_input_tokens, "int64", length=n),
            array("expected_input_positions", expected_input_positions, "int64", length=n))


# ----------------------------------------------------------------------------------------------------------
# Validators: SGLang-named ops (SPEC §5-§8)

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
    rpi = array("req_pool_indices", req_pool_indices, "int64")
    bs = rpi.shape[0]
    prefix = array("prefix_lens", prefix_lens, "int64", length=bs)
    extend = array("extend_seq_lens", extend_seq_lens, "int64", length=bs)
    table = table_views(_PLAN, req_to_token=req_to_token, block_table=block_table, block_size=block_size,
                        pad_row=pad_row)
    lut = _lut(_PLAN, window, full_to_swa_index_mapping)
    pool, valid_lens = _expected_tokens_pool(_PLAN, req_to_verify_expected_tokens,
                                             req_to_verify_expected_tokens_valid_lens, bs, table)
    invalid_rows = _invalid_rows(invalid_rows_out)

    if c_arg != vplan.capacity:
        raise invalid(f"{_PLAN} verify_capacity={c_arg} does not match "
                      f"verify_plan_out.verify_slot_indices.shape[0]={vplan.capacity}")
    if bs > wplan.capacity:
        raise invalid(f"bs={bs} exceeds write_req_capacity={wplan.capacity}")

    device = _same_device(_PLAN, *vplan.all(), *wplan.all(), rpi, prefix, extend, table.array, lut, pool,
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
    wplan = _PLANS.get(plan, _write_plan_arrays(plan), lambda: write_plan_views(plan, "plan"))
    ids = array("input_ids", input_ids, "int64")
    n = ids.shape[0]
    pos = array("positions", positions, "int64", length=n)
    loc = array("out_cache_loc", out_cache_loc, "int64", length=n)
    exp_tok, exp_pos = _input_assert(_WRITE, assert_on, n, expected_input_tokens, expected_input_positions)
    device = _same_device(_WRITE, *ctx.all(), *wplan.all(), ids, pos, loc, exp_tok, exp_pos)
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
    vplan = _PLANS.get(plan, _verify_plan_arrays(plan), lambda: verify_plan_views(plan, "plan"))
    key = (id(ctx), id(vplan), check)
    rec = _VERIFY_LAUNCHES.get(key)
    if rec is not None and rec.ctx is ctx and rec.plan is vplan:
        return rec
    device = _same_device(_VERIFY, *ctx.all(), *vplan.all())
    kept = _CONTEXTS.holds(context, ctx, "context") and _PLANS.holds(plan, vplan)  # views a later call gets again
    rec = VerifyLaunch(device=device, ctx=ctx, plan=vplan, check_expected_token=check, kept=kept)
    if kept:
        if len(_VERIFY_LAUNCHES) >= _PLANS.capacity:
            _VERIFY_LAUNCHES.pop(next(iter(_VERIFY_LAUNCHES)))
        _VERIFY_LAUNCHES[key] = rec
    return rec


def validate_scatter(*, flat_in: Any, offsets: Any, req_pool_indices: Any, pool_out: Any) -> ScatterLaunch:
    flat = array("flat_in", flat_in, "int64")
    rpi = array("req_pool_indices", req_pool_indices, "int64")
    offs = array("offsets", offsets, "int64", length=rpi.shape[0] + 1)
    pool = array("pool_out", pool_out, "int32", ndim=2)
    device = _same_device(_SCATTER, flat, offs, rpi, pool)
    return ScatterLaunch(device=device, flat_in=flat, offsets=offs, req_pool_indices=rpi, pool_out=pool)


# ----------------------------------------------------------------------------------------------------------
# Validators: plan-free ops (SPEC §11, §12)

_VERIFY_TABLE = "launch_canary_verify_from_table"
_WRITE_TABLE = "launch_canary_write_from_table"


def _context_arrays(contexts: tuple[ContextViews, ...]) -> list[ArrayView]:
    return [a for c in contexts for a in c.all()]


def validate_verify_from_table(
    *,
    contexts: Any,
    req_pool_indices: Any,
    prefix_lens: Any,
    req_to_token: Any,
    block_table: Any,
    block_size: Any,
    pad_row: Any,
    swa_window_size: Any,
    full_to_swa_index_mapping: Any,
    req_to_verify_expected_tokens: Any,
    req_to_verify_expected_tokens_valid_lens: Any,
    kv_token_id_vs_position_offset: Any,
    check_verify_expected_token: Any,
    invalid_rows_out: Any,
) -> VerifyTableLaunch:
    window = check_non_negative("swa_window_size", swa_window_size)
    token_offset = check_int("kv_token_id_vs_position_offset", kv_token_id_vs_position_offset)
    check = check_bool("check_verify_expected_token", check_verify_expected_token)

    ctxs = contexts_views(contexts)
    rpi = array("req_pool_indices", req_pool_indices, "int64")
    bs = rpi.shape[0]
    prefix = array("prefix_lens", prefix_lens, "int64", length=bs)
    table = table_views(_VERIFY_TABLE, req_to_token=req_to_token, block_table=block_table, block_size=block_size,
                        pad_row=pad_row)
    lut = _lut(_VERIFY_TABLE, window, full_to_swa_index_mapping)
    pool, valid_lens = _expected_tokens_pool(_VERIFY_TABLE, req_to_verify_expected_tokens,
                                             req_to_verify_expected_tokens_valid_lens, bs, table)
    invalid_rows = _invalid_rows(invalid_rows_out)
    device = _same_device(_VERIFY_TABLE, *_context_arrays(ctxs), rpi, prefix, table.array, lut, pool, valid_lens,
                          invalid_rows)
    return VerifyTableLaunch(device=device, contexts=ctxs, req_pool_indices=rpi, prefix_lens=prefix, table=table,
                             swa_window_size=window, lut=lut, expected_tokens_pool=pool,
                             expected_tokens_valid_lens=valid_lens, token_offset=token_offset,
                             check_expected_token=check, invalid_rows=invalid_rows)


def _bytes_span(c: ContextViews) -> tuple[int, int]:
    return c.canary_buf.ptr, c.canary_buf.ptr + c.num_slots * c.slot_stride_bytes


def validate_write_from_table(
    *,
    contexts: Any,
    req_pool_indices: Any,
    prefix_lens: Any,
    extend_seq_lens: Any,
    req_to_token: Any,
    block_table: Any,
    block_size: Any,
    pad_row: Any,
    swa_window_size: Any,
    full_to_swa_index_mapping: Any,
    input_ids: Any,
    positions: Any,
    out_cache_loc: Any,
    enable_write_input_assert: Any,
    expected_input_tokens: Any,
    expected_input_positions: Any,
    invalid_rows_out: Any,
) -> WriteTableLaunch:
    window = check_non_negative("swa_window_size", swa_window_size)
    assert_on = check_bool("enable_write_input_assert", enable_write_input_assert)

    ctxs = contexts_views(contexts)
    rpi = array("req_pool_indices", req_pool_indices, "int64")
    bs = rpi.shape[0]
    prefix = array("prefix_lens", prefix_lens, "int64", length=bs)
    extend = array("extend_seq_lens", extend_seq_lens, "int64", length=bs)
    table = table_views(_WRITE_TABLE, req_to_token=req_to_token, block_table=block_table, block_size=block_size,
                        pad_row=pad_row)
    lut = _lut(_WRITE_TABLE, window, full_to_swa_index_mapping)
    ids = array("input_ids", input_ids, "int64")
    n = ids.shape[0]
    pos = array("positions", positions, "int64", length=n)
    loc = array("out_cache_loc", out_cache_loc, "int64", length=n)
    exp_tok, exp_pos = _input_assert(_WRITE_TABLE, assert_on, n, expected_input_tokens, expected_input_positions)
    invalid_rows = _invalid_rows(invalid_rows_out)
    # Each context stamps its own chains: two contexts writing one buffer would race on the GPU.
    spans = [_bytes_span(c) for c in ctxs]
    for i, (a0, a1) in enumerate(spans):
        for j, (b0, b1) in enumerate(spans[:i]):
            if a0 < b1 and b0 < a1 and ctxs[i].canary_buf.device == ctxs[j].canary_buf.device:
                raise invalid(f"{_WRITE_TABLE} contexts[{i}].canary_buf overlaps contexts[{j}].canary_buf; "
                              f"each context of a write needs its own canary buffer")
    device = _same_device(_WRITE_TABLE, *_context_arrays(ctxs), rpi, prefix, extend, table.array, lut, ids, pos,
                          loc, exp_tok, exp_pos, invalid_rows)
    return WriteTableLaunch(device=device, contexts=ctxs, req_pool_indices=rpi, prefix_lens=prefix,
                            extend_seq_lens=extend, table=table, lut=lut, input_ids=ids, positions=pos,
                            out_cache_loc=loc, expected_input_tokens=exp_tok, expected_input_positions=exp_pos,
                            invalid_rows=invalid_rows)


# ----------------------------------------------------------------------------------------------------------
# Validators: records that move with the KV (SPEC §13)

_GATHER = "gather_canary_records"
_SCATTER_RECORDS = "scatter_canary_records"
_COPY = "copy_canary_records"


def _records(name: str, x: Any, n: int) -> ArrayView:
    """int64 ``[n, 4]``, contiguous: the first 32 bytes of ``n`` canary records."""
    v = array(name, x, "int64", ndim=2)
    if v.shape != (n, consts.CANARY_FIELDS_PER_SLOT):
        raise invalid(f"{name} must have shape [{n}, {consts.CANARY_FIELDS_PER_SLOT}] (one record per slot), "
                      f"got {v.shape}")
    if not v.is_contiguous():
        raise invalid(f"{name} must be contiguous")
    return v


def _out_of_range(out_of_range_out: Any) -> ArrayView | None:
    return None if out_of_range_out is None else array("out_of_range_out", out_of_range_out, "int32", length=1)


def validate_gather_records(*, canary_buf: Any, slots: Any, records_out: Any,
                            out_of_range_out: Any) -> RecordGatherLaunch:
    canary = canary_buffer_view("canary_buf", canary_buf)
    sl = array("slots", slots, "int64")
    out = _records("records_out", records_out, sl.shape[0])
    oor = _out_of_range(out_of_range_out)
    device = _same_device(_GATHER, canary.buf, sl, out, oor)
    return RecordGatherLaunch(device=device, canary=canary, slots=sl, records_out=out, out_of_range=oor)


def validate_scatter_records(*, canary_buf: Any, slots: Any, records: Any,
                             out_of_range_out: Any) -> RecordScatterLaunch:
    canary = canary_buffer_view("canary_buf", canary_buf)
    sl = array("slots", slots, "int64")
    recs = _records("records", records, sl.shape[0])
    oor = _out_of_range(out_of_range_out)
    device = _same_device(_SCATTER_RECORDS, canary.buf, sl, recs, oor)
    return RecordScatterLaunch(device=device, canary=canary, slots=sl, records=recs, out_of_range=oor)


def validate_copy_records(*, src_canary_buf: Any, src_slots: Any, dst_slots: Any, dst_canary_buf: Any,
                          out_of_range_out: Any) -> RecordCopyLaunch:
    src = canary_buffer_view("src_canary_buf", src_canary_buf)
    dst = src if dst_canary_buf is None else canary_buffer_view("dst_canary_buf", dst_canary_buf)
    s_sl = array("src_slots", src_slots, "int64")
    d_sl = array("dst_slots", dst_slots, "int64", length=s_sl.shape[0])
    oor = _out_of_range(out_of_range_out)
    device = _same_device(_COPY, src.buf, dst.buf, s_sl, d_sl, oor)
    return RecordCopyLaunch(device=device, src=src, src_slots=s_sl, dst=dst, dst_slots=d_sl, out_of_range=oor)
