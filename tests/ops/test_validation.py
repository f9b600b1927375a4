"""SPEC §9: every validation message, exact text, and nothing written on error.

Each case starts from a valid call, breaks exactly one thing, poisons every output buffer, and checks the
exception class, the exact message, and that no byte of any storage reachable from the arguments changed.
A wrong dtype raises one class that is both a ``TypeError`` and a ``ValueError``; the other value checks raise
a plain ``ValueError``; a wrong kind of object (not an int, not an array, not a plan...) a ``TypeError``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kvcanary as kc
from kvcanary.errors import KvCanaryDTypeError
from kvcanary.ops import validation
from support.canary_testlib import PoolSource, poison, storage_snapshot, t32, t64, tensors_in

PLAN = "launch_canary_plan_kernels"
WRITE = "launch_canary_write_kernel"


# ----------------------------------------------------------------------------------------------- machinery


def outputs_of(op: str, kw: dict) -> list[torch.Tensor]:
    if op == "plan":
        return tensors_in([kw["verify_plan_out"], kw["write_plan_out"], kw["invalid_rows_out"]])
    if op in ("write", "verify"):
        ctx = kw["context"]
        if not isinstance(ctx, kc.VerifyOrWriteContext):
            return []
        return tensors_in([ctx.canary_buf, ctx.violation_ring, ctx.violation_write_index, ctx.slot_run_counter,
                           ctx.kernel_run_counter])
    return tensors_in([kw["pool_out"]])


OPS = {
    "plan": kc.launch_canary_plan_kernels,
    "write": kc.launch_canary_write_kernel,
    "verify": kc.launch_canary_verify_kernel,
    "scatter": kc.launch_scatter_req_token_ids_kernel,
}


def expect(op: str, kw: dict, exc: type, message) -> None:
    poison(*outputs_of(op, kw))
    before = storage_snapshot(tensors_in(kw))
    with pytest.raises(Exception) as info:
        OPS[op](**kw)
    e = info.value
    want = message(kw) if callable(message) else message
    assert str(e) == want
    if exc is KvCanaryDTypeError:
        assert type(e) is KvCanaryDTypeError and isinstance(e, TypeError) and isinstance(e, ValueError)
    else:
        assert type(e) is exc, f"{type(e).__name__} raised, {exc.__name__} expected"
    assert storage_snapshot(tensors_in(kw)) == before, "a buffer was modified by a failing call"


# ----------------------------------------------------------------------------------------------- valid calls


def plan_kwargs() -> dict:
    r2t = torch.arange(32, dtype=torch.int32).reshape(4, 8)
    return dict(
        verify_plan_out=kc.VerifyPlan.allocate(verify_capacity=64),
        write_plan_out=kc.WritePlan.allocate(write_req_capacity=4),
        req_pool_indices=t64([1, 2]), prefix_lens=t64([3, 0]), extend_seq_lens=t64([1, 4]), req_to_token=r2t,
        swa_window_size=0, full_to_swa_index_mapping=None, verify_capacity=64,
        req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0, invalid_rows_out=torch.zeros(1, dtype=torch.int32),
    )


def context(num_slots: int = 8, **overrides) -> kc.VerifyOrWriteContext:
    log = kc.ViolationLog.allocate(ring_capacity=4)
    kw = dict(
        canary_buf=kc.allocate_canary_buffer(num_slots), kernel_kind=0, violation_ring=log.violation_ring,
        violation_write_index=log.violation_write_index, slot_run_counter=log.slot_run_counter,
        kernel_run_counter=log.kernel_run_counter, real_kv_sources=(), real_kv_hash_mode=0,
        enable_chain_position_assert=kc.allocate_chain_position_flag(1),
    )
    kw.update(overrides)
    return kc.VerifyOrWriteContext(**kw)


def write_kwargs() -> dict:
    wp = kc.WritePlan.allocate(write_req_capacity=2)
    wp.write_offsets.copy_(t64([0, 2, 3]))
    wp.write_num_valid_reqs[0] = 2
    return dict(context=context(), plan=wp, input_ids=t64([1, 2, 3]), positions=t64([0, 1, 0]),
                out_cache_loc=t64([1, 2, 3]), enable_write_input_assert=False, expected_input_tokens=None,
                expected_input_positions=None)


def verify_kwargs() -> dict:
    vp = kc.VerifyPlan.allocate(verify_capacity=4)
    return dict(context=context(), plan=vp, check_verify_expected_token=True)


def scatter_kwargs() -> dict:
    return dict(flat_in=t64([1, 2, 3]), offsets=t64([0, 1, 3]), req_pool_indices=t64([1, 2]),
                pool_out=torch.zeros((3, 4), dtype=torch.int32))


KWARGS = {"plan": plan_kwargs, "write": write_kwargs, "verify": verify_kwargs, "scatter": scatter_kwargs}


@pytest.mark.parametrize("op", list(OPS))
def test_baseline_calls_are_valid(op):
    OPS[op](**KWARGS[op]())


def rep(obj, **fields):
    return dataclasses.replace(obj, **fields)


def misaligned_u8(rows: int, cols: int, offset: int) -> torch.Tensor:
    big = torch.zeros(rows * cols + 64, dtype=torch.uint8)
    base = (-big.data_ptr()) % 64  # a 64-aligned start, then `offset` bytes further
    return big[base + offset: base + offset + rows * cols].view(rows, cols)


# ----------------------------------------------------------------------------------------------- cases

V, T, D = ValueError, TypeError, KvCanaryDTypeError
VP, WP = "verify_plan_out", "write_plan_out"


def _vp(kw, **f):
    kw[VP] = rep(kw[VP], **f)


def _wp(kw, **f):
    kw[WP] = rep(kw[WP], **f)


PLAN_CASES = [
    # The examples of the issue, verbatim.
    ("capacity-negative", lambda kw: kw.update(verify_capacity=-3), V,
     "kv-canary: verify_capacity must be non-negative, got -3"),
    ("capacity-mismatch", lambda kw: kw.update(verify_capacity=65), V,
     "kv-canary: launch_canary_plan_kernels verify_capacity=65 does not match "
     "verify_plan_out.verify_slot_indices.shape[0]=64"),
    ("vplan-capacity-zero", lambda kw: (kw.update(verify_capacity=0), _vp(kw, **{
        f: torch.zeros(0, dtype=torch.int64) for f in ("verify_slot_indices", "verify_expected_tokens",
                                                       "verify_expected_positions", "verify_prev_slot_indices")})),
     V, "kv-canary: VerifyPlan verify_capacity must be positive, got 0"),
    ("wplan-capacity-zero", lambda kw: _wp(kw, write_seed_slot_indices=torch.zeros(0, dtype=torch.int64),
                                           write_offsets=torch.zeros(1, dtype=torch.int64)),
     V, "kv-canary: WritePlan write_req_capacity must be positive, got 0"),
    ("offsets-len-zero", lambda kw: _wp(kw, write_offsets=torch.zeros(0, dtype=torch.int64)), V,
     "kv-canary: write_offsets_len must be positive, got 0"),
    ("offsets-len-mismatch", lambda kw: _wp(kw, write_offsets=torch.zeros(4, dtype=torch.int64)), V,
     "kv-canary: write_offsets_len must equal write_req_capacity + 1, got 4 and 4"),
    ("bs-exceeds", lambda kw: kw.update(req_pool_indices=t64([1] * 5), prefix_lens=t64([0] * 5),
                                        extend_seq_lens=t64([0] * 5)), V,
     "kv-canary: bs=5 exceeds write_req_capacity=4"),
    ("stride0-zero", lambda kw: kw.update(req_to_token=torch.zeros((4, 0), dtype=torch.int32)), V,
     "kv-canary: req_to_token_stride0 must be positive, got 0"),
    ("swa-without-lut", lambda kw: kw.update(swa_window_size=4), V,
     "kv-canary: launch_canary_plan_kernels requires full_to_swa_index_mapping when swa_window_size > 0"),
    ("lut-empty", lambda kw: kw.update(swa_window_size=4, full_to_swa_index_mapping=torch.zeros(0, dtype=torch.int64)),
     V, "kv-canary: lut_len must be positive when has_swa_lut is True"),
    ("rpi-dtype", lambda kw: kw.update(req_pool_indices=t32([1, 2])), D,
     "kv-canary: req_pool_indices must have dtype int64, got int32"),
    ("rpi-contiguous", lambda kw: kw.update(req_pool_indices=t64([1, 9, 2, 9])[::2]), V,
     "kv-canary: req_pool_indices must be contiguous"),
    ("prefix-length", lambda kw: kw.update(prefix_lens=t64([1, 2, 3])), V,
     "kv-canary: prefix_lens length must be 2, got 3"),
    ("rpi-ndim", lambda kw: kw.update(req_pool_indices=t64([[1, 2]])), V,
     "kv-canary: req_pool_indices must be 1-D, got shape (1, 2)"),
    # Other own-range checks.
    ("capacity-not-int", lambda kw: kw.update(verify_capacity="64"), T, "kv-canary: verify_capacity must be an int, got str"),
    ("capacity-bool", lambda kw: kw.update(verify_capacity=True), T, "kv-canary: verify_capacity must be an int, got bool"),
    ("capacity-too-big", lambda kw: kw.update(verify_capacity=2**63), V,
     "kv-canary: verify_capacity must fit in int64, got 9223372036854775808"),
    ("window-negative", lambda kw: kw.update(swa_window_size=-1), V, "kv-canary: swa_window_size must be non-negative, got -1"),
    ("offset-not-int", lambda kw: kw.update(kv_token_id_vs_position_offset=1.0), T,
     "kv-canary: kv_token_id_vs_position_offset must be an int, got float"),
    ("vplan-type", lambda kw: kw.update(verify_plan_out=kw[WP]), T,
     "kv-canary: verify_plan_out must be a VerifyPlan, got WritePlan"),
    ("wplan-type", lambda kw: kw.update(write_plan_out=None), T, "kv-canary: write_plan_out must be a WritePlan, got NoneType"),
    ("vplan-field-dtype", lambda kw: _vp(kw, verify_expected_tokens=torch.zeros(64, dtype=torch.int32)), D,
     "kv-canary: verify_plan_out.verify_expected_tokens must have dtype int64, got int32"),
    ("vplan-field-length", lambda kw: _vp(kw, verify_prev_slot_indices=torch.zeros(63, dtype=torch.int64)), V,
     "kv-canary: verify_plan_out.verify_prev_slot_indices length must be 64, got 63"),
    ("vplan-positions-length", lambda kw: _vp(kw, verify_expected_positions=torch.zeros(65, dtype=torch.int64)), V,
     "kv-canary: verify_plan_out.verify_expected_positions length must be 64, got 65"),
    ("vplan-slots-ndim", lambda kw: _vp(kw, verify_slot_indices=torch.zeros((8, 8), dtype=torch.int64)), V,
     "kv-canary: verify_plan_out.verify_slot_indices must be 1-D, got shape (8, 8)"),
    ("vplan-slots-contiguous", lambda kw: _vp(kw, verify_slot_indices=torch.zeros(128, dtype=torch.int64)[::2]), V,
     "kv-canary: verify_plan_out.verify_slot_indices must be contiguous"),
    ("vplan-num-valid-dtype", lambda kw: _vp(kw, verify_num_valid=torch.zeros(1, dtype=torch.int64)), D,
     "kv-canary: verify_plan_out.verify_num_valid must have dtype int32, got int64"),
    ("vplan-enable-length", lambda kw: _vp(kw, enable=torch.zeros(2, dtype=torch.int32)), V,
     "kv-canary: verify_plan_out.enable length must be 1, got 2"),
    ("wplan-seeds-dtype", lambda kw: _wp(kw, write_seed_slot_indices=torch.zeros(4, dtype=torch.int32)), D,
     "kv-canary: write_plan_out.write_seed_slot_indices must have dtype int64, got int32"),
    ("wplan-offsets-dtype", lambda kw: _wp(kw, write_offsets=torch.zeros(5, dtype=torch.float32)), D,
     "kv-canary: write_plan_out.write_offsets must have dtype int64, got float32"),
    ("wplan-num-valid-length", lambda kw: _wp(kw, write_num_valid_reqs=torch.zeros(0, dtype=torch.int32)), V,
     "kv-canary: write_plan_out.write_num_valid_reqs length must be 1, got 0"),
    ("extend-length", lambda kw: kw.update(extend_seq_lens=t64([1])), V, "kv-canary: extend_seq_lens length must be 2, got 1"),
    ("extend-dtype", lambda kw: kw.update(extend_seq_lens=t32([1, 1])), D,
     "kv-canary: extend_seq_lens must have dtype int64, got int32"),
    ("rpi-none", lambda kw: kw.update(req_pool_indices=None), T, "kv-canary: req_pool_indices must be an array, got None"),
    ("rpi-list", lambda kw: kw.update(req_pool_indices=[1, 2]), T,
     "kv-canary: req_pool_indices must be a torch tensor or an array with __dlpack__, got list"),
    ("r2t-dtype", lambda kw: kw.update(req_to_token=torch.zeros((4, 8), dtype=torch.int64)), D,
     "kv-canary: req_to_token must have dtype int32, got int64"),
    ("r2t-ndim", lambda kw: kw.update(req_to_token=torch.zeros(8, dtype=torch.int32)), V,
     "kv-canary: req_to_token must be 2-D, got shape (8,)"),
    ("r2t-contiguous", lambda kw: kw.update(req_to_token=torch.zeros((8, 4), dtype=torch.int32).T), V,
     "kv-canary: req_to_token must be contiguous"),
    ("r2t-no-rows", lambda kw: kw.update(req_to_token=torch.zeros((0, 8), dtype=torch.int32)), V,
     "kv-canary: req_to_token must have at least one row (row 0 is padding), got shape (0, 8)"),
    ("lut-dtype", lambda kw: kw.update(swa_window_size=4, full_to_swa_index_mapping=t32([1, 2])), D,
     "kv-canary: full_to_swa_index_mapping must have dtype int64, got int32"),
    ("lut-without-swa", lambda kw: kw.update(full_to_swa_index_mapping=t64([1, 2])), V,
     "kv-canary: launch_canary_plan_kernels full_to_swa_index_mapping must be None when swa_window_size == 0"),
    ("pool-without-lens", lambda kw: kw.update(req_to_verify_expected_tokens=torch.zeros((4, 8), dtype=torch.int32)), V,
     "kv-canary: launch_canary_plan_kernels requires req_to_verify_expected_tokens and "
     "req_to_verify_expected_tokens_valid_lens together, got only req_to_verify_expected_tokens"),
    ("lens-without-pool", lambda kw: kw.update(req_to_verify_expected_tokens_valid_lens=t64([1, 1])), V,
     "kv-canary: launch_canary_plan_kernels requires req_to_verify_expected_tokens and "
     "req_to_verify_expected_tokens_valid_lens together, got only the valid lens"),
    ("pool-dtype", lambda kw: kw.update(req_to_verify_expected_tokens=torch.zeros((4, 8), dtype=torch.int64),
                                        req_to_verify_expected_tokens_valid_lens=t64([1, 1])), D,
     "kv-canary: req_to_verify_expected_tokens must have dtype int32, got int64"),
    ("pool-rows", lambda kw: kw.update(req_to_verify_expected_tokens=torch.zeros((3, 8), dtype=torch.int32),
                                       req_to_verify_expected_tokens_valid_lens=t64([1, 1])), V,
     "kv-canary: req_to_verify_expected_tokens must have at least req_to_token's 4 rows, got 3"),
    ("lens-length", lambda kw: kw.update(req_to_verify_expected_tokens=torch.zeros((4, 8), dtype=torch.int32),
                                         req_to_verify_expected_tokens_valid_lens=t64([1])), V,
     "kv-canary: req_to_verify_expected_tokens_valid_lens length must be 2, got 1"),
    ("invalid-rows-dtype", lambda kw: kw.update(invalid_rows_out=torch.zeros(1, dtype=torch.int64)), D,
     "kv-canary: invalid_rows_out must have dtype int32, got int64"),
    ("invalid-rows-length", lambda kw: kw.update(invalid_rows_out=torch.zeros(2, dtype=torch.int32)), V,
     "kv-canary: invalid_rows_out length must be 1, got 2"),
    # Own range before consistency.
    ("negative-before-mismatch-and-bs", lambda kw: kw.update(verify_capacity=-3, req_pool_indices=t64([1] * 9),
                                                             prefix_lens=t64([0] * 9), extend_seq_lens=t64([0] * 9)),
     V, "kv-canary: verify_capacity must be non-negative, got -3"),
    ("window-negative-before-lut-presence", lambda kw: kw.update(swa_window_size=-2), V,
     "kv-canary: swa_window_size must be non-negative, got -2"),
    ("zero-plan-before-mismatch", lambda kw: (kw.update(verify_capacity=5), _vp(kw, **{
        f: torch.zeros(0, dtype=torch.int64) for f in ("verify_slot_indices", "verify_expected_tokens",
                                                       "verify_expected_positions", "verify_prev_slot_indices")})),
     V, "kv-canary: VerifyPlan verify_capacity must be positive, got 0"),
    ("length-before-bs", lambda kw: kw.update(req_pool_indices=t64([1] * 5), prefix_lens=t64([0] * 4),
                                              extend_seq_lens=t64([0] * 5)), V,
     "kv-canary: prefix_lens length must be 5, got 4"),
    ("dtype-before-capacity-mismatch", lambda kw: kw.update(verify_capacity=3, req_to_token=t64([[1]])), D,
     "kv-canary: req_to_token must have dtype int32, got int64"),
]


@pytest.mark.parametrize("mutate, exc, message", [c[1:] for c in PLAN_CASES], ids=[c[0] for c in PLAN_CASES])
def test_plan_validation(mutate, exc, message):
    kw = plan_kwargs()
    mutate(kw)
    expect("plan", kw, exc, message)


def _ctx(kw, **f):
    kw["context"] = rep(kw["context"], **f)


def _src(num_slots=8):
    return PoolSource.make(rows=num_slots, page_size=1, num_bytes_per_token=16).source


CONTEXT_CASES = [
    ("context-type", lambda kw: kw.update(context={}), T, "kv-canary: context must be a VerifyOrWriteContext, got dict"),
    ("kernel-kind", lambda kw: _ctx(kw, kernel_kind=12), V,
     "kv-canary: context.kernel_kind must be a CanaryLaunchTag (0..11), got 12"),
    ("kernel-kind-negative", lambda kw: _ctx(kw, kernel_kind=-1), V,
     "kv-canary: context.kernel_kind must be a CanaryLaunchTag (0..11), got -1"),
    ("kernel-kind-type", lambda kw: _ctx(kw, kernel_kind="HEAD"), T, "kv-canary: context.kernel_kind must be an int, got str"),
    ("mode", lambda kw: _ctx(kw, real_kv_hash_mode=3), V,
     "kv-canary: context.real_kv_hash_mode must be a RealKvHashMode (0, 1 or 2), got 3"),
    ("buf-dtype", lambda kw: _ctx(kw, canary_buf=torch.zeros((8, 4), dtype=torch.int64)), D,
     "kv-canary: context.canary_buf must have dtype uint8, got int64"),
    ("buf-ndim", lambda kw: _ctx(kw, canary_buf=torch.zeros(256, dtype=torch.uint8)), V,
     "kv-canary: context.canary_buf must be 2-D, got shape (256,)"),
    ("buf-contiguous", lambda kw: _ctx(kw, canary_buf=torch.zeros((8, 64), dtype=torch.uint8)[:, :32]), V,
     "kv-canary: context.canary_buf must be contiguous"),
    ("buf-no-slots", lambda kw: _ctx(kw, canary_buf=torch.zeros((0, 32), dtype=torch.uint8)), V,
     "kv-canary: context.canary_buf must have at least one slot, got shape (0, 32)"),
    ("buf-stride-small", lambda kw: _ctx(kw, canary_buf=torch.zeros((8, 24), dtype=torch.uint8)), V,
     "kv-canary: context.canary_buf slot_stride_bytes must be a multiple of 8 and >= 32, got 24"),
    ("buf-stride-odd", lambda kw: _ctx(kw, canary_buf=torch.zeros((8, 36), dtype=torch.uint8)), V,
     "kv-canary: context.canary_buf slot_stride_bytes must be a multiple of 8 and >= 32, got 36"),
    ("buf-misaligned", lambda kw: _ctx(kw, canary_buf=misaligned_u8(8, 32, 4)), V,
     lambda kw: f"kv-canary: context.canary_buf data pointer must be 8-byte aligned, got {kw['context'].canary_buf.data_ptr():#x}"),
    ("ring-dtype", lambda kw: _ctx(kw, violation_ring=torch.zeros((4, 8), dtype=torch.int32)), D,
     "kv-canary: context.violation_ring must have dtype int64, got int32"),
    ("ring-width", lambda kw: _ctx(kw, violation_ring=torch.zeros((4, 7), dtype=torch.int64)), V,
     "kv-canary: context.violation_ring must have shape [ring_capacity, 8], got (4, 7)"),
    ("ring-empty", lambda kw: _ctx(kw, violation_ring=torch.zeros((0, 8), dtype=torch.int64)), V,
     "kv-canary: context.violation_ring ring_capacity must be positive, got 0"),
    ("ring-ndim", lambda kw: _ctx(kw, violation_ring=torch.zeros(32, dtype=torch.int64)), V,
     "kv-canary: context.violation_ring must be 2-D, got shape (32,)"),
    ("index-dtype", lambda kw: _ctx(kw, violation_write_index=torch.zeros(1, dtype=torch.int64)), D,
     "kv-canary: context.violation_write_index must have dtype int32, got int64"),
    ("index-length", lambda kw: _ctx(kw, violation_write_index=torch.zeros(2, dtype=torch.int32)), V,
     "kv-canary: context.violation_write_index length must be 1, got 2"),
    ("slot-counter-dtype", lambda kw: _ctx(kw, slot_run_counter=torch.zeros(1, dtype=torch.int32)), D,
     "kv-canary: context.slot_run_counter must have dtype int64, got int32"),
    ("kernel-counter-length", lambda kw: _ctx(kw, kernel_run_counter=torch.zeros(3, dtype=torch.int64)), V,
     "kv-canary: context.kernel_run_counter length must be 1, got 3"),
    ("sources-type", lambda kw: _ctx(kw, real_kv_sources="abc"), T,
     "kv-canary: context.real_kv_sources must be a tuple, got str"),
    # SGLang's message (callers match "at most 4 RealKvSource"); kvcanary's own ops take any number.
    ("too-many-sources", lambda kw: _ctx(kw, real_kv_sources=tuple(_src() for _ in range(5)), real_kv_hash_mode=1), V,
     "kv-canary: context.real_kv_sources may hold at most 4 RealKvSource, got 5"),
    ("source-type", lambda kw: _ctx(kw, real_kv_sources=(torch.zeros((8, 16), dtype=torch.uint8),)), T,
     "kv-canary: context.real_kv_sources[0] must be a RealKvSource, got Tensor"),
    ("flag-dtype", lambda kw: _ctx(kw, enable_chain_position_assert=torch.ones(1, dtype=torch.int64)), D,
     "kv-canary: context.enable_chain_position_assert must have dtype int32, got int64"),
    ("flag-length", lambda kw: _ctx(kw, enable_chain_position_assert=torch.ones(2, dtype=torch.int32)), V,
     "kv-canary: context.enable_chain_position_assert length must be 1, got 2"),
    ("flag-not-array", lambda kw: _ctx(kw, enable_chain_position_assert=1), T,
     "kv-canary: context.enable_chain_position_assert must be a torch tensor or an array with __dlpack__, got int"),
]


def _plan(kw, **f):
    kw["plan"] = rep(kw["plan"], **f)


@pytest.mark.parametrize("op", ["write", "verify"])
def test_a_source_covering_fewer_slots_than_the_canary_is_accepted(op):
    """SPEC §9: a source smaller than the canary is no longer refused at launch (it used to be, with
    "covers 2 slots, fewer than canary_buf's num_slots=8"); the slots it does not cover are reported when
    touched (tests/ops/test_realkv_coverage.py)."""
    kw = KWARGS[op]()
    _ctx(kw, real_kv_sources=(_src(), _src(2)), real_kv_hash_mode=1)
    OPS[op](**kw)
    assert int(kw["context"].kernel_run_counter[0]) == 1


WRITE_CASES = CONTEXT_CASES + [
    ("assert-flag-type", lambda kw: kw.update(enable_write_input_assert="yes"), T,
     "kv-canary: enable_write_input_assert must be a bool, got 'yes'"),
    ("assert-flag-int", lambda kw: kw.update(enable_write_input_assert=2), T,
     "kv-canary: enable_write_input_assert must be a bool, got 2"),
    ("plan-type", lambda kw: kw.update(plan=kc.VerifyPlan.allocate(verify_capacity=1)), T,
     "kv-canary: plan must be a WritePlan, got VerifyPlan"),
    ("plan-offsets-dtype", lambda kw: _plan(kw, write_offsets=t32([0, 2, 3])), D,
     "kv-canary: plan.write_offsets must have dtype int64, got int32"),
    ("plan-offsets-len", lambda kw: _plan(kw, write_offsets=t64([0, 2, 3, 3])), V,
     "kv-canary: write_offsets_len must equal write_req_capacity + 1, got 4 and 2"),
    ("plan-num-valid-dtype", lambda kw: _plan(kw, write_num_valid_reqs=t64([2])), D,
     "kv-canary: plan.write_num_valid_reqs must have dtype int32, got int64"),
    ("ids-dtype", lambda kw: kw.update(input_ids=t32([1, 2, 3])), D, "kv-canary: input_ids must have dtype int64, got int32"),
    ("ids-ndim", lambda kw: kw.update(input_ids=t64([[1, 2, 3]])), V, "kv-canary: input_ids must be 1-D, got shape (1, 3)"),
    ("positions-length", lambda kw: kw.update(positions=t64([0, 1])), V, "kv-canary: positions length must be 3, got 2"),
    ("loc-dtype", lambda kw: kw.update(out_cache_loc=t32([1, 2, 3])), D,
     "kv-canary: out_cache_loc must have dtype int64, got int32"),
    ("loc-contiguous", lambda kw: kw.update(out_cache_loc=t64([1, 0, 2, 0, 3, 0])[::2]), V,
     "kv-canary: out_cache_loc must be contiguous"),
    ("assert-without-tokens", lambda kw: kw.update(enable_write_input_assert=True, expected_input_positions=t64([0, 1, 0])),
     V, f"kv-canary: {WRITE} requires expected_input_tokens when enable_write_input_assert is True"),
    ("assert-without-positions", lambda kw: kw.update(enable_write_input_assert=True, expected_input_tokens=t64([1, 2, 3])),
     V, f"kv-canary: {WRITE} requires expected_input_positions when enable_write_input_assert is True"),
    ("tokens-without-assert", lambda kw: kw.update(expected_input_tokens=t64([1, 2, 3])), V,
     f"kv-canary: {WRITE} expected_input_tokens must be None when enable_write_input_assert is False"),
    ("positions-without-assert", lambda kw: kw.update(expected_input_positions=t64([1, 2, 3])), V,
     f"kv-canary: {WRITE} expected_input_positions must be None when enable_write_input_assert is False"),
    ("expected-tokens-dtype", lambda kw: kw.update(enable_write_input_assert=True, expected_input_tokens=t32([1, 2, 3]),
                                                   expected_input_positions=t64([0, 1, 0])), D,
     "kv-canary: expected_input_tokens must have dtype int64, got int32"),
    ("expected-positions-length", lambda kw: kw.update(enable_write_input_assert=True, expected_input_tokens=t64([1, 2, 3]),
                                                       expected_input_positions=t64([0, 1])), V,
     "kv-canary: expected_input_positions length must be 3, got 2"),
]


@pytest.mark.parametrize("mutate, exc, message", [c[1:] for c in WRITE_CASES], ids=[c[0] for c in WRITE_CASES])
def test_write_validation(mutate, exc, message):
    kw = write_kwargs()
    mutate(kw)
    expect("write", kw, exc, message)


VERIFY_CASES = CONTEXT_CASES + [
    ("check-type", lambda kw: kw.update(check_verify_expected_token=None), T,
     "kv-canary: check_verify_expected_token must be a bool, got None"),
    ("plan-type", lambda kw: kw.update(plan=kc.WritePlan.allocate(write_req_capacity=1)), T,
     "kv-canary: plan must be a VerifyPlan, got WritePlan"),
    ("plan-slots-dtype", lambda kw: _plan(kw, verify_slot_indices=t32([0, 0, 0, 0])), D,
     "kv-canary: plan.verify_slot_indices must have dtype int64, got int32"),
    ("plan-tokens-length", lambda kw: _plan(kw, verify_expected_tokens=t64([0, 0, 0])), V,
     "kv-canary: plan.verify_expected_tokens length must be 4, got 3"),
    ("plan-enable-dtype", lambda kw: _plan(kw, enable=torch.ones(1, dtype=torch.bool)), D,
     "kv-canary: plan.enable must have dtype int32, got bool"),
    ("plan-capacity-zero", lambda kw: _plan(kw, **{f: torch.zeros(0, dtype=torch.int64) for f in (
        "verify_slot_indices", "verify_expected_tokens", "verify_expected_positions", "verify_prev_slot_indices")}), V,
     "kv-canary: VerifyPlan verify_capacity must be positive, got 0"),
]


@pytest.mark.parametrize("mutate, exc, message", [c[1:] for c in VERIFY_CASES], ids=[c[0] for c in VERIFY_CASES])
def test_verify_validation(mutate, exc, message):
    kw = verify_kwargs()
    mutate(kw)
    expect("verify", kw, exc, message)


SCATTER_CASES = [
    ("flat-dtype", lambda kw: kw.update(flat_in=t32([1, 2, 3])), D, "kv-canary: flat_in must have dtype int64, got int32"),
    ("offsets-length", lambda kw: kw.update(offsets=t64([0, 1])), V, "kv-canary: offsets length must be 3, got 2"),
    ("rpi-dtype", lambda kw: kw.update(req_pool_indices=t32([1, 2])), D,
     "kv-canary: req_pool_indices must have dtype int64, got int32"),
    ("pool-dtype", lambda kw: kw.update(pool_out=torch.zeros((3, 4), dtype=torch.int64)), D,
     "kv-canary: pool_out must have dtype int32, got int64"),
    ("pool-ndim", lambda kw: kw.update(pool_out=torch.zeros(12, dtype=torch.int32)), V,
     "kv-canary: pool_out must be 2-D, got shape (12,)"),
    ("pool-contiguous", lambda kw: kw.update(pool_out=torch.zeros((4, 3), dtype=torch.int32).T), V,
     "kv-canary: pool_out must be contiguous"),
]


@pytest.mark.parametrize("mutate, exc, message", [c[1:] for c in SCATTER_CASES], ids=[c[0] for c in SCATTER_CASES])
def test_scatter_validation(mutate, exc, message):
    kw = scatter_kwargs()
    mutate(kw)
    expect("scatter", kw, exc, message)


# ----------------------------------------------------------------------------------------------- constructors


def test_allocation_helpers():
    with pytest.raises(ValueError) as e:
        kc.WritePlan.allocate(write_req_capacity=-1)
    assert str(e.value) == "kv-canary: WritePlan write_req_capacity must be positive, got -1"
    with pytest.raises(ValueError) as e:
        kc.VerifyPlan.allocate(verify_capacity=0)
    assert str(e.value) == "kv-canary: VerifyPlan verify_capacity must be positive, got 0"
    with pytest.raises(ValueError) as e:
        kc.ViolationLog.allocate(ring_capacity=0)
    assert str(e.value) == "kv-canary: ViolationLog ring_capacity must be positive, got 0"
    with pytest.raises(ValueError) as e:
        kc.allocate_canary_buffer(0)
    assert str(e.value) == "kv-canary: canary buffer num_slots must be positive, got 0"
    with pytest.raises(ValueError) as e:
        kc.allocate_canary_buffer(4, slot_stride_bytes=36)
    assert str(e.value) == "kv-canary: slot_stride_bytes must be a multiple of 8 and >= 32, got 36"
    with pytest.raises(TypeError) as e:
        kc.VerifyPlan.allocate(verify_capacity=2.0)
    assert str(e.value) == "kv-canary: VerifyPlan verify_capacity must be an int, got float"


def test_allocations_have_the_documented_shapes_and_sizes():
    vp = kc.VerifyPlan.allocate(verify_capacity=5)
    assert [tuple(t.shape) for t in (vp.verify_slot_indices, vp.verify_num_valid, vp.enable)] == [(5,), (1,), (1,)]
    assert int(vp.enable[0]) == 1 and vp.capacity == 5
    assert sum(t.numel() * t.element_size() for t in tensors_in(vp)) == kc.VerifyPlan.allocation_bytes(5)
    wp = kc.WritePlan.allocate(write_req_capacity=3)
    assert tuple(wp.write_offsets.shape) == (4,) and wp.capacity == 3
    assert sum(t.numel() * t.element_size() for t in tensors_in(wp)) == kc.WritePlan.allocation_bytes(3)
    log = kc.ViolationLog.allocate(ring_capacity=7)
    assert tuple(log.violation_ring.shape) == (7, 8)
    assert sum(t.numel() * t.element_size() for t in tensors_in(log)) == kc.ViolationLog.allocation_bytes(7)


def _pool(shape, dtype=torch.uint8):
    return torch.zeros(shape, dtype=dtype)


SOURCE_CASES = [
    ("page-size-zero", dict(tensor=_pool((4, 64)), page_size=0, num_bytes_per_token=16, read_bytes=16), V,
     "kv-canary: RealKvSource page_size must be positive, got 0"),
    ("page-size-type", dict(tensor=_pool((4, 64)), page_size="2", num_bytes_per_token=16, read_bytes=16), T,
     "kv-canary: RealKvSource page_size must be an int, got str"),
    ("nbpt-zero", dict(tensor=_pool((4, 64)), page_size=1, num_bytes_per_token=0, read_bytes=16), V,
     "kv-canary: RealKvSource num_bytes_per_token must be positive, got 0"),
    ("nbpt-multiple", dict(tensor=_pool((4, 64)), page_size=1, num_bytes_per_token=24, read_bytes=16), V,
     "kv-canary: RealKvSource num_bytes_per_token must be a positive multiple of 16, got 24"),
    ("read-multiple", dict(tensor=_pool((4, 64)), page_size=1, num_bytes_per_token=32, read_bytes=8), V,
     "kv-canary: RealKvSource read_bytes must be a positive multiple of 16, got 8"),
    ("read-negative", dict(tensor=_pool((4, 64)), page_size=1, num_bytes_per_token=32, read_bytes=-16), V,
     "kv-canary: RealKvSource read_bytes must be positive, got -16"),
    ("read-too-many", dict(tensor=_pool((4, 64)), page_size=1, num_bytes_per_token=32, read_bytes=48), V,
     "kv-canary: RealKvSource read_bytes must be <= num_bytes_per_token=32, got 48"),
    ("ndim", dict(tensor=_pool(64), page_size=1, num_bytes_per_token=16, read_bytes=16), V,
     "kv-canary: RealKvSource tensor must have ndim >= 2, got shape (64,)"),
    ("inner-contiguous", dict(tensor=_pool((4, 8, 4)).transpose(1, 2), page_size=1, num_bytes_per_token=16,
                              read_bytes=16), V,
     "kv-canary: RealKvSource tensor must be contiguous within a row (dims 1..), got shape (4, 4, 8) and strides (32, 1, 4)"),
    ("row-stride", dict(tensor=_pool((4, 40))[:, :32], page_size=1, num_bytes_per_token=32, read_bytes=16), V,
     "kv-canary: RealKvSource tensor row stride must be a multiple of 16 bytes, got 40"),
    ("row-too-narrow", dict(tensor=_pool((4, 32)), page_size=2, num_bytes_per_token=32, read_bytes=16), V,
     "kv-canary: RealKvSource tensor rows must be at least page_size * num_bytes_per_token = 64 bytes wide, got 32"),
    ("row-too-narrow-dtype", dict(tensor=_pool((4, 8), torch.float32), page_size=1, num_bytes_per_token=48,
                                  read_bytes=16), V,
     "kv-canary: RealKvSource tensor rows must be at least page_size * num_bytes_per_token = 48 bytes wide, got 32"),
]


@pytest.mark.parametrize("kwargs, exc, message", [c[1:] for c in SOURCE_CASES], ids=[c[0] for c in SOURCE_CASES])
def test_real_kv_source_validation(kwargs, exc, message):
    with pytest.raises(Exception) as e:
        kc.RealKvSource(**kwargs)
    assert type(e.value) is exc and str(e.value) == message


def test_real_kv_source_misaligned_pointer():
    t = torch.zeros((4, 64), dtype=torch.uint8)
    big = torch.zeros(4 * 64 + 128, dtype=torch.uint8)
    base = (-big.data_ptr()) % 64
    v = big[base + 8: base + 8 + 4 * 64].view(4, 64)
    with pytest.raises(ValueError) as e:
        kc.RealKvSource(tensor=v, page_size=1, num_bytes_per_token=64, read_bytes=16)
    assert str(e.value) == f"kv-canary: RealKvSource tensor data pointer must be 16-byte aligned, got {v.data_ptr():#x}"
    kc.RealKvSource(tensor=t, page_size=4, num_bytes_per_token=16, read_bytes=16)  # the valid one is accepted


def test_dtype_error_class():
    assert issubclass(KvCanaryDTypeError, TypeError) and issubclass(KvCanaryDTypeError, ValueError)
    kw = plan_kwargs()
    kw["req_pool_indices"] = t32([1, 2])
    for cls in (TypeError, ValueError):
        with pytest.raises(cls):
            kc.launch_canary_plan_kernels(**kw)


def test_every_message_starts_with_the_prefix():
    cases = PLAN_CASES + CONTEXT_CASES + WRITE_CASES + VERIFY_CASES + SCATTER_CASES
    assert all((isinstance(c[3], str) and c[3].startswith("kv-canary: ")) or callable(c[3]) for c in cases)


# The hot path's batch check (KVCanary.step): a torch tensor that passes comes back as itself, anything else
# goes through array_on; errors are array_on's, word for word.
BATCH_CASES = [
    ("good", lambda: torch.arange(6, dtype=torch.int64), {}, None),
    ("good with length", lambda: torch.arange(6, dtype=torch.int64), {"length": 6}, None),
    ("good 2-D", lambda: torch.zeros((3, 4), dtype=torch.int32), {"dtype": "int32", "ndim": 2}, None),
    ("size-1 with an odd stride", lambda: torch.arange(10, dtype=torch.int64)[::7][:1], {}, None),
    ("wrong dtype", lambda: torch.arange(6, dtype=torch.int32), {}, "int64"),
    ("wrong rank", lambda: torch.zeros((2, 3), dtype=torch.int64), {}, "1-D"),
    ("not contiguous", lambda: torch.arange(12, dtype=torch.int64)[::2], {}, "contiguous"),
    ("wrong length", lambda: torch.arange(6, dtype=torch.int64), {"length": 5}, "length must be 5"),
    ("a parameter (subclass)", lambda: torch.nn.Parameter(torch.arange(6.0)).detach().long(), {}, None),
    ("None", lambda: None, {}, "must be an array"),
]


@pytest.mark.parametrize("make, kwargs, message", [c[1:] for c in BATCH_CASES], ids=[c[0] for c in BATCH_CASES])
def test_batch_array_checks_exactly_what_array_on_checks(make, kwargs, message):
    from kvcanary.ops.interop import CPU, Device

    dtype, ndim, length = kwargs.get("dtype", "int64"), kwargs.get("ndim", 1), kwargs.get("length")
    x = make()
    if message is None:
        got = validation.batch_array("x", x, dtype, CPU, ndim=ndim, length=length)
        assert got is x   # a plain tensor that passes is returned as it is: no view built
        assert validation.as_view("x", got) == validation.array_on("x", x, dtype, CPU, ndim=ndim, length=length)
        assert got.data_ptr() == x.data_ptr() and tuple(got.shape) == tuple(x.shape)
        # The same tensor is refused for another device, with array_on's error.
        with pytest.raises(ValueError, match="must be on cuda:0, got cpu"):
            validation.batch_array("x", x, dtype, Device("cuda", 0), ndim=ndim, length=length)
        return
    with pytest.raises((TypeError, ValueError)) as fast:
        validation.batch_array("x", x, dtype, CPU, ndim=ndim, length=length)
    with pytest.raises((TypeError, ValueError)) as full:
        validation.array_on("x", x, dtype, CPU, ndim=ndim, length=length)
    assert str(fast.value) == str(full.value) and type(fast.value) is type(full.value)
    assert message in str(fast.value) and str(fast.value).startswith("kv-canary:")


def test_batch_array_takes_other_arrays_through_their_view():
    import numpy as np

    from kvcanary.ops.interop import CPU, ArrayView

    a = np.arange(5, dtype=np.int64)
    got = validation.batch_array("x", a, "int64", CPU, length=5)
    assert isinstance(got, ArrayView) and got.data_ptr() == a.__array_interface__["data"][0] and got.shape == (5,)
    assert validation.as_view("x", got) is got
