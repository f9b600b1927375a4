"""Validators of the record ops: gather, scatter and copy of canary records, which move with the KV (SPEC §13)."""

from __future__ import annotations

from typing import Any

from kvcanary import consts
from kvcanary.errors import invalid
from kvcanary.ops.interop import ArrayView, Device
from kvcanary.ops.launches import CanaryBufferView, RecordCopyLaunch, RecordGatherLaunch, RecordScatterLaunch
from kvcanary.ops.validation.arrays import array, same_device
from kvcanary.ops.validation.structs import canary_buffer_view

_GATHER = "gather_canary_records"
_SCATTER_RECORDS = "scatter_canary_records"
_COPY = "copy_canary_records"


def _records(name: str, x: Any, n: int) -> ArrayView:
    """int64 ``[n, 4]``, contiguous: the first 32 bytes of ``n`` canary records."""
    v = array(name, x, "int64", ndim=2)
    if v.shape != (n, consts.CANARY_FIELDS_PER_SLOT):
        raise invalid(f"{name} must have shape [{n}, {consts.CANARY_FIELDS_PER_SLOT}] (one record per slot), "
                      f"got {v.shape}")
    return v


def _out_of_range(out_of_range_out: Any) -> ArrayView | None:
    return None if out_of_range_out is None else array("out_of_range_out", out_of_range_out, "int32", length=1)


def _slots_and_records(op: str, canary_buf: Any, slots: Any, records_name: str, records: Any, out_of_range_out: Any
                       ) -> tuple[CanaryBufferView, ArrayView, ArrayView, ArrayView | None, Device]:
    """The arguments of a gather or a scatter, in their order of checks: one canary buffer, int64 ``slots [n]``,
    the records ``[n, 4]`` (named ``records_name``), ``out_of_range_out``; then the one device."""
    canary = canary_buffer_view("canary_buf", canary_buf)
    sl = array("slots", slots, "int64")
    recs = _records(records_name, records, sl.shape[0])
    oor = _out_of_range(out_of_range_out)
    return canary, sl, recs, oor, same_device(op, canary.buf, sl, recs, oor)


def validate_gather_records(*, canary_buf: Any, slots: Any, records_out: Any,
                            out_of_range_out: Any) -> RecordGatherLaunch:
    canary, sl, out, oor, device = _slots_and_records(_GATHER, canary_buf, slots, "records_out", records_out,
                                                      out_of_range_out)
    return RecordGatherLaunch(device=device, canary=canary, slots=sl, records_out=out, out_of_range=oor)


def validate_scatter_records(*, canary_buf: Any, slots: Any, records: Any,
                             out_of_range_out: Any) -> RecordScatterLaunch:
    canary, sl, recs, oor, device = _slots_and_records(_SCATTER_RECORDS, canary_buf, slots, "records", records,
                                                       out_of_range_out)
    return RecordScatterLaunch(device=device, canary=canary, slots=sl, records=recs, out_of_range=oor)


def validate_copy_records(*, src_canary_buf: Any, src_slots: Any, dst_slots: Any, dst_canary_buf: Any,
                          out_of_range_out: Any) -> RecordCopyLaunch:
    src = canary_buffer_view("src_canary_buf", src_canary_buf)
    dst = src if dst_canary_buf is None else canary_buffer_view("dst_canary_buf", dst_canary_buf)
    s_sl = array("src_slots", src_slots, "int64")
    d_sl = array("dst_slots", dst_slots, "int64", length=s_sl.shape[0])
    oor = _out_of_range(out_of_range_out)
    device = same_device(_COPY, src.buf, dst.buf, s_sl, d_sl, oor)
    return RecordCopyLaunch(device=device, src=src, src_slots=s_sl, dst=dst, dst_slots=d_sl, out_of_range=oor)
