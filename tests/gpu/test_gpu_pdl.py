"""Programmatic dependent launch of the plan-free kernels (kvcanary/ops/cuda/pdl.py): which kernels take it, and
that a write_table / verify_table chain launched back to back, each kernel starting while the one before it ends,
still sees every write of the kernel before it (eager and in one CUDA graph), as the CPU reference does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary.consts import CanaryLaunchTag
from kvcanary.ops.cuda import loader, pdl, specs
from support.gpu_util import LogState, assert_same_bytes, compare_logs, context, rng_for, size

_PLAN_FREE = ("write_table", "verify_table")


def _handles(families: tuple[str, ...] | None = None) -> dict[tuple, int]:
    """(family, name, flags) -> kernel handle on GPU 0 of every specialization in use (of ``families``)."""
    out = {}
    for spec in filter(specs.in_use, specs.all_specs()):
        if families is not None and spec.family not in families:
            continue
        for name in spec.entry_points:
            out[spec.family, name, spec.flags] = loader.function(0, spec.family, name, *spec.flags).ptr
    return out


@pytest.mark.min_compute_capability(90)
def test_write_table_and_verify_table_take_programmatic_launch_on_sm90(cuda_ready, monkeypatch):
    handles = _handles()
    plan_free = {k: h for k, h in handles.items() if k[0] in _PLAN_FREE}
    assert len(plan_free) >= 8 and {k[0] for k in plan_free} == set(_PLAN_FREE)
    assert all(h in pdl.functions for h in plan_free.values()), "a plan-free kernel launched without the attribute"
    others = [k for k, h in handles.items() if k[0] not in _PLAN_FREE and h in pdl.functions]
    assert not others, f"kernels without the wait launched with the attribute: {others}"
    # KVCANARY_PDL=0: the same kernels, loaded again, go back to ordinary launches; and on again after.
    monkeypatch.setenv(pdl.ENV, "0")
    loader._functions.clear()
    try:
        assert not any(h in pdl.functions for h in _handles(_PLAN_FREE).values())
    finally:
        monkeypatch.delenv(pdl.ENV)
        loader._functions.clear()
    assert all(h in pdl.functions for h in _handles(_PLAN_FREE).values())


class _Chain:
    """A decode loop prepared in full before it runs: ``bs`` requests of ``steps`` tokens, step i verifying
    positions 0 .. i-1 of every request and writing position i, all on ``device``, K and V buffers with one log."""

    def __init__(self, rng: np.random.Generator, bs: int, steps: int, device: str):
        self.bs, self.steps = bs, steps
        num_slots = 1 + bs * steps
        slots = (1 + rng.permutation(bs * steps)).reshape(bs, steps)
        tokens = rng.integers(0, 32000, (bs, steps))
        table = np.zeros((bs + 1, steps), np.int32)
        table[1:] = slots
        dev = torch.device(device)
        self.r2t = torch.from_numpy(table).to(dev)
        self.rp = torch.arange(1, bs + 1, dtype=torch.int64, device=dev)
        self.extend = torch.ones(bs, dtype=torch.int64, device=dev)
        self.prefix = [torch.full((bs,), i, dtype=torch.int64, device=dev) for i in range(steps)]
        self.ids = [torch.from_numpy(tokens[:, i].copy()).to(dev) for i in range(steps)]
        self.pos = [torch.full((bs,), i, dtype=torch.int64, device=dev) for i in range(steps)]
        self.loc = [torch.from_numpy(slots[:, i].astype(np.int64)).to(dev) for i in range(steps)]
        self.invalid = torch.zeros(1, dtype=torch.int32, device=dev)
        self.log = LogState(torch.zeros((256, 8), dtype=torch.int64, device=dev),
                            torch.zeros(1, dtype=torch.int32, device=dev),
                            torch.zeros(1, dtype=torch.int64, device=dev),
                            torch.zeros(1, dtype=torch.int64, device=dev))
        self.canary = [kc.allocate_canary_buffer(num_slots, device=dev) for _ in range(2)]
        self.contexts = (context(self.canary[0], self.log, tag=CanaryLaunchTag.HEAD_K_FULL),
                         context(self.canary[1], self.log, tag=CanaryLaunchTag.HEAD_V_FULL))

    def run(self) -> None:
        """Every step's verify, then its write, with nothing between the launches."""
        for i in range(self.steps):
            kc.launch_canary_verify_from_table(
                contexts=self.contexts, req_pool_indices=self.rp, prefix_lens=self.prefix[i], req_to_token=self.r2t,
                invalid_rows_out=self.invalid)
            kc.launch_canary_write_from_table(
                contexts=self.contexts, req_pool_indices=self.rp, prefix_lens=self.prefix[i],
                extend_seq_lens=self.extend, req_to_token=self.r2t, input_ids=self.ids[i], positions=self.pos[i],
                out_cache_loc=self.loc[i], invalid_rows_out=self.invalid)


def _assert_like_reference(cpu: _Chain, gpu: _Chain, what: str) -> None:
    for k in range(2):
        assert_same_bytes(cpu.canary[k], gpu.canary[k], f"{what}: canary buffer {k}")
    assert_same_bytes(cpu.invalid, gpu.invalid, f"{what}: invalid_rows_out")
    compare_logs(cpu.log, LogState(*(x.cpu() for x in (gpu.log.ring, gpu.log.index, gpu.log.slot_counter,
                                                         gpu.log.kernel_counter))))


def test_write_table_verify_table_chain_back_to_back_sees_each_write(cuda_ready, vt_flat32):
    """Each verify reads the records the write just before it stamped (and each write the seeds of the write
    before): a kernel that started before the one before it had finished would read stale records and log
    violations the CPU reference does not have."""
    bs, steps = size(96, 24), size(48, 12)
    seed = int(rng_for("pdl-chain").integers(1 << 62))  # fresh per run, the same for every chain below

    def chain(device: str) -> _Chain:
        return _Chain(np.random.default_rng(seed), bs, steps, device)

    cpu = chain("cpu")
    cpu.run()
    assert int(cpu.log.index[0]) == 0 and int(cpu.log.kernel_counter[0]) == 4 * steps  # K and V, verify and write
    for rnd in range(3):
        eager = chain("cuda")
        eager.run()
        torch.cuda.synchronize()
        _assert_like_reference(cpu, eager, f"eager round {rnd}")
    graphed = chain("cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graphed.run()
    torch.cuda.synchronize()
    assert not graphed.canary[0].any() and int(graphed.log.kernel_counter[0]) == 0  # the capture ran nothing
    g.replay()
    torch.cuda.synchronize()
    _assert_like_reference(cpu, graphed, "graph replay")
