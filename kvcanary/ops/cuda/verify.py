"""Verify (SPEC §7) on CUDA: launches ``kvc_verify`` of ``kernels_cu/verify.cu``.

CPU twin: :mod:`kvcanary.ops.reference.verify`. A persistent grid fixed by the plan capacity and the SM
count; ``enable`` and ``verify_num_valid`` are read on the device.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda.grids import sm_count, verify_grid
from kvcanary.ops.cuda.launch import context_args, i64, launch, ptr, real_kv_args
from kvcanary.ops.cuda.loader import kernel
from kvcanary.ops.cuda.specs import spec_for
from kvcanary.ops.launches import VerifyLaunch


def verify(launch_rec: VerifyLaunch, stream: Any = None) -> None:
    """Check the records named by ``launch_rec``'s plan on its CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device
    has_real_kv, rkv = real_kv_args(rec.ctx)
    spec = spec_for("verify", check_token=rec.check_expected_token, has_real_kv=has_real_kv)
    grid = verify_grid(rec.plan.capacity, has_real_kv, sm_count(dev.index))
    p = rec.plan
    args = (*context_args(rec.ctx), ptr(p.slot_indices), ptr(p.expected_tokens), ptr(p.expected_positions),
            ptr(p.prev_slot_indices), ptr(p.num_valid), ptr(p.enable), i64(p.capacity), *rkv)
    launch(kernel(spec, "kvc_verify", dev.index), grid.blocks, grid.threads, args, dev, stream)
