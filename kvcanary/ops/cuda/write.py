"""Write (SPEC §6) on CUDA: launches ``kvc_write`` of ``kernels_cu/write.cu``.

CPU twin: :mod:`kvcanary.ops.reference.write`. Short requests are written by one warp each, longer ones by
one block each (a chain thread plus workers, see the kernel's header); the grid is fixed by the request
capacity and the SM count, and the kernel reads ``write_num_valid_reqs`` on the device.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda.grids import sm_count, write_grid
from kvcanary.ops.cuda.launch import context_args, i64, launch, ptr, real_kv_args
from kvcanary.ops.cuda.loader import kernel
from kvcanary.ops.cuda.specs import spec_for
from kvcanary.ops.launches import WriteLaunch


def write(launch_rec: WriteLaunch, stream: Any = None) -> None:
    """Stamp the canary records of ``launch_rec`` on its CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device
    has_real_kv, rkv = real_kv_args(rec.ctx)
    spec = spec_for("write", input_assert=rec.input_assert, has_real_kv=has_real_kv)
    grid = write_grid(rec.plan.capacity, sm_count(dev.index))
    args = (*context_args(rec.ctx), ptr(rec.ctx.chain_position_flag), ptr(rec.plan.offsets),
            ptr(rec.plan.seed_slot_indices), ptr(rec.plan.num_valid_reqs), i64(rec.plan.capacity),
            ptr(rec.input_ids), ptr(rec.positions), ptr(rec.out_cache_loc), ptr(rec.expected_input_tokens),
            ptr(rec.expected_input_positions), i64(rec.num_tokens), *rkv)
    launch(kernel(spec, "kvc_write", dev.index), grid.blocks, grid.threads, args, dev, stream)
