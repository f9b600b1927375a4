"""Plan (SPEC §5, with the paged tables of §10) on the CPU, vectorized over requests and entries.

The verify entries and the write metadata are computed by :func:`verify_entries` and :func:`write_meta`,
which the plan-free ops (``verify_table``, ``write_table``) call too: one definition of §5 for all three.
Table access, ``T()`` and the row rules (padding, invalid rows) are in :mod:`kvcanary.ops.reference.table`.

Bounds (SPEC §9): ``T(x)`` for ``x >=`` the LUT length is -2; an invalid row (``req_pool_indices`` outside
``[0, max_reqs)`` and not ``pad_row``, or ``prefix_lens`` beyond ``max_seq_len``) gets no verify entries, no
write entries and seed -1, and is counted in ``invalid_rows``; the expected-token gather also requires
``p + offset < max_context_len``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kvcanary.ops.interop import ArrayView
from kvcanary.ops.launches import PlanLaunch, TableViews
from kvcanary.ops.reference.table import BatchRows, Table, classify_rows, translate

__all__ = ["Entries", "plan", "translate", "verify_entries", "write_meta"]


class VerifyBatch(Protocol):
    """What §5's verify entries read (a :class:`PlanLaunch` or a ``VerifyTableLaunch``)."""

    @property
    def req_pool_indices(self) -> ArrayView: ...
    @property
    def prefix_lens(self) -> ArrayView: ...
    @property
    def table(self) -> TableViews: ...
    @property
    def swa_window_size(self) -> int: ...
    @property
    def lut(self) -> ArrayView | None: ...
    @property
    def expected_tokens_pool(self) -> ArrayView | None: ...
    @property
    def expected_tokens_valid_lens(self) -> ArrayView | None: ...
    @property
    def token_offset(self) -> int: ...


class WriteBatch(Protocol):
    """What §5's write metadata reads (a :class:`PlanLaunch` or a ``WriteTableLaunch``)."""

    @property
    def req_pool_indices(self) -> ArrayView: ...
    @property
    def prefix_lens(self) -> ArrayView: ...
    @property
    def extend_seq_lens(self) -> ArrayView: ...
    @property
    def table(self) -> TableViews: ...
    @property
    def lut(self) -> ArrayView | None: ...


@dataclass(frozen=True)
class Entries:
    """All verify entries of a batch, request by request, position by position (int64 arrays of one length)."""

    slots: np.ndarray
    expected_tokens: np.ndarray
    positions: np.ndarray
    prev: np.ndarray
    rows: BatchRows

    @property
    def total(self) -> int:
        return len(self.slots)


def _lut(batch: VerifyBatch | WriteBatch) -> np.ndarray | None:
    return batch.lut.host() if batch.lut is not None else None


def count_entries(batch: VerifyBatch) -> tuple[np.ndarray, np.ndarray, BatchRows]:
    """``(window_start, entries per row, rows)`` without gathering anything."""
    table = Table(batch.table)
    rpi = batch.req_pool_indices.host()
    prefix = batch.prefix_lens.host()
    rows = classify_rows(table, rpi, prefix)
    w = batch.swa_window_size
    window_start = np.maximum(prefix - w, 0) if w > 0 else np.zeros(len(rpi), np.int64)
    n_verify = np.where(rows.active, np.maximum(prefix - window_start, 0), 0)
    return window_start, n_verify, rows


def verify_entries(batch: VerifyBatch) -> Entries:
    """SPEC §5's verify entries, all of them (no capacity)."""
    window_start, n_verify, rows = count_entries(batch)
    table = Table(batch.table)
    lut = _lut(batch)
    total = int(n_verify.sum())
    req = np.repeat(np.arange(len(n_verify)), n_verify)
    starts = np.cumsum(n_verify) - n_verify
    p = window_start[req] + (np.arange(total) - starts[req])
    rp = rows.safe_rp[req]
    slot = translate(table.rt(rp, p), lut)
    # A window's first entry keeps its real predecessor; position 0 is a chain head.
    prev = np.full(total, -1, np.int64)
    has_prev = p > 0
    prev[has_prev] = translate(table.rt(rp[has_prev], p[has_prev] - 1), lut)
    expected = np.full(total, -1, np.int64)
    if batch.expected_tokens_pool is not None:
        assert batch.expected_tokens_valid_lens is not None
        pool = batch.expected_tokens_pool.host()
        valid_lens = batch.expected_tokens_valid_lens.host()
        q = p + batch.token_offset
        ok = (q >= 0) & (q < valid_lens[req]) & (q < pool.shape[1])
        expected[ok] = pool[rp[ok], q[ok]]
    return Entries(slots=slot, expected_tokens=expected, positions=p, prev=prev, rows=rows)


def write_meta(batch: WriteBatch) -> tuple[np.ndarray, np.ndarray, BatchRows]:
    """SPEC §5's write metadata: ``(write_len [bs], seeds [bs], rows)``."""
    table = Table(batch.table)
    rpi = batch.req_pool_indices.host()
    prefix = batch.prefix_lens.host()
    extend = batch.extend_seq_lens.host()
    rows = classify_rows(table, rpi, prefix)
    write_len = np.where(rows.active, np.maximum(extend, 0), 0)
    has_seed = rows.active & (prefix > 0) & (write_len > 0)
    seeds = np.full(len(rpi), -1, np.int64)
    seeds[has_seed] = translate(table.rt(rows.safe_rp[has_seed], prefix[has_seed] - 1), _lut(batch))
    return write_len, seeds, rows


def plan(launch: PlanLaunch) -> None:
    """Fill ``launch``'s verify and write plans on the CPU (SPEC §5, §10); the CUDA twin is ``kernels_cu/plan.cu``."""
    bs = launch.bs
    vp = launch.verify
    cap = vp.capacity
    _, n_verify, rows = count_entries(launch)
    total = int(n_verify.sum())
    if total > cap:
        # Overflow: nothing is gathered and no entry is written.
        vp.num_valid.host()[0] = cap
        vp.enable.host()[0] = 0
    else:
        e = verify_entries(launch)
        vp.num_valid.host()[0] = total
        vp.enable.host()[0] = 1
        vp.slot_indices.host()[:total] = e.slots
        vp.expected_tokens.host()[:total] = e.expected_tokens
        vp.expected_positions.host()[:total] = e.positions
        vp.prev_slot_indices.host()[:total] = e.prev

    wp = launch.write
    write_len, seeds, _ = write_meta(launch)
    offsets = wp.offsets.host()
    offsets[0] = 0
    offsets[1:bs + 1] = np.cumsum(write_len)
    offsets[bs + 1:] = 0
    wp.seed_slot_indices.host()[:bs] = seeds
    wp.num_valid_reqs.host()[0] = bs
    if launch.invalid_rows is not None:
        launch.invalid_rows.host()[0] = rows.num_invalid
