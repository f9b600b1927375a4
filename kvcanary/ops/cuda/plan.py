"""Plan (SPEC §5, §10) on CUDA: launches the three kernels of ``kernels_cu/plan.cu``.

CPU twin: :mod:`kvcanary.ops.reference.plan`. The verify offsets live temporarily in ``write_offsets`` (the
plan's own output, overwritten by the last kernel), so nothing is allocated, and grids depend only on the
capacities: the whole op can be captured in a CUDA graph once :func:`~kvcanary.warmup` has run. The table is
``req_to_token`` or a block table (``TableViews``), with ``pad_row``; all three kernels take one
``KvcPlanParams``.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda.grids import plan_grids, sm_count
from kvcanary.ops.cuda.launch import batch_words, launch, resolve_stream, table_words
from kvcanary.ops.cuda.loader import function
from kvcanary.ops.launches import PlanLaunch


def plan(launch_rec: PlanLaunch, stream: Any = None) -> None:
    """Fill ``launch_rec``'s verify and write plans on its CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device.index
    s = resolve_stream(stream, rec.device)
    flags = (rec.lut is not None, rec.expected_tokens_pool is not None)
    vp, wp = rec.verify, rec.write
    words = P.PLAN.pack(
        table=table_words(rec.table, rec.lut),
        batch=batch_words(req_pool_indices=rec.req_pool_indices, prefix_lens=rec.prefix_lens,
                          extend_seq_lens=rec.extend_seq_lens, pool=rec.expected_tokens_pool,
                          valid_lens=rec.expected_tokens_valid_lens, invalid_rows=rec.invalid_rows,
                          swa_window_size=rec.swa_window_size, token_offset=rec.token_offset),
        verify_slot_indices=vp.slot_indices.ptr, verify_expected_tokens=vp.expected_tokens.ptr,
        verify_expected_positions=vp.expected_positions.ptr, verify_prev_slot_indices=vp.prev_slot_indices.ptr,
        verify_num_valid=vp.num_valid.ptr, verify_enable=vp.enable.ptr, write_offsets=wp.offsets.ptr,
        write_seed_slot_indices=wp.seed_slot_indices.ptr, write_num_valid_reqs=wp.num_valid_reqs.ptr,
        verify_capacity=vp.capacity, write_req_capacity=wp.capacity)
    grids = plan_grids(vp.capacity, sm_count(dev))
    for name, g in (("kvc_plan_verify_offsets", grids["verify_offsets"]),
                    ("kvc_plan_verify_entries", grids["verify_entries"]),
                    ("kvc_plan_write_meta", grids["write_meta"])):
        launch(function(dev, "plan", name, *flags), g.blocks, g.threads, words, dev, s)
