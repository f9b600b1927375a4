"""SPEC §13: records that move with the KV: gather, scatter and copy of canary records on the CPU, against the
scalar model (``spec_model.gather_records`` ...) on fresh random cases with poisoned outputs, worked cases for
the skip and out-of-range rules, strides past 32 bytes, and the end-to-end property: records moved together
with their KV and remapped in the table verify at their new slots; a slot whose KV did not arrive fails the
real-KV check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary import FailReason as F
from kvcanary import RealKvHashMode as Mode
from support import spec_model as M
from support.canary_testlib import POISON, t32, t64
from support.gpu_util import rng_for
from support.table_cases import make_records_case

P32 = POISON[torch.int32]


def recs_of(buf: torch.Tensor) -> list[list[int]]:
    return buf.numpy().view(np.int64)[:, :4].tolist()


def tail_bytes(buf: torch.Tensor) -> bytes:
    """Every byte of a canary buffer past the first 32 of each slot."""
    return buf.numpy()[:, 32:].tobytes()


def expected_buf(buf: torch.Tensor, recs: list[list[int]]) -> bytes:
    b = buf.numpy().copy()
    b.view(np.int64)[:, :4] = np.array(recs, np.int64).reshape(-1, 4)
    return b.tobytes()


# ----------------------------------------------------------------------------------------------- worked cases


def small_buffer(num_slots=4, stride=32):
    buf = kc.allocate_canary_buffer(num_slots, slot_stride_bytes=stride)
    buf.numpy().view(np.int64)[:, :4] = np.arange(num_slots * 4).reshape(num_slots, 4) + 100
    return buf


def test_gather_worked():
    buf = small_buffer(stride=48)
    out = torch.full((5, 4), -7, dtype=torch.int64)
    oor = torch.full((1,), P32, dtype=torch.int32)
    kc.gather_canary_records(canary_buf=buf, slots=t64([2, -1, 4, 0, 2]), records_out=out, out_of_range_out=oor)
    assert out.tolist() == [[108, 109, 110, 111], [0] * 4, [0] * 4, [100, 101, 102, 103], [108, 109, 110, 111]]
    assert int(oor[0]) == 1  # set, not added to the poison


def test_scatter_worked_in_order_with_duplicates():
    buf = small_buffer(stride=40)
    tail = tail_bytes(buf)
    oor = torch.zeros(1, dtype=torch.int32)
    kc.scatter_canary_records(canary_buf=buf, slots=t64([3, -2, 9, 3, 1]),
                              records=t64([[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3], [4, 4, 4, 4], [5, 5, 5, 5]]),
                              out_of_range_out=oor)
    # The last write of slot 3 wins (entries in order); the negative and out-of-range entries write nothing.
    assert recs_of(buf) == [[100, 101, 102, 103], [5] * 4, [108, 109, 110, 111], [4] * 4]
    assert tail_bytes(buf) == tail
    assert int(oor[0]) == 1


def test_copy_worked_across_buffers_and_within_one():
    src = small_buffer()
    dst = small_buffer(num_slots=3, stride=64)
    dst.numpy().view(np.int64)[:, :4] = 0
    tail = tail_bytes(dst)
    oor = torch.zeros(1, dtype=torch.int32)
    # Entries: 1 -> 0, 3 -> 2, a negative source, a destination past dst's 3 slots (counted), a source past
    # src's 4 slots with a negative destination (counted once).
    kc.copy_canary_records(src_canary_buf=src, src_slots=t64([1, 3, -1, 0, 7]), dst_slots=t64([0, 2, 1, 3, -1]),
                           dst_canary_buf=dst, out_of_range_out=oor)
    assert recs_of(dst) == [[104, 105, 106, 107], [0] * 4, [112, 113, 114, 115]]
    assert tail_bytes(dst) == tail and int(oor[0]) == 2
    # dst_canary_buf=None: within src. Disjoint source and destination slots.
    kc.copy_canary_records(src_canary_buf=src, src_slots=t64([0, 1]), dst_slots=t64([2, 3]), out_of_range_out=oor)
    assert recs_of(src) == [[100, 101, 102, 103], [104, 105, 106, 107], [100, 101, 102, 103], [104, 105, 106, 107]]
    assert int(oor[0]) == 0


def test_copy_within_one_buffer_with_overlap_applies_entries_in_order():
    """Unspecified on the GPU; the reference applies the entries in order: a shift by one slot smears slot 0."""
    buf = small_buffer()
    kc.copy_canary_records(src_canary_buf=buf, src_slots=t64([0, 1, 2]), dst_slots=t64([1, 2, 3]))
    assert recs_of(buf) == [[100, 101, 102, 103]] * 4
    # The same through an explicit dst_canary_buf that is the same memory.
    buf = small_buffer()
    kc.copy_canary_records(src_canary_buf=buf, src_slots=t64([0, 1, 2]), dst_slots=t64([1, 2, 3]), dst_canary_buf=buf)
    assert recs_of(buf) == [[100, 101, 102, 103]] * 4


def test_empty_slot_lists_and_no_counter():
    buf = small_buffer()
    before = buf.numpy().tobytes()
    e64 = torch.zeros(0, dtype=torch.int64)
    kc.gather_canary_records(canary_buf=buf, slots=e64, records_out=torch.zeros((0, 4), dtype=torch.int64))
    kc.scatter_canary_records(canary_buf=buf, slots=e64, records=torch.zeros((0, 4), dtype=torch.int64))
    oor = torch.full((1,), 5, dtype=torch.int32)
    kc.copy_canary_records(src_canary_buf=buf, src_slots=e64, dst_slots=e64, out_of_range_out=oor)
    assert buf.numpy().tobytes() == before and int(oor[0]) == 0


# ----------------------------------------------------------------------------------------------- random cases


@pytest.mark.parametrize("seed", range(6))
def test_gather_matches_the_model(seed):
    rng = rng_for(seed, 13)
    c = make_records_case(rng, n=int(rng.integers(2, 200)), stride=int(rng.choice([32, 40, 64])))
    before = c.canary.numpy().tobytes()
    want, want_oor = M.gather_records(recs_of(c.canary), c.slots.tolist())
    kc.gather_canary_records(canary_buf=c.canary, slots=c.slots, records_out=c.records_out,
                             out_of_range_out=c.out_of_range)
    assert c.records_out.tolist() == want and int(c.out_of_range[0]) == want_oor
    assert c.canary.numpy().tobytes() == before
    assert want_oor > 0 and any(s < 0 for s in c.slots.tolist())  # the case has both kinds of skipped entries


@pytest.mark.parametrize("seed", range(6))
def test_scatter_matches_the_model(seed):
    rng = rng_for(seed, 14)
    c = make_records_case(rng, n=int(rng.integers(2, 200)), stride=int(rng.choice([32, 48, 64])))
    recs = recs_of(c.canary)
    want_oor = M.scatter_records(recs, c.slots.tolist(), c.records.tolist())
    want = expected_buf(c.canary, recs)
    kc.scatter_canary_records(canary_buf=c.canary, slots=c.slots, records=c.records, out_of_range_out=c.out_of_range)
    assert c.canary.numpy().tobytes() == want and int(c.out_of_range[0]) == want_oor


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("where", ["other buffer", "same buffer"])
def test_copy_matches_the_model(seed, where):
    rng = rng_for(seed, 15, where)
    c = make_records_case(rng, n=int(rng.integers(2, 120)), num_slots=150, other_slots=120,
                          stride=int(rng.choice([32, 48])), unique_dst=bool(seed % 2))
    dst = c.other if where == "other buffer" else c.canary
    src_recs = recs_of(c.canary)
    dst_recs = src_recs if dst is c.canary else recs_of(dst)
    src_before = c.canary.numpy().tobytes()
    want_oor = M.copy_records(src_recs, dst_recs, c.slots.tolist(), c.dst_slots.tolist())
    want_dst = expected_buf(dst, dst_recs)
    kc.copy_canary_records(src_canary_buf=c.canary, src_slots=c.slots, dst_slots=c.dst_slots,
                           dst_canary_buf=None if dst is c.canary else dst, out_of_range_out=c.out_of_range)
    assert dst.numpy().tobytes() == want_dst and int(c.out_of_range[0]) == want_oor
    if dst is not c.canary:
        assert c.canary.numpy().tobytes() == src_before


def test_gather_then_scatter_round_trips_through_the_host():
    """Offload and reload: records gathered from one buffer and scattered into another buffer at other slots
    equal a direct copy."""
    rng = rng_for(16)
    c = make_records_case(rng, n=50, bad=0.0)
    a, b = c.other.clone(), c.other.clone()
    host = torch.empty((50, 4), dtype=torch.int64)
    kc.gather_canary_records(canary_buf=c.canary, slots=c.slots, records_out=host)
    kc.scatter_canary_records(canary_buf=a, slots=c.dst_slots, records=host)
    kc.copy_canary_records(src_canary_buf=c.canary, src_slots=c.slots, dst_slots=c.dst_slots, dst_canary_buf=b)
    assert torch.equal(a, b) and not torch.equal(a, c.other)


# ----------------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("how", ["copy", "gather-scatter"])
def test_records_moved_with_their_kv_verify_at_the_new_slots(how):
    """Stamp two requests' chains with real KV, move half of request 1's blocks (KV bytes and records) to other
    blocks, remap the block table: the TAIL-style verify is clean. A block whose KV did not arrive (its records
    moved, its bytes not) fails the real-KV check at its new slots, and only there."""
    rng = np.random.default_rng(17)
    bsz, num_blocks = 4, 16
    num_slots = num_blocks * bsz
    kv = torch.from_numpy(rng.integers(0, 256, (num_blocks, bsz * 32), dtype=np.uint8))  # one page per block
    src = kc.RealKvSource(tensor=kv.view(num_blocks, bsz, 32), page_size=bsz, num_bytes_per_token=32, read_bytes=32)
    buf = kc.allocate_canary_buffer(num_slots, slot_stride_bytes=40)
    log = kc.ViolationLog.allocate(ring_capacity=32)
    ctx = log.context(canary_buf=buf, kernel_kind=int(kc.CanaryLaunchTag.TAIL_K_FULL), real_kv_sources=(src,),
                      real_kv_hash_mode=Mode.ALL)
    blocks = t32([[0, 0, 0, 0], [1, 2, 3, 4], [5, 6, 7, 0]])
    kc.launch_canary_write_from_table(
        contexts=(ctx,), req_pool_indices=t64([1, 2]), prefix_lens=t64([0, 0]), extend_seq_lens=t64([16, 10]),
        block_table=blocks, block_size=bsz, input_ids=t64(rng.integers(0, 1 << 31, 26)),
        positions=t64(list(range(16)) + list(range(10))),
        out_cache_loc=t64([b * bsz + o for b in (1, 2, 3, 4) for o in range(bsz)] +
                          [b * bsz + o for b in (5, 6, 7) for o in range(bsz)][:10]))
    verify = dict(contexts=(ctx,), req_pool_indices=t64([1, 2]), prefix_lens=t64([16, 10]), block_size=bsz)
    kc.launch_canary_verify_from_table(block_table=blocks, **verify)
    assert int(log.violation_write_index[0]) == 0
    tail = tail_bytes(buf)

    # Move request 1's blocks 2 and 4 to free blocks 12 and 9: KV bytes, records, then the table.
    moves = {2: 12, 4: 9}
    for old, new in moves.items():
        kv[new] = kv[old]
        kv[old] = torch.from_numpy(rng.integers(0, 256, bsz * 32, dtype=np.uint8))  # the old block is reused
    src_slots = t64([old * bsz + o for old in moves for o in range(bsz)])
    dst_slots = t64([new * bsz + o for new in moves.values() for o in range(bsz)])
    if how == "copy":
        kc.copy_canary_records(src_canary_buf=buf, src_slots=src_slots, dst_slots=dst_slots)
    else:
        host = torch.empty((len(src_slots), 4), dtype=torch.int64)
        kc.gather_canary_records(canary_buf=buf, slots=src_slots, records_out=host)
        kc.scatter_canary_records(canary_buf=buf, slots=dst_slots, records=host)
    assert tail_bytes(buf) == tail
    moved = blocks.clone()
    moved[1] = t32([1, 12, 3, 9])
    kc.launch_canary_verify_from_table(block_table=moved, **verify)
    assert int(log.violation_write_index[0]) == 0
    # The old table now points at blocks whose KV was overwritten: their records still link, the KV does not.
    kc.launch_canary_verify_from_table(block_table=blocks, **verify)
    rows = log.violation_ring[: int(log.violation_write_index[0])].tolist()
    assert {r[1] // bsz for r in rows} == {2, 4} and all(r[7] == int(F.VERIFY_REAL_KV_HASH_MISMATCH) for r in rows)
    log.violation_write_index.zero_()

    # A move whose KV did not arrive intact: block 3's records go to block 13, its bytes arrive corrupted.
    kv[13] = kv[3]
    kv[13, 5] ^= 0x01  # slot 13 * 4 + 0, byte 5
    kc.copy_canary_records(src_canary_buf=buf, src_slots=t64([3 * bsz + o for o in range(bsz)]),
                           dst_slots=t64([13 * bsz + o for o in range(bsz)]))
    moved[1, 2] = 13
    kc.launch_canary_verify_from_table(block_table=moved, **verify)
    rows = log.violation_ring[: int(log.violation_write_index[0])].tolist()
    assert [(r[1], r[7]) for r in rows] == [(13 * bsz, int(F.VERIFY_REAL_KV_HASH_MISMATCH))]
