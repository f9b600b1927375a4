"""The SGLang-named ops (SPEC §5-§8): SGLang's kernel-layer names and arguments, validated, dispatched by device.

Every op is keyword-only, validates everything first (SPEC §9: nothing is written on bad input), then
runs on the CPU reference when all arrays are on the CPU, or on the CUDA backend when all are on one CUDA
device (mixed devices are an error). Results are written in place into the caller's arrays.
"""

from __future__ import annotations

from kvcanary.ops.backends import backend_for
from kvcanary.ops.validation import validate_plan, validate_scatter, validate_verify, validate_write


def launch_canary_plan_kernels(
    *,
    verify_plan_out,
    write_plan_out,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token=None,
    swa_window_size: int,
    full_to_swa_index_mapping,
    verify_capacity: int,
    req_to_verify_expected_tokens,
    req_to_verify_expected_tokens_valid_lens,
    kv_token_id_vs_position_offset: int,
    invalid_rows_out=None,
    block_table=None,
    block_size: int | None = None,
    pad_row: int = 0,
    stream=None,
) -> None:
    """Turn a batch's metadata into the verify and write plans (SPEC §5, with the paged tables of §10).

    Args (``bs`` = batch rows):
        verify_plan_out: :class:`~kvcanary.VerifyPlan` of capacity ``C`` (written).
        write_plan_out: :class:`~kvcanary.WritePlan` of request capacity ``R >= bs`` (written).
        req_pool_indices: int64 ``[bs]``; ``pad_row`` = padding row; other values outside ``[0, max_reqs)``
            are invalid rows (no entries, counted in ``invalid_rows_out``).
        prefix_lens: int64 ``[bs]``, positions already in the cache.
        extend_seq_lens: int64 ``[bs]``, tokens written this step.
        req_to_token: int32 ``[max_reqs, max_seq_len]``, contiguous; or None when ``block_table`` is given
            (exactly one of the two).
        swa_window_size: int >= 0; 0 = full attention.
        full_to_swa_index_mapping: int64 ``[lut_len]``, required iff ``swa_window_size > 0``.
        verify_capacity: must equal ``C``.
        req_to_verify_expected_tokens: optional int32 ``[>= max_reqs, max_context_len]``.
        req_to_verify_expected_tokens_valid_lens: int64 ``[bs]``, required iff the pool is given.
        kv_token_id_vs_position_offset: added to ``p`` for the expected-token gather (0, or 1 for EAGLE).
        invalid_rows_out: optional int32 ``[1]``, set to the number of rows with an out-of-range request
            index (other than ``pad_row``) or a prefix longer than ``max_seq_len``.
        block_table: int32 ``[max_reqs, max_blocks]``, contiguous, the paged form of the table (SPEC §10):
            ``RT(rp, p) = block_table[rp, p // block_size] * block_size + p % block_size`` (64-bit; a
            negative block id gives -1); ``max_seq_len = max_blocks * block_size``.
        block_size: int in ``[1, 2**32]``, required with ``block_table``, None with ``req_to_token``.
        pad_row: the padding row: 0 (SGLang's, default) or -1 (tables without a padding row; row 0 is then an
            ordinary request); any row of the table is accepted.
        stream: CUDA stream to launch on (default: torch's current stream of the arrays' device).

    When the entries exceed ``C``, ``verify_num_valid = C`` and ``enable = 0`` and no entry is written.
    """
    launch = validate_plan(
        verify_plan_out=verify_plan_out,
        write_plan_out=write_plan_out,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        verify_capacity=verify_capacity,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
        invalid_rows_out=invalid_rows_out,
        block_table=block_table,
        block_size=block_size,
        pad_row=pad_row,
    )
    backend_for(launch.device).plan(launch, stream)


def launch_canary_write_kernel(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert: bool,
    expected_input_tokens,
    expected_input_positions,
    stream=None,
) -> None:
    """Stamp the canary records of the tokens written this step (SPEC §6).

    Args (``N`` = flattened tokens; request ``r`` owns ``[write_offsets[r], write_offsets[r+1])``):
        context: :class:`~kvcanary.VerifyOrWriteContext` (canary buffer, tag, log, counters, real KV); at most
            4 real-KV sources (SGLang's limit; a ``ValueError`` containing ``at most 4 RealKvSource``
            otherwise). A source may cover fewer slots than the canary: a token whose slot it does not cover
            is reported (``SLOT_OUT_OF_RANGE``) and not stamped when the mode reads real KV.
        plan: the :class:`~kvcanary.WritePlan` filled by the plan op.
        input_ids, positions: int64 ``[N]``.
        out_cache_loc: int64 ``[N]``, canary slot of each token; -1 = skip the token.
        enable_write_input_assert: check tokens and positions against the two expected arrays.
        expected_input_tokens, expected_input_positions: int64 ``[N]`` iff the assert is on, else None.
        stream: CUDA stream (default: torch's current stream).
    """
    launch = validate_write(
        context=context,
        plan=plan,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        enable_write_input_assert=enable_write_input_assert,
        expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
    )
    backend_for(launch.device).write(launch, stream)


def launch_canary_verify_kernel(*, context, plan, check_verify_expected_token: bool, stream=None) -> None:
    """Re-check the records a batch is about to attend to (SPEC §7); never writes the canary buffer.

    Args:
        context: :class:`~kvcanary.VerifyOrWriteContext`; at most 4 real-KV sources (as for the write). An
            entry whose slot a source does not cover gets one ``SLOT_OUT_OF_RANGE`` row when the mode reads
            real KV.
        plan: the :class:`~kvcanary.VerifyPlan` filled by the plan op.
        check_verify_expected_token: compare stored tokens with the plan's expected tokens (-1 = skip).
        stream: CUDA stream (default: torch's current stream).
    """
    launch = validate_verify(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
    backend_for(launch.device).verify(launch, stream)


def launch_scatter_req_token_ids_kernel(*, flat_in, offsets, req_pool_indices, pool_out, stream=None) -> None:
    """Copy each request's token ids into its row of the expected-token pool (SPEC §8).

    Args: ``flat_in`` int64 ``[N]``; ``offsets`` int64 ``[bs + 1]``; ``req_pool_indices`` int64 ``[bs]``;
    ``pool_out`` int32 ``[max_reqs, cols]`` (written: ``pool_out[rp, :min(len, cols)]``).
    """
    launch = validate_scatter(flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices,
                              pool_out=pool_out)
    backend_for(launch.device).scatter(launch, stream)
