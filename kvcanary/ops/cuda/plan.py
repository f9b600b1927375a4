"""Plan (SPEC §5) on CUDA: launches the three kernels of ``kernels_cu/plan.cu``.

CPU twin: :mod:`kvcanary.ops.reference.plan`. The verify offsets live temporarily in ``write_offsets``
(the plan's own output, overwritten by the last kernel), so nothing is allocated, and grids depend only
on the capacities: the whole op can be captured in a CUDA graph once :func:`~kvcanary.warmup` has run.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda.grids import plan_grids, sm_count
from kvcanary.ops.cuda.launch import i64, launch, ptr
from kvcanary.ops.cuda.loader import kernel
from kvcanary.ops.cuda.specs import spec_for
from kvcanary.ops.launches import PlanLaunch


def plan(launch_rec: PlanLaunch, stream: Any = None) -> None:
    """Fill ``launch_rec``'s verify and write plans on its CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device
    spec = spec_for("plan", has_lut=rec.lut is not None, has_pool=rec.expected_tokens_pool is not None)
    vp, wp = rec.verify, rec.write
    bs = i64(rec.bs)
    max_reqs, max_seq_len = i64(rec.max_reqs), i64(rec.max_seq_len)
    window = i64(rec.swa_window_size)
    lut_len = i64(rec.lut.shape[0] if rec.lut is not None else 0)
    pool_cols = i64(rec.expected_tokens_pool.shape[1] if rec.expected_tokens_pool is not None else 0)
    grids = plan_grids(vp.capacity, sm_count(dev.index))
    g1, g2, g3 = grids["verify_offsets"], grids["verify_entries"], grids["write_meta"]

    launch(kernel(spec, "kvc_plan_verify_offsets", dev.index), g1.blocks, g1.threads,
           (ptr(rec.req_pool_indices), ptr(rec.prefix_lens), bs, max_reqs, max_seq_len, window,
            i64(vp.capacity), ptr(wp.offsets), ptr(vp.num_valid), ptr(vp.enable)),
           dev, stream)
    launch(kernel(spec, "kvc_plan_verify_entries", dev.index), g2.blocks, g2.threads,
           (ptr(wp.offsets), bs, ptr(rec.req_pool_indices), ptr(rec.prefix_lens), window, ptr(rec.table.req_to_token),
            max_seq_len, ptr(rec.lut), lut_len, ptr(rec.expected_tokens_pool), pool_cols,
            ptr(rec.expected_tokens_valid_lens), i64(rec.token_offset), ptr(vp.num_valid), ptr(vp.enable),
            ptr(vp.slot_indices), ptr(vp.expected_tokens), ptr(vp.expected_positions), ptr(vp.prev_slot_indices)),
           dev, stream)
    launch(kernel(spec, "kvc_plan_write_meta", dev.index), g3.blocks, g3.threads,
           (ptr(rec.req_pool_indices), ptr(rec.prefix_lens), ptr(rec.extend_seq_lens), bs, max_reqs, max_seq_len,
            ptr(rec.table.req_to_token), ptr(rec.lut), lut_len, i64(wp.capacity), ptr(wp.offsets),
            ptr(wp.seed_slot_indices), ptr(wp.num_valid_reqs), ptr(rec.invalid_rows)),
           dev, stream)
