"""Plan (SPEC §5) on the GPU vs the CPU reference, byte for byte, on fresh random batches.

Covers the batch sizes 1, 31, 32, 33, 1024, 4096, 4097 and 20000 rows (each in one launch),
every specialization (LUT, expected-token pool), capacity edges (exact fit, overflow), the bounds rule
(out-of-range pool indices, prefixes past the row, LUT misses) and a plan of more than 4,000,000 entries.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from support.gpu_util import assert_same_bytes, random_bytes, rng_for, size, t

COMBOS = [(False, False), (True, False), (False, True), (True, True)]  # (has_lut, has_pool)


def expected_total(rp, prefix, max_reqs, max_seq_len, window) -> int:
    valid = (rp >= 0) & (rp < max_reqs) & (prefix <= max_seq_len)
    active = valid & (rp != 0)
    ws = np.maximum(prefix - window, 0) if window > 0 else np.zeros_like(prefix)
    return int(np.where(active, np.maximum(prefix - ws, 0), 0).sum())


def make_case(rng, bs, *, max_reqs, max_seq_len, prefix_lo=0, prefix_hi, has_lut, has_pool, window=0,
              token_offset=0, bad_rows=True, pad_frac=0.1, capacity="fit", invalid_out=True, num_slots=1 << 20):
    """CPU inputs and poisoned CPU outputs of one plan launch."""
    rp = rng.integers(1, max_reqs, bs)
    rp[rng.random(bs) < pad_frac] = 0
    prefix = rng.integers(prefix_lo, prefix_hi + 1, bs)
    extend = rng.integers(-2, 9, bs)
    if bad_rows and bs:
        k = max(1, bs // 40)
        rp[rng.choice(bs, k)] = rng.choice([-1, -5, max_reqs, max_reqs + 7], k)
        prefix[rng.choice(bs, k)] = max_seq_len + rng.integers(1, 4, k)
        prefix[rng.choice(bs, k)] = -rng.integers(1, 4, k)
        prefix[rng.choice(bs, k)] = max_seq_len  # a full row is still valid
    if has_lut:
        window = window or int(rng.integers(1, max(2, max_seq_len // 2)))
        lut_len = int(rng.integers(max_seq_len, 4 * max_seq_len + 8))
        r2t = rng.integers(-2, lut_len + 4, (max_reqs, max_seq_len))  # values >= lut_len -> T = -2
        lut = rng.integers(-3, num_slots, lut_len)
    else:
        r2t = rng.integers(-2, num_slots, (max_reqs, max_seq_len))
        lut = None
    inputs = dict(req_pool_indices=t(rp), prefix_lens=t(prefix), extend_seq_lens=t(extend),
                  req_to_token=t(r2t.astype(np.int32)),
                  full_to_swa_index_mapping=t(lut) if lut is not None else None,
                  req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None)
    if has_pool:
        cols = max(1, max_seq_len + int(rng.integers(-3, 4)))
        pool = rng.integers(-(1 << 31), 1 << 31, (max_reqs + int(rng.integers(0, 3)), cols)).astype(np.int32)
        inputs["req_to_verify_expected_tokens"] = t(pool)
        inputs["req_to_verify_expected_tokens_valid_lens"] = t(rng.integers(-2, cols + 4, bs))
    total = expected_total(rp, prefix, max_reqs, max_seq_len, window)
    cap = {"fit": total + int(rng.integers(1, 64)), "exact": max(total, 1), "overflow": max(total - 1, 1)}[capacity]
    r_cap = bs + int(rng.integers(1, 6))
    outputs = dict(
        verify_slot_indices=random_bytes(rng, (cap,), torch.int64),
        verify_expected_tokens=random_bytes(rng, (cap,), torch.int64),
        verify_expected_positions=random_bytes(rng, (cap,), torch.int64),
        verify_prev_slot_indices=random_bytes(rng, (cap,), torch.int64),
        verify_num_valid=random_bytes(rng, (1,), torch.int32),
        enable=random_bytes(rng, (1,), torch.int32),
        write_offsets=random_bytes(rng, (r_cap + 1,), torch.int64),
        write_seed_slot_indices=random_bytes(rng, (r_cap,), torch.int64),
        write_num_valid_reqs=random_bytes(rng, (1,), torch.int32),
        invalid_rows_out=random_bytes(rng, (1,), torch.int32) if invalid_out else None,
    )
    scalars = dict(swa_window_size=window, verify_capacity=cap, kv_token_id_vs_position_offset=token_offset)
    return inputs, outputs, scalars, total


def plan_kwargs(inputs, outputs, scalars, device):
    def mv(x):
        return None if x is None else x.to(device).clone()

    o = {k: mv(v) for k, v in outputs.items()}
    kw = {k: mv(v) for k, v in inputs.items()}
    kw.update(scalars)
    kw["verify_plan_out"] = kc.VerifyPlan(
        verify_slot_indices=o["verify_slot_indices"], verify_expected_tokens=o["verify_expected_tokens"],
        verify_expected_positions=o["verify_expected_positions"],
        verify_prev_slot_indices=o["verify_prev_slot_indices"], verify_num_valid=o["verify_num_valid"],
        enable=o["enable"])
    kw["write_plan_out"] = kc.WritePlan(write_offsets=o["write_offsets"],
                                        write_seed_slot_indices=o["write_seed_slot_indices"],
                                        write_num_valid_reqs=o["write_num_valid_reqs"])
    kw["invalid_rows_out"] = o["invalid_rows_out"]
    return kw, o


def run_and_compare(inputs, outputs, scalars):
    cpu_kw, cpu_out = plan_kwargs(inputs, outputs, scalars, "cpu")
    gpu_kw, gpu_out = plan_kwargs(inputs, outputs, scalars, "cuda")
    kc.launch_canary_plan_kernels(**cpu_kw)
    kc.launch_canary_plan_kernels(**gpu_kw)
    torch.cuda.synchronize()
    for name, c in cpu_out.items():
        if c is not None:
            assert_same_bytes(c, gpu_out[name], name)
    return cpu_out


@pytest.mark.parametrize("bs", [1, 31, 32, 33, 1024, 4096, 4097, 20000])
def test_plan_batch_sizes(cuda_ready, bs):
    rng = rng_for("plan-bs", bs)
    has_lut, has_pool = COMBOS[[1, 31, 32, 33, 1024, 4096, 4097, 20000].index(bs) % 4]
    inputs, outputs, scalars, total = make_case(
        rng, bs, max_reqs=max(bs // 2, 4) + 1, max_seq_len=48, prefix_hi=48, has_lut=has_lut, has_pool=has_pool,
        token_offset=int(rng.integers(0, 2)), invalid_out=bs % 2 == 0)
    out = run_and_compare(inputs, outputs, scalars)
    assert int(out["enable"][0]) == 1 and int(out["verify_num_valid"][0]) == total
    assert int(out["write_num_valid_reqs"][0]) == bs


@pytest.mark.parametrize("has_lut,has_pool", COMBOS)
@pytest.mark.parametrize("token_offset", [0, 1])
def test_plan_specializations(cuda_ready, has_lut, has_pool, token_offset):
    rng = rng_for("plan-spec", has_lut, has_pool, token_offset)
    inputs, outputs, scalars, total = make_case(
        rng, 700, max_reqs=257, max_seq_len=300, prefix_hi=300, has_lut=has_lut, has_pool=has_pool,
        token_offset=token_offset)
    out = run_and_compare(inputs, outputs, scalars)
    assert total > 0 and int(out["verify_num_valid"][0]) == total


@pytest.mark.parametrize("capacity", ["exact", "overflow"])
def test_plan_capacity_edges(cuda_ready, capacity):
    rng = rng_for("plan-cap", capacity)
    inputs, outputs, scalars, total = make_case(rng, 300, max_reqs=100, max_seq_len=64, prefix_hi=64,
                                                has_lut=False, has_pool=True, capacity=capacity)
    out = run_and_compare(inputs, outputs, scalars)
    cap = scalars["verify_capacity"]
    if capacity == "overflow":
        assert int(out["enable"][0]) == 0 and int(out["verify_num_valid"][0]) == cap
        # No entry was written: the poison is intact (it was compared byte for byte on both sides too).
        assert torch.equal(out["verify_slot_indices"], outputs["verify_slot_indices"])
    else:
        assert int(out["enable"][0]) == 1 and int(out["verify_num_valid"][0]) == cap == total


def test_plan_empty_batch(cuda_ready):
    rng = rng_for("plan-empty")
    inputs, outputs, scalars, total = make_case(rng, 0, max_reqs=5, max_seq_len=8, prefix_hi=8, has_lut=False,
                                                has_pool=False)
    out = run_and_compare(inputs, outputs, scalars)
    assert total == 0 and int(out["verify_num_valid"][0]) == 0 and int(out["enable"][0]) == 1
    assert int(out["write_offsets"][0]) == 0


def test_plan_four_million_entries(cuda_ready):
    rng = rng_for("plan-4m")
    bs = size(1024, 48)
    inputs, outputs, scalars, total = make_case(
        rng, bs, max_reqs=bs + 1, max_seq_len=5200, prefix_lo=3000, prefix_hi=5200, has_lut=False,
        has_pool=True, bad_rows=False, pad_frac=0.0)
    if bs == 1024:
        assert total >= 4_000_000
    out = run_and_compare(inputs, outputs, scalars)
    assert int(out["verify_num_valid"][0]) == total


# ----------------------------------------------------------------------------------------------------------
# Paged tables and padding rows (SPEC §10)


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("pad_row", [0, -1])
def test_plan_block_table_matches_reference_and_req_to_token(cuda_ready, block_size, pad_row):
    """The plan from a block table equals the CPU reference and the plan from the req_to_token it expands to,
    byte for byte (outputs poisoned), with padding rows, invalid rows, bad block ids, SWA + LUT and expected
    tokens."""
    from support.table_cases import make_table_batch, to_device

    rng = rng_for("plan-paged", block_size, pad_row)
    b = make_table_batch(rng, block_size=block_size, max_blocks=max(2, 256 // block_size), pad_row=pad_row,
                         window=int(rng.choice([0, 11])), token_offset=int(rng.integers(0, 2)), n_active=12,
                         max_reqs=16)
    cap = 1 + int(b.prefix_lens.clamp(min=0).sum())
    poison = dict(
        verify_slot_indices=random_bytes(rng, (cap,), torch.int64),
        verify_expected_tokens=random_bytes(rng, (cap,), torch.int64),
        verify_expected_positions=random_bytes(rng, (cap,), torch.int64),
        verify_prev_slot_indices=random_bytes(rng, (cap,), torch.int64),
        verify_num_valid=random_bytes(rng, (1,), torch.int32), enable=random_bytes(rng, (1,), torch.int32),
        write_offsets=random_bytes(rng, (b.bs + 3,), torch.int64),
        write_seed_slot_indices=random_bytes(rng, (b.bs + 2,), torch.int64),
        write_num_valid_reqs=random_bytes(rng, (1,), torch.int32), invalid=random_bytes(rng, (1,), torch.int32))
    outs = []
    for dev, paged in (("cpu", True), ("cuda", True), ("cuda", False)):
        bb, o = to_device((b, poison), dev)
        vp = kc.VerifyPlan(verify_slot_indices=o["verify_slot_indices"], verify_expected_tokens=o["verify_expected_tokens"],
                           verify_expected_positions=o["verify_expected_positions"],
                           verify_prev_slot_indices=o["verify_prev_slot_indices"],
                           verify_num_valid=o["verify_num_valid"], enable=o["enable"])
        wp = kc.WritePlan(write_offsets=o["write_offsets"], write_seed_slot_indices=o["write_seed_slot_indices"],
                          write_num_valid_reqs=o["write_num_valid_reqs"])
        kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, verify_capacity=cap,
                                      invalid_rows_out=o["invalid"], **bb.plan_kwargs(paged))
        outs.append(o)
    torch.cuda.synchronize()
    for name in poison:
        assert_same_bytes(outs[0][name], outs[1][name], f"{name} (cpu vs cuda, block table)")
        assert_same_bytes(outs[1][name], outs[2][name], f"{name} (block table vs req_to_token)")
    assert int(outs[0]["enable"][0]) == 1 and int(outs[0]["invalid"][0]) >= 2
