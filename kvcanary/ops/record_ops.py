"""Records that move with the KV (SPEC §13): gather, scatter and copy canary records between slots.

An engine that moves KV between slots (block de-duplication, copy-on-write forks, offload and reload, transfer
to another instance) moves the records of those slots with it; nothing in a record names its own slot, so
records moved with their KV and remapped in the table verify at their new slots. A record is the first 32
bytes of a slot, seen as int64 ``(token, position, prev_hash, real_kv_hash)``; bytes past 32 are never touched.

Slots are int64. A negative slot skips its entry; a slot ``>= num_slots`` of its buffer is skipped too and
counted in ``out_of_range_out`` (int32 ``[1]``, *set* to the number of such entries). Several entries writing
one destination slot, or a copy whose source and destination slots overlap in one buffer, have an unspecified
result (the CPU reference applies the entries in order). Keyword-only, validated first (SPEC §9), CPU or CUDA
by the arrays' device, graph-safe on CUDA.
"""

from __future__ import annotations

from kvcanary.ops.backends import backend_for
from kvcanary.ops.validation import validate_copy_records, validate_gather_records, validate_scatter_records


def gather_canary_records(*, canary_buf, slots, records_out, out_of_range_out=None, stream=None) -> None:
    """``records_out[i] = record(slots[i])``; a zero record for a skipped entry.

    Args:
        canary_buf: uint8 ``[num_slots, slot_stride_bytes]`` (contiguous, stride >= 32 and a multiple of 8,
            8-byte aligned).
        slots: int64 ``[n]``.
        records_out: int64 ``[n, 4]``, contiguous (written, every row).
        out_of_range_out: optional int32 ``[1]``, set to the number of slots ``>= num_slots``.
        stream: CUDA stream (default: torch's current stream of the arrays' device).
    """
    launch = validate_gather_records(canary_buf=canary_buf, slots=slots, records_out=records_out,
                                     out_of_range_out=out_of_range_out)
    backend_for(launch.device).gather_records(launch, stream)


def scatter_canary_records(*, canary_buf, slots, records, out_of_range_out=None, stream=None) -> None:
    """``record(slots[i]) = records[i]`` for every entry with a slot in ``[0, num_slots)``.

    Args:
        canary_buf: uint8 ``[num_slots, slot_stride_bytes]`` as for :func:`gather_canary_records` (written).
        slots: int64 ``[n]``; duplicates have an unspecified result.
        records: int64 ``[n, 4]``, contiguous.
        out_of_range_out: optional int32 ``[1]``, set to the number of slots ``>= num_slots``.
        stream: CUDA stream (default: torch's current stream of the arrays' device).
    """
    launch = validate_scatter_records(canary_buf=canary_buf, slots=slots, records=records,
                                      out_of_range_out=out_of_range_out)
    backend_for(launch.device).scatter_records(launch, stream)


def copy_canary_records(*, src_canary_buf, src_slots, dst_slots, dst_canary_buf=None, out_of_range_out=None,
                        stream=None) -> None:
    """``dst record(dst_slots[i]) = src record(src_slots[i])`` for every entry whose two slots are valid.

    Args:
        src_canary_buf: uint8 ``[src_num_slots, stride]`` as for :func:`gather_canary_records`.
        src_slots, dst_slots: int64 ``[n]``.
        dst_canary_buf: the destination buffer (its own ``num_slots`` and stride), or None for ``src_canary_buf``
            itself. Overlapping source and destination slots in one buffer, or duplicate destinations, have an
            unspecified result.
        out_of_range_out: optional int32 ``[1]``, set to the number of entries with a source slot
            ``>= src_num_slots`` or a destination slot ``>= dst_num_slots``.
        stream: CUDA stream (default: torch's current stream of the arrays' device).
    """
    launch = validate_copy_records(src_canary_buf=src_canary_buf, src_slots=src_slots, dst_slots=dst_slots,
                                   dst_canary_buf=dst_canary_buf, out_of_range_out=out_of_range_out)
    backend_for(launch.device).copy_records(launch, stream)
