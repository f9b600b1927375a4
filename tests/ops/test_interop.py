"""Zero-copy interop (SPEC §9 "Zero copy", "Device"): torch tensors, NumPy arrays and any ``__dlpack__`` array
are described without copying and written in place; device dispatch and the mixed-device error, tested with
fake CUDA views (no GPU needed); stream handles."""

from __future__ import annotations

import dataclasses
import sys
import types

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary.errors import CudaBackendUnavailableError
from kvcanary.ops import backends, interop
from kvcanary.ops.interop import CPU, ArrayView, Device, common_device, view
from support.canary_testlib import PoolSource, t32, t64


class DLPackOnly:
    """An array known only through the DLPack protocol (not torch, not NumPy)."""

    def __init__(self, inner):
        self._inner = inner

    def __dlpack__(self, *args, **kwargs):
        return self._inner.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._inner.__dlpack_device__()


def test_torch_view_fields_and_storage_offset():
    base = torch.arange(24, dtype=torch.int64).reshape(4, 6)
    t = base[1:3]
    v = view("x", t)
    assert (v.dtype, v.itemsize, v.shape, v.strides, v.device) == ("int64", 8, (2, 6), (6, 1), CPU)
    assert v.ptr == base.data_ptr() + 6 * 8
    assert v.is_contiguous() and not view("y", base[:, ::2]).is_contiguous()
    assert view("z", base[:, 1:2]).is_contiguous() is False
    assert view("w", base[1:2, 2:3]).is_contiguous()  # size-1 dims may have any stride
    assert view("e", torch.zeros((4, 0))).is_contiguous()
    assert view("b", torch.zeros(3, dtype=torch.bfloat16)).dtype == "bfloat16"


def test_host_is_zero_copy_over_torch_memory():
    base = torch.zeros(10, dtype=torch.int64)
    h = view("x", base[2:5]).host()
    h[:] = [7, 8, 9]
    assert base.tolist() == [0, 0, 7, 8, 9, 0, 0, 0, 0, 0]
    assert not h.flags.owndata


def test_host_rows_is_the_byte_view_of_each_row():
    base = torch.arange(4 * 64, dtype=torch.int32).reshape(4, 64)[:, 8:24]  # row stride 256 bytes, 64 used
    rows = view("x", base).host_rows(64)
    assert rows.shape == (4, 64) and rows.strides == (256, 1)
    assert rows[2].tobytes() == base[2].numpy().tobytes()
    rows[1, :4] = 0xFF
    assert int(base[1, 0]) == -1


def test_numpy_view_and_bad_strides():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    v = view("a", a)
    assert (v.dtype, v.shape, v.strides, v.ptr) == ("int32", (3, 4), (4, 1), a.__array_interface__["data"][0])
    odd = np.lib.stride_tricks.as_strided(np.zeros(20, np.int32), shape=(3,), strides=(6,))
    with pytest.raises(ValueError) as e:
        view("odd", odd)
    assert str(e.value) == "kv-canary: odd has byte strides (6,) that are not whole elements"


def test_dlpack_only_object_is_zero_copy():
    a = np.zeros(6, dtype=np.int64)
    v = view("d", DLPackOnly(a))
    assert v.device == CPU and v.ptr == a.__array_interface__["data"][0]
    v.host()[:] = 5
    assert a.tolist() == [5] * 6
    t = torch.zeros(3, dtype=torch.int32)
    v = view("t", DLPackOnly(t))
    assert v.ptr == t.data_ptr() and v.dtype == "int32"


def test_unsupported_objects_and_devices():
    with pytest.raises(TypeError) as e:
        view("x", "abc")
    assert str(e.value) == "kv-canary: x must be a torch tensor or an array with __dlpack__, got str"
    with pytest.raises(ValueError) as e:
        view("m", torch.zeros(3, device="meta"))
    assert str(e.value) == "kv-canary: m is on device meta, which kvcanary does not support (cpu or cuda only)"

    class OpenCL:
        def __dlpack__(self, *a, **k):
            raise AssertionError("must not be called")

        def __dlpack_device__(self):
            return (4, 0)

    with pytest.raises(ValueError) as e:
        view("o", OpenCL())
    assert str(e.value) == "kv-canary: o is on DLPack device type 4, which kvcanary does not support"


# ----------------------------------------------------------------------------------------------- ops, in place


def pipeline(make):
    """plan -> write -> verify -> scatter on arrays built by ``make(torch_tensor)``; returns everything as lists."""
    r2t = make(t32([[0, 0, 0, 0], [3, 1, 2, 0], [4, 5, 0, 0]]))
    vp = kc.VerifyPlan(**{f.name: make(getattr(kc.VerifyPlan.allocate(verify_capacity=8), f.name))
                          for f in dataclasses.fields(kc.VerifyPlan)})
    wp = kc.WritePlan(**{f.name: make(getattr(kc.WritePlan.allocate(write_req_capacity=2), f.name))
                         for f in dataclasses.fields(kc.WritePlan)})
    pool = make(torch.zeros((3, 4), dtype=torch.int32))
    kc.launch_scatter_req_token_ids_kernel(flat_in=make(t64([10, 11, 12, 20, 21])), offsets=make(t64([0, 3, 5])),
                                           req_pool_indices=make(t64([1, 2])), pool_out=pool)
    buf = make(kc.allocate_canary_buffer(6))
    log = kc.ViolationLog.allocate(ring_capacity=4)
    log = kc.ViolationLog(**{f.name: make(getattr(log, f.name)) for f in dataclasses.fields(kc.ViolationLog)})
    src = PoolSource.make(rows=6, page_size=1, num_bytes_per_token=16, generator=torch.Generator().manual_seed(3))
    real = kc.RealKvSource(tensor=make(src.big), page_size=1, num_bytes_per_token=16, read_bytes=16)
    ctx = log.context(canary_buf=buf, kernel_kind=2, real_kv_sources=(real,), real_kv_hash_mode=1,
                      enable_chain_position_assert=make(kc.allocate_chain_position_flag(1)))
    common = dict(req_pool_indices=make(t64([1, 2])), req_to_token=r2t, swa_window_size=0,
                  full_to_swa_index_mapping=None, verify_capacity=8, req_to_verify_expected_tokens=pool,
                  req_to_verify_expected_tokens_valid_lens=make(t64([3, 2])), kv_token_id_vs_position_offset=0)
    # step 1: prefill 3 + 2 tokens; step 2: verify them and decode one token for request 1.
    kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, prefix_lens=make(t64([0, 0])),
                                  extend_seq_lens=make(t64([3, 2])), **common)
    kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True)
    kc.launch_canary_write_kernel(context=ctx, plan=wp, input_ids=make(t64([10, 11, 12, 20, 21])),
                                  positions=make(t64([0, 1, 2, 0, 1])), out_cache_loc=make(t64([3, 1, 2, 4, 5])),
                                  enable_write_input_assert=False, expected_input_tokens=None,
                                  expected_input_positions=None)
    kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, prefix_lens=make(t64([3, 2])),
                                  extend_seq_lens=make(t64([1, 0])), **common)
    kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True)
    # request 2 claims token 99 at position 1: one violation.
    kc.launch_scatter_req_token_ids_kernel(flat_in=make(t64([20, 99])), offsets=make(t64([0, 2])),
                                           req_pool_indices=make(t64([2])), pool_out=pool)
    kc.launch_canary_plan_kernels(verify_plan_out=vp, write_plan_out=wp, prefix_lens=make(t64([3, 2])),
                                  extend_seq_lens=make(t64([1, 0])), **common)
    kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True)
    out = [vp, wp, pool, buf, log]
    return [np.asarray(view("o", x).host()).tolist() for x in tensors_of(out)]


def tensors_of(objs):
    out = []
    for o in objs:
        if dataclasses.is_dataclass(o):
            out += [getattr(o, f.name) for f in dataclasses.fields(o)]
        else:
            out.append(o)
    return out


def test_ops_write_numpy_and_dlpack_arrays_in_place_like_torch():
    ref = pipeline(lambda t: t)
    ring = ref[-4]
    index = ref[-3]
    assert index == [1] and ring[0][1] == 5 and ring[0][4] == 99  # the pipeline really detects something
    assert pipeline(lambda t: t.numpy().copy()) == ref
    kept = []

    def dl(t):
        a = t.numpy().copy()
        kept.append(a)
        return DLPackOnly(a)

    assert pipeline(dl) == ref


def test_numpy_outputs_are_the_callers_memory():
    pool = np.zeros((2, 3), dtype=np.int32)
    ptr = pool.__array_interface__["data"][0]
    kc.launch_scatter_req_token_ids_kernel(flat_in=np.array([4, 5], np.int64), offsets=np.array([0, 2], np.int64),
                                           req_pool_indices=np.array([1], np.int64), pool_out=pool)
    assert pool.__array_interface__["data"][0] == ptr and pool.tolist() == [[0, 0, 0], [4, 5, 0]]


# ----------------------------------------------------------------------------------------------- devices


def fake(t, name: str, device: Device) -> ArrayView:
    """A view of CPU memory that claims to live on ``device`` (validation never dereferences it)."""
    return view(name, t)._replace(device=device)


CUDA0, CUDA1 = Device("cuda", 0), Device("cuda", 1)


def test_common_device():
    a = fake(torch.zeros(1), "a", CPU)
    b = fake(torch.zeros(1), "b", CUDA0)
    c = fake(torch.zeros(1), "c", CUDA1)
    assert common_device("op", [a, a]) == CPU
    assert common_device("op", [b, fake(torch.zeros(1), "b2", CUDA0)]) == CUDA0
    with pytest.raises(ValueError) as e:
        common_device("op", [a, a, b])
    assert str(e.value) == "kv-canary: op arrays must all be on one device, got a on cpu and b on cuda:0"
    with pytest.raises(ValueError) as e:
        common_device("op", [b, c])
    assert str(e.value) == "kv-canary: op arrays must all be on one device, got b on cuda:0 and c on cuda:1"
    assert str(CUDA1) == "cuda:1" and str(CPU) == "cpu"


def scatter_args(device_of):
    ts = dict(flat_in=t64([1, 2]), offsets=t64([0, 2]), req_pool_indices=t64([1]),
              pool_out=torch.full((2, 2), -3, dtype=torch.int32))
    return ts, {k: fake(v, k, device_of(k)) for k, v in ts.items()}


def test_mixed_devices_are_an_error_and_nothing_is_written():
    ts, args = scatter_args(lambda k: CUDA0 if k == "pool_out" else CPU)
    with pytest.raises(ValueError) as e:
        kc.launch_scatter_req_token_ids_kernel(**args)
    assert str(e.value) == ("kv-canary: launch_scatter_req_token_ids_kernel arrays must all be on one device, "
                            "got flat_in on cpu and pool_out on cuda:0")
    assert ts["pool_out"].tolist() == [[-3, -3], [-3, -3]]


def test_mixed_devices_in_a_context():
    log = kc.ViolationLog.allocate(ring_capacity=2)
    ctx = log.context(canary_buf=kc.allocate_canary_buffer(4), kernel_kind=0)
    vp = kc.VerifyPlan.allocate(verify_capacity=2)
    vp = dataclasses.replace(vp, enable=fake(vp.enable, "plan.enable", CUDA1))
    with pytest.raises(ValueError) as e:
        kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=False)
    assert str(e.value) == ("kv-canary: launch_canary_verify_kernel arrays must all be on one device, "
                            "got context.canary_buf on cpu and plan.enable on cuda:1")
    assert int(log.kernel_run_counter[0]) == 0


def test_all_cuda_arrays_dispatch_to_the_cuda_backend(monkeypatch):
    calls = []
    backend = types.SimpleNamespace(scatter=lambda launch, stream: calls.append((launch, stream)))
    monkeypatch.setitem(backends._backends, "cuda", backend)
    ts, args = scatter_args(lambda k: CUDA1)
    kc.launch_scatter_req_token_ids_kernel(**args, stream=1234)
    (launch, stream), = calls
    assert launch.device == CUDA1 and stream == 1234
    assert launch.pool_out.ptr == ts["pool_out"].data_ptr()
    assert ts["pool_out"].tolist() == [[-3, -3], [-3, -3]]  # the CPU reference did not run


def test_cuda_backend_unavailable_is_a_clear_error(monkeypatch):
    # Hide the backend even where it was imported already (on a GPU machine): the fake CUDA views below
    # hold host pointers, so a real launch would fault.
    import kvcanary.ops.cuda

    monkeypatch.setitem(sys.modules, "kvcanary.ops.cuda.backend", None)
    monkeypatch.delattr(kvcanary.ops.cuda, "backend", raising=False)
    monkeypatch.delitem(backends._backends, "cuda", raising=False)
    ts, args = scatter_args(lambda k: CUDA0)
    with pytest.raises(CudaBackendUnavailableError) as e:
        kc.launch_scatter_req_token_ids_kernel(**args)
    assert str(e.value).startswith("kv-canary: the CUDA backend is not available")
    assert ts["pool_out"].tolist() == [[-3, -3], [-3, -3]]


def test_import_cupy_names_the_extras(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(CudaBackendUnavailableError) as e:
        interop.import_cupy()
    assert "kvcanary[cu12]" in str(e.value) and "kvcanary[cu13]" in str(e.value)
    assert str(e.value).startswith("kv-canary: ")


# ----------------------------------------------------------------------------------------------- streams


def test_stream_handle_forms():
    class Proto:
        def __cuda_stream__(self):
            return (0, 77)

    class ProtoAttr:
        __cuda_stream__ = (0, 78)

    assert interop.stream_handle(5, CUDA0) == 5
    assert interop.stream_handle(np.int64(6), CUDA0) == 6
    assert interop.stream_handle(Proto(), CUDA0) == 77
    assert interop.stream_handle(ProtoAttr(), CUDA0) == 78
    assert interop.stream_handle(types.SimpleNamespace(cuda_stream=79), CUDA0) == 79
    assert interop.stream_handle(types.SimpleNamespace(ptr=80), CUDA0) == 80
    with pytest.raises(TypeError) as e:
        interop.stream_handle("s", CUDA0)
    assert str(e.value) == ("kv-canary: stream must be a torch or CuPy stream, an object with __cuda_stream__ or "
                            "an int handle, got str")
