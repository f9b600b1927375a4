"""Scatter request token ids (SPEC §8) on the CPU.

Bounds (SPEC §9), shared with ``kernels_cu/scatter.cu``: a row whose ``req_pool_indices`` is outside
``[0, max_reqs)`` or whose start offset is outside ``[0, N]`` is skipped; copies are clipped to the row's
columns and to the end of ``flat_in``. Values are narrowed to int32 like a C cast.
"""

from __future__ import annotations

import numpy as np

from kvcanary.ops.launches import ScatterLaunch


def scatter(launch: ScatterLaunch) -> None:
    """Scatter each request's token ids into its row of the expected-token pool (SPEC §8); the CUDA twin is
    ``kernels_cu/scatter.cu``."""
    flat = launch.flat_in.host()
    offsets = launch.offsets.host()
    rpi = launch.req_pool_indices.host()
    pool = launch.pool_out.host()
    max_reqs, cols = pool.shape
    n_flat = flat.shape[0]
    for r in range(rpi.shape[0]):
        row, start = int(rpi[r]), int(offsets[r])
        if not (0 <= row < max_reqs) or not (0 <= start <= n_flat):
            continue
        n = min(int(offsets[r + 1]) - start, cols, n_flat - start)
        if n > 0:
            pool[row, :n] = flat[start:start + n].astype(np.int32)
