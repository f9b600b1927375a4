"""Scenarios the CPU and the GPU tests both run (each test asserts on what a scenario returns)."""

from __future__ import annotations

import torch

import kvcanary as kc


def every_layer_scenario(device):
    """32 layers x K/V, one source per layer and half (SPEC §13), on ``device``: two requests stamped, a byte
    flipped in the last layer's V of an idle slot, a sweep; then one in the last layer's K of a live slot and a
    step. Returns the (tag, slot, reasons) of what the sweep found and of what the step found."""
    d = torch.device(device)

    def t64(xs):
        return torch.tensor(list(xs), dtype=torch.int64, device=d)

    layers = [torch.zeros((16, 16), dtype=torch.int16, device=d) for _ in range(64)]   # 16 slots x 32 bytes each
    srcs = [kc.RealKvSource(tensor=t, page_size=1, num_bytes_per_token=32, read_bytes=32) for t in layers]
    c = kc.KVCanary(num_slots=16, max_batch_size=2, k_sources=srcs[:32], v_sources=srcs[32:], mode="quiet",
                    device=d)
    r2t = torch.zeros((3, 8), dtype=torch.int32, device=d)
    r2t[1, :4] = torch.tensor([1, 2, 3, 4], dtype=torch.int32, device=d)
    r2t[2, :4] = torch.tensor([5, 6, 7, 8], dtype=torch.int32, device=d)
    for row, base in ((1, 1), (2, 5)):
        b = dict(req_pool_indices=t64([row]), prefix_lens=t64([0]), extend_seq_lens=t64([4]), req_to_token=r2t,
                 input_ids=t64([10, 11, 12, 13]), positions=t64([0, 1, 2, 3]), out_cache_loc=t64(range(base, base + 4)))
        c.step("head", **b)
        for i, t in enumerate(layers):
            t[base:base + 4] = i + 3
        c.step("tail", **b)
    assert c.poll(sync=True) == []  # clean so far
    layers[-1][6, 0] ^= 0x10                   # request 2 is idle now: only a sweep sees it
    c.sweep(t64([5, 6, 7, 8]), t64([0, 1, 2, 3]), t64([-1, 5, 6, 7]))
    swept = [(v.tag, v.slot, v.reasons) for v in c.poll(sync=True)]
    layers[31][2, 3] ^= 0x01                   # the last layer's K of a live slot
    b = dict(req_pool_indices=t64([1]), prefix_lens=t64([4]), extend_seq_lens=t64([1]), req_to_token=r2t,
             input_ids=t64([14]), positions=t64([4]), out_cache_loc=t64([9]))
    r2t[1, 4] = 9
    c.step("head", **b)
    c.step("tail", **b)
    tailed = [(v.tag, v.slot, v.reasons) for v in c.poll(sync=True)]
    return swept, tailed
