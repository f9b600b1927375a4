"""SPEC §8 scatter of request token ids on the CPU: hand-built cases and a property test against the model."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcanary as kc
from support import spec_model as M
from support.canary_testlib import POISON, poison, t64

P32 = POISON[torch.int32]


def scatter(flat, offsets, rpi, pool_shape, *, check_model=True):
    pool = torch.zeros(pool_shape, dtype=torch.int32)
    poison(pool)
    model = pool.tolist()
    M.scatter(flat=list(flat), offsets=list(offsets), rpi=list(rpi), pool=model)
    kc.launch_scatter_req_token_ids_kernel(flat_in=t64(flat), offsets=t64(offsets), req_pool_indices=t64(rpi),
                                           pool_out=pool)
    if check_model:
        assert pool.tolist() == model
    return pool.tolist()


def test_each_request_fills_the_start_of_its_row_and_nothing_else():
    pool = scatter([1, 2, 3, 4, 5, 6], [0, 2, 6], [3, 1], (4, 5))
    assert pool[3] == [1, 2, P32, P32, P32]
    assert pool[1] == [3, 4, 5, 6, P32]
    assert pool[0] == [P32] * 5 and pool[2] == [P32] * 5


def test_long_requests_are_clipped_to_the_row():
    pool = scatter(list(range(10, 20)), [0, 7, 10], [1, 2], (3, 4))
    assert pool[1] == [10, 11, 12, 13]
    assert pool[2] == [17, 18, 19, P32]  # never spills into the next row
    assert pool[0] == [P32] * 4


def test_never_reads_past_flat_in():
    pool = scatter([7, 8, 9], [1, 10], [2], (3, 5))
    assert pool[2] == [8, 9, P32, P32, P32]


def test_values_are_narrowed_to_int32_like_a_c_cast():
    pool = scatter([2**31, -1, 2**32 + 5], [0, 3], [1], (2, 3))
    assert pool[1] == [-(2**31), -1, 5]


def test_bounds_rows_and_offsets():
    # Rows outside [0, max_reqs) and starts outside [0, N] are skipped; a negative length copies nothing.
    pool = scatter([1, 2, 3], [0, 1, 2, 3, -1, 4], [-1, 5, 1, 2, 1], (3, 3))
    assert pool == [[P32] * 3, [3, P32, P32], [P32] * 3]


@given(st.data())
def test_scatter_matches_scalar_model(data):
    n = data.draw(st.integers(0, 10))
    bs = data.draw(st.integers(0, 5))
    max_reqs, cols = data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))
    flat = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n))
    if data.draw(st.booleans()):
        offsets = sorted(data.draw(st.lists(st.integers(0, n), min_size=bs + 1, max_size=bs + 1)))
    else:
        offsets = data.draw(st.lists(st.integers(-2, n + 2), min_size=bs + 1, max_size=bs + 1))
    rpi = data.draw(st.lists(st.integers(-1, max_reqs), min_size=bs, max_size=bs))
    scatter(flat, offsets, rpi, (max_reqs, cols))


def test_pool_rows_and_int32_dtype_accepted_as_numpy():
    import numpy as np

    pool = np.full((3, 4), -7, dtype=np.int32)
    kc.launch_scatter_req_token_ids_kernel(flat_in=np.array([5, 6], np.int64), offsets=np.array([0, 2], np.int64),
                                           req_pool_indices=np.array([2], np.int64), pool_out=pool)
    assert pool.tolist() == [[-7] * 4, [-7] * 4, [5, 6, -7, -7]]
