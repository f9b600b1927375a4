"""Records that move with the KV (SPEC §13) on the CPU: gather, scatter and copy of canary records.

A record here is the first 32 bytes of a slot (int64 token, position, prev_hash, real_kv_hash); bytes past 32
of a slot are never read or written.

Decisions shared with the CUDA kernels:

* a negative slot means "skip this entry": gather writes a zero record to ``records_out[i]``; scatter and
  copy write nothing for it;
* a slot ``>= num_slots`` of its buffer is skipped the same way and counted: ``out_of_range_out`` (when
  given) is *set* to the number of entries with at least one such slot (copy: an entry counts once even if
  both of its slots are out of range; a negative slot does not stop the other one from being counted);
* several entries writing one destination slot (scatter, copy), or a copy whose source and destination slots
  overlap in one buffer, have an unspecified result on the GPU; this reference applies the entries in order
  (the last write of a slot wins, and a copy reads a source slot after the earlier entries wrote it).
"""

from __future__ import annotations

import numpy as np

from kvcanary import consts
from kvcanary.ops.launches import CanaryBufferView, RecordCopyLaunch, RecordGatherLaunch, RecordScatterLaunch
from kvcanary.ops.reference.hashing import records

_F = consts.CANARY_FIELDS_PER_SLOT


def _recs(c: CanaryBufferView) -> np.ndarray:
    return records(c.buf.host())[:, :_F]


def _set_count(view, count: int) -> None:
    if view is not None:
        view.host()[0] = count


def _last_of_each(slots: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The entries of ``idx`` that are the last to write their slot (``slots[idx]``), in entry order."""
    if len(idx) == 0:
        return idx
    _, first_rev = np.unique(slots[idx][::-1], return_index=True)
    return np.sort(idx[len(idx) - 1 - first_rev])


def gather_records(launch: RecordGatherLaunch) -> None:
    """Copy the records of ``launch.slots`` into ``launch.records_out`` (SPEC §13; the decisions above); CUDA twin:
    ``kvc_gather_records`` in ``kernels_cu/records.cu``."""
    slots = launch.slots.host()
    n_slots = launch.canary.num_slots
    ok = (slots >= 0) & (slots < n_slots)
    vals = np.zeros((len(slots), _F), np.int64)
    vals[ok] = np.take(_recs(launch.canary), slots[ok], axis=0)
    launch.records_out.host()[:] = vals
    _set_count(launch.out_of_range, int((slots >= n_slots).sum()))


def scatter_records(launch: RecordScatterLaunch) -> None:
    """Write ``launch.records`` into the records of ``launch.slots`` (SPEC §13); CUDA twin: ``kvc_scatter_records``."""
    slots = launch.slots.host()
    n_slots = launch.canary.num_slots
    ok = np.flatnonzero((slots >= 0) & (slots < n_slots))
    keep = _last_of_each(slots, ok)
    _recs(launch.canary)[slots[keep]] = launch.records.host()[keep]
    _set_count(launch.out_of_range, int((slots >= n_slots).sum()))


def _reads_after_writes(launch: RecordCopyLaunch, src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether a destination record may overlap a source record in memory (then order matters)."""
    s_buf, d_buf = launch.src, launch.dst
    s0, s1 = s_buf.buf.ptr, s_buf.buf.ptr + s_buf.num_slots * s_buf.slot_stride_bytes
    d0, d1 = d_buf.buf.ptr, d_buf.buf.ptr + d_buf.num_slots * d_buf.slot_stride_bytes
    if len(src) == 0 or not (s0 < d1 and d0 < s1):
        return False
    s_addr = np.sort(s0 + src * s_buf.slot_stride_bytes)
    d_addr = d0 + dst * d_buf.slot_stride_bytes
    k = np.searchsorted(s_addr, d_addr)
    near = np.minimum(np.abs(d_addr - s_addr[np.minimum(k, len(s_addr) - 1)]),
                      np.abs(d_addr - s_addr[np.maximum(k - 1, 0)]))
    return bool((near < consts.CANARY_SLOT_BYTES).any())


def copy_records(launch: RecordCopyLaunch) -> None:
    """Copy records from ``src_slots`` of one buffer to ``dst_slots`` of another (or the same; SPEC §13); CUDA
    twin: ``kvc_copy_records``."""
    src_slots = launch.src_slots.host()
    dst_slots = launch.dst_slots.host()
    s_n, d_n = launch.src.num_slots, launch.dst.num_slots
    oor = (src_slots >= s_n) | (dst_slots >= d_n)
    ok = np.flatnonzero((src_slots >= 0) & (dst_slots >= 0) & ~oor)
    src_recs, dst_recs = _recs(launch.src), _recs(launch.dst)
    s, d = src_slots[ok], dst_slots[ok]
    if _reads_after_writes(launch, s, d):
        for a, b in zip(s.tolist(), d.tolist()):
            dst_recs[b] = src_recs[a]
    else:
        keep = _last_of_each(dst_slots, ok)
        dst_recs[dst_slots[keep]] = np.take(src_recs, src_slots[keep], axis=0)
    _set_count(launch.out_of_range, int(oor.sum()))
