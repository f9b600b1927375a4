"""SPEC §3 known-answer table, pinned for every implementation of the hashes: kvcanary.consts (Python ints),
kvcanary.ops.reference.hashing (NumPy), the scalar test model, and the write op itself (stored records)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary import consts
from kvcanary.ops.reference import hashing
from support import spec_model as M
from support.canary_testlib import PoolSource, Rig, write_plan

ANCHOR = 0xC0FFEE1234567890
SM_1 = 0x5692161D100B05E5
SM_ANCHOR = 0xDE7FAE23A9A1B716
MIX_123 = 0xA55BDF37C08724B5
CHAIN = [0xDE7FAE23A9A1B716, 0x89CD2ABFBEBC0649, 0x13F5BAAFE6EF85D6]
CHAIN_NEXT = 0x86BD2A2B9B320591
MIX_ANCHOR_M1_0 = 0xE5A9A05404A720CF
RKV_BYTES = bytes([0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x81, 0x82, 0x84, 0x88, 0x90, 0xA0, 0xC0, 0xFF])
RKV_SOURCE_HASH = 0xF036E30B6961C78D
RKV_FINGERPRINT = 0x6041580849E6407D


def test_anchor_constant_and_int64_cast():
    assert consts.CANARY_CHAIN_ANCHOR == ANCHOR
    assert consts.ANCHOR_HASH == SM_ANCHOR
    assert consts.to_int64(SM_ANCHOR) == -2414019407054260458
    assert M.i64(SM_ANCHOR) == -2414019407054260458
    assert consts.to_u64(-2414019407054260458) == SM_ANCHOR


@pytest.mark.parametrize("impl", ["consts", "model"])
def test_scalar_hashes(impl):
    sm, mix = (consts.splitmix64, consts.splitmix64_mix3) if impl == "consts" else (M.splitmix64, M.mix3)
    assert sm(1) == SM_1
    assert sm(0) == 0  # finalizer only
    assert sm(ANCHOR) == SM_ANCHOR
    assert mix(1, 2, 3) == MIX_123
    assert mix(SM_ANCHOR, -1, 0) == MIX_ANCHOR_M1_0
    h = SM_ANCHOR
    for want, (tok, pos) in zip(CHAIN, [(11, 0), (12, 1), (13, 2)]):
        assert h == want
        h = mix(h, tok, pos)
    assert h == CHAIN_NEXT


def test_vectorized_hashes():
    x = np.array([1, ANCHOR, 0], dtype=np.uint64)
    assert hashing.splitmix64(x).tolist() == [SM_1, SM_ANCHOR, 0]
    out = hashing.mix3(np.array([1, SM_ANCHOR], np.uint64), np.array([2, -1], np.int64), np.array([3, 0], np.int64))
    assert out.tolist() == [MIX_123, MIX_ANCHOR_M1_0]
    assert int(hashing.ANCHOR_HASH) == SM_ANCHOR


def test_write_op_stores_the_known_chain():
    """Write tokens 11,12,13 at positions 0,1,2 as a chain head: stored prev_hash values are the table's, and a
    fourth token continued from the last slot as seed gets the table's "next link"."""
    rig = Rig.make(8)
    rows = rig.write(write_plan([0, 3], [-1]), ids=[11, 12, 13], pos=[0, 1, 2], loc=[5, 2, 7])
    assert rows == []
    recs = rig.recs()
    assert [recs[s][2] for s in (5, 2, 7)] == [M.i64(h) for h in CHAIN]
    assert [recs[s][:2] for s in (5, 2, 7)] == [[11, 0], [12, 1], [13, 2]]
    rig.write(write_plan([0, 1], [7]), ids=[14], pos=[3], loc=[1])
    assert rig.recs()[1][:3] == [14, 3, M.i64(CHAIN_NEXT)]


def test_real_kv_fingerprint_known_answer():
    src_bytes = M.Source(RKV_BYTES, 0, 16, 1, 16, 16)
    assert M.source_hash(src_bytes, 0, 16) == RKV_SOURCE_HASH
    assert M.fingerprint([src_bytes], 1, 0) == RKV_FINGERPRINT
    assert M.fingerprint([src_bytes], 2, 0) == RKV_FINGERPRINT
    for mode in (kc.RealKvHashMode.PARTIAL, kc.RealKvHashMode.ALL):
        pool = PoolSource.make(rows=2, page_size=1, num_bytes_per_token=16)
        pool.big[1] = torch.tensor(list(RKV_BYTES), dtype=torch.uint8)
        rig = Rig.make(2, pools=[pool], mode=int(mode))
        rig.write(write_plan([0, 1], [-1]), ids=[7], pos=[0], loc=[1])
        assert rig.recs()[1][3] == M.i64(RKV_FINGERPRINT)
