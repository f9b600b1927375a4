"""Plan (SPEC §5) on the CPU, vectorized over requests and entries.

Bounds (SPEC §9): ``T(x)`` for ``x >=`` the LUT length is -2; a row whose ``req_pool_indices`` is outside
``[0, max_reqs)`` or whose ``prefix_lens`` exceeds ``max_seq_len`` gets no verify entries, no write entries
and seed -1, and is counted in ``invalid_rows``; the expected-token gather also requires
``p + offset < max_context_len``.
"""

from __future__ import annotations

import numpy as np

from kvcanary import consts
from kvcanary.ops.launches import PlanLaunch


def translate(x: np.ndarray, lut: np.ndarray | None) -> np.ndarray:
    """``T(x)``: ``x`` if negative or without a LUT, ``lut[x]`` if in range, else -2."""
    x = x.astype(np.int64)
    if lut is None:
        return x
    out = x.copy()
    hit = (x >= 0) & (x < len(lut))
    out[hit] = lut[x[hit]]
    out[x >= len(lut)] = consts.LUT_OUT_OF_RANGE_SLOT
    return out


def plan(launch: PlanLaunch) -> None:
    rp = launch.req_pool_indices.host()
    prefix = launch.prefix_lens.host()
    extend = launch.extend_seq_lens.host()
    r2t = launch.table.req_to_token.host()
    lut = launch.lut.host() if launch.lut is not None else None
    bs, max_reqs, max_seq_len = launch.bs, launch.max_reqs, launch.max_seq_len

    valid_row = (rp >= 0) & (rp < max_reqs) & (prefix <= max_seq_len)
    active = valid_row & (rp != consts.REQ_POOL_IDX_PADDING)
    safe_rp = np.where(valid_row, rp, 0)
    w = launch.swa_window_size
    window_start = np.maximum(prefix - w, 0) if w > 0 else np.zeros(bs, np.int64)
    n_verify = np.where(active, np.maximum(prefix - window_start, 0), 0)
    total = int(n_verify.sum())

    vp = launch.verify
    cap = vp.capacity
    if total > cap:
        vp.num_valid.host()[0] = cap
        vp.enable.host()[0] = 0
    else:
        vp.num_valid.host()[0] = total
        vp.enable.host()[0] = 1
        req = np.repeat(np.arange(bs), n_verify)
        starts = np.cumsum(n_verify) - n_verify
        p = window_start[req] + (np.arange(total) - starts[req])
        row = safe_rp[req]
        slot = translate(r2t[row, p], lut)
        prev = np.where(p > 0, translate(r2t[row, np.maximum(p - 1, 0)], lut), -1)
        expected = np.full(total, -1, np.int64)
        if launch.expected_tokens_pool is not None:
            pool = launch.expected_tokens_pool.host()
            valid_lens = launch.expected_tokens_valid_lens.host()
            q = p + launch.token_offset
            ok = (q >= 0) & (q < valid_lens[req]) & (q < pool.shape[1])
            expected[ok] = pool[row[ok], q[ok]]
        vp.slot_indices.host()[:total] = slot
        vp.expected_tokens.host()[:total] = expected
        vp.expected_positions.host()[:total] = p
        vp.prev_slot_indices.host()[:total] = prev

    wp = launch.write
    write_len = np.where(active, np.maximum(extend, 0), 0)
    offsets = wp.offsets.host()
    offsets[0] = 0
    offsets[1:bs + 1] = np.cumsum(write_len)
    offsets[bs + 1:] = 0
    has_seed = active & (prefix > 0) & (write_len > 0)
    seed_pos = np.where(has_seed, prefix - 1, 0)
    seeds = np.where(has_seed, translate(r2t[safe_rp, seed_pos], lut), -1)
    wp.seed_slot_indices.host()[:bs] = seeds
    wp.num_valid_reqs.host()[0] = bs
    if launch.invalid_rows is not None:
        launch.invalid_rows.host()[0] = int((~valid_row).sum())
