"""Multi-step serving pipelines on the CPU (SPEC §7 last paragraph: plan, verify the prefix, write the new
tokens), driven by a small simulated engine: prefill, decode, a prefix shared by two requests, chunked prefill,
padding rows and sliding-window attention. Clean runs must report nothing; each run corrupted in one way must be
detected. Every verify and write is also checked byte for byte against the scalar model (``Rig``)."""

from __future__ import annotations

import pytest
import torch

import kvcanary as kc
from kvcanary import FailReason as F
from kvcanary import RealKvHashMode as Mode
from support.canary_testlib import PoolSource, Rig, t64

CHAIN, POS, RKV, TOK, WPOS = (int(F.VERIFY_CHAIN_HASH_MISMATCH), int(F.VERIFY_POSITION_MISMATCH),
                              int(F.VERIFY_REAL_KV_HASH_MISMATCH), int(F.VERIFY_TOKEN_MISMATCH),
                              int(F.WRITE_POSITION_MISMATCH))


class Engine:
    """A toy serving engine around one canary buffer.

    ``r2t`` maps (request row, position) to a KV index; with sliding-window attention (``window > 0``) that is
    a full-pool index translated by ``lut`` into the SWA pool, which the canary covers. Real KV is a byte pool
    (one 32-byte row per canary slot) that the "forward" fills from (token, position).
    """

    def __init__(self, *, num_slots=40, max_reqs=6, max_seq_len=24, mode=Mode.PARTIAL, window=0, full_slots=80,
                 capacity=96, req_capacity=4):
        self.kv = PoolSource.make(rows=num_slots, page_size=1, num_bytes_per_token=32,
                                  generator=torch.Generator().manual_seed(0))
        self.rig = Rig.make(num_slots, ring=64, flag=1, pools=[self.kv], mode=mode,
                            tag=int(kc.CanaryLaunchTag.TAIL_K_FULL))
        self.r2t = torch.zeros((max_reqs, max_seq_len), dtype=torch.int32)
        self.expected = torch.zeros((max_reqs, max_seq_len), dtype=torch.int32)
        self.free = list(range(num_slots - 1, 0, -1))  # slot 0 is the padding slot
        self.window = window
        self.full_free = list(range(full_slots, 0, -1))
        self.lut = torch.zeros(full_slots + 1, dtype=torch.int64) if window else None
        self.tokens: dict[int, list[int]] = {}
        self.vp = kc.VerifyPlan.allocate(verify_capacity=capacity)
        self.wp = kc.WritePlan.allocate(write_req_capacity=req_capacity)
        self.invalid = torch.zeros(1, dtype=torch.int32)
        self.rows: list[tuple] = []

    # ------------------------------------------------------------------ engine bookkeeping

    def slot_of(self, rp: int, p: int) -> int:
        x = int(self.r2t[rp, p])
        return int(self.lut[x]) if self.window else x

    def alloc(self) -> tuple[int, int]:
        """(r2t value, canary slot) of a fresh KV location."""
        slot = self.free.pop()
        if not self.window:
            return slot, slot
        full = self.full_free.pop()
        self.lut[full] = slot
        return full, slot

    def fork(self, src: int, dst: int, n: int) -> None:
        """``dst`` reuses the first ``n`` cached positions of ``src`` (radix/prefix cache)."""
        self.r2t[dst, :n] = self.r2t[src, :n]
        self.tokens[dst] = self.tokens[src][:n]

    def evict_out_of_window(self, rp: int) -> None:
        """SWA: positions before the window lose their SWA slot (LUT entry -> 0, slot back to the free list)."""
        n = len(self.tokens[rp])
        for p in range(max(0, n - self.window)):
            x = int(self.r2t[rp, p])
            if int(self.lut[x]) != 0:
                self.free.append(int(self.lut[x]))
                self.lut[x] = 0

    def forward_kv(self, slot: int, tok: int, pos: int) -> None:
        self.kv.big[slot] = (torch.arange(32) * 7 + tok * 31 + pos * 131) % 256

    # ------------------------------------------------------------------ one step

    def step(self, batch, *, prefix_override=None, positions_hook=None, loc_hook=None, alloc_hook=None,
             before_write=None) -> list[tuple]:
        """Run one step for ``batch`` = [(request row, new tokens)] (row 0 = a padding row with no tokens)."""
        rpi, prefix, extend, ids, pos, loc, flat, offs = [], [], [], [], [], [], [], [0]
        for rp, new in batch:
            pre = len(self.tokens.get(rp, [])) if rp else 0
            if prefix_override and rp in prefix_override:
                pre = prefix_override[rp]
            rpi.append(rp)
            prefix.append(pre)
            extend.append(len(new))
            for k, tok in enumerate(new):
                x, slot = alloc_hook(rp, pre + k) if alloc_hook else self.alloc()
                self.r2t[rp, pre + k] = x
                ids.append(tok)
                pos.append(pre + k)
                loc.append(slot)
            hist = (self.tokens.get(rp, [])[:pre] + list(new)) if rp else []
            flat += hist
            offs.append(len(flat))
        kc.launch_scatter_req_token_ids_kernel(flat_in=t64(flat), offsets=t64(offs), req_pool_indices=t64(rpi),
                                               pool_out=self.expected)
        kc.launch_canary_plan_kernels(
            verify_plan_out=self.vp, write_plan_out=self.wp, req_pool_indices=t64(rpi), prefix_lens=t64(prefix),
            extend_seq_lens=t64(extend), req_to_token=self.r2t, swa_window_size=self.window,
            full_to_swa_index_mapping=self.lut, verify_capacity=self.vp.capacity,
            req_to_verify_expected_tokens=self.expected, req_to_verify_expected_tokens_valid_lens=t64(prefix),
            kv_token_id_vs_position_offset=0, invalid_rows_out=self.invalid)
        assert int(self.invalid[0]) == 0 and int(self.vp.enable[0]) == 1
        rows = self.rig.verify(self.vp, check_token=True)
        for slot, tok, p in zip(loc, ids, pos):
            self.forward_kv(slot, tok, p)
        if positions_hook:
            pos = positions_hook(pos)
        if loc_hook:
            loc = loc_hook(loc)
        if before_write:
            before_write()
        rows += self.rig.write(self.wp, ids=ids, pos=pos, loc=loc)
        for (rp, new), pre in zip(batch, prefix):
            if rp:
                self.tokens[rp] = self.tokens.get(rp, [])[:pre] + list(new)
                if self.window:
                    self.evict_out_of_window(rp)
        self.rows += rows
        return rows


def prefill_and_decode(e: Engine, steps: int = 4) -> None:
    e.step([(1, [11, 12, 13, 14, 15]), (2, [21, 22, 23])])
    for k in range(steps):
        e.step([(1, [16 + k]), (2, [24 + k])])


# ------------------------------------------------------------------------------------------------ clean runs


@pytest.mark.parametrize("mode", list(Mode))
def test_prefill_then_decode_is_clean(mode):
    e = Engine(mode=mode)
    prefill_and_decode(e)
    assert e.rows == []
    assert e.rig.kernel_runs == 2 * 5
    verified = sum((5 + k) + (3 + k) for k in range(4))
    written = 8 + 2 * 4
    assert e.rig.slot_runs == verified + written
    if mode != Mode.NONE:
        assert all(r[3] != 0 for r in [e.rig.recs()[e.slot_of(1, p)] for p in range(9)])


def test_shared_prefix_is_clean_for_both_requests():
    e = Engine()
    e.step([(1, [11, 12, 13, 14, 15, 16])])
    e.fork(1, 3, 4)  # request 3 reuses positions 0..3 of request 1
    e.step([(1, [17]), (3, [40, 41, 42])])
    # request 3's first new token chains on request 1's slot of position 3.
    assert e.wp.write_seed_slot_indices[1].item() == e.slot_of(1, 3)
    for k in range(3):
        e.step([(3, [43 + k]), (1, [18 + k])])
    assert e.rows == []
    assert e.slot_of(3, 2) == e.slot_of(1, 2) and e.slot_of(3, 4) != e.slot_of(1, 4)


def test_chunked_prefill_with_concurrent_decode_and_padding_rows_is_clean():
    e = Engine()
    e.step([(2, [1, 2, 3])])
    prompt = list(range(100, 110))
    e.step([(1, prompt[:4]), (2, [4]), (0, [])])
    e.step([(0, []), (1, prompt[4:8]), (2, [5])])
    e.step([(1, prompt[8:]), (0, []), (2, [6])])
    e.step([(1, [7]), (2, [8]), (0, [])])
    assert e.rows == []
    assert e.tokens[1] == [*prompt, 7]


def test_sliding_window_with_slot_reuse_outside_the_window_is_clean():
    e = Engine(window=3, num_slots=12)
    e.step([(1, [10, 11, 12, 13, 14]), (2, [20, 21])])
    for k in range(8):  # SWA slots of evicted positions are recycled by later tokens of both requests
        e.step([(1, [15 + k]), (2, [22 + k])])
    assert e.rows == []
    assert int(e.vp.verify_num_valid[0]) == 6  # 3 positions per request in the window
    assert int(e.vp.verify_prev_slot_indices[0]) == 0  # the window's first predecessor was evicted


# ------------------------------------------------------------------------------------------------ corruptions


def bits_by_slot(rows) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in rows:
        out[r[1]] = out.get(r[1], 0) | r[7]
    return out


def test_swapped_slot_mapping_is_detected():
    e = Engine()
    prefill_and_decode(e, steps=1)
    a, b = e.slot_of(1, 2), e.slot_of(1, 3)
    e.r2t[1, 2], e.r2t[1, 3] = b, a
    rows = e.step([(1, [30]), (2, [31])])
    got = bits_by_slot(rows)
    assert set(got) == {a, b, e.slot_of(1, 4)}
    assert got[b] & POS and got[b] & TOK and got[b] & CHAIN
    assert got[a] & POS and got[a] & TOK


def test_double_allocation_overwrite_is_detected():
    e = Engine()
    prefill_and_decode(e, steps=1)
    victim = e.slot_of(1, 1)
    # The allocator hands request 2's next token a slot request 1 still uses.
    rows = e.step([(2, [50])], alloc_hook=lambda rp, p: (victim, victim))
    assert rows == []  # nothing verified reads the victim yet
    rows = e.step([(1, [60])])
    got = bits_by_slot(rows)
    # The victim now holds request 2's record, consistent with the real KV request 2 wrote there.
    assert got[victim] == CHAIN | POS | TOK
    assert set(got) == {victim, e.slot_of(1, 2)}  # and its successor's chain no longer matches
    assert got[e.slot_of(1, 2)] == CHAIN


def test_wrong_prefix_reuse_is_detected_as_a_token_mismatch():
    e = Engine()
    e.step([(1, [11, 12, 13, 14, 15])])
    e.fork(1, 3, 4)
    e.tokens[3][2] = 99  # request 3's real prompt differs at position 2, but the cache matched it anyway
    rows = e.step([(3, [40])])
    assert len(rows) == 1
    r = rows[0]
    assert (r[1], r[2], r[3], r[4], r[7]) == (e.slot_of(1, 2), 2, 13, 99, TOK)


@pytest.mark.parametrize("mode", [Mode.PARTIAL, Mode.ALL])
def test_real_kv_corruption_is_detected(mode):
    e = Engine(mode=mode)
    prefill_and_decode(e, steps=1)
    slot = e.slot_of(2, 1)
    e.kv.big[slot, 5] ^= 0x80
    rows = e.step([(1, [30]), (2, [31])])
    assert [(r[1], r[7]) for r in rows] == [(slot, RKV)]


def test_real_kv_corruption_past_the_partial_window_needs_all_mode():
    for mode, want in ((Mode.PARTIAL, []), (Mode.ALL, [RKV])):
        e = Engine(mode=mode)
        prefill_and_decode(e, steps=1)
        e.kv.big[e.slot_of(2, 1), 20] ^= 0x01
        assert [r[7] for r in e.step([(2, [31])])] == want


def test_lost_write_is_detected():
    e = Engine()
    e.step([(1, [11, 12, 13])])
    # The token at position 3 is never stamped (its KV write went nowhere), but req_to_token says it is cached.
    e.step([(1, [14, 15])], loc_hook=lambda loc: [-1, loc[1]])
    rows = e.step([(1, [16])])
    got = bits_by_slot(rows)
    assert got[e.slot_of(1, 3)] & (CHAIN | POS | TOK)
    assert got[e.slot_of(1, 4)] == CHAIN  # its successor was chained on position 2


def test_position_off_by_one_is_caught_at_write_and_verify():
    e = Engine()
    e.step([(1, [11, 12, 13])])
    rows = e.step([(1, [14])], positions_hook=lambda pos: [pos[0] + 1])
    slot = e.slot_of(1, 3)
    assert [(r[1], r[2], r[6], r[7]) for r in rows] == [(slot, 4, 3, WPOS)]
    rows = e.step([(1, [15])])
    # Verify sees the stored position 4 where 3 is expected; the next write chains on it and expects 5.
    assert bits_by_slot(rows) == {slot: POS, e.slot_of(1, 4): WPOS}


def test_chunked_prefill_with_a_stale_prefix_is_detected():
    e = Engine()
    prompt = list(range(100, 112))
    e.step([(1, prompt[:4])])
    e.step([(1, prompt[4:8])])
    # The third chunk is planned with a prefix one short (7 instead of 8): its tokens land at positions 7..10
    # and the cached token of position 7 is lost. The chunk is internally consistent (chain and positions).
    rows = e.step([(1, prompt[8:])], prefix_override={1: 7})
    assert rows == []
    # The scheduler still believes positions 0..10 hold prompt[0..10]: the next verify sees every shifted token.
    e.tokens[1] = prompt[:11]
    rows = e.step([(1, [200])])
    assert bits_by_slot(rows) == {e.slot_of(1, p): TOK for p in range(7, 11)}
    assert [(r[2], r[3], r[4]) for r in rows] == [(p, prompt[p + 1], prompt[p]) for p in range(7, 11)]


def test_chunked_prefill_with_a_wrong_seed_position_is_caught_by_the_chain_position_assert():
    e = Engine()
    prompt = list(range(100, 110))
    e.step([(1, prompt[:4])])
    # The second chunk's positions skip one (a stale position counter): the write's chain-position assert fires.
    rows = e.step([(1, prompt[4:8])], positions_hook=lambda pos: [p + 1 for p in pos])
    assert [(r[2], r[6], r[7]) for r in rows] == [(5, 4, WPOS)]


def test_use_after_free_of_a_shared_prefix_slot_is_detected():
    e = Engine()
    e.step([(1, [11, 12, 13, 14])])
    e.fork(1, 3, 3)
    e.step([(3, [40])])
    freed = e.slot_of(1, 1)
    e.free.append(freed)  # request 1 finishes and its slots are freed although request 3 still shares them
    del e.tokens[1]
    e.step([(2, [70, 71])], alloc_hook=lambda rp, p: (e.free.pop(), freed) if p == 0 else e.alloc())
    rows = e.step([(3, [41])])
    assert bits_by_slot(rows)[freed] == CHAIN | POS | TOK


def test_swa_lut_corruption_is_detected():
    e = Engine(window=3, num_slots=16)
    e.step([(1, [10, 11, 12, 13, 14]), (2, [20, 21, 22])])
    e.step([(1, [15]), (2, [23])])
    x1, x2 = int(e.r2t[1, 4]), int(e.r2t[2, 2])
    e.lut[x1], e.lut[x2] = int(e.lut[x2]), int(e.lut[x1])  # two in-window translations swapped
    rows = e.step([(1, [16]), (2, [24])])
    got = bits_by_slot(rows)
    assert got[e.slot_of(1, 4)] & (POS | TOK) and got[e.slot_of(2, 2)] & (POS | TOK)


def test_verify_capacity_overflow_skips_the_step_visibly():
    e = Engine(capacity=6)
    e.step([(1, [1, 2, 3, 4])])
    e.kv.big[e.slot_of(1, 0), 0] ^= 1  # would be detected if verified
    kc.launch_canary_plan_kernels(
        verify_plan_out=e.vp, write_plan_out=e.wp, req_pool_indices=t64([1, 2]), prefix_lens=t64([4, 3]),
        extend_seq_lens=t64([0, 0]), req_to_token=e.r2t, swa_window_size=0, full_to_swa_index_mapping=None,
        verify_capacity=6, req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0)
    assert (int(e.vp.verify_num_valid[0]), int(e.vp.enable[0])) == (6, 0)
    runs = e.rig.slot_runs
    assert e.rig.verify(e.vp) == []
    assert e.rig.slot_runs == runs  # nothing was checked: the host must warn
    rows = e.step([(1, [5])])
    assert [r[7] for r in rows] == [RKV]
