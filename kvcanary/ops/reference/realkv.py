"""Real-KV fingerprint (SPEC §3.1), vectorized over slots."""

from __future__ import annotations

import numpy as np

from kvcanary.consts import RealKvHashMode
from kvcanary.ops.launches import RealKvSourceView
from kvcanary.ops.reference.hashing import splitmix64


def source_hash(src: RealKvSourceView, slots: np.ndarray, nbytes: int) -> np.ndarray:
    """Fold of the first ``nbytes`` bytes each slot owns in ``src`` (uint64 per slot).

    ``slots`` must be in ``[0, src covers)`` (validation checks the source covers the canary's slots).
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
