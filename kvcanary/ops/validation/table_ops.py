"""Validators of the plan-free verify and write straight from the table (SPEC §11, §12)."""

from __future__ import annotations

from typing import Any

from kvcanary.errors import invalid
from kvcanary.ops.checks import check_bool, check_int, check_non_negative
from kvcanary.ops.interop import ArrayView
from kvcanary.ops.launches import ContextViews, VerifyTableLaunch, WriteTableLaunch
from kvcanary.ops.validation.arguments import (
    batch_rows,
    expected_tokens_pool,
    invalid_rows_view,
    table_and_lut,
    write_tokens,
)
from kvcanary.ops.validation.arrays import array, same_device
from kvcanary.ops.validation.structs import contexts_views

_VERIFY_TABLE = "launch_canary_verify_from_table"
_WRITE_TABLE = "launch_canary_write_from_table"


def _context_arrays(contexts: tuple[ContextViews, ...]) -> list[ArrayView]:
    return [a for c in contexts for a in c.all()]


def validate_verify_from_table(
    *,
    contexts: Any,
    req_pool_indices: Any,
    prefix_lens: Any,
    req_to_token: Any,
    block_table: Any,
    block_size: Any,
    pad_row: Any,
    swa_window_size: Any,
    full_to_swa_index_mapping: Any,
    req_to_verify_expected_tokens: Any,
    req_to_verify_expected_tokens_valid_lens: Any,
    kv_token_id_vs_position_offset: Any,
    check_verify_expected_token: Any,
    invalid_rows_out: Any,
) -> VerifyTableLaunch:
    window = check_non_negative("swa_window_size", swa_window_size)
    token_offset = check_int("kv_token_id_vs_position_offset", kv_token_id_vs_position_offset)
    check = check_bool("check_verify_expected_token", check_verify_expected_token)

    ctxs = contexts_views(contexts)
    rpi, prefix = batch_rows(req_pool_indices, prefix_lens)
    bs = rpi.shape[0]
    table, lut = table_and_lut(_VERIFY_TABLE, req_to_token=req_to_token, block_table=block_table,
                               block_size=block_size, pad_row=pad_row, window=window,
                               full_to_swa_index_mapping=full_to_swa_index_mapping)
    pool, valid_lens = expected_tokens_pool(_VERIFY_TABLE, req_to_verify_expected_tokens,
                                             req_to_verify_expected_tokens_valid_lens, bs, table)
    invalid_rows = invalid_rows_view(invalid_rows_out)
    device = same_device(_VERIFY_TABLE, *_context_arrays(ctxs), rpi, prefix, table.array, lut, pool, valid_lens,
                          invalid_rows)
    return VerifyTableLaunch(device=device, contexts=ctxs, req_pool_indices=rpi, prefix_lens=prefix, table=table,
                             swa_window_size=window, lut=lut, expected_tokens_pool=pool,
                             expected_tokens_valid_lens=valid_lens, token_offset=token_offset,
                             check_expected_token=check, invalid_rows=invalid_rows)


def _bytes_span(c: ContextViews) -> tuple[int, int]:
    return c.canary_buf.ptr, c.canary_buf.ptr + c.num_slots * c.slot_stride_bytes


def validate_write_from_table(
    *,
    contexts: Any,
    req_pool_indices: Any,
    prefix_lens: Any,
    extend_seq_lens: Any,
    req_to_token: Any,
    block_table: Any,
    block_size: Any,
    pad_row: Any,
    swa_window_size: Any,
    full_to_swa_index_mapping: Any,
    input_ids: Any,
    positions: Any,
    out_cache_loc: Any,
    enable_write_input_assert: Any,
    expected_input_tokens: Any,
    expected_input_positions: Any,
    invalid_rows_out: Any,
) -> WriteTableLaunch:
    window = check_non_negative("swa_window_size", swa_window_size)
    assert_on = check_bool("enable_write_input_assert", enable_write_input_assert)

    ctxs = contexts_views(contexts)
    rpi, prefix = batch_rows(req_pool_indices, prefix_lens)
    extend = array("extend_seq_lens", extend_seq_lens, "int64", length=rpi.shape[0])
    table, lut = table_and_lut(_WRITE_TABLE, req_to_token=req_to_token, block_table=block_table,
                               block_size=block_size, pad_row=pad_row, window=window,
                               full_to_swa_index_mapping=full_to_swa_index_mapping)
    ids, pos, loc, exp_tok, exp_pos = write_tokens(
        _WRITE_TABLE, input_ids=input_ids, positions=positions, out_cache_loc=out_cache_loc, assert_on=assert_on,
        expected_input_tokens=expected_input_tokens, expected_input_positions=expected_input_positions)
    invalid_rows = invalid_rows_view(invalid_rows_out)
    # Each context stamps its own chains: two contexts writing one buffer would race on the GPU.
    spans = [_bytes_span(c) for c in ctxs]
    for i, (a0, a1) in enumerate(spans):
        for j, (b0, b1) in enumerate(spans[:i]):
            if a0 < b1 and b0 < a1 and ctxs[i].canary_buf.device == ctxs[j].canary_buf.device:
                raise invalid(f"{_WRITE_TABLE} contexts[{i}].canary_buf overlaps contexts[{j}].canary_buf; "
                              f"each context of a write needs its own canary buffer")
    device = same_device(_WRITE_TABLE, *_context_arrays(ctxs), rpi, prefix, extend, table.array, lut, ids, pos,
                          loc, exp_tok, exp_pos, invalid_rows)
    return WriteTableLaunch(device=device, contexts=ctxs, req_pool_indices=rpi, prefix_lens=prefix,
                            extend_seq_lens=extend, table=table, lut=lut, input_ids=ids, positions=pos,
                            out_cache_loc=loc, expected_input_tokens=exp_tok, expected_input_positions=exp_pos,
                            invalid_rows=invalid_rows)
