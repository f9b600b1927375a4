"""Array checks (SPEC §9): dtype, rank, contiguity, length and device, each with its exact ``kv-canary:`` message.

:func:`array` describes any array (:func:`~kvcanary.ops.interop.view`) and checks it; :func:`array_on` adds the
device; :func:`batch_array` is :func:`array_on` at the least host cost, for the arrays a hot path is passed anew on
every call. A plain torch tensor takes a fast path of attribute reads; anything else takes the general one.
"""

from __future__ import annotations

from typing import Any

import torch

from kvcanary.errors import invalid, wrong_dtype
from kvcanary.ops.interop import CPU, ArrayView, Device, common_device, view

TENSOR_TYPE = torch.Tensor  # the fast paths compare with it (a subclass takes the general path)
_TORCH_DTYPES: dict[str, Any] = {}
_CUDA_DEVICES: dict[int, Device] = {}


def _torch_dtype(name: str) -> Any:
    dt = _TORCH_DTYPES.get(name)
    if dt is None:
        dt = _TORCH_DTYPES[name] = getattr(torch, name, None)
    return dt


def _checked_torch_view(name: str, x: Any, dtype: str, ndim: int) -> ArrayView | None:
    """The view of a plain torch tensor that passes every check of :func:`array` but the length, built from a
    handful of attribute reads (the same description :func:`~kvcanary.ops.interop.view` gives it); None for
    anything else (which then takes the general path and, if bad, gets its exact error)."""
    if type(x).__name__ != "Tensor" or x.dtype is not _torch_dtype(dtype) or x.dim() != ndim or not x.is_contiguous():
        return None
    if x.is_cuda:
        index = x.get_device()
        device = _CUDA_DEVICES.get(index)
        if device is None:
            device = _CUDA_DEVICES[index] = Device("cuda", index)
    elif x.is_cpu:
        device = CPU
    else:
        return None
    return ArrayView(name, x, dtype, x.element_size(), tuple(x.shape), x.stride(), device, x.data_ptr())


def array(
    name: str,
    x: Any,
    dtype: str,
    *,
    ndim: int = 1,
    length: int | None = None,
    min_length: int | None = None,
) -> ArrayView:
    """Describe ``x`` and check dtype, rank, contiguity and (first-dimension) length."""
    v = _checked_torch_view(name, x, dtype, ndim)
    if v is None:
        if x is None:
            raise TypeError(f"kv-canary: {name} must be an array, got None")
        v = view(name, x)
        if v.dtype != dtype:
            raise wrong_dtype(name, dtype, v.dtype)
        if v.ndim != ndim:
            raise invalid(f"{name} must be {ndim}-D, got shape {v.shape}")
        if not v.is_contiguous():
            raise invalid(f"{name} must be contiguous")
    if length is not None and v.shape[0] != length:
        raise invalid(f"{name} length must be {length}, got {v.shape[0]}")
    if min_length is not None and v.shape[0] < min_length:
        raise invalid(f"{name} length must be at least {min_length}, got {v.shape[0]}")
    return v


def array_on(name: str, x: Any, dtype: str, device: Device, *, ndim: int = 1, length: int | None = None) -> ArrayView:
    """:func:`array` plus "lives on ``device``", for arguments passed anew on every call of a hot path."""
    v = array(name, x, dtype, ndim=ndim, length=length)
    if v.device != device:
        raise invalid(f"{name} must be on {device}, got {v.device}")
    return v


def batch_array(name: str, x: Any, dtype: str, device: Device, *, ndim: int = 1, length: int | None = None) -> Any:
    """The checks of :func:`array_on` at the least host cost, for the arrays a hot path is passed on every call
    (a canary step checks seven per call).

    Returns ``x`` itself when it is a plain torch tensor that passes every check (dtype, rank, contiguity, length,
    device: a handful of attribute reads, no view built); anything else takes :func:`array_on` and returns its
    :class:`ArrayView`, or raises its exact error. Either way the result has ``.shape`` and ``.data_ptr()``
    (see :func:`as_view` for an :class:`ArrayView` of it).
    """
    if type(x) is TENSOR_TYPE and x.dtype is _TORCH_DTYPES.get(dtype) and x.is_contiguous():
        shape = x.shape
        if (len(shape) == ndim and (length is None or shape[0] == length)
                and (x.get_device() == device.index if x.is_cuda else (x.is_cpu and device.kind == "cpu"))):
            return x
    v = array_on(name, x, dtype, device, ndim=ndim, length=length)
    return x if type(x) is TENSOR_TYPE else v   # a torch tensor of a dtype not looked up before


def as_view(name: str, a: Any) -> ArrayView:
    """The :class:`ArrayView` of an array :func:`batch_array` accepted (itself if it is one already)."""
    return view(name, a)


def same_device(op: str, *views: ArrayView | None) -> Device:
    """The one device of the given views (None: an absent optional array); else ``op``'s device error."""
    return common_device(op, [v for v in views if v is not None])
