"""Kernel arguments and the launch itself: on the arrays' device, on the caller's stream.

Kernel scalars are ``numpy.int64`` and pointers ``numpy.uint64`` (CuPy passes both by value, 8 bytes);
absent optional arrays are null pointers. Every array was validated by :mod:`kvcanary.ops.validation`
(dtype, shape, contiguity, device), which matters because a raw pointer carries none of that.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvcanary.consts import REAL_KV_LOAD_BYTES, RealKvHashMode
from kvcanary.ops.interop import ArrayView, Device, import_cupy, stream_handle
from kvcanary.ops.launches import ContextViews

NULL = np.uint64(0)


def ptr(v: ArrayView | None) -> np.uint64:
    """The device address of a validated array (``NULL`` for an absent one)."""
    return NULL if v is None else np.uint64(v.ptr)


def i64(x: int) -> np.int64:
    return np.int64(x)


def context_args(ctx: ContextViews) -> tuple:
    """``canary, num_slots, slot_stride, ring, write_index, ring_capacity, tag, slot_run_counter,
    kernel_run_counter`` — the leading parameters of the write and verify kernels."""
    return (ptr(ctx.canary_buf), i64(ctx.num_slots), i64(ctx.slot_stride_bytes), ptr(ctx.violation_ring),
            ptr(ctx.violation_write_index), i64(ctx.ring_capacity), i64(ctx.kernel_kind),
            ptr(ctx.slot_run_counter), ptr(ctx.kernel_run_counter))


def real_kv_args(ctx: ContextViews) -> tuple[bool, tuple]:
    """Whether real KV is fingerprinted, and the ``KVC_REAL_KV_PARAMS`` kernel arguments (SPEC §3.1).

    Sources are passed by value (four slots, unused ones zero), so nothing is allocated per launch.
    """
    sources = ctx.real_kv_sources if ctx.real_kv_hash_mode != RealKvHashMode.NONE else ()
    n = len(sources)
    pad = 4 - n
    ptrs = [ptr(s.tensor) for s in sources] + [NULL] * pad
    pages = [i64(s.page_size) for s in sources] + [i64(0)] * pad
    bpt = [i64(s.num_bytes_per_token) for s in sources] + [i64(0)] * pad
    strides = [i64(s.row_stride_bytes) for s in sources] + [i64(0)] * pad
    nbytes = [i64(REAL_KV_LOAD_BYTES if ctx.real_kv_hash_mode == RealKvHashMode.PARTIAL else s.read_bytes)
              for s in sources] + [i64(0)] * pad
    return n > 0, (*ptrs, *pages, *bpt, *strides, *nbytes, i64(n))


_streams: dict[tuple[int, int], Any] = {}


def _external_stream(cp: Any, handle: int, device_index: int) -> Any:
    """A non-owning CuPy wrapper of the raw stream ``handle``, cached: it holds only the handle value and
    the device, so a reused handle value still names the right stream."""
    key = (handle, device_index)
    s = _streams.get(key)
    if s is None:
        with warnings.catch_warnings():
            # CuPy 14 deprecates ExternalStream in favour of Stream.from_external, which CuPy 13 lacks.
            warnings.simplefilter("ignore", DeprecationWarning)
            s = cp.cuda.ExternalStream(handle, device_index)
        if len(_streams) >= 256:
            _streams.clear()
        _streams[key] = s
    return s


def launch(fn: Any, grid: int, block: int, args: Sequence[Any], device: Device, stream: Any) -> None:
    """Launch ``fn`` on ``device`` (whatever the current device is) on the caller's stream.

    ``stream``: ``None`` (torch's current stream of ``device``), a torch or CuPy stream, an object with
    ``__cuda_stream__`` or a raw handle (see :func:`kvcanary.ops.interop.stream_handle`).
    """
    cp = import_cupy()
    handle = stream_handle(stream, device)
    with cp.cuda.Device(device.index), _external_stream(cp, handle, device.index):
        fn((int(grid),), (int(block),), tuple(args))

