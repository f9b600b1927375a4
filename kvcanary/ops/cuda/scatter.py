"""Scatter request token ids (SPEC §8) on CUDA: launches ``kvc_scatter`` of ``kernels_cu/scatter.cu``.

CPU twin: :mod:`kvcanary.ops.reference.scatter`.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda.grids import scatter_grid, sm_count
from kvcanary.ops.cuda.launch import launch, resolve_stream
from kvcanary.ops.cuda.loader import function
from kvcanary.ops.launches import ScatterLaunch


def scatter(launch_rec: ScatterLaunch, stream: Any = None) -> None:
    """Copy each request's token ids into its pool row on the arrays' CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device.index
    s = resolve_stream(stream, rec.device)
    bs = rec.req_pool_indices.shape[0]
    max_reqs, cols = rec.pool_out.shape
    words = P.SCATTER.pack(flat_in=rec.flat_in.ptr, offsets=rec.offsets.ptr, req_pool_indices=rec.req_pool_indices.ptr,
                           pool_out=rec.pool_out.ptr, n_flat=rec.flat_in.shape[0], bs=bs, max_reqs=max_reqs, cols=cols)
    g = scatter_grid(bs, sm_count(dev))
    launch(function(dev, "scatter", "kvc_scatter"), g.blocks, g.threads, words, dev, s)
