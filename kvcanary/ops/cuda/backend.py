"""The CUDA backend: what :mod:`kvcanary.ops` calls for arrays on a CUDA device.

Each entry point takes a launch record validated by :mod:`kvcanary.ops.validation` and a stream (``None`` =
torch's current stream of the arrays' device) and launches CuPy raw kernels compiled from
``kernels_cu/`` on that device, writing the caller's arrays in place. One module per op, named like the
CPU reference (:mod:`kvcanary.ops.reference`) and the kernel sources.
"""

from __future__ import annotations

from kvcanary.ops.cuda.loader import warmup
from kvcanary.ops.cuda.plan import plan
from kvcanary.ops.cuda.scatter import scatter
from kvcanary.ops.cuda.verify import verify
from kvcanary.ops.cuda.write import write

__all__ = ["plan", "scatter", "verify", "warmup", "write"]
