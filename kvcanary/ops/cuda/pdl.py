"""Programmatic dependent launch (PDL, sm_90 and newer): a kernel of the plan-free family starts while the kernel
before it in the stream finishes.

The plan-free kernels (``write_table.cu``, ``verify_table.cu``, with their ``KVC_WT_PDL`` / ``KVC_VT_PDL`` define
at 1) begin with ``griddepcontrol.launch_dependents`` and ``griddepcontrol.wait`` (``common.cuh``,
``kvc_grid_dependency``): the next kernel of the stream may be scheduled at once, and nothing of this one touches
memory until the kernel before it has finished and its writes are visible. Launched with the programmatic stream
serialization attribute (``cuLaunchKernelEx``), such a kernel's launch and block scheduling then overlap the end of
the kernel before it, when that kernel allows it (as these do at their start): in a ``KVCanary`` step the write
right after the verify, the next group's verify after that write, and so on. Without the attribute (a device before
sm_90, ``KVCANARY_PDL=0``) the two instructions do nothing and the launch is an ordinary one, so the stream order
holds either way; a kernel compiled without the instructions is never launched with the attribute (the decision
reads the define from the source that was compiled).

Measured on an H100 (docs/BENCHMARKS.md, 2026-12-06): a K + V verify and the write after it 0.9-1.6 µs faster in a
graph and 1.5-2.2 µs eagerly; the decode write at A in a graph of its own back-to-back launches 2.96-3.00 -> 2.45-2.47
µs. After a kernel that does not allow the overlap (an engine's, usually) a graph gains nothing (up to 0.2 µs lost),
an eager launch 0.7-1.5 µs. ``cuLaunchKernelEx`` through ctypes costs about 1 µs more host time per launch.

``cuLaunchKernelEx`` is called through ctypes (CuPy binds only ``cuLaunchKernel``) with a launch configuration
built once per (grid, block, stream) and kept.
"""

from __future__ import annotations

import ctypes
import os
import threading
from functools import cache
from typing import Any

from kvcanary.ops.cuda.specs import int_define

ENV = "KVCANARY_PDL"
"""Environment variable: ``0`` launches every kernel the ordinary way (read when a kernel is first loaded)."""

DEFINES: dict[str, tuple[str, str]] = {
    "write_table": ("write_table.cu", "KVC_WT_PDL"),
    "verify_table": ("verify_table.cu", "KVC_VT_PDL"),
}
"""Kernel family -> (source file, the define that compiles the dependency instructions in)."""

MIN_COMPUTE_CAPABILITY = (9, 0)

functions: set[int] = set()
"""Handles (``CUfunction``) of the loaded kernels launched with the attribute (:func:`register`)."""

_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute`` (cuda.h): the id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h)."""

    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("num_attrs", ctypes.c_uint)]


def enabled_by_env() -> bool:
    """Whether ``KVCANARY_PDL`` allows the attribute (anything but ``0``; default: on)."""
    return os.environ.get(ENV, "1").strip() != "0"


@cache
def _compute_capability(device_index: int) -> tuple[int, int]:
    from kvcanary.ops.interop import import_cupy

    cc = str(import_cupy().cuda.Device(device_index).compute_capability)
    return int(cc[:-1]), int(cc[-1])


@cache
def _driver_entry() -> Any:
    """``cuLaunchKernelEx`` of the CUDA driver library, or None where it cannot be loaded."""
    try:
        f = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    f.restype = ctypes.c_int
    return f


def wanted(family: str, device_index: int) -> bool:
    """Whether kernels of ``family`` loaded on device ``device_index`` are launched with the attribute: the family
    compiles the dependency instructions in (its define is 1 in the source the loader compiles), the device is
    sm_90 or newer, ``KVCANARY_PDL`` is not ``0`` and the driver has ``cuLaunchKernelEx``."""
    where = DEFINES.get(family)
    if where is None or not enabled_by_env() or int_define(*where) != 1:
        return False
    return _compute_capability(device_index) >= MIN_COMPUTE_CAPABILITY and _driver_entry() is not None


def register(handle: int, on: bool) -> None:
    """Launch the kernel ``handle`` with the attribute (``on``) or not. A handle is registered either way each time
    a kernel is loaded: that of an unloaded module may come back for another kernel."""
    if on:
        functions.add(handle)
    else:
        functions.discard(handle)


_configs: dict[tuple[int, int, int], tuple[int, LaunchConfig, LaunchAttribute]] = {}
_configs_lock = threading.Lock()


def _config(grid: int, block: int, stream: int) -> tuple[int, LaunchConfig, LaunchAttribute]:
    """A new launch configuration (its address, and the objects the address points into), kept for next time."""
    attr = LaunchAttribute()
    attr.id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1  # programmaticStreamSerializationAllowed
    cfg = LaunchConfig(grid, 1, 1, block, 1, 1, 0, stream, ctypes.addressof(attr), 1)
    entry = (ctypes.addressof(cfg), cfg, attr)
    with _configs_lock:
        if len(_configs) >= 1024:
            _configs.clear()
        _configs[grid, block, stream] = entry
    return entry


def launch(handle: int, grid: int, block: int, stream: int, params_addr: int) -> None:
    """``cuLaunchKernelEx`` of kernel ``handle`` (one by-value struct argument at ``params_addr``, the
    ``kernelParams`` array) on ``grid`` x ``block``, on the raw stream handle ``stream``, with programmatic stream
    serialization allowed. On the current device (the caller made it the kernel's)."""
    entry = _configs.get((grid, block, stream)) or _config(grid, block, stream)  # held: its memory stays alive
    rc = _driver_entry()(entry[0], handle, params_addr, None)
    if rc != 0:
        raise RuntimeError(f"kv-canary: cuLaunchKernelEx failed (CUresult {rc}) for a grid of {grid} x {block}")
