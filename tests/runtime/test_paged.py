"""KVCanary and CanaryPlanner on an engine's block table (SPEC §10): the same bytes as the req_to_token table it
expands to, with SGLang's padding row 0 and with vLLM's convention (pad_row = -1, row 0 an ordinary request)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary import CanaryLaunchTag as T


def t64(xs):
    return torch.tensor(xs, dtype=torch.int64)


class PagedEngine:
    """Requests on pages of ``block_size`` slots handed out in a random order; every step a random subset of
    the requests extends by 1-5 tokens. Drives two canaries: one given the block table, one the expanded
    req_to_token."""

    def __init__(self, *, block_size: int, pad_row: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.bs, self.max_reqs, self.max_blocks = block_size, 6, max(8, 64 // block_size)
        n_blocks = self.max_reqs * self.max_blocks + 1
        self.num_slots = n_blocks * block_size
        free = list(self.rng.permutation(np.arange(1, n_blocks)))   # block 0 is never handed out
        self.free = [int(b) for b in free]
        self.pad_row = pad_row
        self.rows = list(range(0 if pad_row == -1 else 1, self.max_reqs))
        self.block_table = torch.full((self.max_reqs, self.max_blocks), -1, dtype=torch.int32)
        self.lens = {r: 0 for r in self.rows}
        kw = dict(num_slots=self.num_slots, max_batch_size=self.max_reqs + 1, mode="quiet", pad_row=pad_row,
                  max_tokens_per_step=self.max_reqs * 5)
        self.paged = kc.KVCanary(block_size=block_size, **kw)
        self.flat = kc.KVCanary(**kw)

    def req_to_token(self) -> torch.Tensor:
        bt = self.block_table.to(torch.int64)
        p = torch.arange(self.max_blocks * self.bs)
        rt = bt[:, p // self.bs] * self.bs + p % self.bs
        return torch.where(bt[:, p // self.bs] < 0, torch.full_like(rt, -1), rt).to(torch.int32)

    def step(self, include: int | None = None):
        rows = [r for r in self.rows if (r == include or self.rng.random() < 0.7)
                and self.lens[r] < self.max_blocks * self.bs - 5]
        rpi, pre, ext, ids, pos, loc = [], [], [], [], [], []
        for r in rows:
            n = int(self.rng.integers(1, 6))
            p0 = self.lens[r]
            for p in range(p0, p0 + n):
                if p % self.bs == 0:
                    self.block_table[r, p // self.bs] = self.free.pop()
                ids.append(int(self.rng.integers(1, 1000)))
                pos.append(p)
                loc.append(int(self.block_table[r, p // self.bs]) * self.bs + p % self.bs)
            rpi.append(r), pre.append(p0), ext.append(n)
            self.lens[r] = p0 + n
        # A padding row, as a CUDA-graph bucket would add one (it writes nothing).
        rpi.append(self.pad_row), pre.append(0), ext.append(0)
        args = dict(req_pool_indices=t64(rpi), prefix_lens=t64(pre), extend_seq_lens=t64(ext), input_ids=t64(ids),
                    positions=t64(pos), out_cache_loc=t64(loc))
        for phase in ("head", "tail"):
            self.paged.step(phase, block_table=self.block_table, **args)
            self.flat.step(phase, req_to_token=self.req_to_token(), **args)


@pytest.mark.parametrize("block_size", [1, 16, 64])
@pytest.mark.parametrize("pad_row", [0, -1])
def test_block_table_equals_its_expansion_over_many_steps(block_size, pad_row):
    e = PagedEngine(block_size=block_size, pad_row=pad_row, seed=block_size + pad_row)
    for _ in range(25):
        e.step()
    assert e.paged.poll(sync=True) == [] and e.flat.poll(sync=True) == []
    for tag in e.paged.buffers:
        assert torch.equal(e.paged.buffers[tag], e.flat.buffers[tag]), tag
    hp, hf = e.paged.health(), e.flat.health()
    assert hp.tags == hf.tags and hp.invalid_rows == hf.invalid_rows == 0
    assert hp.tags[T.HEAD_K_FULL].verified_slots > 0
    # A corrupted table entry is caught the same way through either form.
    r = next(r for r in e.rows if 2 < e.lens[r] < e.max_blocks * block_size - 5)
    e.block_table[r, 0] = e.free[-1]
    e.step(include=r)
    vp, vf = e.paged.poll(sync=True), e.flat.poll(sync=True)
    assert vp and [v.to_row() for v in vp] == [v.to_row() for v in vf]


def test_block_table_needs_block_size_and_exactly_one_table():
    c = kc.KVCanary(num_slots=16, max_batch_size=2, mode="quiet")
    args = dict(req_pool_indices=t64([1]), prefix_lens=t64([0]), extend_seq_lens=t64([1]), input_ids=t64([5]),
                positions=t64([0]), out_cache_loc=t64([3]))
    bt = torch.zeros((2, 4), dtype=torch.int32)
    with pytest.raises(ValueError, match=r"kv-canary: step\(block_table=...\) needs a canary built with block_size"):
        c.step("head", block_table=bt, **args)
    with pytest.raises(ValueError, match="exactly one of req_to_token and block_table, got neither"):
        c.step("head", **args)
    with pytest.raises(ValueError, match="got both"):
        c.step("head", block_table=bt, req_to_token=bt, **args)


def test_planner_plans_from_a_block_table():
    bt = torch.tensor([[0, 0], [3, 1]], dtype=torch.int32)   # request 1: pages 3 then 1 of 4 slots
    r2t = torch.tensor([[0] * 8, [12, 13, 14, 15, 4, 5, 6, 7]], dtype=torch.int32)
    out = []
    for kw in (dict(block_table=bt), dict(req_to_token=r2t)):
        p = kc.CanaryPlanner(max_batch_size=2, verify_capacity=16, block_size=4)
        vp, wp = p.plan(req_pool_indices=t64([1, 0]), prefix_lens=t64([6, 0]), extend_seq_lens=t64([1, 1]), **kw)
        out.append([x.clone() for x in (vp.verify_slot_indices, vp.verify_prev_slot_indices, vp.verify_num_valid,
                                        wp.write_offsets, wp.write_seed_slot_indices)])
    for a, b in zip(*out):
        assert torch.equal(a, b)
    assert out[0][0][:6].tolist() == [12, 13, 14, 15, 4, 5] and out[0][4][0].item() == 5
