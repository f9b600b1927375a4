"""Compile the kernel modules with CuPy/NVRTC at first use and cache them per (device, specialization).

``cupy.RawModule(code=spec.source(), options=NVRTC_OPTIONS)`` compiles (or reads CuPy's on-disk cache,
keyed by the source text and options) and loads the module on the current device; a kernel is fetched
and forced to load under ``cupy.cuda.Device(index)``, so launches never compile or load anything.
:func:`function` hands the launchers the kernel's ``cupy.cuda.function.Function`` of a device (launched with a
raw stream handle), cached by ``(device, family, name, flags)`` so a launch builds no spec.
:func:`warmup` does this for every specialization ahead of time: call it before capturing a CUDA graph,
since module loading is not a stream operation and must not happen inside a capture.
"""

from __future__ import annotations

import threading
from typing import Any

from kvcanary.errors import invalid
from kvcanary.ops.cuda import pdl
from kvcanary.ops.cuda.grids import sm_count
from kvcanary.ops.cuda.specs import NVRTC_OPTIONS, KernelSpec, all_specs, family_flags, in_use, spec_for
from kvcanary.ops.interop import import_cupy

_lock = threading.Lock()
_modules: dict[tuple[int, str], Any] = {}
_kernels: dict[tuple[int, str, str], Any] = {}


def kernel(spec: KernelSpec, name: str, device_index: int) -> Any:
    """The ``cupy.RawKernel`` ``name`` of ``spec``, compiled and loaded on CUDA device ``device_index``."""
    key = (device_index, spec.key, name)
    k = _kernels.get(key)
    if k is not None:
        return k
    if name not in spec.entry_points:
        raise invalid(f"kernel {name!r} is not an entry point of {spec.key} ({spec.entry_points})")
    cp = import_cupy()
    with _lock:
        k = _kernels.get(key)
        if k is None:
            with cp.cuda.Device(device_index):
                mod = _modules.get((device_index, spec.key))
                if mod is None:
                    mod = cp.RawModule(code=spec.source(), options=NVRTC_OPTIONS)
                    _modules[(device_index, spec.key)] = mod
                k = mod.get_function(name)
                # Reading an attribute compiles, loads the module and resolves the function on this device
                # now (CUDA may otherwise load lazily at the first launch, possibly inside a capture).
                _ = k.num_regs
            _kernels[key] = k
    return k


_functions: dict[tuple[int, str, str, tuple[bool | int, ...]], Any] = {}


def function(device_index: int, family: str, name: str, *flags: bool | int) -> Any:
    """The ``cupy.cuda.function.Function`` of kernel ``name`` of ``family`` specialized by ``flags`` (the
    family's flags in order, see :mod:`kvcanary.ops.cuda.specs`), loaded on CUDA device ``device_index``."""
    key = (device_index, family, name, flags)
    fn = _functions.get(key)
    if fn is None:
        spec = spec_for(family, **dict(zip(family_flags(family), flags)))
        k = kernel(spec, name, device_index)
        cp = import_cupy()
        with cp.cuda.Device(device_index):
            fn = getattr(k, "kernel", None)  # the cupy.cuda.function.Function of this device
        if fn is None:  # pragma: no cover - a CuPy without RawKernel.kernel: launch through the RawKernel
            fn = _RawKernelCall(k)
        else:
            pdl.register(fn.ptr, pdl.wanted(family, device_index))
        _functions[key] = fn
    return fn


class _RawKernelCall:
    """``Function.__call__``'s signature over a ``cupy.RawKernel`` (on the stream given as an object with ``ptr``)."""

    def __init__(self, k: Any) -> None:
        self.k = k

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0, stream: Any = None) -> None:
        cp = import_cupy()
        with cp.cuda.ExternalStream(stream.ptr):
            self.k(grid, block, args, shared_mem=shared_mem)


def _device_index(device: Any) -> int:
    if device is None:
        return int(import_cupy().cuda.runtime.getDevice())
    if isinstance(device, bool):
        raise TypeError(f"kv-canary: device must be a CUDA device, got {device!r}")
    if isinstance(device, int):
        index = device
    elif hasattr(device, "type") and hasattr(device, "index"):  # torch.device
        if device.type != "cuda":
            raise invalid(f"device must be a CUDA device, got {device}")
        index = device.index if device.index is not None else int(import_cupy().cuda.runtime.getDevice())
    elif hasattr(device, "id"):  # cupy.cuda.Device
        index = int(device.id)
    elif isinstance(device, str):
        kind, _, num = device.partition(":")
        if kind != "cuda" or (num and not num.isdigit()):
            raise invalid(f"device must be 'cuda' or 'cuda:N', got {device!r}")
        index = int(num) if num else int(import_cupy().cuda.runtime.getDevice())
    else:
        raise TypeError(f"kv-canary: device must be an int, 'cuda:N', a torch or CuPy device, got {device!r}")
    count = int(import_cupy().cuda.runtime.getDeviceCount())
    if not 0 <= index < count:
        raise invalid(f"device index must be in [0, {count}), got {index}")
    return index


def warmup(device: Any = None) -> int:
    """Compile and load every kernel specialization the launchers can take (:func:`~kvcanary.ops.cuda.specs.in_use`)
    on ``device`` (default: the current CUDA device).

    Call it before capturing CUDA graphs that contain kvcanary launches. Returns the number of kernels
    loaded. ``device`` may be an int, ``"cuda"``/``"cuda:N"``, a ``torch.device`` or a ``cupy.cuda.Device``.
    """
    index = _device_index(device)
    n = 0
    for spec in filter(in_use, all_specs()):
        for name in spec.entry_points:
            function(index, spec.family, name, *spec.flags)
            n += 1
    sm_count(index)  # cache it now: the launchers size grids from it
    return n
