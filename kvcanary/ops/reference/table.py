"""The per-position table and the batch rows (SPEC §5, §9, §10) on the CPU, vectorized.

Shared by every op that reads a table: the plan (§5), ``verify_from_table`` (§11) and ``write_from_table``
(§12). The CUDA kernels hold the same three rules in one header (the twin of this module), so that a block
table and the ``req_to_token`` it expands to give identical bytes on both backends.

Decisions shared with the CUDA kernels:

* ``RT(rp, p)`` (§10): ``req_to_token[rp, p]`` (int32, sign-extended), or, for a block table,
  ``block_table[rp, p // block_size] * block_size + p % block_size`` computed in 64 bits, with ``RT = -1``
  when the block id is negative. ``RT`` then goes through ``T()`` and the bounds rules like any table value.
  Callers only ask for ``0 <= p < max_seq_len`` of a valid row.
* ``T(x)`` (§5, §9): ``x`` if ``x < 0`` or there is no LUT; ``lut[x]`` if ``x < len(lut)``; else -2.
* Batch rows (§9, §10): row ``r`` is *padding* when ``req_pool_indices[r] == pad_row``; it is *invalid*
  when its index is outside ``[0, max_reqs)`` and not ``pad_row``, or when ``prefix_lens[r] > max_seq_len``
  (a padding row with such a prefix is invalid too: with ``pad_row = 0`` this is exactly the rule before
  paged tables); otherwise it is *active*. Only active rows have verify entries, write tokens and seeds;
  ``invalid_rows`` counts the invalid ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcanary import consts
from kvcanary.ops.launches import TableViews


def translate(x: np.ndarray, lut: np.ndarray | None) -> np.ndarray:
    """``T(x)``: ``x`` if negative or without a LUT, ``lut[x]`` if in range, else -2."""
    x = x.astype(np.int64)
    if lut is None:
        return x
    out = x.copy()
    hit = (x >= 0) & (x < len(lut))
    out[hit] = lut[x[hit]]
    out[x >= len(lut)] = consts.LUT_OUT_OF_RANGE_SLOT
    return out


class Table:
    """Host access to a validated table: :meth:`rt` reads ``RT(rp, p)`` for arrays of rows and positions."""

    def __init__(self, views: TableViews) -> None:
        self.views = views
        self.array = views.array.host()
        self.block_size = views.block_size
        self.max_reqs = views.max_reqs
        self.max_seq_len = views.max_seq_len
        self.pad_row = views.pad_row

    def rt(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """``RT(rows[i], positions[i])`` as int64; every row valid and every position in ``[0, max_seq_len)``."""
        if not self.views.paged:
            return self.array[rows, positions].astype(np.int64)
        bsz = self.block_size
        block = self.array[rows, positions // bsz].astype(np.int64)
        # A negative block id means "no block": RT = -1 whatever the offset.
        return np.where(block < 0, consts.NO_SLOT, block * bsz + positions % bsz)


@dataclass(frozen=True)
class BatchRows:
    """Row classification of one batch (see the module docstring); arrays of length ``bs``."""

    active: np.ndarray  # bool: has entries, tokens and a seed
    invalid: np.ndarray  # bool: counted in invalid_rows
    safe_rp: np.ndarray  # int64: req_pool_indices where active, else 0 (a valid row to gather from)

    @property
    def num_invalid(self) -> int:
        return int(self.invalid.sum())


def classify_rows(table: Table, rpi: np.ndarray, prefix: np.ndarray) -> BatchRows:
    """Each batch row as valid, padding or invalid (SPEC §9, §10), from its pool index and prefix; the CUDA side
    is ``kvc_row_valid`` in ``common.cuh``."""
    in_range = (rpi >= 0) & (rpi < table.max_reqs)
    padding = rpi == table.pad_row
    invalid = (~in_range & ~padding) | (prefix > table.max_seq_len)
    active = ~invalid & ~padding
    return BatchRows(active=active, invalid=invalid, safe_rp=np.where(active, rpi, 0))
