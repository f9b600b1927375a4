"""The CUDA backend: what :mod:`kvcanary.ops` calls for arrays on a CUDA device.

Each entry point takes a launch record validated by :mod:`kvcanary.validation` and a stream (``None`` =
torch's current stream of the arrays' device) and launches CuPy raw kernels compiled from
``kernels_cu/`` on that device, writing the caller's arrays in place. One module per op, named like the
CPU reference (:mod:`kvcanary.reference`) and the kernel sources.
"""

from __future__ import annotations

from .loader import warmup
from .plan import plan
from .scatter import scatter
from .verify import verify
from .write import write

__all__ = ["plan", "write", "verify", "scatter", "warmup"]
