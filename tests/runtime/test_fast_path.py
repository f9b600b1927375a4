"""KVCanary.step's fast path (contexts validated once, batch arrays checked per call) gives exactly what the
fully checked public plan-free ops give on the same contexts (CPU; the GPU twin is in tests/gpu)."""

from __future__ import annotations

import torch

from kvcanary.testing.engine import ServingSimulation, SimConfig
from support.checked_path import checked_step


def test_fast_path_equals_the_checked_ops_over_a_workload():
    cfg = SimConfig(seed=11)
    fast, checked = ServingSimulation(cfg), ServingSimulation(cfg)

    def via_ops(sim, phase, **args):
        args["swa_out_cache_loc"] = sim.canary._swa_locs.translate(args["out_cache_loc"]).clone()
        checked_step(sim.canary, phase, **args)

    checked.canary.step = lambda phase, **args: via_ops(checked, phase, **args)
    for _ in range(40):
        fast.step()
        checked.step()
    a, b = fast.canary, checked.canary
    for tag in a.buffers:
        assert torch.equal(a.buffers[tag], b.buffers[tag]), tag
    assert torch.equal(a.state.status, b.state.status)
    n = min(int(a.violation_write_index[0]), a.ring_capacity)
    assert torch.equal(a.violation_ring[:n], b.violation_ring[:n])
    assert a.health().tags == b.health().tags and a.health().verified_slots > 0
