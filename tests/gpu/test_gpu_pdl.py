"""Programmatic dependent launch of the plan-free kernels (kvcanary/ops/cuda/pdl.py): which kernels take it, and
that a write_table / verify_table chain launched back to back (a long prefill's write, then a verify and a write
per decode step), each kernel starting while the one before it ends, still sees every write of the kernel before
it (eager and in one CUDA graph), as the CPU reference does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary.consts import CanaryLaunchTag
from kvcanary.ops.cuda import loader, pdl, specs
from support.gpu_util import LogState, assert_same_bytes, compare_logs, context, rng_for, size, t

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
    """A batch prepared in full before it runs, on ``device``: ``bs`` requests, a prefill of ``plen`` tokens each,
    then ``steps`` decode steps, step i verifying positions 0 .. plen + i - 1 of every request and writing position
    plen + i; K and V buffers with one log. The prefill write walks chains of ``plen`` tokens (about 100 ns a
    token), so the verify launched right after it would read records it has not stamped yet, were it to start
    before the write has finished."""

    def __init__(self, rng: np.random.Generator, bs: int, plen: int, steps: int, device: str):
        width = plen + steps
        num_slots = 1 + bs * width
        slots = (1 + rng.permutation(bs * width)).reshape(bs, width)
        tokens = rng.integers(0, 32000, (bs, width))
        table = np.zeros((bs + 1, width), np.int32)
        table[1:] = slots
        dev = torch.device(device)

        def on_dev(a: np.ndarray) -> torch.Tensor:
            return t(np.asarray(a, dtype=np.int64)).to(dev)

        self.r2t = torch.from_numpy(table).to(dev)
        self.rp = torch.arange(1, bs + 1, dtype=torch.int64, device=dev)
        # the prefill: one row of plen tokens per request (prefix 0); then one token per request per step
        self.prefill = (on_dev(np.zeros(bs)), on_dev(np.full(bs, plen)), on_dev(tokens[:, :plen].ravel()),
                        on_dev(np.tile(np.arange(plen), bs)), on_dev(slots[:, :plen].ravel()))
        self.decode = [(on_dev(np.full(bs, plen + i)), on_dev(np.ones(bs)), on_dev(tokens[:, plen + i]),
                        on_dev(np.full(bs, plen + i)), on_dev(slots[:, plen + i])) for i in range(steps)]
        self.invalid = torch.zeros(1, dtype=torch.int32, device=dev)
        self.log = LogState(torch.zeros((256, 8), dtype=torch.int64, device=dev),
                            torch.zeros(1, dtype=torch.int32, device=dev),
                            torch.zeros(1, dtype=torch.int64, device=dev),
                            torch.zeros(1, dtype=torch.int64, device=dev))
        self.canary = [kc.allocate_canary_buffer(num_slots, device=dev) for _ in range(2)]
        self.contexts = (context(self.canary[0], self.log, tag=CanaryLaunchTag.HEAD_K_FULL),
                         context(self.canary[1], self.log, tag=CanaryLaunchTag.HEAD_V_FULL))

    def _write(self, prefix, extend, ids, pos, loc) -> None:
        kc.launch_canary_write_from_table(
            contexts=self.contexts, req_pool_indices=self.rp, prefix_lens=prefix, extend_seq_lens=extend,
            req_to_token=self.r2t, input_ids=ids, positions=pos, out_cache_loc=loc, invalid_rows_out=self.invalid)

    def run(self) -> None:
        """The prefill's write, then every step's verify and write, with nothing launched between them."""
        self._write(*self.prefill)
        for step in self.decode:
            kc.launch_canary_verify_from_table(
                contexts=self.contexts, req_pool_indices=self.rp, prefix_lens=step[0], req_to_token=self.r2t,
                invalid_rows_out=self.invalid)
            self._write(*step)


def _assert_like_reference(cpu: _Chain, gpu: _Chain, what: str) -> None:
    for k in range(2):
        assert_same_bytes(cpu.canary[k], gpu.canary[k], f"{what}: canary buffer {k}")
    assert_same_bytes(cpu.invalid, gpu.invalid, f"{what}: invalid_rows_out")
    compare_logs(cpu.log, gpu.log.to("cpu"))


def test_write_table_verify_table_chain_back_to_back_sees_each_write(cuda_ready, vt_flat32):
    """Each verify reads the records the write just before it stamped (the first one, all of the prefill's long
    chains), and each write the seeds the write before it stamped: a kernel that started touching memory before
    the one before it had finished would read unstamped records, log violations the CPU reference does not have
    and chain its records from the wrong hashes. (Kernels built without ``griddepcontrol.wait`` fail this on an
    H100: GPU_SUITE.md.)"""
    bs, plen, steps = 8, size(2048, 128), size(12, 4)
    seed = int(rng_for("pdl-chain").integers(1 << 62))  # fresh per run, the same for every chain below

    def chain(device: str) -> _Chain:
        return _Chain(np.random.default_rng(seed), bs, plen, steps, device)

    cpu = chain("cpu")
    cpu.run()
    # K and V: the prefill's write, then a verify and a write per step; every slot stamped once, each verify
    # checking every position before its step, all clean
    assert int(cpu.log.index[0]) == 0 and int(cpu.log.kernel_counter[0]) == 2 * (1 + 2 * steps)
    stamped, verified = bs * (plen + steps), bs * sum(plen + i for i in range(steps))
    assert int(cpu.log.slot_counter[0]) == 2 * (stamped + verified)
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
