"""SPEC §9 validation of the arguments new in §10-§13: the paged table and ``pad_row`` (plan and plan-free ops),
``contexts``, the plan-free verify and write, and the record ops. Exact messages, the exception class, and no
byte of any storage reachable from the arguments changed (outputs poisoned first), as in test_validation.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kvcanary as kc
from kvcanary.errors import KvCanaryDTypeError
from kvcanary.ops.interop import Device, view
from support.canary_testlib import PoolSource, poison, storage_snapshot, t32, t64, tensors_in

V, T, D = ValueError, TypeError, KvCanaryDTypeError
VT = "launch_canary_verify_from_table"
WT = "launch_canary_write_from_table"
PLAN = "launch_canary_plan_kernels"
CUDA0 = Device("cuda", 0)

OPS = {
    "plan": kc.launch_canary_plan_kernels,
    "verify_table": kc.launch_canary_verify_from_table,
    "write_table": kc.launch_canary_write_from_table,
    "gather": kc.gather_canary_records,
    "scatter": kc.scatter_canary_records,
    "copy": kc.copy_canary_records,
}


def fake_cuda(x, name):
    """A view of CPU memory that claims to live on cuda:0 (validation never dereferences it)."""
    return dataclasses.replace(view(name, x), device=CUDA0)


def expect(op: str, kw: dict, exc: type, message) -> None:
    outs = [t for t in tensors_in(kw) if t.dtype != torch.float16]
    poison(*outs)
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


def context(num_slots: int = 8, **overrides) -> kc.VerifyOrWriteContext:
    log = kc.ViolationLog.allocate(ring_capacity=4)
    kw = dict(canary_buf=kc.allocate_canary_buffer(num_slots), kernel_kind=0, violation_ring=log.violation_ring,
              violation_write_index=log.violation_write_index, slot_run_counter=log.slot_run_counter,
              kernel_run_counter=log.kernel_run_counter, real_kv_sources=(), real_kv_hash_mode=0,
              enable_chain_position_assert=kc.allocate_chain_position_flag(1))
    kw.update(overrides)
    return kc.VerifyOrWriteContext(**kw)


def r2t() -> torch.Tensor:
    return torch.arange(32, dtype=torch.int32).reshape(4, 8) % 8


def plan_kwargs() -> dict:
    return dict(verify_plan_out=kc.VerifyPlan.allocate(verify_capacity=64),
                write_plan_out=kc.WritePlan.allocate(write_req_capacity=4), req_pool_indices=t64([1, 2]),
                prefix_lens=t64([3, 0]), extend_seq_lens=t64([1, 4]), block_table=t32([[0, 0], [1, 2], [3, 4], [5, 6]]),
                block_size=4, pad_row=0, swa_window_size=0, full_to_swa_index_mapping=None, verify_capacity=64,
                req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
                kv_token_id_vs_position_offset=0, invalid_rows_out=torch.zeros(1, dtype=torch.int32))


def verify_table_kwargs() -> dict:
    return dict(contexts=(context(), context()), req_pool_indices=t64([1, 2]), prefix_lens=t64([3, 0]),
                req_to_token=r2t(), invalid_rows_out=torch.zeros(1, dtype=torch.int32))


def write_table_kwargs() -> dict:
    return dict(contexts=[context(), context()], req_pool_indices=t64([1, 2]), prefix_lens=t64([3, 0]),
                extend_seq_lens=t64([1, 2]), req_to_token=r2t(), input_ids=t64([1, 2, 3]), positions=t64([3, 0, 1]),
                out_cache_loc=t64([3, 4, 5]), invalid_rows_out=torch.zeros(1, dtype=torch.int32))


def gather_kwargs() -> dict:
    return dict(canary_buf=kc.allocate_canary_buffer(8), slots=t64([1, 2, 3]),
                records_out=torch.zeros((3, 4), dtype=torch.int64), out_of_range_out=torch.zeros(1, dtype=torch.int32))


def scatter_kwargs() -> dict:
    return dict(canary_buf=kc.allocate_canary_buffer(8), slots=t64([1, 2, 3]),
                records=torch.zeros((3, 4), dtype=torch.int64), out_of_range_out=torch.zeros(1, dtype=torch.int32))


def copy_kwargs() -> dict:
    return dict(src_canary_buf=kc.allocate_canary_buffer(8), src_slots=t64([1, 2, 3]), dst_slots=t64([4, 5, 6]),
                dst_canary_buf=kc.allocate_canary_buffer(8, slot_stride_bytes=48),
                out_of_range_out=torch.zeros(1, dtype=torch.int32))


KWARGS = {"plan": plan_kwargs, "verify_table": verify_table_kwargs, "write_table": write_table_kwargs,
          "gather": gather_kwargs, "scatter": scatter_kwargs, "copy": copy_kwargs}


@pytest.mark.parametrize("op", list(OPS))
def test_baseline_calls_are_valid(op):
    OPS[op](**KWARGS[op]())


def test_defaults_of_the_plan_free_ops_are_the_documented_ones():
    """Everything but contexts, the batch, one table and (write) the tokens is optional."""
    kc.launch_canary_verify_from_table(contexts=[context()], req_pool_indices=t64([1]), prefix_lens=t64([2]),
                                       block_table=t32([[0], [1]]), block_size=8)
    kc.launch_canary_write_from_table(contexts=(context(),), req_pool_indices=t64([1]), prefix_lens=t64([0]),
                                      extend_seq_lens=t64([1]), req_to_token=r2t(), input_ids=t64([1]),
                                      positions=t64([0]), out_cache_loc=t64([1]))


def test_five_sources_are_fine_on_the_plan_free_ops():
    srcs = tuple(PoolSource.make(rows=8, page_size=1, num_bytes_per_token=16).source for _ in range(5))
    kw = verify_table_kwargs()
    kw["contexts"] = (context(real_kv_sources=srcs, real_kv_hash_mode=1),)
    kc.launch_canary_verify_from_table(**kw)
    kw = write_table_kwargs()
    kw["contexts"] = (context(real_kv_sources=srcs, real_kv_hash_mode=2),)
    kc.launch_canary_write_from_table(**kw)


# ----------------------------------------------------------------------------------------------- shared cases


def _ctx(i, **f):
    def mutate(kw):
        cs = list(kw["contexts"])
        cs[i] = dataclasses.replace(cs[i], **f)
        kw["contexts"] = type(kw["contexts"])(cs)
    return mutate


def table_cases(op: str) -> list:
    """The table arguments (SPEC §10), the same for every op that reads a table."""
    return [
        ("both-tables", lambda kw: kw.update(req_to_token=r2t(), block_table=t32([[0], [1], [2], [3]]), block_size=2),
         V, f"kv-canary: {op} needs exactly one of req_to_token and block_table, got both"),
        ("neither-table", lambda kw: kw.update(req_to_token=None, block_table=None, block_size=None), V,
         f"kv-canary: {op} needs exactly one of req_to_token and block_table, got neither"),
        ("block-table-without-size", lambda kw: kw.update(req_to_token=None, block_table=t32([[0], [1]]),
                                                          block_size=None), V,
         f"kv-canary: {op} requires block_size when block_table is given"),
        ("size-with-req-to-token", lambda kw: kw.update(req_to_token=r2t(), block_table=None, block_size=4), V,
         f"kv-canary: {op} block_size must be None when req_to_token is given"),
        ("block-size-zero", lambda kw: kw.update(req_to_token=None, block_table=t32([[0], [1]]), block_size=0), V,
         "kv-canary: block_size must be positive, got 0"),
        ("block-size-negative", lambda kw: kw.update(req_to_token=None, block_table=t32([[0], [1]]), block_size=-16),
         V, "kv-canary: block_size must be positive, got -16"),
        ("block-size-type", lambda kw: kw.update(req_to_token=None, block_table=t32([[0], [1]]), block_size="16"), T,
         "kv-canary: block_size must be an int, got str"),
        ("block-size-bool", lambda kw: kw.update(req_to_token=None, block_table=t32([[0], [1]]), block_size=True), T,
         "kv-canary: block_size must be an int, got bool"),
        ("block-size-huge", lambda kw: kw.update(req_to_token=None, block_table=t32([[0], [1]]),
                                                 block_size=(1 << 32) + 1), V,
         "kv-canary: block_size must be at most 2**32 = 4294967296, got 4294967297"),
        ("block-table-dtype", lambda kw: kw.update(req_to_token=None, block_table=t64([[0], [1]]), block_size=4), D,
         "kv-canary: block_table must have dtype int32, got int64"),
        ("block-table-ndim", lambda kw: kw.update(req_to_token=None, block_table=t32([0, 1]), block_size=4), V,
         "kv-canary: block_table must be 2-D, got shape (2,)"),
        ("block-table-contiguous", lambda kw: kw.update(req_to_token=None, block_size=4,
                                                        block_table=torch.zeros((3, 4), dtype=torch.int32).T), V,
         "kv-canary: block_table must be contiguous"),
        ("block-table-no-rows", lambda kw: kw.update(req_to_token=None, block_size=4,
                                                     block_table=torch.zeros((0, 3), dtype=torch.int32)), V,
         "kv-canary: block_table must have at least one row, got shape (0, 3)"),
        ("block-table-no-blocks", lambda kw: kw.update(req_to_token=None, block_size=4,
                                                       block_table=torch.zeros((3, 0), dtype=torch.int32)), V,
         "kv-canary: block_table must have at least one block per row, got shape (3, 0)"),
        ("block-table-list", lambda kw: kw.update(req_to_token=None, block_table=[[0], [1]], block_size=4), T,
         "kv-canary: block_table must be a torch tensor or an array with __dlpack__, got list"),
        ("r2t-dtype", lambda kw: kw.update(req_to_token=r2t().long(), block_table=None, block_size=None), D,
         "kv-canary: req_to_token must have dtype int32, got int64"),
        ("pad-row-type", lambda kw: kw.update(pad_row=0.0), T, "kv-canary: pad_row must be an int, got float"),
        ("pad-row-below", lambda kw: kw.update(pad_row=-2), V,
         "kv-canary: pad_row must be -1 or a row of the table in [0, 4), got -2"),
        ("pad-row-past", lambda kw: kw.update(pad_row=4), V,
         "kv-canary: pad_row must be -1 or a row of the table in [0, 4), got 4"),
        ("swa-without-lut", lambda kw: kw.update(swa_window_size=4, full_to_swa_index_mapping=None), V,
         f"kv-canary: {op} requires full_to_swa_index_mapping when swa_window_size > 0"),
        ("lut-without-swa", lambda kw: kw.update(swa_window_size=0, full_to_swa_index_mapping=t64([0, 1])), V,
         f"kv-canary: {op} full_to_swa_index_mapping must be None when swa_window_size == 0"),
        ("lut-dtype", lambda kw: kw.update(swa_window_size=4, full_to_swa_index_mapping=t32([0, 1])), D,
         "kv-canary: full_to_swa_index_mapping must have dtype int64, got int32"),
        ("lut-empty", lambda kw: kw.update(swa_window_size=4, full_to_swa_index_mapping=t64([])), V,
         "kv-canary: lut_len must be positive when has_swa_lut is True"),
        ("window-negative", lambda kw: kw.update(swa_window_size=-1), V,
         "kv-canary: swa_window_size must be non-negative, got -1"),
        ("rpi-dtype", lambda kw: kw.update(req_pool_indices=t32([1, 2])), D,
         "kv-canary: req_pool_indices must have dtype int64, got int32"),
        ("rpi-ndim", lambda kw: kw.update(req_pool_indices=t64([[1, 2]])), V,
         "kv-canary: req_pool_indices must be 1-D, got shape (1, 2)"),
        ("rpi-contiguous", lambda kw: kw.update(req_pool_indices=t64([1, 9, 2, 9])[::2]), V,
         "kv-canary: req_pool_indices must be contiguous"),
        ("prefix-length", lambda kw: kw.update(prefix_lens=t64([1, 2, 3])), V,
         "kv-canary: prefix_lens length must be 2, got 3"),
        ("invalid-rows-dtype", lambda kw: kw.update(invalid_rows_out=t64([0])), D,
         "kv-canary: invalid_rows_out must have dtype int32, got int64"),
        ("invalid-rows-length", lambda kw: kw.update(invalid_rows_out=t32([0, 0])), V,
         "kv-canary: invalid_rows_out length must be 1, got 2"),
        ("device-mix-table", lambda kw: kw.update(prefix_lens=fake_cuda(kw["prefix_lens"], "prefix_lens")), V,
         lambda kw: f"kv-canary: {op} arrays must all be on one device, got "
                    f"{'verify_plan_out.verify_slot_indices' if op == PLAN else 'contexts[0].canary_buf'} on cpu "
                    f"and prefix_lens on cuda:0"),
    ]


def contexts_cases(op: str) -> list:
    what = "kv-canary: contexts must be a non-empty tuple of VerifyOrWriteContext"
    return [
        ("contexts-type", lambda kw: kw.update(contexts={}), T, f"{what}, got dict"),
        ("contexts-one-context", lambda kw: kw.update(contexts=context()), T, f"{what}, got VerifyOrWriteContext"),
        ("contexts-none", lambda kw: kw.update(contexts=None), T, f"{what}, got NoneType"),
        ("contexts-empty", lambda kw: kw.update(contexts=()), V, f"{what}, got an empty tuple"),
        ("contexts-empty-list", lambda kw: kw.update(contexts=[]), V, f"{what}, got an empty list"),
        ("contexts-element", lambda kw: kw.update(contexts=(context(), {})), T,
         "kv-canary: contexts[1] must be a VerifyOrWriteContext, got dict"),
        ("contexts-num-slots", lambda kw: kw.update(contexts=(context(8), context(8), context(6))), V,
         "kv-canary: contexts[2].canary_buf must have num_slots=8 like contexts[0], got 6"),
        ("contexts-buf-dtype", _ctx(1, canary_buf=torch.zeros((8, 4), dtype=torch.int64)), D,
         "kv-canary: contexts[1].canary_buf must have dtype uint8, got int64"),
        ("contexts-buf-stride", _ctx(0, canary_buf=torch.zeros((8, 36), dtype=torch.uint8)), V,
         "kv-canary: contexts[0].canary_buf slot_stride_bytes must be a multiple of 8 and >= 32, got 36"),
        ("contexts-kind", _ctx(1, kernel_kind=12), V,
         "kv-canary: contexts[1].kernel_kind must be a CanaryLaunchTag (0..11), got 12"),
        ("contexts-mode", _ctx(0, real_kv_hash_mode=3), V,
         "kv-canary: contexts[0].real_kv_hash_mode must be a RealKvHashMode (0, 1 or 2), got 3"),
        ("contexts-ring", _ctx(1, violation_ring=torch.zeros((4, 7), dtype=torch.int64)), V,
         "kv-canary: contexts[1].violation_ring must have shape [ring_capacity, 8], got (4, 7)"),
        ("contexts-source", _ctx(1, real_kv_sources=(torch.zeros((8, 16), dtype=torch.uint8),)), T,
         "kv-canary: contexts[1].real_kv_sources[0] must be a RealKvSource, got Tensor"),
        ("contexts-flag", _ctx(0, enable_chain_position_assert=torch.ones(1, dtype=torch.int64)), D,
         "kv-canary: contexts[0].enable_chain_position_assert must have dtype int32, got int64"),
        ("contexts-device-mix", _ctx(1, canary_buf=fake_cuda(kc.allocate_canary_buffer(8), "contexts[1].canary_buf")),
         V, f"kv-canary: {op} arrays must all be on one device, got contexts[0].canary_buf on cpu and "
            f"contexts[1].canary_buf on cuda:0"),
    ]


VERIFY_TABLE_CASES = table_cases(VT) + contexts_cases(VT) + [
    ("check-type", lambda kw: kw.update(check_verify_expected_token=None), T,
     "kv-canary: check_verify_expected_token must be a bool, got None"),
    ("offset-type", lambda kw: kw.update(kv_token_id_vs_position_offset=1.0), T,
     "kv-canary: kv_token_id_vs_position_offset must be an int, got float"),
    ("pool-without-lens", lambda kw: kw.update(req_to_verify_expected_tokens=torch.zeros((4, 8), dtype=torch.int32)), V,
     f"kv-canary: {VT} requires req_to_verify_expected_tokens and req_to_verify_expected_tokens_valid_lens "
     f"together, got only req_to_verify_expected_tokens"),
    ("lens-without-pool", lambda kw: kw.update(req_to_verify_expected_tokens_valid_lens=t64([1, 1])), V,
     f"kv-canary: {VT} requires req_to_verify_expected_tokens and req_to_verify_expected_tokens_valid_lens "
     f"together, got only the valid lens"),
    ("pool-dtype", lambda kw: kw.update(req_to_verify_expected_tokens=torch.zeros((4, 8), dtype=torch.int64),
                                        req_to_verify_expected_tokens_valid_lens=t64([1, 1])), D,
     "kv-canary: req_to_verify_expected_tokens must have dtype int32, got int64"),
    ("pool-rows-block-table", lambda kw: kw.update(req_to_token=None, block_table=t32([[0], [1], [2], [3], [4]]),
                                                   block_size=4,
                                                   req_to_verify_expected_tokens=torch.zeros((4, 8), dtype=torch.int32),
                                                   req_to_verify_expected_tokens_valid_lens=t64([1, 1])), V,
     "kv-canary: req_to_verify_expected_tokens must have at least block_table's 5 rows, got 4"),
    ("lens-length", lambda kw: kw.update(req_to_verify_expected_tokens=torch.zeros((4, 8), dtype=torch.int32),
                                         req_to_verify_expected_tokens_valid_lens=t64([1])), V,
     "kv-canary: req_to_verify_expected_tokens_valid_lens length must be 2, got 1"),
]


@pytest.mark.parametrize("mutate, exc, message", [c[1:] for c in VERIFY_TABLE_CASES],
                         ids=[c[0] for c in VERIFY_TABLE_CASES])
def test_verify_from_table_validation(mutate, exc, message):
    kw = verify_table_kwargs()
    mutate(kw)
    expect("verify_table", kw, exc, message)


WRITE_TABLE_CASES = table_cases(WT) + contexts_cases(WT) + [
    ("extend-length", lambda kw: kw.update(extend_seq_lens=t64([1])), V,
     "kv-canary: extend_seq_lens length must be 2, got 1"),
    ("extend-dtype", lambda kw: kw.update(extend_seq_lens=t32([1, 1])), D,
     "kv-canary: extend_seq_lens must have dtype int64, got int32"),
    ("ids-dtype", lambda kw: kw.update(input_ids=t32([1, 2, 3])), D, "kv-canary: input_ids must have dtype int64, got int32"),
    ("positions-length", lambda kw: kw.update(positions=t64([0, 1])), V, "kv-canary: positions length must be 3, got 2"),
    ("loc-contiguous", lambda kw: kw.update(out_cache_loc=t64([1, 0, 2, 0, 3, 0])[::2]), V,
     "kv-canary: out_cache_loc must be contiguous"),
    ("loc-none", lambda kw: kw.update(out_cache_loc=None), T, "kv-canary: out_cache_loc must be an array, got None"),
    ("assert-type", lambda kw: kw.update(enable_write_input_assert="yes"), T,
     "kv-canary: enable_write_input_assert must be a bool, got 'yes'"),
    ("assert-without-tokens", lambda kw: kw.update(enable_write_input_assert=True, expected_input_positions=t64([0, 1, 0])),
     V, f"kv-canary: {WT} requires expected_input_tokens when enable_write_input_assert is True"),
    ("tokens-without-assert", lambda kw: kw.update(expected_input_tokens=t64([1, 2, 3])), V,
     f"kv-canary: {WT} expected_input_tokens must be None when enable_write_input_assert is False"),
    ("expected-positions-length", lambda kw: kw.update(enable_write_input_assert=True, expected_input_tokens=t64([1, 2, 3]),
                                                       expected_input_positions=t64([0, 1])), V,
     "kv-canary: expected_input_positions length must be 3, got 2"),
    ("shared-buffer", lambda kw: kw.update(contexts=(kw["contexts"][0], kw["contexts"][0])), V,
     f"kv-canary: {WT} contexts[1].canary_buf overlaps contexts[0].canary_buf; each context of a write needs "
     f"its own canary buffer"),
    ("device-mix-tokens", lambda kw: kw.update(positions=fake_cuda(kw["positions"], "positions")), V,
     f"kv-canary: {WT} arrays must all be on one device, got contexts[0].canary_buf on cpu and positions on cuda:0"),
]


@pytest.mark.parametrize("mutate, exc, message", [c[1:] for c in WRITE_TABLE_CASES],
                         ids=[c[0] for c in WRITE_TABLE_CASES])
def test_write_from_table_validation(mutate, exc, message):
    kw = write_table_kwargs()
    mutate(kw)
    expect("write_table", kw, exc, message)


PLAN_TABLE_CASES = table_cases(PLAN) + [
    ("pool-rows-block-table", lambda kw: kw.update(req_to_verify_expected_tokens=torch.zeros((3, 8), dtype=torch.int32),
                                                   req_to_verify_expected_tokens_valid_lens=t64([1, 1])), V,
     "kv-canary: req_to_verify_expected_tokens must have at least block_table's 4 rows, got 3"),
]


@pytest.mark.parametrize("mutate, exc, message", [c[1:] for c in PLAN_TABLE_CASES], ids=[c[0] for c in PLAN_TABLE_CASES])
def test_plan_table_validation(mutate, exc, message):
    kw = plan_kwargs()
    mutate(kw)
    expect("plan", kw, exc, message)


# ----------------------------------------------------------------------------------------------- records


def misaligned_u8(rows: int, cols: int, offset: int) -> torch.Tensor:
    big = torch.zeros(rows * cols + 64, dtype=torch.uint8)
    base = (-big.data_ptr()) % 64
    return big[base + offset: base + offset + rows * cols].view(rows, cols)


def canary_cases(name: str, mix_message: str) -> list:
    return [
        (f"{name}-dtype", lambda kw: kw.update({name: torch.zeros((8, 4), dtype=torch.int64)}), D,
         f"kv-canary: {name} must have dtype uint8, got int64"),
        (f"{name}-ndim", lambda kw: kw.update({name: torch.zeros(256, dtype=torch.uint8)}), V,
         f"kv-canary: {name} must be 2-D, got shape (256,)"),
        (f"{name}-contiguous", lambda kw: kw.update({name: torch.zeros((8, 64), dtype=torch.uint8)[:, :32]}), V,
         f"kv-canary: {name} must be contiguous"),
        (f"{name}-no-slots", lambda kw: kw.update({name: torch.zeros((0, 32), dtype=torch.uint8)}), V,
         f"kv-canary: {name} must have at least one slot, got shape (0, 32)"),
        (f"{name}-stride-small", lambda kw: kw.update({name: torch.zeros((8, 24), dtype=torch.uint8)}), V,
         f"kv-canary: {name} slot_stride_bytes must be a multiple of 8 and >= 32, got 24"),
        (f"{name}-stride-odd", lambda kw: kw.update({name: torch.zeros((8, 44), dtype=torch.uint8)}), V,
         f"kv-canary: {name} slot_stride_bytes must be a multiple of 8 and >= 32, got 44"),
        (f"{name}-misaligned", lambda kw: kw.update({name: misaligned_u8(8, 32, 4)}), V,
         lambda kw: f"kv-canary: {name} data pointer must be 8-byte aligned, got {kw[name].data_ptr():#x}"),
        (f"{name}-none", lambda kw: kw.update({name: None}), T, f"kv-canary: {name} must be an array, got None"),
        (f"{name}-device-mix", lambda kw: kw.update({name: fake_cuda(kc.allocate_canary_buffer(8), name)}), V,
         mix_message),
    ]


def slots_cases(name: str) -> list:
    return [
        (f"{name}-dtype", lambda kw: kw.update({name: t32([1, 2, 3])}), D, f"kv-canary: {name} must have dtype int64, got int32"),
        (f"{name}-ndim", lambda kw: kw.update({name: t64([[1, 2, 3]])}), V, f"kv-canary: {name} must be 1-D, got shape (1, 3)"),
        (f"{name}-contiguous", lambda kw: kw.update({name: t64([1, 0, 2, 0, 3, 0])[::2]}), V,
         f"kv-canary: {name} must be contiguous"),
    ]


OOR_CASES = [
    ("oor-dtype", lambda kw: kw.update(out_of_range_out=t64([0])), D, "kv-canary: out_of_range_out must have dtype int32, got int64"),
    ("oor-length", lambda kw: kw.update(out_of_range_out=t32([0, 0])), V, "kv-canary: out_of_range_out length must be 1, got 2"),
]


def records_cases(name: str) -> list:
    return [
        (f"{name}-dtype", lambda kw: kw.update({name: torch.zeros((3, 4), dtype=torch.int32)}), D,
         f"kv-canary: {name} must have dtype int64, got int32"),
        (f"{name}-width", lambda kw: kw.update({name: torch.zeros((3, 3), dtype=torch.int64)}), V,
         f"kv-canary: {name} must have shape [3, 4] (one record per slot), got (3, 3)"),
        (f"{name}-rows", lambda kw: kw.update({name: torch.zeros((4, 4), dtype=torch.int64)}), V,
         f"kv-canary: {name} must have shape [3, 4] (one record per slot), got (4, 4)"),
        (f"{name}-ndim", lambda kw: kw.update({name: torch.zeros(12, dtype=torch.int64)}), V,
         f"kv-canary: {name} must be 2-D, got shape (12,)"),
        (f"{name}-contiguous", lambda kw: kw.update({name: torch.zeros((3, 8), dtype=torch.int64)[:, :4]}), V,
         f"kv-canary: {name} must be contiguous"),
    ]


MIX = "kv-canary: {} arrays must all be on one device, got {} on {} and {} on {}"
GATHER_CASES = (canary_cases("canary_buf", MIX.format("gather_canary_records", "canary_buf", "cuda:0", "slots", "cpu"))
                + slots_cases("slots") + OOR_CASES + records_cases("records_out"))
SCATTER_CASES = (canary_cases("canary_buf", MIX.format("scatter_canary_records", "canary_buf", "cuda:0", "slots", "cpu"))
                 + slots_cases("slots") + OOR_CASES + records_cases("records"))
COPY_CASES = (canary_cases("src_canary_buf", MIX.format("copy_canary_records", "src_canary_buf", "cuda:0",
                                                        "dst_canary_buf", "cpu"))
              # dst_canary_buf=None is valid (the source buffer), so its "none" case is left out.
              + [c for c in canary_cases("dst_canary_buf", MIX.format("copy_canary_records", "src_canary_buf", "cpu",
                                                                      "dst_canary_buf", "cuda:0"))
                 if c[0] != "dst_canary_buf-none"]
              + slots_cases("src_slots") + OOR_CASES + [
                  ("dst-none-device-mix", lambda kw: kw.update(dst_canary_buf=None,
                                                               dst_slots=fake_cuda(kw["dst_slots"], "dst_slots")), V,
                   MIX.format("copy_canary_records", "src_canary_buf", "cpu", "dst_slots", "cuda:0")),
                  ("dst-slots-dtype", lambda kw: kw.update(dst_slots=t32([1, 2, 3])), D,
                   "kv-canary: dst_slots must have dtype int64, got int32"),
                  ("dst-slots-length", lambda kw: kw.update(dst_slots=t64([1, 2])), V,
                   "kv-canary: dst_slots length must be 3, got 2"),
              ])


@pytest.mark.parametrize("op, mutate, exc, message",
                         [("gather", *c[1:]) for c in GATHER_CASES] + [("scatter", *c[1:]) for c in SCATTER_CASES]
                         + [("copy", *c[1:]) for c in COPY_CASES],
                         ids=[f"gather-{c[0]}" for c in GATHER_CASES] + [f"scatter-{c[0]}" for c in SCATTER_CASES]
                         + [f"copy-{c[0]}" for c in COPY_CASES])
def test_record_ops_validation(op, mutate, exc, message):
    kw = KWARGS[op]()
    mutate(kw)
    expect(op, kw, exc, message)


def test_every_new_message_starts_with_the_prefix():
    cases = (VERIFY_TABLE_CASES + WRITE_TABLE_CASES + PLAN_TABLE_CASES + GATHER_CASES + SCATTER_CASES + COPY_CASES)
    assert all((isinstance(c[3], str) and c[3].startswith("kv-canary: ")) or callable(c[3]) for c in cases)
