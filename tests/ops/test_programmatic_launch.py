"""Programmatic dependent launch (kvcanary/ops/cuda/pdl.py) on the CPU: the ``cuLaunchKernelEx`` structures'
layout, which kernels are launched with the attribute, and that ``launch_prepared`` routes them (and only them)
through it. The kernels' side (the wait before any memory access) is checked on their PTX in
test_nvrtc_compile.py; the launches themselves in tests/gpu/test_gpu_pdl.py."""

from __future__ import annotations

import ctypes

import pytest

from kvcanary.ops.cuda import launch, pdl, specs
from support.kernel_source import edited_copy, kernels_from


def test_launch_structs_have_cuda_h_layout():
    # cuda.h (CUDA 12 and 13): CUlaunchAttribute is {CUlaunchAttributeID id; char pad[8 - sizeof(id)];
    # CUlaunchAttributeValue value;} with a 64-byte value union; CUlaunchConfig is seven unsigned ints, a CUstream,
    # a CUlaunchAttribute*, an unsigned int (x86-64: pointers 8-byte aligned).
    A, C = pdl.LaunchAttribute, pdl.LaunchConfig
    assert (ctypes.sizeof(A), A.id.offset, A.value.offset, A.value.size) == (72, 0, 8, 64)
    assert [getattr(C, f).offset for f in ("grid_x", "block_x", "shared_mem", "stream", "attrs", "num_attrs")] == \
        [0, 12, 24, 32, 40, 48]
    assert ctypes.sizeof(C) == 56


@pytest.fixture
def sm(monkeypatch):
    """A device of a chosen compute capability and a driver with cuLaunchKernelEx (no GPU needed)."""
    cc = {"value": (9, 0)}
    monkeypatch.setattr(pdl, "_compute_capability", lambda index: cc["value"])
    monkeypatch.setattr(pdl, "_driver_entry", lambda: object())
    monkeypatch.delenv(pdl.ENV, raising=False)
    return cc


def test_wanted_for_the_plan_free_families_on_sm90_only(sm, monkeypatch):
    assert pdl.wanted("write_table", 0) and pdl.wanted("verify_table", 0)
    for family in ("plan", "write", "verify", "scatter", "records"):
        assert not pdl.wanted(family, 0), family
    sm["value"] = (8, 9)
    assert not pdl.wanted("write_table", 0) and not pdl.wanted("verify_table", 0)
    sm["value"] = (10, 0)
    assert pdl.wanted("write_table", 0)
    monkeypatch.setenv(pdl.ENV, "0")
    assert not pdl.wanted("write_table", 0) and not pdl.wanted("verify_table", 0)
    monkeypatch.setenv(pdl.ENV, "1")
    assert pdl.wanted("verify_table", 0)
    monkeypatch.setattr(pdl, "_driver_entry", lambda: None)
    assert not pdl.wanted("verify_table", 0)


@pytest.mark.parametrize("family", sorted(pdl.DEFINES))
def test_wanted_follows_the_define_of_the_source_compiled(sm, tmp_path, family):
    source, define = pdl.DEFINES[family]
    assert specs.int_define(source, define) == 1  # shipped on
    off = edited_copy(tmp_path / "off", source, lambda text: specs.set_int_define(text, define, 0, source))
    with kernels_from(off):
        assert not pdl.wanted(family, 0)
    assert pdl.wanted(family, 0)


def test_register_adds_and_discards():
    h = 0x7F00DEAD0000
    try:
        pdl.register(h, True)
        assert h in pdl.functions
        pdl.register(h, True)
        pdl.register(h, False)
        assert h not in pdl.functions
        pdl.register(h, False)  # a handle never added
        assert h not in pdl.functions
    finally:
        pdl.functions.discard(h)


class _Fn:
    def __init__(self, ptr: int):
        self.ptr = ptr


class _Rt:
    @staticmethod
    def getDevice() -> int:
        return 0


def test_launch_prepared_takes_cuLaunchKernelEx_for_registered_kernels_only(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "_rt", _Rt())
    monkeypatch.setattr(launch, "_driver_launch", lambda *a: calls.append(("cuLaunchKernel", a)))
    monkeypatch.setattr(pdl, "launch", lambda *a: calls.append(("cuLaunchKernelEx", a)))
    buf = launch.ArgBuffer(4)
    stream = launch.raw_stream(0x5000)
    fn = _Fn(0x7F00BEEF0000)
    try:
        launch.launch_prepared(fn, 132, 256, buf, 0, stream)
        pdl.register(fn.ptr, True)
        launch.launch_prepared(fn, 132, 256, buf, 0, stream)
        pdl.register(fn.ptr, False)
        launch.launch_prepared(fn, 528, 128, buf, 0, stream)
    finally:
        pdl.functions.discard(fn.ptr)
    assert calls == [
        ("cuLaunchKernel", (fn.ptr, 132, 1, 1, 256, 1, 1, 0, 0x5000, buf.params_addr, 0)),
        ("cuLaunchKernelEx", (fn.ptr, 132, 256, 0x5000, buf.params_addr)),
        ("cuLaunchKernel", (fn.ptr, 528, 1, 1, 128, 1, 1, 0, 0x5000, buf.params_addr, 0)),
    ]


def test_launch_builds_one_config_per_geometry_and_stream(monkeypatch):
    seen = []

    def entry(cfg, handle, params, extra):
        c = pdl.LaunchConfig.from_address(cfg)
        a = pdl.LaunchAttribute.from_address(c.attrs)
        seen.append((cfg, handle, params, extra, c.grid_x, c.grid_y, c.grid_z, c.block_x, c.block_y, c.block_z,
                     c.shared_mem, c.stream, c.num_attrs, a.id, a.value[0]))
        return 0

    monkeypatch.setattr(pdl, "_driver_entry", lambda: entry)
    monkeypatch.setattr(pdl, "_configs", {})
    pdl.launch(11, 132, 256, 0x77, 0x1000)
    pdl.launch(12, 132, 256, 0x77, 0x2000)
    pdl.launch(11, 528, 256, 0x77, 0x1000)
    assert [s[1:] for s in seen] == [
        (11, 0x1000, None, 132, 1, 1, 256, 1, 1, 0, 0x77, 1, 6, 1),
        (12, 0x2000, None, 132, 1, 1, 256, 1, 1, 0, 0x77, 1, 6, 1),
        (11, 0x1000, None, 528, 1, 1, 256, 1, 1, 0, 0x77, 1, 6, 1),
    ]
    assert seen[0][0] == seen[1][0] != seen[2][0]  # one config per (grid, block, stream), reused
    monkeypatch.setattr(pdl, "_driver_entry", lambda: lambda *a: 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match=r"kv-canary: cuLaunchKernelEx failed \(CUresult 1\)"):
        pdl.launch(11, 132, 256, 0x77, 0x1000)
