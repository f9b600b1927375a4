"""Violation log and counters (SPEC §4), as the CPU appends to them."""

from __future__ import annotations

import numpy as np

from kvcanary.ops.launches import ContextViews


def append_rows(ctx: ContextViews, rows: np.ndarray) -> None:
    """Append int64 rows ``[k, 8]`` in order: row ``i`` of the log gets the ``i``-th violation ever appended
    while ``i < ring_capacity``; the int32 write index counts every row (wrapping like ``atomicAdd``)."""
    k = len(rows)
    if k == 0:
        return
    index = ctx.violation_write_index.host()
    ring = ctx.violation_ring.host()
    start = int(index[0])
    first = max(start, 0)
    last = min(start + k, ctx.ring_capacity)
    if last > first:
        ring[first:last] = rows[first - start:last - start]
    total = (start + k) & 0xFFFFFFFF
    index[0] = total - (1 << 32) if total >= (1 << 31) else total


def add_counter(counter_view, amount: int) -> None:
    """``counter += amount`` on an int64 ``[1]`` counter, wrapping."""
    c = counter_view.host()
    c += np.int64(amount)


def rows_in_entry_order(*parts: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Merge ``(entry_index[k], rows[k, 8])`` groups into one row array sorted by entry index (stable)."""
    idx = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    rows = np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, 8), np.int64)
    order = np.argsort(idx, kind="stable")
    return rows[order]
