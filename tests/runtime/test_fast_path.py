"""KVCanary.step's fast path (contexts validated once, batch arrays checked per call) gives exactly what the
fully checked public plan-free ops give on the same contexts (CPU; the GPU twin is in tests/gpu)."""

from __future__ import annotations

import torch

from kvcanary.testing.engine import SimConfig
from support.checked_path import fast_and_checked


def test_fast_path_equals_the_checked_ops_over_a_workload():
    a, b = fast_and_checked(SimConfig(seed=11), steps=40)
    for tag in a.buffers:
        assert torch.equal(a.buffers[tag], b.buffers[tag]), tag
    assert torch.equal(a.state.status, b.state.status)
    n = min(int(a.violation_write_index[0]), a.ring_capacity)
    assert torch.equal(a.violation_ring[:n], b.violation_ring[:n])   # the CPU appends in entry order
    assert a.health().tags == b.health().tags and a.health().verified_slots > 0
