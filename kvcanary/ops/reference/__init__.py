"""CPU reference backend: the executable form of SPEC §3-§13, in NumPy, byte for byte.

One module per SPEC paragraph, named like its CUDA twin in ``kernels_cu/`` and ``kvcanary/ops/cuda/``:
``hashing`` (§3), ``realkv`` (§3.1 and the sources' coverage of §9), ``log`` (§4), ``table`` (the table,
``T()`` and the batch rows of §5, §9, §10), ``plan`` (§5), ``write`` (§6), ``verify`` (§7), ``scatter`` (§8),
``verify_table`` (§11), ``write_table`` (§12), ``records`` (§13). Each entry point takes a validated launch
record from :mod:`kvcanary.ops.validation` and writes the caller's arrays in place.
"""

from kvcanary.ops.reference.plan import plan
from kvcanary.ops.reference.records import copy_records, gather_records, scatter_records
from kvcanary.ops.reference.scatter import scatter
from kvcanary.ops.reference.verify import verify
from kvcanary.ops.reference.verify_table import verify_from_table
from kvcanary.ops.reference.write import write
from kvcanary.ops.reference.write_table import write_from_table

__all__ = [
    "copy_records",
    "gather_records",
    "plan",
    "scatter",
    "scatter_records",
    "verify",
    "verify_from_table",
    "write",
    "write_from_table",
]
