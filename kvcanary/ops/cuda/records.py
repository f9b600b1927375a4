"""Canary records that move with the KV (SPEC §13) on CUDA: ``kernels_cu/records.cu``.

CPU twin: :mod:`kvcanary.ops.reference.records`. One entry per thread; ``out_of_range_out`` (when given) is
zeroed on the stream first (a memset, no allocation) and counted into by the kernel.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda.grids import records_grid, sm_count
from kvcanary.ops.cuda.launch import launch, memset32_zero, ptr, resolve_stream
from kvcanary.ops.cuda.loader import function
from kvcanary.ops.interop import ArrayView, Device
from kvcanary.ops.launches import CanaryBufferView, RecordCopyLaunch, RecordGatherLaunch, RecordScatterLaunch


def _run(name: str, device: Device, stream: Any, n: int, out_of_range: ArrayView | None, *,
         src: CanaryBufferView | None = None, dst: CanaryBufferView | None = None, src_slots: ArrayView | None = None,
         dst_slots: ArrayView | None = None, records_in: ArrayView | None = None,
         records_out: ArrayView | None = None) -> None:
    dev = device.index
    s = resolve_stream(stream, device)
    if out_of_range is not None:
        memset32_zero(out_of_range.ptr, dev, s)
    if n == 0:
        return
    words = P.RECORDS.pack(
        src=src.buf.ptr if src is not None else 0, dst=dst.buf.ptr if dst is not None else 0, src_slots=ptr(src_slots),
        dst_slots=ptr(dst_slots), records_in=ptr(records_in), records_out=ptr(records_out),
        out_of_range=ptr(out_of_range), n=n, src_num_slots=src.num_slots if src is not None else 0,
        src_stride=src.slot_stride_bytes if src is not None else 0,
        dst_num_slots=dst.num_slots if dst is not None else 0,
        dst_stride=dst.slot_stride_bytes if dst is not None else 0)
    g = records_grid(n, sm_count(dev))
    launch(function(dev, "records", name), g.blocks, g.threads, words, dev, s)


def gather_records(launch_rec: RecordGatherLaunch, stream: Any = None) -> None:
    """``records_out[i] = record(slots[i])`` (a zero record for a skipped entry)."""
    r = launch_rec
    _run("kvc_gather_records", r.device, stream, r.slots.shape[0], r.out_of_range, src=r.canary, src_slots=r.slots,
         records_out=r.records_out)


def scatter_records(launch_rec: RecordScatterLaunch, stream: Any = None) -> None:
    """``record(slots[i]) = records[i]``."""
    r = launch_rec
    _run("kvc_scatter_records", r.device, stream, r.slots.shape[0], r.out_of_range, dst=r.canary, dst_slots=r.slots,
         records_in=r.records)


def copy_records(launch_rec: RecordCopyLaunch, stream: Any = None) -> None:
    """``dst record(dst_slots[i]) = src record(src_slots[i])``."""
    r = launch_rec
    _run("kvc_copy_records", r.device, stream, r.src_slots.shape[0], r.out_of_range, src=r.src, dst=r.dst,
         src_slots=r.src_slots, dst_slots=r.dst_slots)
