"""The CUDA backend: what :mod:`kvcanary.ops` calls for arrays on a CUDA device.

Each entry point takes a launch record validated by :mod:`kvcanary.ops.validation` and a stream (``None`` =
torch's current stream of the arrays' device) and launches CuPy raw kernels compiled from ``kernels_cu/`` on
that device, writing the caller's arrays in place. One module per op family, named like the CPU reference
(:mod:`kvcanary.ops.reference`) and the kernel sources.

Before capturing a CUDA graph: :func:`warmup` (compiles and loads every kernel) and, for the plan-free ops of
contexts that fold real KV, :func:`prepare_real_kv_sources` (builds their device descriptor tables), or one
eager run of the ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcanary.errors import RealKvSourcesNotPreparedError
from kvcanary.ops.cuda import launch as _launch
from kvcanary.ops.cuda.loader import _device_index, warmup
from kvcanary.ops.cuda.plan import plan
from kvcanary.ops.cuda.records import copy_records, gather_records, scatter_records
from kvcanary.ops.cuda.scatter import scatter
from kvcanary.ops.cuda.verify import verify
from kvcanary.ops.cuda.verify_table import verify_from_table
from kvcanary.ops.cuda.write import write
from kvcanary.ops.cuda.write_table import write_from_table
from kvcanary.ops.launches import ContextViews


def prepare_real_kv_sources(contexts: Sequence[Any], device: Any = None) -> None:
    """Build the device descriptor tables of the real-KV sources that plan-free launches of ``contexts`` fold,
    so that such launches can then be captured in a CUDA graph (building a table allocates).

    ``contexts``: :class:`~kvcanary.VerifyOrWriteContext` objects (validated here) or validated
    ``ContextViews``; ``device``: their CUDA device (default: the device of their canary buffers).
    """
    from kvcanary.ops.validation import context_views

    views = [c if isinstance(c, ContextViews) else context_views(c) for c in contexts]
    for v in views:
        index = _device_index(device) if device is not None else v.canary_buf.device.index
        _launch.prepare_real_kv_sources([v], index)


__all__ = [
    "RealKvSourcesNotPreparedError",
    "copy_records",
    "gather_records",
    "plan",
    "prepare_real_kv_sources",
    "scatter",
    "scatter_records",
    "verify",
    "verify_from_table",
    "warmup",
    "write",
    "write_from_table",
]
