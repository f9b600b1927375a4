"""Scatter request token ids (SPEC §8) on the GPU vs the CPU reference, byte for byte.

Rows are distinct pool rows (rows naming the same pool row race on the GPU; the reference keeps the last),
plus out-of-range pool indices, start offsets outside ``[0, N]``, lengths past the row and past ``flat_in``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from support.gpu_util import assert_same_bytes, random_bytes, rng_for, t


@pytest.mark.parametrize("bs", [1, 33, 4097])
def test_scatter_differential(cuda_ready, bs):
    rng = rng_for("scatter", bs)
    max_reqs, cols = bs + 50, int(rng.integers(8, 300))
    rp = rng.permutation(np.arange(max_reqs))[:bs]  # distinct rows (row 0 included sometimes)
    lens = rng.integers(-3, cols + 20, bs)
    lens[0] = max(lens[0], 1)  # row 0 is always copied, so the test always checks a copy
    offsets = np.concatenate([[0], np.cumsum(np.maximum(lens, 0))]).astype(np.int64)
    # The tail runs past flat_in (but row 0 keeps its tokens).
    n_flat = max(int(offsets[-1]) - int(rng.integers(0, 40)), int(offsets[1]))
    k = bs // 20
    rp[1 + rng.choice(bs - 1, k)] = rng.choice([-1, -9, max_reqs, max_reqs + 4], k)  # invalid rows: skipped
    offsets[2 + rng.choice(bs - 1, k)] = rng.choice([-5, n_flat + 1, n_flat + 1000], k)  # bad starts: skipped
    flat = rng.integers(-(1 << 40), 1 << 40, n_flat)  # values wider than int32: narrowed like a C cast
    pool = random_bytes(rng, (max_reqs, cols), torch.int32)
    outs = {}
    for dev in ("cpu", "cuda"):
        p = pool.to(dev).clone()
        kc.launch_scatter_req_token_ids_kernel(flat_in=t(flat).to(dev), offsets=t(offsets).to(dev),
                                               req_pool_indices=t(rp).to(dev), pool_out=p)
        outs[dev] = p
    torch.cuda.synchronize()
    assert_same_bytes(outs["cpu"], outs["cuda"], "pool_out")
    assert not torch.equal(outs["cpu"], pool)  # something was copied
