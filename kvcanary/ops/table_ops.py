"""Plan-free verify and write straight from the table (SPEC §11, §12): kvcanary's own ops.

One launch walks a batch's table once for one or more contexts that share it (e.g. the K and the V canary of
one attention group), with no plan buffers in between. Keyword-only; everything is validated first (SPEC §9:
nothing is written on bad input, messages name the op); the CPU reference runs when all arrays are on the CPU,
the CUDA backend when all are on one CUDA device. On CUDA the work is read on the device: a fixed grid, no
host sync, safe to capture in a CUDA graph and replay after the inputs are refilled in place.
"""

from __future__ import annotations

from kvcanary.ops.backends import backend_for
from kvcanary.ops.validation import validate_verify_from_table, validate_write_from_table


def launch_canary_verify_from_table(
    *,
    contexts,
    req_pool_indices,
    prefix_lens,
    req_to_token=None,
    block_table=None,
    block_size: int | None = None,
    pad_row: int = 0,
    swa_window_size: int = 0,
    full_to_swa_index_mapping=None,
    req_to_verify_expected_tokens=None,
    req_to_verify_expected_tokens_valid_lens=None,
    kv_token_id_vs_position_offset: int = 0,
    check_verify_expected_token: bool = False,
    invalid_rows_out=None,
    stream=None,
) -> None:
    """Verify the prefix (the window, with SWA) of every active batch row straight from its table (SPEC §11).

    Result, for each context: exactly what the plan (SPEC §5) followed by verify (§7) produce with an unlimited
    ``verify_capacity``: the same violation rows (as a multiset; the CPU appends them in entry order),
    ``kernel_run_counter += 1``, ``slot_run_counter +=`` the number of entries (slot-0 entries included).
    There is no capacity and no ``enable`` flag. The canary buffers are never written.

    Args (``bs`` = batch rows):
        contexts: a non-empty tuple (or list) of :class:`~kvcanary.VerifyOrWriteContext` sharing the table and
            the slot space (equal ``num_slots``), each with any number of real-KV sources (SPEC §13). A slot a
            source does not cover gets one ``SLOT_OUT_OF_RANGE`` row when the mode reads real KV (SPEC §9).
        req_pool_indices: int64 ``[bs]``; ``pad_row`` = padding row (no entries); any other value outside
            ``[0, max_reqs)`` is an invalid row (no entries, counted).
        prefix_lens: int64 ``[bs]``, positions already in the cache; a prefix beyond ``max_seq_len`` makes the
            row invalid.
        req_to_token: int32 ``[max_reqs, max_seq_len]``, or
        block_table: int32 ``[max_reqs, max_blocks]`` with ``block_size`` (int in ``[1, 2**32]``), the paged
            form (SPEC §10); exactly one of the two tables.
        pad_row: 0 (SGLang's padding row, default) or -1 (no padding row); any row of the table is accepted.
        swa_window_size: int >= 0; 0 = full attention, else only the last ``swa_window_size`` positions.
        full_to_swa_index_mapping: int64 ``[lut_len]``, required iff ``swa_window_size > 0``.
        req_to_verify_expected_tokens: optional int32 ``[>= max_reqs, max_context_len]``, with
        req_to_verify_expected_tokens_valid_lens: int64 ``[bs]`` (together or not at all).
        kv_token_id_vs_position_offset: added to the position for the expected-token gather (0, or 1 for EAGLE).
        check_verify_expected_token: compare stored tokens with the expected ones (-1 = unchecked).
        invalid_rows_out: optional int32 ``[1]``, set to the number of invalid rows.
        stream: CUDA stream (default: torch's current stream of the arrays' device).
    """
    launch = validate_verify_from_table(
        contexts=contexts,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        req_to_token=req_to_token,
        block_table=block_table,
        block_size=block_size,
        pad_row=pad_row,
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
        check_verify_expected_token=check_verify_expected_token,
        invalid_rows_out=invalid_rows_out,
    )
    backend_for(launch.device).verify_from_table(launch, stream)


def launch_canary_write_from_table(
    *,
    contexts,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token=None,
    block_table=None,
    block_size: int | None = None,
    pad_row: int = 0,
    swa_window_size: int = 0,
    full_to_swa_index_mapping=None,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert: bool = False,
    expected_input_tokens=None,
    expected_input_positions=None,
    invalid_rows_out=None,
    stream=None,
) -> None:
    """Stamp the canary records of the tokens written this step straight from the table (SPEC §12).

    Result, for each context: exactly what the plan's write metadata (SPEC §5) followed by write (§6) produce:
    records byte-identical, violation rows as a multiset, ``kernel_run_counter += 1``, ``slot_run_counter +=``
    the stamped slots. Request ``r``'s tokens are ``[sum of write_len of rows < r, + write_len[r])`` of the
    flattened token arrays, with ``write_len = max(extend, 0)`` for active rows and 0 for padding and invalid
    rows; its seed is the (translated) slot of its last cached position.

    Args (``bs`` = batch rows, ``N`` = flattened tokens):
        contexts: a non-empty tuple (or list) of :class:`~kvcanary.VerifyOrWriteContext` with equal
            ``num_slots`` and non-overlapping canary buffers (each context keeps its own chains), each with any
            number of real-KV sources (SPEC §13). A token whose slot a source does not cover is reported
            (``SLOT_OUT_OF_RANGE``) and not stamped when the mode reads real KV (SPEC §9).
        req_pool_indices, prefix_lens, extend_seq_lens: int64 ``[bs]``.
        req_to_token / block_table + block_size, pad_row: the table as for
            :func:`launch_canary_verify_from_table`.
        swa_window_size, full_to_swa_index_mapping: as for the plan; the LUT (required iff
            ``swa_window_size > 0``) translates the seed only.
        input_ids, positions: int64 ``[N]``.
        out_cache_loc: int64 ``[N]``, the canary slot of each token (already translated); -1 = skip the token.
        enable_write_input_assert: check tokens and positions against the two expected arrays.
        expected_input_tokens, expected_input_positions: int64 ``[N]`` iff the assert is on, else None.
        invalid_rows_out: optional int32 ``[1]``, set to the number of invalid rows.
        stream: CUDA stream (default: torch's current stream of the arrays' device).
    """
    launch = validate_write_from_table(
        contexts=contexts,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        block_table=block_table,
        block_size=block_size,
        pad_row=pad_row,
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        enable_write_input_assert=enable_write_input_assert,
        expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
        invalid_rows_out=invalid_rows_out,
    )
    backend_for(launch.device).write_from_table(launch, stream)
