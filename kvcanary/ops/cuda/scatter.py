"""Scatter request token ids (SPEC §8) on CUDA: launches ``kvc_scatter`` of ``kernels_cu/scatter.cu``.

CPU twin: :mod:`kvcanary.ops.reference.scatter`.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda.grids import scatter_grid, sm_count
from kvcanary.ops.cuda.launch import i64, launch, ptr
from kvcanary.ops.cuda.loader import kernel
from kvcanary.ops.cuda.specs import spec_for
from kvcanary.ops.launches import ScatterLaunch


def scatter(launch_rec: ScatterLaunch, stream: Any = None) -> None:
    """Copy each request's token ids into its pool row on the arrays' CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device
    bs = rec.req_pool_indices.shape[0]
    grid = scatter_grid(bs, sm_count(dev.index))
    max_reqs, cols = rec.pool_out.shape
    args = (ptr(rec.flat_in), i64(rec.flat_in.shape[0]), ptr(rec.offsets), ptr(rec.req_pool_indices), i64(bs),
            ptr(rec.pool_out), i64(max_reqs), i64(cols))
    launch(kernel(spec_for("scatter"), "kvc_scatter", dev.index), grid.blocks, grid.threads, args, dev,
           stream)
