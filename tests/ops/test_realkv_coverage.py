"""SPEC §9 and §13 for real-KV sources: a source covering fewer slots than the canary (accepted; a touched slot it
does not cover is reported, only when the mode reads the sources), the SGLang-named ops' limit of 4 sources
(SGLang's message), and any number of sources (64 = 32 layers x K/V) on kvcanary's own ops.

Every launch through ``Rig`` is also compared byte for byte with the scalar model; the from-table launches go
through ``support.table_testlib`` (model comparison inside)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcanary as kc
from kvcanary import FailReason as F
from kvcanary import RealKvHashMode as Mode
from support import spec_model as M
from support.canary_testlib import PoolSource, Rig, single_chain_plan, snapshot, t32, t64, verify_plan, write_plan
from support.gpu_util import rng_for
from support.table_cases import make_canary_case, make_canary_cases, make_table_batch, make_write_tokens, stamp_batch
from support.table_testlib import assert_same_state, copies, run_verify_from_table, run_write_from_table

OOR = int(F.SLOT_OUT_OF_RANGE)
RKV = int(F.VERIFY_REAL_KV_HASH_MISMATCH)
TAG = int(kc.CanaryLaunchTag.TAIL_K_FULL)


def small_pool(gen, rows=2, page_size=2):
    """A pool covering rows * page_size slots (4 by default), fewer than the canaries below."""
    return PoolSource.make(rows=rows, page_size=page_size, num_bytes_per_token=32, read_bytes=32, generator=gen)


# ----------------------------------------------------------------------------------------------- SGLang-named ops


@pytest.mark.parametrize("mode", [Mode.PARTIAL, Mode.ALL])
def test_write_reports_and_skips_a_token_outside_the_sources(mode, gen):
    rig = Rig.make(8, tag=TAG, pools=[small_pool(gen)], mode=mode, flag=1)
    # One request from the anchor: slots 1, 2, then 5 (not covered: row 2 of a 2-row source), then 3.
    rows = rig.write(write_plan([0, 4], [-1]), ids=[10, 11, 12, 13], pos=[0, 1, 2, 3], loc=[1, 2, 5, 3])
    chain = M.Chain().hashes([(10, 0), (11, 1), (13, 3)])
    running_at_5 = M.i64(M.mix3(M.mix3(M.splitmix64(M.ANCHOR), 10, 0), 11, 1))
    # Exactly the row of an out_cache_loc >= num_slots: no stamp, no chain step, no count.
    assert rows == [(TAG, 5, 2, 12, -1, running_at_5, -1, OOR)]
    recs = rig.recs()
    assert [recs[s][:3] for s in (1, 2, 3)] == [[10, 0, chain[0]], [11, 1, chain[1]], [13, 3, chain[2]]]
    assert recs[5] == [0, 0, 0, 0]
    assert rig.slot_runs == 3


def test_write_in_none_mode_stamps_every_slot_whatever_the_sources_cover(gen):
    rig = Rig.make(8, tag=TAG, pools=[small_pool(gen)], mode=Mode.NONE)
    assert rig.write(write_plan([0, 3], [-1]), ids=[10, 11, 12], pos=[0, 1, 2], loc=[1, 7, 3]) == []
    assert [rig.recs()[s][:2] for s in (1, 7, 3)] == [[10, 0], [11, 1], [12, 2]]
    assert rig.slot_runs == 3


@pytest.mark.parametrize("mode", [Mode.PARTIAL, Mode.ALL])
def test_verify_reports_a_slot_outside_the_sources_like_an_out_of_range_slot(mode, gen):
    pool = small_pool(gen)
    rig = Rig.make(8, tag=TAG, pools=[pool], mode=Mode.NONE)
    # Stamp in NONE mode (every slot), then verify in `mode`: slots 1..3 are covered, 4 and 6 are not.
    rig.write(write_plan([0, 5], [-1]), ids=[10, 11, 12, 13, 14], pos=[0, 1, 2, 3, 4], loc=[1, 2, 4, 3, 6])
    rig.mode = mode
    fp = rig.fp()
    recs = rig.recs()
    for s in (1, 2, 3):  # give the covered slots their real fingerprints, so only coverage is reported
        recs[s][3] = M.i64(fp(s))
    rig.set_recs(recs)
    rows = rig.verify(single_chain_plan([1, 2, 4, 3, 6], [0, 1, 2, 3, 4], [10, 11, 99, 13, 14]))
    # Slot 4: one OOR row, no record read (stored fields -1/0, expected_aux = prev), no token check either.
    # Slot 3 (prev 4, a valid canary slot) is checked normally and is clean.
    assert rows == [(TAG, 4, 2, -1, 99, 0, 2, OOR), (TAG, 6, 4, -1, 14, 0, 3, OOR)]
    assert rig.slot_runs == 5 + 5  # the write's stamps, then every verify entry
    # In NONE mode nothing reads the sources: every entry is checked; slots 4 and 6 (stamped in NONE mode) are
    # clean, and the three fingerprints set above now fail (the expected fingerprint is 0).
    rig.mode = Mode.NONE
    rows = rig.verify(single_chain_plan([1, 2, 4, 3, 6], [0, 1, 2, 3, 4]))
    assert [(r[1], r[7]) for r in rows] == [(1, RKV), (2, RKV), (3, RKV)]


def test_verify_with_no_sources_has_no_coverage_limit():
    rig = Rig.make(8, tag=TAG, mode=Mode.PARTIAL)
    rig.write(write_plan([0, 2], [-1]), ids=[1, 2], pos=[0, 1], loc=[6, 7])
    assert rig.verify(single_chain_plan([6, 7], [0, 1])) == []


def test_the_smallest_source_sets_the_limit_and_page_size_counts(gen):
    big = PoolSource.make(rows=8, page_size=1, num_bytes_per_token=16, generator=gen)
    paged = small_pool(gen, rows=2, page_size=3)  # covers slots 0..5
    rig = Rig.make(8, tag=TAG, pools=[big, paged], mode=Mode.PARTIAL)
    rows = rig.write(write_plan([0, 3], [-1]), ids=[1, 2, 3], pos=[0, 1, 2], loc=[5, 6, 7])
    assert [(r[1], r[7]) for r in rows] == [(6, OOR), (7, OOR)]
    assert rig.verify(single_chain_plan([5], [0])) == []
    rows = rig.verify(verify_plan([6, 5], [-1, -1], [1, 0], [5, 6]))
    # slot 6 is not covered; slot 5's prev 6 is a valid canary slot (prev records are canary reads): checked,
    # and prev 6's record is all zero, so the chain check fails.
    assert [(r[1], r[7]) for r in rows] == [(6, OOR), (5, int(F.VERIFY_CHAIN_HASH_MISMATCH))]


def test_sglang_named_ops_refuse_five_sources_with_sglangs_message(gen):
    pools = [PoolSource.make(rows=4, page_size=1, num_bytes_per_token=16, generator=gen) for _ in range(5)]
    rig = Rig.make(4, pools=pools, mode=Mode.PARTIAL)
    outs = [rig.buf, *(getattr(rig.log, f) for f in ("violation_ring", "violation_write_index", "slot_run_counter",
                                                     "kernel_run_counter"))]
    snap = snapshot(*outs)
    wp = write_plan([0, 1], [-1])
    with pytest.raises(ValueError) as e:
        kc.launch_canary_write_kernel(context=rig.ctx(), plan=wp, input_ids=t64([1]), positions=t64([0]),
                                      out_cache_loc=t64([1]), enable_write_input_assert=False,
                                      expected_input_tokens=None, expected_input_positions=None)
    assert str(e.value) == "kv-canary: context.real_kv_sources may hold at most 4 RealKvSource, got 5"
    assert "at most 4 RealKvSource" in str(e.value) and type(e.value) is ValueError
    with pytest.raises(ValueError) as e:
        kc.launch_canary_verify_kernel(context=rig.ctx(), plan=single_chain_plan([1], [0]),
                                       check_verify_expected_token=False)
    assert str(e.value) == "kv-canary: context.real_kv_sources may hold at most 4 RealKvSource, got 5"
    assert snapshot(*outs) == snap
    # The same context on kvcanary's own ops is fine.
    kc.launch_canary_write_from_table(contexts=(rig.ctx(),), req_pool_indices=t64([1]), prefix_lens=t64([0]),
                                      extend_seq_lens=t64([1]), req_to_token=t32([[0, 0], [1, 2]]),
                                      input_ids=t64([1]), positions=t64([0]), out_cache_loc=t64([1]))
    kc.launch_canary_verify_from_table(contexts=(rig.ctx(),), req_pool_indices=t64([1]), prefix_lens=t64([1]),
                                       req_to_token=t32([[0, 0], [1, 2]]))
    assert rig.index == 0 and rig.kernel_runs == 2


@given(st.data())
def test_small_sources_through_the_sglang_ops_match_the_model(data):
    n_slots = data.draw(st.integers(2, 10))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    pools = []
    for _ in range(data.draw(st.integers(1, 4))):
        page = data.draw(st.integers(1, 3))
        pools.append(PoolSource.make(rows=data.draw(st.integers(0, -(-n_slots // page) + 1)), page_size=page,
                                     num_bytes_per_token=16, read_bytes=16, generator=g))
    rig = Rig.make(n_slots, pools=pools, mode=data.draw(st.sampled_from(list(Mode))), ring=32, tag=3)
    slots = data.draw(st.lists(st.integers(-1, n_slots + 1), min_size=1, max_size=8))
    rig.write(write_plan([0, len(slots)], [-1]), ids=list(range(len(slots))), pos=list(range(len(slots))),
              loc=slots)
    prev = data.draw(st.lists(st.integers(-1, n_slots), min_size=len(slots), max_size=len(slots)))
    rig.verify(verify_plan(slots, [-1] * len(slots), list(range(len(slots))), prev))


# ----------------------------------------------------------------------------------------------- kvcanary's own ops


@pytest.mark.parametrize("mode", list(Mode))
def test_small_sources_from_the_table_match_the_model(mode):
    touched = 0
    for seed in range(3):
        rng = rng_for(int(mode), seed, 41)
        b = make_table_batch(rng, block_size=4, max_blocks=6, n_active=5, max_reqs=8)
        limit = b.num_slots // 3
        cases = make_canary_cases(rng, b.num_slots, 2, n_sources=2, mode=mode, source_rows=limit, page_size=1,
                                  shared_log=True, ring_capacity=512)
        for c in cases:
            stamp_batch(rng, c, b)
        no_sources = [dataclasses.replace(c, sources=[]) for c in copies(cases)]
        run_verify_from_table(b, cases, paged=True, rng=rng)
        n = int(cases[0].log.index[0])
        ring = cases[0].log.ring[:n]
        uncovered = ring[(ring[:, 1] >= limit) & (ring[:, 1] < b.num_slots)]
        if mode == Mode.NONE:
            # Nothing reads the sources: the launch is the same as one without sources.
            kc.launch_canary_verify_from_table(contexts=[c.context() for c in no_sources], **b.verify_kwargs(True))
            assert_same_state(cases, no_sources)
        else:
            assert (uncovered[:, 7] == OOR).all()
            touched += len(uncovered)
        tokens = make_write_tokens(rng, b)
        run_write_from_table(b, cases, tokens, paged=False, rng=rng)
    assert mode == Mode.NONE or touched > 0


def layer_sources(rng, n_layers, num_slots, *, page_size=16):
    """One source per layer over a [pages, page_size, heads * head_dim] bfloat16 pool (each layer its own)."""
    out = []
    for _ in range(n_layers):
        pool = torch.from_numpy(rng.integers(0, 256, (-(-num_slots // page_size), page_size * 64), dtype=np.uint8))
        out.append((pool, kc.RealKvSource(tensor=pool.view(torch.bfloat16).view(-1, page_size, 32),
                                          page_size=page_size, num_bytes_per_token=64, read_bytes=64)))
    return out


def test_sixty_four_sources_32_layers_k_and_v_in_one_launch():
    rng = np.random.default_rng(64)
    num_slots = 40
    log = kc.ViolationLog.allocate(ring_capacity=64)
    k_layers, v_layers = layer_sources(rng, 32, num_slots), layer_sources(rng, 32, num_slots)
    bufs = [kc.allocate_canary_buffer(num_slots) for _ in range(2)]
    ctxs = tuple(log.context(canary_buf=buf, kernel_kind=kind, real_kv_sources=tuple(s for _, s in layers),
                             real_kv_hash_mode=Mode.ALL)
                 for buf, kind, layers in ((bufs[0], 2, k_layers), (bufs[1], 3, v_layers)))
    r2t = t32([[0] * 16, list(range(1, 17)), list(range(17, 33))])
    table = dict(req_pool_indices=t64([1, 2]), req_to_token=r2t)
    kc.launch_canary_write_from_table(contexts=ctxs, prefix_lens=t64([0, 0]), extend_seq_lens=t64([10, 16]),
                                      input_ids=t64(list(range(26))), positions=t64(list(range(10)) + list(range(16))),
                                      out_cache_loc=t64(list(range(1, 11)) + list(range(17, 33))), **table)
    # The stored fingerprint folds the 32 layers in order (SPEC §3.1), recomputed here by hand for one slot.
    for buf, layers in ((bufs[0], k_layers), (bufs[1], v_layers)):
        acc = 0
        for pool, _ in layers:
            raw = pool[20 // 16, (20 % 16) * 64:(20 % 16) * 64 + 64].numpy().tobytes()
            h = 0
            for k in range(0, 64, 8):
                h = M.splitmix64(h ^ int.from_bytes(raw[k:k + 8], "little"))
            acc = M.splitmix64(acc ^ h)
        assert int(buf.numpy().view(np.int64)[20, 3]) == M.i64(acc)
    kc.launch_canary_verify_from_table(contexts=ctxs, prefix_lens=t64([10, 16]), **table)
    assert int(log.violation_write_index[0]) == 0
    v_layers[17][0][20 // 16, (20 % 16) * 64 + 63] ^= 0x80  # last byte of slot 20 in V layer 17
    kc.launch_canary_verify_from_table(contexts=ctxs, prefix_lens=t64([10, 16]), **table)
    rows = log.violation_ring[: int(log.violation_write_index[0])].tolist()
    assert [(r[0], r[1], r[7]) for r in rows] == [(3, 20, RKV)]
    assert int(log.kernel_run_counter[0]) == 6


@pytest.mark.parametrize("mode", [Mode.PARTIAL, Mode.ALL])
def test_sixty_four_sources_match_the_model(mode):
    rng = rng_for(int(mode), 64)
    b = make_table_batch(rng, block_size=4, max_blocks=4, n_active=3, max_reqs=5)
    cases = [make_canary_case(rng, b.num_slots, n_sources=32, mode=mode, num_bytes_per_token=32, tag=tag,
                              ring_capacity=256) for tag in (2, 3)]
    for c in cases:
        stamp_batch(rng, c, b)
    run_verify_from_table(b, cases, paged=True, rng=rng)
    run_write_from_table(b, cases, make_write_tokens(rng, b), paged=True, rng=rng)
    one = make_canary_case(rng, b.num_slots, n_sources=64, mode=mode, num_bytes_per_token=16, ring_capacity=256)
    stamp_batch(rng, one, b)
    run_verify_from_table(b, [one], paged=False, rng=rng)
