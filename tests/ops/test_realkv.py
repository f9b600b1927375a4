"""SPEC §3.1 real-KV fingerprint through the write and verify ops: NONE / PARTIAL / ALL, 1-4 sources, paged and
holey pools (row stride larger than page_size * num_bytes_per_token), live views, and a property test."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcanary as kc
from kvcanary import FailReason as F
from kvcanary import RealKvHashMode as Mode
from support import spec_model as M
from support.canary_testlib import PoolSource, Rig, single_chain_plan, write_plan

KA_BYTES = [0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x81, 0x82, 0x84, 0x88, 0x90, 0xA0, 0xC0, 0xFF]
KA_SOURCE = 0xF036E30B6961C78D
KA_FP = 0x6041580849E6407D
RKV = int(F.VERIFY_REAL_KV_HASH_MISMATCH)


def stamp(rig: Rig, slots) -> None:
    rig.write(write_plan([0, len(slots)], [-1]), ids=list(range(len(slots))), pos=list(range(len(slots))),
              loc=list(slots))


def test_known_answer_with_two_sources_folds_in_order():
    pools = [PoolSource.make(rows=1, page_size=1, num_bytes_per_token=16) for _ in range(2)]
    for p in pools:
        p.big[0] = torch.tensor(KA_BYTES, dtype=torch.uint8)
    rig = Rig.make(1, pools=pools, mode=Mode.PARTIAL)
    stamp(rig, [0])
    # acc = splitmix64(0 ^ h) = KA_FP after the first source; then splitmix64(KA_FP ^ h).
    assert rig.recs()[0][3] == M.i64(M.splitmix64(KA_FP ^ KA_SOURCE))


def test_none_mode_stores_zero_even_with_sources(gen):
    pool = PoolSource.make(rows=4, page_size=1, num_bytes_per_token=32, generator=gen)
    rig = Rig.make(4, pools=[pool], mode=Mode.NONE)
    stamp(rig, [1, 2, 3])
    assert [r[3] for r in rig.recs()] == [0, 0, 0, 0]
    pool.big.fill_(0)
    assert rig.verify(single_chain_plan([1, 2, 3], [0, 1, 2])) == []


def test_partial_folds_16_bytes_and_all_folds_read_bytes(gen):
    pool = PoolSource.make(rows=2, page_size=2, num_bytes_per_token=64, read_bytes=48, generator=gen)
    for mode, detected in ((Mode.PARTIAL, {5}), (Mode.ALL, {5, 20})):
        rig = Rig.make(4, pools=[pool], mode=mode)
        stamp(rig, [1, 2, 3])
        # slot 3 = row 1, bytes [64, 128) of the row.
        for byte in (5, 20, 50):
            old = int(pool.big[1, 64 + byte])
            pool.big[1, 64 + byte] = old ^ 0x40
            rows = rig.verify(single_chain_plan([1, 2, 3], [0, 1, 2]))
            assert ([r[1] for r in rows] == [3]) == (byte in detected), (mode, byte)
            if rows:
                assert rows[0][7] == RKV
            pool.big[1, 64 + byte] = old


@pytest.mark.parametrize("n_sources", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", [Mode.PARTIAL, Mode.ALL])
def test_one_to_four_sources_each_detects_a_flipped_byte(n_sources, mode, gen):
    pools = [PoolSource.make(rows=3, page_size=2, num_bytes_per_token=32, read_bytes=32, generator=gen,
                             slack=16 * k, big_row_bytes=2 * 32 + 16 * k + 48) for k in range(n_sources)]
    rig = Rig.make(6, pools=pools, mode=mode, tag=int(kc.CanaryLaunchTag.TAIL_V_FULL))
    slots = [5, 4, 1, 2]
    stamp(rig, slots)
    fps = [rig.recs()[s][3] for s in slots]
    assert len(set(fps)) == 4 and 0 not in fps
    plan = single_chain_plan(slots, [0, 1, 2, 3])
    assert rig.verify(plan) == []
    for k, p in enumerate(pools):
        # slot 4 = row 2, first token of the page; flip a byte in its first 16.
        p.big[2, 3] ^= 0x01
        rec = rig.recs()[4]
        rows = rig.verify(plan)
        assert rows == [(int(kc.CanaryLaunchTag.TAIL_V_FULL), 4, 1, 1, -1, rec[2], rec[2], RKV)], k
        p.big[2, 3] ^= 0x01
    assert rig.verify(plan) == []


def test_source_order_matters(gen):
    a = PoolSource.make(rows=2, page_size=1, num_bytes_per_token=16, generator=gen)
    b = PoolSource.make(rows=2, page_size=1, num_bytes_per_token=16, generator=gen)
    r1, r2 = Rig.make(2, pools=[a, b], mode=Mode.ALL), Rig.make(2, pools=[b, a], mode=Mode.ALL)
    stamp(r1, [1])
    stamp(r2, [1])
    assert r1.recs()[1][3] != r2.recs()[1][3]


def test_paged_bfloat16_pool_byte_layout(gen):
    """A [pages, page_size, elems] bfloat16 pool: slot s owns row s // page_size, bytes (s % page_size) * nbpt."""
    pool = PoolSource.make(rows=3, page_size=4, num_bytes_per_token=32, dtype=torch.bfloat16, paged=True,
                           generator=gen)
    assert pool.source.tensor.dtype == torch.bfloat16 and pool.source.tensor.shape == (3, 4, 16)
    rig = Rig.make(12, pools=[pool], mode=Mode.ALL)
    stamp(rig, [6])
    # Hand-fold slot 6's bytes: row 1, bytes [64, 96).
    raw = bytes(pool.big[1, 64:96].tolist())
    h = 0
    for k in range(0, 32, 8):
        h = M.splitmix64(h ^ int.from_bytes(raw[k:k + 8], "little"))
    assert rig.recs()[6][3] == M.i64(M.splitmix64(h))


def test_holey_pool_ignores_bytes_outside_the_slots(gen):
    """The source is a column window of a wider pool (row stride 256 bytes, 2 x 48 used, offset 32), with 16
    trailing bytes inside the view too: bytes outside each slot's range never change the fingerprint."""
    pool = PoolSource.make(rows=4, page_size=2, num_bytes_per_token=48, read_bytes=48, big_row_bytes=256,
                           col_offset=32, slack=16, generator=gen)
    assert pool.source.row_stride_bytes == 256 and pool.source.row_bytes == 112
    rig = Rig.make(8, pools=[pool], mode=Mode.ALL)
    slots = [1, 2, 3, 4, 5, 6, 7]
    stamp(rig, slots)
    plan = single_chain_plan(slots, list(range(7)))
    assert rig.verify(plan) == []
    holes = [0, 31, 32 + 96, 32 + 111, 200, 255]  # before the view, view's slack, after the view
    for row in range(4):
        for col in holes:
            pool.big[row, col] ^= 0xFF
    assert rig.verify(plan) == []
    pool.big[3, 32 + 48 + 47] ^= 0x10  # last byte of slot 7
    rows = rig.verify(plan)
    assert [(r[1], r[7]) for r in rows] == [(7, RKV)]


def test_source_is_a_live_view_not_a_copy(gen):
    pool = PoolSource.make(rows=2, page_size=1, num_bytes_per_token=16, generator=gen)
    rig = Rig.make(2, pools=[pool], mode=Mode.PARTIAL)
    pool.big[1] = torch.tensor(KA_BYTES, dtype=torch.uint8)  # after the source was built
    stamp(rig, [1])
    assert rig.recs()[1][3] == M.i64(KA_FP)


def test_verify_in_none_mode_flags_a_stamped_fingerprint(gen):
    pool = PoolSource.make(rows=2, page_size=1, num_bytes_per_token=16, generator=gen)
    rig = Rig.make(2, pools=[pool], mode=Mode.PARTIAL)
    stamp(rig, [1])
    rig.mode = Mode.NONE
    rows = rig.verify(single_chain_plan([1], [0]))
    assert [r[7] for r in rows] == [RKV]
    rig.mode = Mode.PARTIAL
    rig.pools = []  # no sources: fingerprint 0
    assert [r[7] for r in rig.verify(single_chain_plan([1], [0]))] == [RKV]


@given(st.data())
def test_fingerprint_matches_scalar_model(data):
    n_slots = data.draw(st.integers(1, 9))
    pools = []
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    for _ in range(data.draw(st.integers(1, 4))):
        page = data.draw(st.integers(1, 4))
        nbpt = 16 * data.draw(st.integers(1, 4))
        slack = 16 * data.draw(st.integers(0, 2))
        off = 16 * data.draw(st.integers(0, 2))
        pools.append(PoolSource.make(
            rows=-(-n_slots // page) + data.draw(st.integers(0, 2)), page_size=page, num_bytes_per_token=nbpt,
            read_bytes=16 * data.draw(st.integers(1, nbpt // 16)), col_offset=off, slack=slack,
            big_row_bytes=off + page * nbpt + slack + 16 * data.draw(st.integers(0, 3)),
            dtype=data.draw(st.sampled_from([torch.uint8, torch.bfloat16, torch.int32, torch.float64])),
            generator=g))
    rig = Rig.make(n_slots, pools=pools, mode=data.draw(st.sampled_from(list(Mode))))
    slots = data.draw(st.permutations(list(range(n_slots))))
    rig.write(write_plan([0, n_slots], [-1]), ids=[3] * n_slots, pos=list(range(n_slots)), loc=slots)
    fp = rig.fp()
    assert [r[3] for r in rig.recs()] == [M.i64(fp(s)) for s in range(n_slots)]
