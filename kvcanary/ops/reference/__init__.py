"""CPU reference backend: the executable form of SPEC §3-§9, in NumPy, byte for byte.

One module per SPEC paragraph, named like its CUDA twin in ``kernels_cu/`` and ``kvcanary/ops/cuda/``:
``hashing`` (§3), ``realkv`` (§3.1), ``log`` (§4), ``plan`` (§5), ``write`` (§6), ``verify`` (§7),
``scatter`` (§8). Each entry point takes a validated launch record from :mod:`kvcanary.ops.validation` and
writes the caller's arrays in place.
"""

from kvcanary.ops.reference.plan import plan
from kvcanary.ops.reference.scatter import scatter
from kvcanary.ops.reference.verify import verify
from kvcanary.ops.reference.write import write

__all__ = ["plan", "scatter", "verify", "write"]
