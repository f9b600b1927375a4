"""Long-lived objects are validated once and never launched stale: an array replaced or resized under a
KVCanary after construction is noticed and re-checked at the next step (CPU; the GPU twin is in tests/gpu)."""

from __future__ import annotations

import torch

import kvcanary as kc
from kvcanary import CanaryLaunchTag as T
from kvcanary import FailReason as F
from kvcanary.runtime.status import Kernel
from support.scenarios import every_layer_scenario


def t64(xs):
    return torch.tensor(xs, dtype=torch.int64)


class Engine:
    """One request on a 16-slot pool with a real K pool of 2-slot pages."""

    def __init__(self):
        self.k = torch.zeros((8, 2, 16), dtype=torch.int16)  # 16 slots x 32 bytes
        self.src = kc.RealKvSource(tensor=self.k, page_size=2, num_bytes_per_token=32, read_bytes=32)
        self.c = kc.KVCanary(num_slots=16, max_batch_size=2, k_sources=(self.src,), mode="quiet")
        self.r2t = torch.zeros((2, 16), dtype=torch.int32)
        self.n = 0

    def step(self, slot: int):
        p = self.n
        self.r2t[1, p] = slot
        b = dict(req_pool_indices=t64([1]), prefix_lens=t64([p]), extend_seq_lens=t64([1]), req_to_token=self.r2t,
                 input_ids=t64([100 + p]), positions=t64([p]), out_cache_loc=t64([slot]))
        self.c.step("head", **b)
        self.k.view(-1, 16)[slot] = 7 * p + 1
        self.c.step("tail", **b)
        self.n += 1


def source_view(e: Engine):
    return e.c.state.views[(T.TAIL_K_FULL, Kernel.VERIFY)].real_kv_sources[0]


def test_a_source_moved_to_new_storage_is_revalidated_and_read_there():
    e = Engine()
    for s in (1, 2, 3):
        e.step(s)
    old_ptr = source_view(e).tensor.ptr
    # The engine re-allocates its pool (same bytes, new storage) under the same tensor object.
    e.k.set_(e.k.clone())
    e.step(4)
    assert source_view(e).tensor.ptr == e.k.data_ptr() != old_ptr
    assert e.c.poll(sync=True) == []
    # Reads really go to the new storage: a flipped byte there is caught by the next TAIL verify.
    kc.faults.flip_real_kv_byte(e.src, slot=2, byte=0, mask=0x10)
    e.step(5)
    found = e.c.poll(sync=True)
    assert [(v.tag, v.slot) for v in found if v.reasons & F.VERIFY_REAL_KV_HASH_MISMATCH] == [(T.TAIL_K_FULL, 2)]


def test_a_source_shrunk_in_place_is_revalidated_and_uncovered_slots_are_reported():
    e = Engine()
    for s in (1, 2, 9):
        e.step(s)
    e.k.resize_(2, 2, 16)   # now covers slots 0..3 only: slot 9's bytes are gone
    e.step(3)
    assert source_view(e).num_rows == 2
    found = e.c.poll(sync=True)
    # The TAIL verify touches slot 9 (position 2 of the prefix): reported, never read.
    assert [(v.tag, v.slot, v.reasons) for v in found] == [(T.TAIL_K_FULL, 9, F.SLOT_OUT_OF_RANGE)]


def test_a_canary_buffer_shrunk_in_place_is_revalidated():
    e = Engine()
    for s in (1, 2):
        e.step(s)
    e.c.buffers[T.HEAD_K_FULL].resize_(8, 32)   # 8 records left
    e.step(12)                                   # slot 12 is past the shrunken HEAD buffer
    views = e.c.state.views[(T.HEAD_K_FULL, Kernel.WRITE)]
    assert views.num_slots == 8
    found = e.c.poll(sync=True)
    assert [(v.tag, v.slot) for v in found if v.reasons == F.SLOT_OUT_OF_RANGE] == [(T.HEAD_K_FULL, 12)]


def test_unchanged_state_is_not_revalidated():
    e = Engine()
    e.step(1)
    assert e.c.state.refresh() is False
    before = e.c.state.views
    e.step(2)
    assert e.c.state.views is before


def test_fresh_batch_tensors_every_step_are_fine():
    # Engines re-allocate their batch tensors every step (and the allocator reuses addresses): only the
    # long-lived state is cached, so nothing stale is launched.
    e = Engine()
    for s in range(1, 12):
        e.r2t = e.r2t.clone()
        e.step(s)
    assert e.c.poll(sync=True) == []


def test_every_layer_fingerprinted_head_tail_and_sweep():
    """32 layers x K/V: one source per layer and half (SPEC §13); a byte flipped in the last layer's V of an idle
    slot is found by the sweep, and of a live slot by the next TAIL."""
    swept, tailed = every_layer_scenario("cpu")
    assert swept == [(T.SWEEP_V_FULL, 6, F.VERIFY_REAL_KV_HASH_MISMATCH)]
    assert tailed == [(T.TAIL_K_FULL, 2, F.VERIFY_REAL_KV_HASH_MISMATCH)]
