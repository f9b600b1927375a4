"""CPU reference backend: the executable form of SPEC §3-§9, in NumPy, byte for byte.

One module per SPEC paragraph, named like its CUDA twin in ``kernels_cu/`` and ``kvcanary/cuda/``:
``hashing`` (§3), ``realkv`` (§3.1), ``log`` (§4), ``plan`` (§5), ``write`` (§6), ``verify`` (§7),
``scatter`` (§8). Each entry point takes a validated launch record from :mod:`kvcanary.validation` and
writes the caller's arrays in place.
"""

from .plan import plan
from .scatter import scatter
from .verify import verify
from .write import write

__all__ = ["plan", "write", "verify", "scatter"]
