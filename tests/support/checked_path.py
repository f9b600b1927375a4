"""The checked path of a KVCanary step: what ``KVCanary.step`` launches, done instead through the public,
fully validated plan-free ops on the canary's own contexts. Tests hold the two against each other."""

from __future__ import annotations

from typing import Any

import torch

import kvcanary as kc
from kvcanary.runtime.status import Kernel, StatusLayout


def checked_step(canary: kc.KVCanary, phase: str, *, swa_out_cache_loc: Any = None, **batch: Any) -> None:
    """One HEAD or TAIL step of ``canary`` through ``launch_canary_verify_from_table`` and
    ``launch_canary_write_from_table`` (the SWA group needs ``swa_out_cache_loc``), then ``end_step()``."""
    table = {k: batch[k] for k in ("req_to_token", "block_table") if batch.get(k) is not None}
    if "block_table" in table:
        table["block_size"] = canary.block_size
    pool = batch.get("expected_tokens")
    # The public op sets an int32 count; the checked path adds it to the status block itself.
    invalid = torch.zeros(1, dtype=torch.int32, device=canary.state.status.device)
    for group in canary.groups:
        swa = group == "swa"
        contexts = {kernel: tuple(canary.state.contexts[(kc.CanaryLaunchTag.of(phase, kv, group), kernel)]
                                  for kv in canary.kvs) for kernel in Kernel}
        lut = canary.swa.full_to_swa_index_mapping if swa else None
        window = canary.swa_window if swa else 0
        kc.launch_canary_verify_from_table(
            contexts=contexts[Kernel.VERIFY], req_pool_indices=batch["req_pool_indices"],
            prefix_lens=batch["prefix_lens"], pad_row=canary.pad_row, swa_window_size=window,
            full_to_swa_index_mapping=lut, req_to_verify_expected_tokens=pool,
            req_to_verify_expected_tokens_valid_lens=batch.get("expected_tokens_valid_lens"),
            kv_token_id_vs_position_offset=canary.kv_token_id_vs_position_offset,
            check_verify_expected_token=pool is not None,
            invalid_rows_out=None if swa else invalid, **table)
        assert_on = batch.get("expected_input_tokens") is not None
        kc.launch_canary_write_from_table(
            contexts=contexts[Kernel.WRITE], req_pool_indices=batch["req_pool_indices"],
            prefix_lens=batch["prefix_lens"], extend_seq_lens=batch["extend_seq_lens"], pad_row=canary.pad_row,
            swa_window_size=window, full_to_swa_index_mapping=lut, input_ids=batch["input_ids"],
            positions=batch["positions"], out_cache_loc=swa_out_cache_loc if swa else batch["out_cache_loc"],
            enable_write_input_assert=assert_on, expected_input_tokens=batch.get("expected_input_tokens"),
            expected_input_positions=batch.get("expected_input_positions"), **table)
    i = StatusLayout.INVALID_ROWS
    canary.state.status[i:i + 1].add_(invalid)
    canary.phases.check(phase)
    canary.phases.commit(phase)
    canary.end_step()


def fast_and_checked(config: Any, *, device: Any = "cpu", steps: int = 40) -> tuple[kc.KVCanary, kc.KVCanary]:
    """Two engine models on ``config`` run ``steps`` steps: one through ``KVCanary.step``, one through
    :func:`checked_step` (the SWA slots translated by the canary's own table). Returns their canaries."""
    from kvcanary.testing.engine import ServingSimulation

    fast, checked = ServingSimulation(config, device=device), ServingSimulation(config, device=device)

    def via_ops(phase: str, **args: Any) -> None:
        args["swa_out_cache_loc"] = checked.canary._swa_locs.translate(args["out_cache_loc"]).clone()
        checked_step(checked.canary, phase, **args)

    checked.canary.step = via_ops  # type: ignore[method-assign]
    for _ in range(steps):
        fast.step()
        checked.step()
    return fast.canary, checked.canary
