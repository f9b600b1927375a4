"""CPU runners for the plan-free ops (SPEC §11, §12): run the public op on the cases of ``table_cases`` and the
scalar model of ``spec_model`` on the same state, and compare every byte; and the same launch done the two-pass
way (plan -> verify / plan -> write) for the differential tests."""

from __future__ import annotations

import numpy as np
import torch

import kvcanary as kc
from support import spec_model as M
from support.gpu_util import random_bytes, sort_rows
from support.table_cases import CanaryCase, TableBatch, WriteTokens, to_device


def model_sources(case: CanaryCase) -> list[M.Source]:
    return [M.Source(memory=s.base.numpy().tobytes(), base=0, row_stride=s.base.shape[1], page_size=s.page_size,
                     num_bytes_per_token=s.num_bytes_per_token, read_bytes=s.read_bytes, rows=s.base.shape[0])
            for s in case.sources]


def model_ctxs(cases: list[CanaryCase]) -> list[M.Ctx]:
    """The model's state of each case; cases sharing a log (its ring) share one model log."""
    logs: dict[int, M.Log] = {}
    out = []
    for c in cases:
        key = c.log.ring.data_ptr()
        if key not in logs:
            logs[key] = M.Log(ring=c.log.ring.tolist(), index=int(c.log.index[0]),
                                    slot_runs=int(c.log.slot_counter[0]), kernel_runs=int(c.log.kernel_counter[0]))
        sources, mode = model_sources(c), c.mode
        out.append(M.Ctx(recs=c.canary.numpy().view(np.int64)[:, :4].tolist(), log=logs[key], tag=c.tag,
                         chain_flag=None if c.flag is None else int(c.flag[0]),
                         fp=lambda slot, s=sources, m=mode: M.fingerprint(s, m, slot),
                         covered=lambda slot, s=sources, m=mode: M.covers(s, m, slot)))
    return out


def assert_case_matches(case: CanaryCase, m: M.Ctx, before: bytes) -> None:
    """Canary bytes (records from the model, bytes past 32 as before) and log equal the model's."""
    want = np.frombuffer(before, np.uint8).copy().reshape(case.canary.shape)
    want.view(np.int64)[:, :4] = np.array(m.recs, np.int64).reshape(-1, 4)
    assert case.canary.numpy().tobytes() == want.tobytes(), "canary records"
    assert case.log.ring.tolist() == m.log.ring, "violation ring"
    assert int(case.log.index[0]) == m.log.index, "violation_write_index"
    assert int(case.log.slot_counter[0]) == m.log.slot_runs, "slot_run_counter"
    assert int(case.log.kernel_counter[0]) == m.log.kernel_runs, "kernel_run_counter"


def _table_model_kwargs(b: TableBatch, paged: bool) -> dict:
    if paged:
        return dict(block_table=b.block_table.tolist(), block_size=b.block_size, pad_row=b.pad_row)
    return dict(r2t=b.req_to_token.tolist(), pad_row=b.pad_row)


def _lut(b: TableBatch):
    return None if b.lut is None else b.lut.tolist()


def run_verify_from_table(b: TableBatch, cases: list[CanaryCase], *, paged: bool, check_token: bool = True,
                          rng: np.random.Generator | None = None) -> int:
    """Run ``launch_canary_verify_from_table`` and the model; compare every byte. Returns invalid_rows."""
    rng = rng if rng is not None else np.random.default_rng(0)
    inv = random_bytes(rng, (1,), torch.int32)
    mctx = model_ctxs(cases)
    before = [c.canary.numpy().tobytes() for c in cases]
    kc.launch_canary_verify_from_table(contexts=tuple(c.context() for c in cases), invalid_rows_out=inv,
                                       **b.verify_kwargs(paged, check_token=check_token))
    want_inv = M.verify_from_table(
        contexts=mctx, rpi=b.req_pool_indices.tolist(), prefix=b.prefix_lens.tolist(), window=b.swa_window_size,
        lut=_lut(b), pool=None if b.expected_tokens is None else b.expected_tokens.tolist(),
        valid_lens=None if b.expected_valid_lens is None else b.expected_valid_lens.tolist(), offset=b.token_offset,
        check_token=check_token, **_table_model_kwargs(b, paged))
    for c, m, bb in zip(cases, mctx, before):
        assert c.canary.numpy().tobytes() == bb, "verify wrote a canary buffer"
        assert_case_matches(c, m, bb)
    assert int(inv[0]) == want_inv
    return want_inv


def run_write_from_table(b: TableBatch, cases: list[CanaryCase], tokens: WriteTokens, *, paged: bool,
                         rng: np.random.Generator | None = None) -> int:
    """Run ``launch_canary_write_from_table`` and the model; compare every byte. Returns invalid_rows."""
    rng = rng if rng is not None else np.random.default_rng(0)
    inv = random_bytes(rng, (1,), torch.int32)
    mctx = model_ctxs(cases)
    before = [c.canary.numpy().tobytes() for c in cases]
    kc.launch_canary_write_from_table(contexts=tuple(c.context() for c in cases), invalid_rows_out=inv,
                                      **b.write_kwargs(paged), **tokens.kwargs())
    assert_on = tokens.enable_write_input_assert
    want_inv = M.write_from_table(
        contexts=mctx, rpi=b.req_pool_indices.tolist(), prefix=b.prefix_lens.tolist(),
        extend=b.extend_seq_lens.tolist(), window=b.swa_window_size, lut=_lut(b), ids=tokens.input_ids.tolist(),
        pos=tokens.positions.tolist(), loc=tokens.out_cache_loc.tolist(),
        exp_tok=tokens.expected_input_tokens.tolist() if assert_on else None,
        exp_pos=tokens.expected_input_positions.tolist() if assert_on else None, **_table_model_kwargs(b, paged))
    for c, m, bb in zip(cases, mctx, before):
        assert_case_matches(c, m, bb)
    assert int(inv[0]) == want_inv
    return want_inv


# ----------------------------------------------------------------------------------------------------------
# The same launch the two-pass way


def plan_for(b: TableBatch, *, paged: bool, capacity: int | None = None) -> tuple[kc.VerifyPlan, kc.WritePlan]:
    cap = capacity if capacity is not None else max(1, int(b.prefix_lens.clamp(min=0).sum()))
    vp = kc.VerifyPlan.allocate(verify_capacity=cap)
    wp = kc.WritePlan.allocate(write_req_capacity=max(b.bs, 1))
    kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, verify_capacity=cap, **b.plan_kwargs(paged))
    assert int(vp.enable[0]) == 1
    return vp, wp


def two_pass_verify(b: TableBatch, cases: list[CanaryCase], *, paged: bool, check_token: bool = True) -> None:
    vp, _ = plan_for(b, paged=paged)
    for c in cases:
        kc.launch_canary_verify_kernel(context=c.context(), plan=vp, check_verify_expected_token=check_token)


def two_pass_write(b: TableBatch, cases: list[CanaryCase], tokens: WriteTokens, *, paged: bool) -> None:
    _, wp = plan_for(b, paged=paged)
    for c in cases:
        kc.launch_canary_write_kernel(context=c.context(), plan=wp, **tokens.kwargs())


def assert_same_state(a: list[CanaryCase], b: list[CanaryCase]) -> None:
    """Canary bytes, counters and index equal; appended rows equal as a multiset; the ring past them equal."""
    for x, y in zip(a, b):
        assert x.canary.numpy().tobytes() == y.canary.numpy().tobytes(), "canary bytes"
        for name in ("index", "slot_counter", "kernel_counter"):
            assert torch.equal(getattr(x.log, name), getattr(y.log, name)), name
        n = min(max(int(x.log.index[0]), 0), x.log.ring.shape[0])
        ra, rb = x.log.ring.numpy(), y.log.ring.numpy()
        np.testing.assert_array_equal(sort_rows(ra[:n]), sort_rows(rb[:n]))
        np.testing.assert_array_equal(ra[n:], rb[n:])


def copies(cases: list[CanaryCase]) -> list[CanaryCase]:
    """A deep copy of the cases (a shared log stays shared)."""
    return to_device(cases, "cpu")
