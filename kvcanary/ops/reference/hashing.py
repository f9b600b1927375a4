"""Vectorized SPEC §3 hashes on NumPy ``uint64`` arrays (wrapping arithmetic), and canary record access."""

from __future__ import annotations

import numpy as np

from kvcanary import consts

_M1 = np.uint64(consts.SPLITMIX64_MUL1)
_M2 = np.uint64(consts.SPLITMIX64_MUL2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
ANCHOR_HASH = np.uint64(consts.ANCHOR_HASH)


def u64(x: np.ndarray) -> np.ndarray:
    """Bit-cast an int64 array (or any integer array) to uint64."""
    x = np.asarray(x)
    return x.view(np.uint64) if x.dtype == np.int64 else x.astype(np.int64).view(np.uint64)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SPEC §3's splitmix64 finalizer, elementwise on uint64 (wrapping); ``kvc_splitmix64`` in ``common.cuh``."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> _S30)) * _M1
        x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def mix3(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``splitmix64(splitmix64(splitmix64(a) ^ b) ^ c)``; ``b``, ``c`` are int64 (bit-cast)."""
    return splitmix64(splitmix64(splitmix64(a) ^ u64(b)) ^ u64(c))


def records(canary_host: np.ndarray) -> np.ndarray:
    """The canary buffer (uint8 ``[num_slots, stride]``, contiguous) as int64 ``[num_slots, stride // 8]``;
    columns 0..3 are the record fields, the rest is never touched."""
    return canary_host.view(np.int64)


def slot_hash(recs: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """``slot_hash(s)`` for each ``s`` (uint64): the anchor hash for ``s < 0``, else ``mix3`` of the record.

    Every non-negative ``s`` must be a valid slot (the callers apply the bounds rule first).
    """
    slots = np.asarray(slots, dtype=np.int64)
    out = np.full(slots.shape, ANCHOR_HASH, dtype=np.uint64)
    live = slots >= 0
    if live.any():
        # np.take gathers rows several times faster than fancy indexing on large random index arrays.
        r = np.take(recs, slots[live], axis=0)
        out[live] = mix3(u64(r[:, consts.FIELD_PREV_HASH]), r[:, consts.FIELD_TOKEN], r[:, consts.FIELD_POSITION])
    return out
