"""Verify (SPEC §7) on CUDA: launches ``kvc_verify`` of ``kernels_cu/verify.cu``.

CPU twin: :mod:`kvcanary.reference.verify`. A persistent grid fixed by the plan capacity and the SM
count; ``enable`` and ``verify_num_valid`` are read on the device.
"""

from __future__ import annotations

from typing import Any

from ..validation import VerifyLaunch
from .launch import ceil_div, context_args, i64, launch, ptr, real_kv_args
from .loader import kernel, sm_count
from .specs import int_define, spec_for

_SRC = "verify.cu"


def verify(launch_rec: VerifyLaunch, stream: Any = None) -> None:
    """Check the records named by ``launch_rec``'s plan on its CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device
    has_real_kv, rkv = real_kv_args(rec.ctx)
    spec = spec_for("verify", check_token=rec.check_expected_token, has_real_kv=has_real_kv)
    threads = int_define(_SRC, "KVC_VERIFY_THREADS")
    per_sm = int_define(_SRC, "KVC_VERIFY_BLOCKS_PER_SM_REAL_KV" if has_real_kv else "KVC_VERIFY_BLOCKS_PER_SM")
    per_block = threads * int_define(_SRC, "KVC_VERIFY_UNROLL")
    grid = max(1, min(ceil_div(rec.plan.capacity, per_block), sm_count(dev.index) * per_sm))
    p = rec.plan
    args = (*context_args(rec.ctx), ptr(p.slot_indices), ptr(p.expected_tokens), ptr(p.expected_positions),
            ptr(p.prev_slot_indices), ptr(p.num_valid), ptr(p.enable), i64(p.capacity), *rkv)
    launch(kernel(spec, "kvc_verify", dev.index), grid, threads, args, dev, stream)
