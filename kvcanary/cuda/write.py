"""Write (SPEC §6) on CUDA: launches ``kvc_write`` of ``kernels_cu/write.cu``.

CPU twin: :mod:`kvcanary.reference.write`. One block walks one request's chain at a time; the grid is
fixed by the request capacity and the SM count, and the kernel reads ``write_num_valid_reqs`` on the
device.
"""

from __future__ import annotations

from typing import Any

from ..validation import WriteLaunch
from .launch import context_args, i64, launch, ptr, real_kv_args
from .loader import kernel, sm_count
from .specs import int_define, spec_for

_SRC = "write.cu"


def write(launch_rec: WriteLaunch, stream: Any = None) -> None:
    """Stamp the canary records of ``launch_rec`` on its CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device
    has_real_kv, rkv = real_kv_args(rec.ctx)
    spec = spec_for("write", input_assert=rec.input_assert, has_real_kv=has_real_kv)
    grid = max(1, min(rec.plan.capacity, sm_count(dev.index) * int_define(_SRC, "KVC_WRITE_BLOCKS_PER_SM")))
    args = (*context_args(rec.ctx), ptr(rec.ctx.chain_position_flag), ptr(rec.plan.offsets),
            ptr(rec.plan.seed_slot_indices), ptr(rec.plan.num_valid_reqs), i64(rec.plan.capacity),
            ptr(rec.input_ids), ptr(rec.positions), ptr(rec.out_cache_loc), ptr(rec.expected_input_tokens),
            ptr(rec.expected_input_positions), i64(rec.num_tokens), *rkv)
    launch(kernel(spec, "kvc_write", dev.index), grid, int_define(_SRC, "KVC_WRITE_THREADS"), args, dev, stream)
