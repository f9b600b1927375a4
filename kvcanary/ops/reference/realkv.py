"""Real-KV fingerprint (SPEC §3.1), vectorized over slots, and the slots the sources cover (SPEC §9).

Decision shared with the CUDA kernels: a source may cover fewer slots than the canary buffer. When a launch
folds real KV (mode != NONE and at least one source), a slot with ``slot // page_size >= num_rows`` for any
source, i.e. ``slot >= covered_slots(ctx)``, is treated exactly like a slot ``>= num_slots``: verify reports
it with one ``SLOT_OUT_OF_RANGE`` row and no other check, write reports it and does not stamp it. In NONE
mode, or without sources, nothing is read and the canary's ``num_slots`` is the only limit.
"""

from __future__ import annotations

import numpy as np

from kvcanary.consts import RealKvHashMode
from kvcanary.ops.launches import ContextViews, RealKvSourceView
from kvcanary.ops.reference.hashing import splitmix64


def covered_slots(ctx: ContextViews) -> int:
    """The slots ``[0, n)`` a launch of ``ctx`` may touch: ``num_slots``, or fewer when it folds real KV from
    a source covering fewer (``num_rows * page_size``)."""
    if not ctx.folds_real_kv:
        return ctx.num_slots
    return min(ctx.num_slots, *(s.num_slots for s in ctx.real_kv_sources))


def source_hash(src: RealKvSourceView, slots: np.ndarray, nbytes: int) -> np.ndarray:
    """Fold of the first ``nbytes`` bytes each slot owns in ``src`` (uint64 per slot).

    ``slots`` must be in ``[0, num_rows * page_size)`` (callers apply :func:`covered_slots` first).
    """
    width = src.page_size * src.num_bytes_per_token
    # Every slot's bytes start 16-byte aligned (data pointer, row stride and num_bytes_per_token are multiples
    # of 16, checked by RealKvSource), so the pool reads as little-endian u64 words [rows, page_size, words]:
    # gathering whole word runs per slot is far faster than indexing byte by byte.
    pool = src.tensor.host_rows(src.row_bytes)[:, :width].view("<u8")
    pool = pool.reshape(pool.shape[0], src.page_size, src.num_bytes_per_token // 8)
    slots = np.asarray(slots, dtype=np.int64)
    words = pool[slots // src.page_size, slots % src.page_size, : nbytes // 8]  # [k, nbytes / 8], a gathered copy
    h = np.zeros(len(slots), dtype=np.uint64)
    for j in range(words.shape[1]):
        h = splitmix64(h ^ words[:, j])
    return h


def fingerprint(sources: tuple[RealKvSourceView, ...], mode: int, slots: np.ndarray) -> np.ndarray:
    """The real-KV fingerprint of each slot (uint64): 0 in NONE mode or with no sources."""
    slots = np.asarray(slots, dtype=np.int64)
    acc = np.zeros(len(slots), dtype=np.uint64)
    if mode == RealKvHashMode.NONE or not sources or len(slots) == 0:
        return acc
    for src in sources:
        nbytes = 16 if mode == RealKvHashMode.PARTIAL else src.read_bytes
        acc = splitmix64(acc ^ source_hash(src, slots, nbytes))
    return acc
