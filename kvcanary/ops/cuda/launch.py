"""Kernel arguments and the launch itself: on the arrays' device, on the caller's stream, cheaply.

Every kernel takes one parameter struct (:mod:`kvcanary.ops.cuda.params`). The per-context part of it (canary
buffer, log, counters, tag, real-KV sources, the slot limit) is packed once per validated
:class:`~kvcanary.ops.launches.ContextViews` (a frozen record: its addresses cannot change) and cached for as
long as that record lives; the per-call part (batch arrays, plans) is packed on every call. A launch packs the words
into this thread's reusable argument buffer and calls ``cuLaunchKernel`` through CuPy's driver binding with the
kernel's handle and the raw stream handle (:func:`launch`; CuPy's ``Function.__call__`` is the fallback), or, for the
kernels :mod:`kvcanary.ops.cuda.pdl` registered, ``cuLaunchKernelEx`` with programmatic dependent launch: no
per-launch NumPy array, argument tuple, CuPy stream or device context manager (the device is switched only when
the current one differs). :func:`launch_prepared` launches a struct packed ahead of time
(:mod:`kvcanary.ops.cuda.table_step`, the canary's hot path).

Real-KV sources (SPEC §3.1, §13). The SGLang-named kernels get up to four sources by value (a ``KvcRealKv4``);
the plan-free kernels read a device descriptor table (int64 ``[n, 6]``: pointer, page size, bytes per token,
row stride, bytes folded per slot, rows) that this module builds on first use and keeps, per device, keyed by the
descriptors' *content* (so a table can never be stale, and one table serves every context with the same
sources). Building one allocates and copies, which a CUDA-graph capture forbids: a launch whose table does not
exist yet raises :class:`RealKvSourcesNotPreparedError` inside a capture; call :func:`prepare_real_kv_sources`
(or run the op once) before capturing. Tables are never freed (a few hundred bytes each), so a captured graph
that reads one stays valid. When a launch folds real KV, the context's ``slot_limit`` is the slots every source
covers (``num_rows * page_size``, at most ``num_slots``; SPEC §9): the kernels report a slot beyond it like an
out-of-range slot.

Every array was validated by :mod:`kvcanary.ops.validation` (dtype, shape, contiguity, device), which matters
because a raw pointer carries none of that.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvcanary.consts import REAL_KV_LOAD_BYTES, RealKvHashMode
from kvcanary.errors import RealKvSourcesNotPreparedError, invalid
from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda import pdl
from kvcanary.ops.interop import ArrayView, Device, import_cupy, stream_handle
from kvcanary.ops.launches import ContextViews, RealKvSourceView, TableViews


def ptr(v: ArrayView | None) -> int:
    """The device address of a validated array (0 for an absent one)."""
    return 0 if v is None else v.ptr


# ----------------------------------------------------------------------------------------------------------
# Streams and the launch


class _RawStream:
    """What ``cupy.cuda.function.Function.__call__`` needs of a stream: its handle, as ``ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, handle: int) -> None:
        self.ptr = handle


_streams: dict[int, _RawStream] = {}


def raw_stream(handle: int) -> _RawStream:
    s = _streams.get(handle)
    if s is None:
        if len(_streams) >= 256:
            _streams.clear()
        s = _streams[handle] = _RawStream(handle)
    return s


def resolve_stream(stream: Any, device: Device) -> _RawStream:
    """The stream to launch on (SPEC §9): ``stream`` if given, else torch's current stream of ``device``; looked
    up once per op call."""
    return raw_stream(stream_handle(stream, device))


class ArgBuffer:
    """A reusable host buffer holding one by-value struct argument, and the one-entry ``void*`` array that points
    at it (what ``cuLaunchKernel`` takes as ``kernelParams``). CUDA copies the argument bytes when a launch is
    enqueued (or a graph node captured), so the buffer may be refilled by the next launch at once; one per thread
    and size, so concurrent launchers never share one."""

    __slots__ = ("packer", "params", "params_addr", "words")

    def __init__(self, n: int) -> None:
        self.words = (ctypes.c_int64 * n)()
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.words))
        self.params_addr = ctypes.addressof(self.params)
        self.packer = struct.Struct(f"<{n}q")


_tls = threading.local()
_driver_launch: Any = None  # cupy.cuda.driver.launchKernel, or False when this CuPy lacks it
_rt: Any = None             # cupy.cuda.runtime, once imported (launches look up the current device through it)


def _runtime() -> Any:
    global _rt
    _rt = import_cupy().cuda.runtime
    return _rt


def _launch_kernel_fn() -> Any:
    global _driver_launch
    if _driver_launch is None:
        drv = getattr(import_cupy().cuda, "driver", None)
        _driver_launch = getattr(drv, "launchKernel", None) or False
    return _driver_launch


def launch_path() -> str:
    """Which call launches the kernels: ``"cuLaunchKernel"`` (CuPy's thin driver binding, a prebuilt argument
    buffer) or ``"cupy Function"`` (``cupy.cuda.function.Function.__call__``, when the binding is missing)."""
    return "cuLaunchKernel" if _launch_kernel_fn() else "cupy Function"


def _thread_buffer(n: int) -> ArgBuffer:
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    buf = bufs.get(n)
    if buf is None:
        buf = bufs[n] = ArgBuffer(n)
    return buf


def launch(fn: Any, grid: int, block: int, words: Sequence[int], device_index: int, stream: _RawStream) -> None:
    """Launch ``fn`` (a ``cupy.cuda.function.Function`` loaded on ``device_index``) with one by-value struct
    argument of ``words``, on ``stream``, on ``device_index`` whatever the current device is: the words are packed
    into this thread's reusable argument buffer, then :func:`launch_prepared`."""
    buf = _thread_buffer(len(words))
    buf.packer.pack_into(buf.words, 0, *words)
    launch_prepared(fn, grid, block, buf, device_index, stream)


def launch_prepared(fn: Any, grid: int, block: int, buf: ArgBuffer, device_index: int, stream: _RawStream) -> None:
    """Launch ``fn`` with the struct packed in ``buf``, on ``stream``, on ``device_index``: ``cuLaunchKernel``
    through CuPy's driver binding (no per-launch NumPy array or argument tuple); CuPy's ``Function.__call__`` with
    the struct's bytes is the fallback for a CuPy without the binding, or a kernel without a raw handle."""
    if (_rt or _runtime()).getDevice() != device_index:
        with import_cupy().cuda.Device(device_index):
            return launch_prepared(fn, grid, block, buf, device_index, stream)
    drv_launch = _driver_launch if _driver_launch is not None else _launch_kernel_fn()
    fptr = getattr(fn, "ptr", None)
    if fptr in pdl.functions:
        pdl.launch(fptr, grid, block, stream.ptr, buf.params_addr)
    elif drv_launch and fptr is not None:
        drv_launch(fptr, grid, 1, 1, block, 1, 1, 0, stream.ptr, buf.params_addr, 0)
    else:
        fn((grid,), (block,), (P.kernel_arg(list(buf.words)),), 0, stream)


def memset32_zero(p: int, device_index: int, stream: _RawStream) -> None:
    """``*(int32*)p = 0`` on ``stream`` (a memset node in a captured graph; allocates nothing)."""
    cp = import_cupy()
    if cp.cuda.runtime.getDevice() == device_index:
        cp.cuda.runtime.memsetAsync(p, 0, 4, stream.ptr)
    else:
        with cp.cuda.Device(device_index):
            cp.cuda.runtime.memsetAsync(p, 0, 4, stream.ptr)


def stream_capturing(handle: int) -> bool:
    """Whether the stream ``handle`` is capturing a CUDA graph."""
    rt = import_cupy().cuda.runtime
    f = getattr(rt, "streamIsCapturing", None)
    if f is not None:
        try:
            return bool(f(handle))
        except Exception:  # pragma: no cover - depends on the CuPy build
            pass
    import torch

    return bool(torch.cuda.is_current_stream_capturing())


# ----------------------------------------------------------------------------------------------------------
# Real-KV sources


def folds_real_kv(ctx: ContextViews) -> bool:
    return ctx.real_kv_hash_mode != RealKvHashMode.NONE and bool(ctx.real_kv_sources)


def _fold_bytes(ctx: ContextViews, s: RealKvSourceView) -> int:
    return REAL_KV_LOAD_BYTES if ctx.real_kv_hash_mode == RealKvHashMode.PARTIAL else s.read_bytes


def slot_limit(ctx: ContextViews) -> int:
    """The slots ``[0, limit)`` a launch of ``ctx`` may touch (SPEC §9): ``num_slots``, or fewer when it folds
    real KV from a source that covers fewer."""
    if not folds_real_kv(ctx):
        return ctx.num_slots
    return min(ctx.num_slots, *(s.num_rows * s.page_size for s in ctx.real_kv_sources))


def real_kv4_words(ctx: ContextViews) -> list[int]:
    """The ``KvcRealKv4`` of the SGLang-named kernels: up to four sources by value (unused slots zero)."""
    if len(ctx.real_kv_sources) > P.MAX_BY_VALUE_SOURCES:
        raise invalid(f"context.real_kv_sources may hold at most {P.MAX_BY_VALUE_SOURCES} RealKvSource, "
                      f"got {len(ctx.real_kv_sources)}")
    sources = ctx.real_kv_sources if folds_real_kv(ctx) else ()
    n = len(sources)
    pad = [0] * (P.MAX_BY_VALUE_SOURCES - n)
    return P.REAL_KV4.pack(
        ptr=[s.tensor.ptr for s in sources] + pad,
        page_size=[s.page_size for s in sources] + pad,
        bytes_per_token=[s.num_bytes_per_token for s in sources] + pad,
        row_stride=[s.row_stride_bytes for s in sources] + pad,
        nbytes=[_fold_bytes(ctx, s) for s in sources] + pad,
        count=n,
    )


def source_descriptors(ctx: ContextViews) -> tuple[tuple[int, ...], ...]:
    """The descriptor rows (``params.SOURCE_DESC_FIELDS`` ints each) of the sources a launch of ``ctx`` folds."""
    if not folds_real_kv(ctx):
        return ()
    rows = []
    for s in ctx.real_kv_sources:
        row = [0] * P.SOURCE_DESC_FIELDS
        row[P.SRC_PTR] = s.tensor.ptr
        row[P.SRC_PAGE_SIZE] = s.page_size
        row[P.SRC_BYTES_PER_TOKEN] = s.num_bytes_per_token
        row[P.SRC_ROW_STRIDE] = s.row_stride_bytes
        row[P.SRC_FOLD_BYTES] = _fold_bytes(ctx, s)
        row[P.SRC_NUM_ROWS] = s.num_rows
        rows.append(tuple(row))
    return tuple(rows)


_tables_lock = threading.Lock()
_tables: dict[tuple[int, tuple[tuple[int, ...], ...]], Any] = {}  # (device, descriptors) -> CuPy int64 [n, 6]


def source_table(ctx: ContextViews, device_index: int, stream: _RawStream | None) -> tuple[int, int]:
    """``(device address, count)`` of the descriptor table of ``ctx``'s folded sources (``(0, 0)`` when the
    launch folds none), built on first use and cached by content (see the module docstring)."""
    desc = source_descriptors(ctx)
    if not desc:
        return 0, 0
    key = (device_index, desc)
    table = _tables.get(key)
    if table is None:
        if stream is not None and stream_capturing(stream.ptr):
            raise RealKvSourcesNotPreparedError(
                "kv-canary: a launch inside a CUDA-graph capture needs the device table of its context's "
                f"{len(desc)} real-KV sources, which does not exist yet (building it allocates device memory, "
                "which a capture forbids); run the op once, or call "
                "kvcanary.ops.cuda.backend.prepare_real_kv_sources(contexts), before capturing")
        cp = import_cupy()
        with _tables_lock:
            table = _tables.get(key)
            if table is None:
                host = np.array(desc, dtype=np.int64).reshape(len(desc), P.SOURCE_DESC_FIELDS)
                with cp.cuda.Device(device_index):
                    table = cp.asarray(host)
                    # The copy ran on CuPy's current stream; the launch may be on another one.
                    cp.cuda.get_current_stream().synchronize()
                _tables[key] = table
    return int(table.data.ptr), len(desc)


# ----------------------------------------------------------------------------------------------------------
# Per-context words, cached per ContextViews object


def _context_words(ctx: ContextViews, sources: int, num_sources: int) -> list[int]:
    return P.CONTEXT.pack(
        canary=ctx.canary_buf.ptr, ring=ctx.violation_ring.ptr, write_index=ctx.violation_write_index.ptr,
        slot_run_counter=ctx.slot_run_counter.ptr, kernel_run_counter=ctx.kernel_run_counter.ptr,
        chain_position_flag=ptr(ctx.chain_position_flag), sources=sources, num_sources=num_sources,
        num_slots=ctx.num_slots, slot_limit=slot_limit(ctx), slot_stride=ctx.slot_stride_bytes,
        ring_capacity=ctx.ring_capacity, tag=ctx.kernel_kind)


# id(ctx) -> (weak reference to ctx, {flavour: words}); an entry goes when its ContextViews is collected.
_ctx_cache: dict[int, tuple[Any, dict[Any, tuple[int, ...]]]] = {}
_CTX_CACHE_MAX = 4096


def _ctx_entry(ctx: ContextViews) -> dict[Any, tuple[int, ...]]:
    key = id(ctx)
    e = _ctx_cache.get(key)
    if e is not None and e[0]() is ctx:
        return e[1]
    if len(_ctx_cache) >= _CTX_CACHE_MAX:
        _ctx_cache.clear()
    d: dict[Any, tuple[int, ...]] = {}

    def forget(_ref: Any, k: int = key) -> None:
        _ctx_cache.pop(k, None)

    _ctx_cache[key] = (weakref.ref(ctx, forget), d)
    return d


def sglang_context_words(ctx: ContextViews) -> tuple[int, ...]:
    """``KvcContextParams`` + ``KvcRealKv4`` words of an SGLang-named launch (sources by value)."""
    d = _ctx_entry(ctx)
    w = d.get("sglang")
    if w is None:
        w = d["sglang"] = (*_context_words(ctx, 0, 0), *real_kv4_words(ctx))
    return w


def table_context_words(ctx: ContextViews, device_index: int, stream: _RawStream | None) -> tuple[int, ...]:
    """``KvcContextParams`` words of a plan-free launch (sources through the device descriptor table)."""
    d = _ctx_entry(ctx)
    w = d.get(device_index)
    if w is None:
        table, n = source_table(ctx, device_index, stream)
        w = d[device_index] = tuple(_context_words(ctx, table, n))
    return w


def contexts_words(contexts: Sequence[ContextViews], device_index: int, stream: _RawStream | None) -> list[int]:
    """The ``ctx[kMaxContexts]`` words of up to ``MAX_CONTEXTS`` contexts (unused entries zero)."""
    out: list[int] = []
    for c in contexts:
        out.extend(table_context_words(c, device_index, stream))
    out.extend([0] * (P.CONTEXT.words * (P.MAX_CONTEXTS - len(contexts))))
    return out


def prepare_real_kv_sources(contexts: Sequence[ContextViews], device_index: int) -> None:
    """Build (outside any capture) the descriptor tables the plan-free launches of ``contexts`` need."""
    for c in contexts:
        source_table(c, device_index, None)


def clear_caches() -> None:
    """Forget the per-context words and the prepared launches (not the descriptor tables: captured graphs may read
    them)."""
    _ctx_cache.clear()
    _streams.clear()
    _prepared.clear()


# Prepared launches of the SGLang-named ops: the words of a launch record that validation keeps (and hands back as
# the same object while nothing under it changed) are packed once and relaunched as they are. An entry holds its
# record, so the record's id is not recycled while it lives.
_prepared: dict[tuple, tuple[tuple, Any, Any, ArgBuffer]] = {}
PREPARED_CAPACITY = 64


def prepared_launch(key: tuple, owners: tuple) -> tuple[Any, Any, ArgBuffer] | None:
    """The ``(fn, grid, buffer)`` stored under ``key`` for exactly the objects ``owners`` (compared by identity),
    or None."""
    e = _prepared.get(key)
    if e is None or len(e[0]) != len(owners) or any(a is not b for a, b in zip(e[0], owners)):
        return None
    return e[1], e[2], e[3]


def prepare_launch(key: tuple, owners: tuple, fn: Any, grid: Any, words: Sequence[int]) -> ArgBuffer:
    """Pack ``words`` into a buffer of their own and keep ``(fn, grid, buffer)`` under ``key`` for ``owners``; the
    oldest entry goes when :data:`PREPARED_CAPACITY` are kept. The buffer is never written again, so threads may
    launch from it at once."""
    buf = ArgBuffer(len(words))
    buf.packer.pack_into(buf.words, 0, *words)
    if len(_prepared) >= PREPARED_CAPACITY:
        _prepared.pop(next(iter(_prepared)))
    _prepared[key] = (owners, fn, grid, buf)
    return buf


# ----------------------------------------------------------------------------------------------------------
# Shared argument groups


def table_words(table: TableViews, lut: ArrayView | None) -> list[int]:
    """``KvcTableParams`` of SPEC §10's table and the SWA LUT."""
    arr = table.array
    return P.TABLE.pack(
        table=arr.ptr, lut=ptr(lut), lut_len=lut.shape[0] if lut is not None else 0, max_reqs=arr.shape[0],
        cols=arr.shape[1], block_size=table.block_size, paged=1 if table.paged else 0,
        max_seq_len=table.max_seq_len, pad_row=table.pad_row)


def batch_words(*, req_pool_indices: ArrayView, prefix_lens: ArrayView, extend_seq_lens: ArrayView | None,
                pool: ArrayView | None, valid_lens: ArrayView | None, invalid_rows: ArrayView | None,
                swa_window_size: int, token_offset: int) -> list[int]:
    """``KvcBatchParams`` of a batch."""
    return P.BATCH.pack(
        req_pool_indices=req_pool_indices.ptr, prefix_lens=prefix_lens.ptr, extend_seq_lens=ptr(extend_seq_lens),
        pool=ptr(pool), valid_lens=ptr(valid_lens), invalid_rows=ptr(invalid_rows), bs=req_pool_indices.shape[0],
        swa_window_size=swa_window_size, pool_cols=pool.shape[1] if pool is not None else 0,
        token_offset=token_offset)


def token_words(*, input_ids: ArrayView, positions: ArrayView, out_cache_loc: ArrayView,
                expected_input_tokens: ArrayView | None, expected_input_positions: ArrayView | None) -> list[int]:
    """``KvcTokenParams`` of a write's flattened tokens."""
    return P.TOKENS.pack(
        input_ids=input_ids.ptr, positions=positions.ptr, out_cache_loc=out_cache_loc.ptr,
        expected_input_tokens=ptr(expected_input_tokens), expected_input_positions=ptr(expected_input_positions),
        num_tokens=input_ids.shape[0])
