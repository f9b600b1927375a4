"""Validators of the arguments several ops share: the batch rows, the table of SPEC §10 in either form (with
``pad_row``) and its SWA LUT, the expected-token pool (SPEC §5), the write's tokens with the input assert (SPEC §6)
and ``invalid_rows_out``.

The plan and the plan-free ops of SPEC §11, §12 read a table, so each validates it here the same way."""

from __future__ import annotations

from typing import Any

from kvcanary.errors import invalid
from kvcanary.ops.checks import check_int, check_positive
from kvcanary.ops.interop import ArrayView
from kvcanary.ops.launches import TableViews
from kvcanary.ops.validation.arrays import array

# RT(rp, p) is computed in 64 bits: block ids are int32, so block_size <= 2**32 keeps
# block_id * block_size + p % block_size inside int64 for every block id.
MAX_BLOCK_SIZE = 1 << 32


def table_views(op: str, *, req_to_token: Any, block_table: Any, block_size: Any, pad_row: Any) -> TableViews:
    """The per-position table of SPEC §10: exactly one of ``req_to_token`` (int32 ``[max_reqs, max_seq_len]``)
    and ``block_table`` (int32 ``[max_reqs, max_blocks]`` with ``1 <= block_size <= 2**32``), both contiguous
    with at least one row and one column; ``block_size`` must be None with ``req_to_token``.

    ``pad_row``: -1 (no padding row) or a row of the table (default 0, SGLang's padding row). Every op that
    reads a table validates it here.
    """
    pad = check_int("pad_row", pad_row)
    has_r2t, has_bt = req_to_token is not None, block_table is not None
    if has_r2t == has_bt:
        raise invalid(f"{op} needs exactly one of req_to_token and block_table, got {'both' if has_r2t else 'neither'}")
    if has_bt:
        if block_size is None:
            raise invalid(f"{op} requires block_size when block_table is given")
        bsz = check_positive("block_size", block_size)
        if bsz > MAX_BLOCK_SIZE:
            raise invalid(f"block_size must be at most 2**32 = {MAX_BLOCK_SIZE}, got {bsz}")
        bt = array("block_table", block_table, "int32", ndim=2)
        if bt.shape[0] <= 0:
            raise invalid(f"block_table must have at least one row, got shape {bt.shape}")
        if bt.shape[1] <= 0:
            raise invalid(f"block_table must have at least one block per row, got shape {bt.shape}")
        table = TableViews(req_to_token=None, block_table=bt, block_size=bsz, pad_row=pad)
    else:
        if block_size is not None:
            raise invalid(f"{op} block_size must be None when req_to_token is given")
        r2t = array("req_to_token", req_to_token, "int32", ndim=2)
        if r2t.shape[0] <= 0:
            raise invalid(f"req_to_token must have at least one row (row 0 is padding), got shape {r2t.shape}")
        if r2t.shape[1] <= 0:
            raise invalid(f"req_to_token_stride0 must be positive, got {r2t.shape[1]}")
        table = TableViews(req_to_token=r2t, block_table=None, block_size=1, pad_row=pad)
    if not -1 <= pad < table.max_reqs:
        raise invalid(f"pad_row must be -1 or a row of the table in [0, {table.max_reqs}), got {pad}")
    return table


def _lut_view(op: str, window: int, full_to_swa_index_mapping: Any) -> ArrayView | None:
    """SPEC §5: the LUT is required iff ``swa_window_size > 0``."""
    if window > 0:
        if full_to_swa_index_mapping is None:
            raise invalid(f"{op} requires full_to_swa_index_mapping when swa_window_size > 0")
        lut = array("full_to_swa_index_mapping", full_to_swa_index_mapping, "int64")
        if lut.shape[0] <= 0:
            raise invalid("lut_len must be positive when has_swa_lut is True")
        return lut
    if full_to_swa_index_mapping is not None:
        raise invalid(f"{op} full_to_swa_index_mapping must be None when swa_window_size == 0")
    return None


def expected_tokens_pool(op: str, pool: Any, valid_lens: Any, bs: int,
                         table: TableViews) -> tuple[ArrayView | None, ArrayView | None]:
    """SPEC §5: the expected-token pool and its valid lengths, together or not at all."""
    has_pool, has_lens = pool is not None, valid_lens is not None
    if has_pool != has_lens:
        raise invalid(
            f"{op} requires req_to_verify_expected_tokens and req_to_verify_expected_tokens_valid_lens "
            f"together, got only {'req_to_verify_expected_tokens' if has_pool else 'the valid lens'}"
        )
    if not has_pool:
        return None, None
    p = array("req_to_verify_expected_tokens", pool, "int32", ndim=2)
    lens = array("req_to_verify_expected_tokens_valid_lens", valid_lens, "int64", length=bs)
    if p.shape[0] < table.max_reqs:
        form = "block_table" if table.paged else "req_to_token"
        raise invalid(f"req_to_verify_expected_tokens must have at least {form}'s "
                      f"{table.max_reqs} rows, got {p.shape[0]}")
    return p, lens


def invalid_rows_view(invalid_rows_out: Any) -> ArrayView | None:
    """``invalid_rows_out``: None or int32 ``[1]`` (SPEC §10)."""
    return None if invalid_rows_out is None else array("invalid_rows_out", invalid_rows_out, "int32", length=1)


def _input_assert_views(op: str, assert_on: bool, n: int, expected_input_tokens: Any,
                        expected_input_positions: Any) -> tuple[ArrayView | None, ArrayView | None]:
    """SPEC §6: the expected input arrays are given iff the input assert is on."""
    for name, value in (("expected_input_tokens", expected_input_tokens),
                        ("expected_input_positions", expected_input_positions)):
        if assert_on and value is None:
            raise invalid(f"{op} requires {name} when enable_write_input_assert is True")
        if not assert_on and value is not None:
            raise invalid(f"{op} {name} must be None when enable_write_input_assert is False")
    if not assert_on:
        return None, None
    return (array("expected_input_tokens", expected_input_tokens, "int64", length=n),
            array("expected_input_positions", expected_input_positions, "int64", length=n))


def batch_rows(req_pool_indices: Any, prefix_lens: Any) -> tuple[ArrayView, ArrayView]:
    """The batch's rows (SPEC §5): int64 ``req_pool_indices [bs]`` and ``prefix_lens [bs]`` (a write's
    ``extend_seq_lens [bs]`` is checked next, by its validator)."""
    rpi = array("req_pool_indices", req_pool_indices, "int64")
    return rpi, array("prefix_lens", prefix_lens, "int64", length=rpi.shape[0])


def table_and_lut(op: str, *, req_to_token: Any, block_table: Any, block_size: Any, pad_row: Any, window: int,
                  full_to_swa_index_mapping: Any) -> tuple[TableViews, ArrayView | None]:
    """:func:`table_views`, then the SWA LUT for ``window`` (the checked ``swa_window_size``): required iff
    ``window > 0`` (SPEC §5)."""
    table = table_views(op, req_to_token=req_to_token, block_table=block_table, block_size=block_size,
                        pad_row=pad_row)
    return table, _lut_view(op, window, full_to_swa_index_mapping)


def write_tokens(op: str, *, input_ids: Any, positions: Any, out_cache_loc: Any, assert_on: bool,
                 expected_input_tokens: Any, expected_input_positions: Any
                 ) -> tuple[ArrayView, ArrayView, ArrayView, ArrayView | None, ArrayView | None]:
    """A write's tokens (SPEC §6): int64 ``input_ids [n]``, ``positions [n]``, ``out_cache_loc [n]``, then the
    expected inputs, given iff the assert is on (None, None when off). Returns the five in that
    order."""
    ids = array("input_ids", input_ids, "int64")
    n = ids.shape[0]
    pos = array("positions", positions, "int64", length=n)
    loc = array("out_cache_loc", out_cache_loc, "int64", length=n)
    exp_tok, exp_pos = _input_assert_views(op, assert_on, n, expected_input_tokens, expected_input_positions)
    return ids, pos, loc, exp_tok, exp_pos
