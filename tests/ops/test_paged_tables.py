"""SPEC §10 paged tables and ``pad_row`` through the plan op: hand-worked cases, then fresh random batches against
the scalar model, for a block table and for the ``req_to_token`` it expands to (identical bytes).

``run_plan`` poisons every output first and compares every output with ``spec_model.plan``.
"""

from __future__ import annotations

import pytest

import kvcanary as kc
from support.canary_testlib import run_plan, snapshot, t32, t64
from support.gpu_util import rng_for
from support.table_cases import make_table_batch

BS = 4
# Row 0 is SGLang's padding row; row 1: blocks 5, 2, none; row 2: block 7, a negative id, block 9;
# row 3: block 1 three times.
BLOCKS = [[0, 0, 0], [5, 2, -1], [7, -3, 9], [1, 1, 1]]


def expand(blocks, bs):
    """req_to_token of a block table, by hand: position p -> block[p // bs] * bs + p % bs, -1 for a negative block."""
    return [[-1 if row[p // bs] < 0 else row[p // bs] * bs + p % bs for p in range(len(row) * bs)] for row in blocks]


def entries(run):
    vp = run.vp
    n = int(vp.verify_num_valid[0])
    return list(zip(vp.verify_slot_indices[:n].tolist(), vp.verify_expected_tokens[:n].tolist(),
                    vp.verify_expected_positions[:n].tolist(), vp.verify_prev_slot_indices[:n].tolist()))


def outputs(run) -> list[bytes]:
    vp, wp = run.vp, run.wp
    return snapshot(vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
                    vp.verify_prev_slot_indices, vp.verify_num_valid, vp.enable, wp.write_offsets,
                    wp.write_seed_slot_indices, wp.write_num_valid_reqs, run.invalid_rows)


def test_expand_by_hand():
    assert expand([[5, -1]], 2) == [[10, 11, -1, -1]]


@pytest.mark.parametrize("paged", [True, False], ids=["block_table", "req_to_token"])
def test_block_table_worked_by_hand(paged):
    table = dict(block_table=BLOCKS, block_size=BS) if paged else dict(r2t=expand(BLOCKS, BS))
    run = run_plan(rpi=[1, 2], prefix=[6, 9], extend=[2, 1], capacity=20, **table)
    assert entries(run) == [
        # row 1: positions 0..3 in block 5 (slots 20..23), 4..5 in block 2 (slots 8, 9)
        (20, -1, 0, -1), (21, -1, 1, 20), (22, -1, 2, 21), (23, -1, 3, 22), (8, -1, 4, 23), (9, -1, 5, 8),
        # row 2: block 7 (slots 28..31), then a negative block id: RT = -1 for positions 4..7, then block 9
        (28, -1, 0, -1), (29, -1, 1, 28), (30, -1, 2, 29), (31, -1, 3, 30),
        (-1, -1, 4, 31), (-1, -1, 5, -1), (-1, -1, 6, -1), (-1, -1, 7, -1), (36, -1, 8, -1),
    ]
    assert run.wp.write_offsets.tolist() == [0, 2, 3]
    assert run.wp.write_seed_slot_indices.tolist() == [9, 36]  # RT(1, 5), RT(2, 8)
    assert int(run.invalid_rows[0]) == 0


def test_block_table_with_a_lut_and_a_window():
    lut = [100 + x for x in range(30)]  # full indices >= 30 miss: T = -2
    run = run_plan(rpi=[2], prefix=[9], extend=[1], block_table=BLOCKS, block_size=BS, window=3, lut=lut,
                   capacity=8)
    # Window [6, 9): RT = -1, -1, 36; T(-1) = -1 (negative passes), T(36) = -2 (past the LUT).
    assert entries(run) == [(-1, -1, 6, -1), (-1, -1, 7, -1), (-2, -1, 8, -1)]
    assert run.wp.write_seed_slot_indices.tolist() == [-2]


def test_block_size_one_is_req_to_token():
    r2t = [[0] * 3, [7, 8, 9]]
    a = run_plan(rpi=[1], prefix=[3], extend=[1], block_table=r2t, block_size=1, capacity=4)
    b = run_plan(rpi=[1], prefix=[3], extend=[1], r2t=r2t, capacity=4)
    assert entries(a) == [(7, -1, 0, -1), (8, -1, 1, 7), (9, -1, 2, 8)]
    assert outputs(a) == outputs(b)


def test_values_past_int32_are_computed_in_64_bits():
    bs = 1 << 20
    run = run_plan(rpi=[1], prefix=[2], extend=[1], block_table=[[0], [5000]], block_size=bs, capacity=2)
    big = 5000 * bs  # > 2**31
    assert entries(run) == [(big, -1, 0, -1), (big + 1, -1, 1, big)]
    assert run.wp.write_seed_slot_indices.tolist() == [big + 1]


@pytest.mark.parametrize("paged", [True, False], ids=["block_table", "req_to_token"])
def test_pad_row_minus_one_makes_row_zero_a_request(paged):
    table = dict(block_table=BLOCKS, block_size=BS) if paged else dict(r2t=expand(BLOCKS, BS))
    # pad_row -1: row 0 is an ordinary request, -1 is padding, -2 and 4 (= max_reqs) are invalid.
    run = run_plan(rpi=[0, -1, -2, 4, 3], prefix=[2, 5, 1, 1, 1], extend=[1, 3, 1, 1, 2], capacity=8, pad_row=-1,
                   **table)
    assert entries(run) == [(0, -1, 0, -1), (1, -1, 1, 0), (4, -1, 0, -1)]
    assert run.wp.write_offsets.tolist() == [0, 1, 1, 1, 1, 3]
    assert run.wp.write_seed_slot_indices.tolist() == [1, -1, -1, -1, 4]
    assert int(run.invalid_rows[0]) == 2
    # The same batch with SGLang's pad_row 0: row 0 is padding and -1 is one more invalid row.
    run = run_plan(rpi=[0, -1, -2, 4, 3], prefix=[2, 5, 1, 1, 1], extend=[1, 3, 1, 1, 2], capacity=8, **table)
    assert entries(run) == [(4, -1, 0, -1)]
    assert run.wp.write_offsets.tolist() == [0, 0, 0, 0, 0, 2]
    assert int(run.invalid_rows[0]) == 3


def test_any_row_of_the_table_may_be_the_padding_row():
    run = run_plan(rpi=[3, 0], prefix=[2, 1], extend=[1, 1], block_table=BLOCKS, block_size=BS, capacity=4,
                   pad_row=3)
    assert entries(run) == [(0, -1, 0, -1)]  # row 3 is padding; row 0 an ordinary request
    assert run.wp.write_offsets.tolist() == [0, 0, 1]
    assert int(run.invalid_rows[0]) == 0


@pytest.mark.parametrize("pad_row", [0, -1])
def test_a_padding_row_with_a_prefix_past_max_seq_len_is_invalid(pad_row):
    """Decision (reference/table.py): the prefix rule applies to padding rows too, so pad_row 0 keeps the rule
    the plan always had."""
    run = run_plan(rpi=[pad_row, pad_row], prefix=[13, 12], extend=[1, 1], block_table=BLOCKS, block_size=BS,
                   capacity=4, pad_row=pad_row)
    assert entries(run) == []
    assert int(run.invalid_rows[0]) == 1


def test_prefix_past_the_paged_max_seq_len_is_an_invalid_row():
    # max_seq_len = 3 blocks * 4 = 12.
    run = run_plan(rpi=[3, 1], prefix=[12, 13], extend=[0, 1], block_table=BLOCKS, block_size=BS, capacity=16)
    assert [e[0] for e in entries(run)] == [4, 5, 6, 7] * 3
    assert run.wp.write_seed_slot_indices.tolist() == [-1, -1]
    assert int(run.invalid_rows[0]) == 1


def test_existing_positional_keyword_call_is_unchanged():
    """The SGLang call (every argument named, no table keywords) still works and means req_to_token + pad_row 0."""
    vp = kc.VerifyPlan.allocate(verify_capacity=4)
    wp = kc.WritePlan.allocate(write_req_capacity=2)
    kc.launch_canary_plan_kernels(
        verify_plan_out=vp, write_plan_out=wp, req_pool_indices=t64([1, 0]), prefix_lens=t64([2, 2]),
        extend_seq_lens=t64([1, 1]), req_to_token=t32(expand(BLOCKS, BS)), swa_window_size=0,
        full_to_swa_index_mapping=None, verify_capacity=4, req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None, kv_token_id_vs_position_offset=0)
    assert vp.verify_slot_indices[:2].tolist() == [20, 21] and int(vp.verify_num_valid[0]) == 2


# ----------------------------------------------------------------------------------------------- random batches


def run_both_forms(b, *, capacity: int):
    kw = dict(rpi=b.req_pool_indices.tolist(), prefix=b.prefix_lens.tolist(), extend=b.extend_seq_lens.tolist(),
              window=b.swa_window_size, lut=b.lut, pool=b.expected_tokens,
              valid_lens=None if b.expected_valid_lens is None else b.expected_valid_lens.tolist(),
              offset=b.token_offset, capacity=capacity, req_capacity=b.bs + 2, pad_row=b.pad_row)
    paged = run_plan(block_table=b.block_table, block_size=b.block_size, **kw)
    flat = run_plan(r2t=b.req_to_token, **kw)
    return paged, flat


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("pad_row", [0, -1])
@pytest.mark.parametrize("window", [0, 9])
def test_random_block_tables_match_the_model_and_their_expansion(block_size, pad_row, window):
    for seed in range(3):
        rng = rng_for(block_size, pad_row, window, seed)
        b = make_table_batch(rng, block_size=block_size, max_blocks=max(2, 96 // block_size), pad_row=pad_row,
                             window=window, token_offset=int(rng.integers(0, 2)), with_pool=bool(seed != 1))
        total = int(b.prefix_lens.clamp(min=0).sum())
        paged, flat = run_both_forms(b, capacity=total + 3)  # both compared with the model inside
        assert int(paged.vp.enable[0]) == 1
        assert outputs(paged) == outputs(flat)
        assert paged.model.invalid_rows >= 2  # the builder's invalid rows are there


def test_random_block_table_overflow_matches_its_expansion():
    rng = rng_for(7)
    total = 0
    while total < 2:  # a batch with at least 2 entries (almost always the first)
        b = make_table_batch(rng, block_size=16, max_blocks=4)
        fits, _ = run_both_forms(b, capacity=1000)
        total = int(fits.vp.verify_num_valid[0])
    paged, flat = run_both_forms(b, capacity=total - 1)
    assert int(paged.vp.enable[0]) == 0
    assert outputs(paged) == outputs(flat)


def test_pad_row_minus_one_tables_without_a_padding_row_use_row_zero():
    rng = rng_for(11)
    for _ in range(10):
        b = make_table_batch(rng, pad_row=-1, n_active=9, max_reqs=9, block_size=4, max_blocks=4)
        assert 0 in b.req_pool_indices.tolist()
        paged, flat = run_both_forms(b, capacity=200)
        assert outputs(paged) == outputs(flat)
