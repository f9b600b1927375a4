"""How the CUDA ops launch: CUDA-graph capture and replay, the caller's stream, zero-copy inputs of every kind
(torch, CuPy, bare ``__dlpack__``), and the arrays' device when another device is current."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary.consts import CanaryLaunchTag, RealKvHashMode
from support.gpu_util import (
    LogState,
    assert_same_bytes,
    build_chains,
    compare_logs,
    context,
    make_log,
    make_verify_case,
    rng_for,
    t,
)

# ----------------------------------------------------------------------------------------------------------
# CUDA graphs: plan -> verify -> write captured once, replayed over decode steps with inputs refilled in place.


class Engine:
    """The buffers of one canary over a toy decode loop (all on one CUDA device)."""

    def __init__(self, host: dict, device: str = "cuda"):
        self.t = {k: v.to(device).clone() for k, v in host.items()}
        d = self.t
        self.log = LogState(d["ring"], d["index"], d["slot_counter"], d["kernel_counter"])
        self.vplan = kc.VerifyPlan(verify_slot_indices=d["v_slot"], verify_expected_tokens=d["v_tok"],
                                   verify_expected_positions=d["v_pos"], verify_prev_slot_indices=d["v_prev"],
                                   verify_num_valid=d["v_n"], enable=d["v_en"])
        self.wplan = kc.WritePlan(write_offsets=d["w_off"], write_seed_slot_indices=d["w_seed"],
                                  write_num_valid_reqs=d["w_n"])
        self.head = context(d["canary"], self.log, tag=CanaryLaunchTag.HEAD_K_FULL)
        self.tail = context(d["canary"], self.log, tag=CanaryLaunchTag.TAIL_K_FULL, flag=d["flag"])

    def refill(self, step: dict) -> None:
        for k, v in step.items():
            self.t[k].copy_(v)  # in place: the captured graph reads these addresses

    def step(self) -> None:
        d = self.t
        kc.launch_canary_plan_kernels(
            verify_plan_out=self.vplan, write_plan_out=self.wplan, req_pool_indices=d["rp"],
            prefix_lens=d["prefix"], extend_seq_lens=d["extend"], req_to_token=d["r2t"], swa_window_size=0,
            full_to_swa_index_mapping=None, verify_capacity=d["v_slot"].shape[0],
            req_to_verify_expected_tokens=d["pool"], req_to_verify_expected_tokens_valid_lens=d["valid"],
            kv_token_id_vs_position_offset=0, invalid_rows_out=d["invalid"])
        kc.launch_canary_verify_kernel(context=self.head, plan=self.vplan, check_verify_expected_token=True)
        kc.launch_canary_write_kernel(context=self.tail, plan=self.wplan, input_ids=d["ids"], positions=d["pos"],
                                      out_cache_loc=d["loc"], enable_write_input_assert=False,
                                      expected_input_tokens=None, expected_input_positions=None)


def test_graph_capture_replay_equals_eager(cuda_ready):
    rng = rng_for("graph")
    bs, max_seq_len, steps = 48, 96, 6
    max_reqs = bs + 1
    num_slots = max_reqs * max_seq_len + 1
    rp = rng.permutation(np.arange(1, max_reqs))
    r2t = (1 + rng.permutation(num_slots - 1)).reshape(max_reqs, max_seq_len)  # unique slots
    prefix0 = rng.integers(1, 40, bs)
    pool_tok = rng.integers(0, 1 << 30, (max_reqs, max_seq_len))
    canary = torch.zeros((num_slots, 32), dtype=torch.uint8)
    recs = canary.numpy().view(np.int64)
    build_chains(recs, [r2t[r, :p] for r, p in zip(rp, prefix0)], [pool_tok[r, :p] for r, p in zip(rp, prefix0)])
    log = make_log(rng, 256)
    cap = bs * max_seq_len
    host = dict(
        rp=t(rp), prefix=t(prefix0), extend=torch.ones(bs, dtype=torch.int64), r2t=t(r2t.astype(np.int32)),
        pool=t(pool_tok.astype(np.int32)), valid=t(prefix0), invalid=torch.zeros(1, dtype=torch.int32),
        v_slot=torch.full((cap,), -7, dtype=torch.int64), v_tok=torch.full((cap,), -7, dtype=torch.int64),
        v_pos=torch.full((cap,), -7, dtype=torch.int64), v_prev=torch.full((cap,), -7, dtype=torch.int64),
        v_n=torch.zeros(1, dtype=torch.int32), v_en=torch.ones(1, dtype=torch.int32),
        w_off=torch.zeros(bs + 1, dtype=torch.int64), w_seed=torch.zeros(bs, dtype=torch.int64),
        w_n=torch.zeros(1, dtype=torch.int32),
        ids=torch.zeros(bs, dtype=torch.int64), pos=torch.zeros(bs, dtype=torch.int64),
        loc=torch.zeros(bs, dtype=torch.int64), canary=canary, flag=torch.ones(1, dtype=torch.int32),
        ring=log.ring, index=log.index, slot_counter=log.slot_counter, kernel_counter=log.kernel_counter,
    )

    def step_inputs(i: int) -> dict:
        prefix = prefix0 + i
        ids = pool_tok[rp, prefix]
        if i == 3:
            ids = ids.copy()
            ids[::7] += 1  # tokens that differ from the expected-token pool: verify reports them next step
        return dict(prefix=t(prefix), valid=t(prefix), pos=t(prefix), ids=t(ids), loc=t(r2t[rp, prefix]))

    graph_eng, eager_eng = Engine(host), Engine(host)
    graph_eng.refill(step_inputs(0))
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_eng.step()
    torch.cuda.synchronize()
    # Capture launches nothing: the buffers are still the initial ones.
    assert_same_bytes(host["canary"], graph_eng.t["canary"], "canary after capture")

    for i in range(steps):
        graph_eng.refill(step_inputs(i))
        g.replay()
        eager_eng.refill(step_inputs(i))
        eager_eng.step()
        torch.cuda.synchronize()
        for k in host:
            if k != "ring":
                assert_same_bytes(eager_eng.t[k], graph_eng.t[k], f"step {i}: {k}")
        compare_logs(eager_eng.log, graph_eng.log)  # rows as a multiset: several threads append
    # The run did real work: tokens were stamped every step and the injected mismatches were reported.
    assert int(graph_eng.t["kernel_counter"][0]) == int(log.kernel_counter[0]) + 2 * steps
    assert int(graph_eng.t["index"][0]) > 0


# ----------------------------------------------------------------------------------------------------------
# Streams: inputs produced on a side stream (behind a long sleep); the op must be ordered after them.


class _StreamProto:
    def __init__(self, s: torch.cuda.Stream):
        self._s = s

    def __cuda_stream__(self):
        return (0, self._s.cuda_stream)


@pytest.mark.parametrize("how", ["torch_stream", "cupy_stream", "cuda_stream_protocol", "current_stream"])
def test_op_runs_on_callers_stream(cuda_ready, how):
    import cupy

    rng = rng_for("stream", how)
    case = make_verify_case(rng, num_slots=20_000, n_chains=60, len_lo=50, len_hi=200, corrupt=0.05)
    canary, _sources, plan, log, _mode = case
    # Reference on the CPU.
    cpu_log = log.to("cpu")
    kc.launch_canary_verify_kernel(context=context(canary.clone(), cpu_log, tag=1), plan=kc.VerifyPlan(**plan),
                                   check_verify_expected_token=True)
    # GPU: the plan arrives on the side stream, from device staging copies, after ~50 ms of sleep.
    staging = {k: v.cuda() for k, v in plan.items()}
    dst = {k: torch.zeros_like(v) for k, v in staging.items()}
    gpu_log = log.to("cuda")
    ctx = context(canary.cuda(), gpu_log, tag=1)
    torch.cuda.synchronize()
    cupy_side = cupy.cuda.Stream(non_blocking=True)
    side = torch.cuda.ExternalStream(cupy_side.ptr) if how == "cupy_stream" else torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        for k in dst:
            dst[k].copy_(staging[k])
    vp = kc.VerifyPlan(**dst)
    if how == "torch_stream":
        kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True, stream=side)
    elif how == "cupy_stream":
        kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True, stream=cupy_side)
    elif how == "cuda_stream_protocol":
        kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True,
                                       stream=_StreamProto(side))
    else:
        with torch.cuda.stream(side):
            kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True)
    side.synchronize()
    rows = compare_logs(cpu_log, gpu_log)
    assert rows > 0


# ----------------------------------------------------------------------------------------------------------
# Zero copy: CuPy arrays and bare __dlpack__ objects are used in place.


class _DLPackOnly:
    """Exposes nothing but the DLPack protocol of a torch tensor."""

    def __init__(self, x: torch.Tensor):
        self._x = x

    def __dlpack__(self, *args, **kwargs):
        return self._x.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._x.__dlpack_device__()


def test_zero_copy_cupy_and_dlpack(cuda_ready):
    import cupy

    rng = rng_for("zero-copy")
    case = make_verify_case(rng, num_slots=10_000, n_chains=40, len_lo=20, len_hi=150, corrupt=0.05)
    canary, _sources, plan, log, _mode = case
    cpu_log = log.to("cpu")
    kc.launch_canary_verify_kernel(context=context(canary.clone(), cpu_log, tag=5), plan=kc.VerifyPlan(**plan),
                                   check_verify_expected_token=False)
    # Log outputs: CuPy arrays (ring, index) and bare DLPack wrappers of torch tensors (counters).
    ring = cupy.asarray(log.ring.numpy())
    index = cupy.asarray(log.index.numpy())
    slot_counter = log.slot_counter.cuda()
    kernel_counter = log.kernel_counter.cuda()
    ctx = kc.VerifyOrWriteContext(
        canary_buf=cupy.asarray(canary.numpy()), kernel_kind=5, violation_ring=ring, violation_write_index=index,
        slot_run_counter=_DLPackOnly(slot_counter), kernel_run_counter=_DLPackOnly(kernel_counter))
    vp = kc.VerifyPlan(**{k: _DLPackOnly(v.cuda()) if i % 2 else cupy.asarray(v.numpy())
                          for i, (k, v) in enumerate(plan.items())})
    kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=False)
    cupy.cuda.runtime.deviceSynchronize()
    gpu_log = LogState(torch.from_numpy(cupy.asnumpy(ring)), torch.from_numpy(cupy.asnumpy(index)),
                       slot_counter.cpu(), kernel_counter.cpu())
    rows = compare_logs(cpu_log, gpu_log)  # the results are in the caller's own arrays
    assert rows > 0


# ----------------------------------------------------------------------------------------------------------
# Devices: run on the arrays' device even when another device is current.


@pytest.mark.min_gpus(2)
@pytest.mark.parametrize("data_dev,current_dev", [(1, 0), (0, 1)])
def test_arrays_device_not_current_device(cuda_ready, data_dev, current_dev):
    kc.warmup(device=data_dev)
    rng = rng_for("device", data_dev)
    case = make_verify_case(rng, num_slots=20_000, n_chains=60, len_lo=50, len_hi=200, corrupt=0.05)
    canary, _sources, plan, log, _mode = case
    cpu_log = log.to("cpu")
    kc.launch_canary_verify_kernel(context=context(canary.clone(), cpu_log, tag=1), plan=kc.VerifyPlan(**plan),
                                   check_verify_expected_token=True)
    dev = f"cuda:{data_dev}"
    gpu_log = log.to(dev)
    ctx = context(canary.to(dev), gpu_log, tag=1)
    vp = kc.VerifyPlan(**{k: v.to(dev) for k, v in plan.items()})
    torch.cuda.synchronize(data_dev)
    with torch.cuda.device(current_dev):
        kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True)
        assert torch.cuda.current_device() == current_dev
    torch.cuda.synchronize(data_dev)
    rows = compare_logs(cpu_log, gpu_log)
    assert rows > 0


# ----------------------------------------------------------------------------------------------------------
# Plan-free ops (SPEC §11, §12) in a CUDA graph, after torch.cuda.empty_cache(), and the real-KV tables.


def _decode_setup(rng, *, bs, max_seq_len, pool_bytes=64):
    """A decode loop over a req_to_token table (unique slots), K and V contexts with a PARTIAL real-KV source
    each (their own pools), one shared log; prefixes stamped clean."""
    from support.gpu_util import fingerprints, make_source

    max_reqs = bs + 1
    num_slots = max_reqs * max_seq_len + 1
    rp = rng.permutation(np.arange(1, max_reqs))
    r2t = np.zeros((max_reqs, max_seq_len), np.int64)
    r2t[1:] = (1 + rng.permutation(num_slots - 1)[: bs * max_seq_len]).reshape(bs, max_seq_len)
    prefix0 = rng.integers(1, max_seq_len // 2, bs)
    toks = rng.integers(0, 1 << 30, (max_reqs, max_seq_len))
    log = make_log(rng, 4096)
    host = dict(rp=t(rp), prefix=t(prefix0), extend=torch.ones(bs, dtype=torch.int64), r2t=t(r2t.astype(np.int32)),
                pool=t(toks.astype(np.int32)), valid=t(prefix0), invalid=torch.zeros(1, dtype=torch.int32),
                ids=torch.zeros(bs, dtype=torch.int64), pos=torch.zeros(bs, dtype=torch.int64),
                loc=torch.zeros(bs, dtype=torch.int64), flag=torch.ones(1, dtype=torch.int32),
                ring=log.ring, index=log.index, slot_counter=log.slot_counter, kernel_counter=log.kernel_counter)
    sources = {}
    for kv in ("k", "v"):
        src = make_source(rng, num_slots, page_size=1, num_bytes_per_token=pool_bytes, read_bytes=pool_bytes)
        canary = torch.zeros((num_slots, 32), dtype=torch.uint8)
        fp = fingerprints([src], RealKvHashMode.PARTIAL, np.arange(num_slots))
        build_chains(canary.numpy().view(np.int64), [r2t[r, :p] for r, p in zip(rp, prefix0)],
                     [toks[r, :p] for r, p in zip(rp, prefix0)], fp)
        host[f"canary_{kv}"], host[f"kv_{kv}"] = canary, src.base
        sources[kv] = src

    def step_inputs(i: int) -> dict:
        prefix = prefix0 + i
        ids = toks[rp, prefix]
        if i == 3:
            ids = ids.copy()
            ids[::5] += 1  # tokens that differ from the expected-token pool: verify reports them next step
        return dict(prefix=t(prefix), valid=t(prefix), pos=t(prefix), ids=t(ids), loc=t(r2t[rp, prefix]))

    return host, sources, step_inputs


class TableEngine:
    """One canary's buffers on one device, stepping with the plan-free ops (K and V in one launch each)."""

    def __init__(self, host: dict, sources: dict, device: str):
        self.t = {k: v.to(device).clone() for k, v in host.items()}
        d = self.t
        self.log = LogState(d["ring"], d["index"], d["slot_counter"], d["kernel_counter"])
        self.contexts = tuple(
            context(d[f"canary_{kv}"], self.log, tag=int(CanaryLaunchTag.TAIL_K_FULL) + i, sources=[sources[kv]],
                    source_bases=[d[f"kv_{kv}"]], mode=RealKvHashMode.PARTIAL, flag=d["flag"])
            for i, kv in enumerate(("k", "v")))

    def refill(self, step: dict) -> None:
        for k, v in step.items():
            self.t[k].copy_(v)

    def step(self) -> None:
        d = self.t
        kc.launch_canary_verify_from_table(
            contexts=self.contexts, req_pool_indices=d["rp"], prefix_lens=d["prefix"], req_to_token=d["r2t"],
            req_to_verify_expected_tokens=d["pool"], req_to_verify_expected_tokens_valid_lens=d["valid"],
            check_verify_expected_token=True, invalid_rows_out=d["invalid"])
        kc.launch_canary_write_from_table(
            contexts=self.contexts, req_pool_indices=d["rp"], prefix_lens=d["prefix"], extend_seq_lens=d["extend"],
            req_to_token=d["r2t"], input_ids=d["ids"], positions=d["pos"], out_cache_loc=d["loc"],
            invalid_rows_out=d["invalid"])


def test_verify_table_write_table_graph_replay_equals_eager(cuda_ready):
    from kvcanary.ops.cuda.backend import prepare_real_kv_sources

    rng = rng_for("table-graph")
    steps = 12
    host, sources, step_inputs = _decode_setup(rng, bs=40, max_seq_len=64)
    graph_eng, eager_eng = TableEngine(host, sources, "cuda"), TableEngine(host, sources, "cuda")
    graph_eng.refill(step_inputs(0))
    prepare_real_kv_sources(graph_eng.contexts)  # the capture must not build descriptor tables
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_eng.step()
    torch.cuda.synchronize()
    for k in ("canary_k", "canary_v", "index"):
        assert_same_bytes(host[k], graph_eng.t[k], f"{k} after capture (capture launches nothing)")
    cpu_eng = TableEngine(host, sources, "cpu")
    for i in range(steps):
        graph_eng.refill(step_inputs(i))
        g.replay()
        eager_eng.refill(step_inputs(i))
        eager_eng.step()
        cpu_eng.refill(step_inputs(i))
        cpu_eng.step()
        torch.cuda.synchronize()
        for k in host:
            if k != "ring":
                assert_same_bytes(eager_eng.t[k], graph_eng.t[k], f"step {i}: {k} (graph vs eager)")
                assert_same_bytes(cpu_eng.t[k], graph_eng.t[k], f"step {i}: {k} (graph vs CPU reference)")
        compare_logs(eager_eng.log, graph_eng.log)
        compare_logs(cpu_eng.log, LogState(*(x.cpu() for x in (graph_eng.log.ring, graph_eng.log.index,
                                                                 graph_eng.log.slot_counter,
                                                                 graph_eng.log.kernel_counter))))
    assert int(graph_eng.t["kernel_counter"][0]) == int(host["kernel_counter"][0]) + 4 * steps
    assert int(graph_eng.t["index"][0]) > 0  # the injected token mismatches were reported


def test_capture_without_real_kv_tables_raises_then_prepare_works(cuda_ready):
    from kvcanary.ops.cuda import launch as cuda_launch
    from kvcanary.ops.cuda.backend import RealKvSourcesNotPreparedError, prepare_real_kv_sources
    from kvcanary.ops.validation import context_views

    rng = rng_for("table-not-prepared")
    host, sources, step_inputs = _decode_setup(rng, bs=8, max_seq_len=32, pool_bytes=48)
    eng = TableEngine(host, sources, "cuda")
    eng.refill(step_inputs(0))
    for c in eng.contexts:  # a fresh allocation may reuse an address an earlier test built a table for
        cuda_launch._tables.pop((torch.cuda.current_device(), cuda_launch.source_descriptors(context_views(c))), None)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RealKvSourcesNotPreparedError, match="prepare_real_kv_sources"), torch.cuda.graph(g):
        eng.step()
    del g
    torch.cuda.synchronize()
    assert_same_bytes(host["canary_k"], eng.t["canary_k"], "nothing ran")
    prepare_real_kv_sources(eng.contexts)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        eng.step()
    ref = TableEngine(host, sources, "cpu")
    ref.refill(step_inputs(0))
    g.replay()
    ref.step()
    torch.cuda.synchronize()
    for k in ("canary_k", "canary_v", "index", "slot_counter", "kernel_counter"):
        assert_same_bytes(ref.t[k], eng.t[k], k)


def test_launch_after_empty_cache_with_reallocated_tensors(cuda_ready):
    """Cached per-context words and descriptor tables never outlive what they describe: new tensors (possibly
    at the old addresses) after torch.cuda.empty_cache() give the reference's results."""
    rng = rng_for("empty-cache")
    for round_ in range(3):
        host, sources, step_inputs = _decode_setup(rng, bs=16, max_seq_len=48)
        eng, ref = TableEngine(host, sources, "cuda"), TableEngine(host, sources, "cpu")
        for i in range(2):
            for e in (eng, ref):
                e.refill(step_inputs(i))
                e.step()
        # The SGLang-named verify on the same contexts, through a plan.
        for e, dev in ((eng, "cuda"), (ref, "cpu")):
            d = e.t
            vp = kc.VerifyPlan.allocate(verify_capacity=16 * 48, device=dev)
            wp = kc.WritePlan.allocate(write_req_capacity=16, device=dev)
            kc.launch_canary_plan_kernels(
                verify_plan_out=vp, write_plan_out=wp, req_pool_indices=d["rp"], prefix_lens=d["prefix"],
                extend_seq_lens=d["extend"], req_to_token=d["r2t"], swa_window_size=0, full_to_swa_index_mapping=None,
                verify_capacity=16 * 48, req_to_verify_expected_tokens=None,
                req_to_verify_expected_tokens_valid_lens=None, kv_token_id_vs_position_offset=0)
            for c in e.contexts:
                kc.launch_canary_verify_kernel(context=c, plan=vp, check_verify_expected_token=False)
        torch.cuda.synchronize()
        for k in host:
            if k != "ring":
                assert_same_bytes(ref.t[k], eng.t[k], f"round {round_}: {k}")
        compare_logs(ref.log, LogState(*(x.cpu() for x in (eng.log.ring, eng.log.index, eng.log.slot_counter,
                                                             eng.log.kernel_counter))))
        del eng
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
