"""Zero-copy array and stream interop (DLPack, torch, CuPy, NumPy).

Every array a public op receives is described once by an :class:`ArrayView`: dtype, shape, strides,
device and data pointer, read without copying. The CPU reference reads and writes through
:meth:`ArrayView.host` (a NumPy array over the caller's memory); the CUDA backend passes
:attr:`ArrayView.ptr` to its kernels. Nothing here casts, copies or makes an array contiguous.

torch tensors are read through their own attributes rather than ``__dlpack__``: the DLPack handshake
makes the producer's stream wait on the consumer's, which would add cross-stream dependencies inside a
CUDA-graph capture. CuPy arrays are read directly too. Anything else is imported with
``numpy.from_dlpack`` (CPU) or ``cupy.from_dlpack`` (CUDA), both zero-copy.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from kvcanary.errors import CudaBackendUnavailableError, invalid

# DLPack device types (dlpack.h).
_DL_CPU = 1
_DL_CUDA = 2
_DL_CUDA_HOST = 3
_DL_CUDA_MANAGED = 13

_NUMPY_DTYPES = {
    "int64": np.int64,
    "int32": np.int32,
    "int16": np.int16,
    "int8": np.int8,
    "uint64": np.uint64,
    "uint32": np.uint32,
    "uint16": np.uint16,
    "uint8": np.uint8,
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bool": np.bool_,
}


class Device(NamedTuple):
    """Where an array lives: ``kind`` is ``"cpu"`` or ``"cuda"``; ``index`` is the CUDA ordinal (-1 on CPU)."""

    kind: str
    index: int = -1  # type: ignore[assignment]  # shadows tuple.index, which nothing here calls

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"


CPU = Device("cpu")


class ArrayView(NamedTuple):
    """A read-only description of one caller array; ``obj`` keeps it alive.

    ``dtype`` is a short name (``"int64"``, ``"uint8"``, ``"bfloat16"``, ...); ``strides`` are in
    elements; ``ptr`` is the address of element 0 (storage offset included). A named tuple rather than a
    dataclass because hot paths build several per call and a tuple is several times cheaper to build.
    """

    name: str
    obj: Any
    dtype: str
    itemsize: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    device: Device
    ptr: int

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def data_ptr(self) -> int:
        """``ptr``, under torch's name: hot paths take a checked torch tensor or a view alike."""
        return self.ptr

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        """C-contiguous in the torch sense: size-1 dimensions may have any stride; an empty array is contiguous."""
        if self.numel == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def host(self) -> np.ndarray:
        """A writable NumPy array over the caller's CPU memory (no copy), with this view's shape and strides."""
        if self.dtype not in _NUMPY_DTYPES:
            raise invalid(f"{self.name} has dtype {self.dtype}, which NumPy cannot view; use host_rows()")
        np_dtype = np.dtype(_NUMPY_DTYPES[self.dtype])
        return self._raw(np_dtype, self.shape, tuple(s * self.itemsize for s in self.strides))

    def host_rows(self, row_bytes: int) -> np.ndarray:
        """The CPU memory as a 2-D uint8 array ``[shape[0], row_bytes]`` with row stride ``strides[0]``.

        This is the byte view of SPEC §3.1 (real-KV sources of any dtype); the caller has checked that
        each row's first ``row_bytes`` bytes are inside the array.
        """
        stride0 = self.strides[0] * self.itemsize
        return self._raw(np.dtype(np.uint8), (self.shape[0], row_bytes), (stride0, 1))

    def _raw(self, np_dtype: np.dtype, shape: tuple[int, ...], byte_strides: tuple[int, ...]) -> np.ndarray:
        if self.device.kind != "cpu":
            raise invalid(f"{self.name} is on {self.device}, not the CPU")
        if 0 in shape:
            return np.empty(shape, dtype=np_dtype)
        span = sum((n - 1) * st for n, st in zip(shape, byte_strides)) + np_dtype.itemsize
        # A ctypes array is a buffer (its stubs do not say so).
        raw = np.frombuffer((ctypes.c_char * span).from_address(self.ptr), dtype=np.uint8)  # type: ignore[call-overload]
        if np_dtype.itemsize > 1:
            raw = raw[: span - span % np_dtype.itemsize].view(np_dtype)
        return np.lib.stride_tricks.as_strided(raw, shape=shape, strides=byte_strides)


def _torch_view(name: str, t: Any) -> ArrayView:
    dev = t.device
    if dev.type == "cpu":
        device = CPU
    elif dev.type == "cuda":
        device = Device("cuda", dev.index if dev.index is not None else 0)
    else:
        raise invalid(f"{name} is on device {dev}, which kvcanary does not support (cpu or cuda only)")
    return ArrayView(
        name=name,
        obj=t,
        dtype=str(t.dtype).removeprefix("torch."),
        itemsize=t.element_size(),
        shape=tuple(t.shape),
        strides=tuple(t.stride()),
        device=device,
        ptr=t.data_ptr(),
    )


def _numpy_like_view(name: str, a: Any, device: Device, ptr: int) -> ArrayView:
    itemsize = a.dtype.itemsize
    for s in a.strides:
        if s % itemsize:
            raise invalid(f"{name} has byte strides {tuple(a.strides)} that are not whole elements")
    return ArrayView(
        name=name,
        obj=a,
        dtype=a.dtype.name if a.dtype.name != "bool" else "bool",
        itemsize=itemsize,
        shape=tuple(a.shape),
        strides=tuple(s // itemsize for s in a.strides),
        device=device,
        ptr=ptr,
    )


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "stride")


def _is_cupy_array(x: Any) -> bool:
    return type(x).__module__.startswith("cupy") and hasattr(x, "data") and hasattr(x, "device")


def view(name: str, x: Any) -> ArrayView:
    """Describe ``x`` (torch tensor, NumPy or CuPy array, or any ``__dlpack__`` array) without copying."""
    if isinstance(x, ArrayView):
        return x
    if _is_torch_tensor(x):
        return _torch_view(name, x)
    if isinstance(x, np.ndarray):
        return _numpy_like_view(name, x, CPU, x.__array_interface__["data"][0])
    if _is_cupy_array(x):
        return _numpy_like_view(name, x, Device("cuda", x.device.id), x.data.ptr)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        dev_type, dev_id = x.__dlpack_device__()
        dev_type = int(dev_type)
        if dev_type in (_DL_CPU, _DL_CUDA_HOST):
            a = np.from_dlpack(x)
            return _with_obj(_numpy_like_view(name, a, CPU, a.__array_interface__["data"][0]), x)
        if dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
            cp = import_cupy()
            with cp.cuda.Device(int(dev_id)):
                a = cp.from_dlpack(x)
            return _with_obj(_numpy_like_view(name, a, Device("cuda", int(dev_id)), a.data.ptr), x)
        raise invalid(f"{name} is on DLPack device type {dev_type}, which kvcanary does not support")
    raise TypeError(
        f"kv-canary: {name} must be a torch tensor or an array with __dlpack__, got {type(x).__name__}"
    )


def _with_obj(v: ArrayView, original: Any) -> ArrayView:
    # Keep both the imported array (it owns the DLPack capsule) and the caller's object alive.
    return ArrayView(v.name, (v.obj, original), v.dtype, v.itemsize, v.shape, v.strides, v.device, v.ptr)


def common_device(op: str, views: Sequence[ArrayView]) -> Device:
    """The one device all ``views`` live on; a ``kv-canary:`` error naming two of them otherwise."""
    first = views[0]
    for v in views[1:]:
        if v.device != first.device:
            raise invalid(
                f"{op} arrays must all be on one device, got {first.name} on {first.device} "
                f"and {v.name} on {v.device}"
            )
    return first.device


def import_cupy():
    """Import CuPy lazily, with an error that names the extra to install."""
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CudaBackendUnavailableError(
            "kv-canary: the CUDA backend needs CuPy: install kvcanary[cu12] (CUDA 12) or kvcanary[cu13] "
            f"(CUDA 13) ({e})"
        ) from e
    return cupy


def stream_handle(stream: Any, device: Device) -> int:
    """The raw ``cudaStream_t`` to launch on: ``stream`` if given, else torch's current stream on ``device``.

    ``stream`` may be a torch stream, a CuPy stream, any object with ``__cuda_stream__`` (the CUDA Python
    stream protocol) or a raw integer handle.
    """
    if stream is None:
        import torch

        # The raw handle without building a torch.cuda.Stream object (what torch's own compiled code uses).
        get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if get_raw is not None:
            return int(get_raw(device.index))
        return int(torch.cuda.current_stream(device.index).cuda_stream)
    if hasattr(stream, "__cuda_stream__"):
        proto = stream.__cuda_stream__
        proto = proto() if callable(proto) else proto
        return int(proto[1])
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        return int(stream.cuda_stream)
    if hasattr(stream, "ptr"):  # cupy.cuda.Stream / ExternalStream
        return int(stream.ptr)
    if isinstance(stream, (int, np.integer)):
        return int(stream)
    raise TypeError(
        f"kv-canary: stream must be a torch or CuPy stream, an object with __cuda_stream__ or an int handle, "
        f"got {type(stream).__name__}"
    )
