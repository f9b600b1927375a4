"""The kernel-level ops: data structures, validation, launch records, and the two backends.

Layers, bottom up: :mod:`~kvcanary.ops.interop` (zero-copy views of caller arrays), :mod:`~kvcanary.ops.structs`
(plans, contexts, real-KV sources, the violation log), :mod:`~kvcanary.ops.checks` and
:mod:`~kvcanary.ops.validation` (SPEC §9), :mod:`~kvcanary.ops.launches` (what a backend receives),
:mod:`~kvcanary.ops.backends` with :mod:`~kvcanary.ops.reference` (CPU) and :mod:`~kvcanary.ops.cuda` (CUDA),
and the public ops: :mod:`~kvcanary.ops.sglang_ops` (SGLang's names, SPEC §5-§8), :mod:`~kvcanary.ops.table_ops`
(plan-free verify and write, SPEC §11, §12) and :mod:`~kvcanary.ops.record_ops` (records that move with the KV,
SPEC §13).
"""

from kvcanary.ops.record_ops import copy_canary_records, gather_canary_records, scatter_canary_records
from kvcanary.ops.sglang_ops import (
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_scatter_req_token_ids_kernel,
)
from kvcanary.ops.structs import (
    RealKvSource,
    VerifyOrWriteContext,
    VerifyPlan,
    ViolationLog,
    WritePlan,
    allocate_canary_buffer,
    allocate_chain_position_flag,
)
from kvcanary.ops.table_ops import launch_canary_verify_from_table, launch_canary_write_from_table

__all__ = [
    "RealKvSource",
    "VerifyOrWriteContext",
    "VerifyPlan",
    "ViolationLog",
    "WritePlan",
    "allocate_canary_buffer",
    "allocate_chain_position_flag",
    "copy_canary_records",
    "gather_canary_records",
    "launch_canary_plan_kernels",
    "launch_canary_verify_from_table",
    "launch_canary_verify_kernel",
    "launch_canary_write_from_table",
    "launch_canary_write_kernel",
    "launch_scatter_req_token_ids_kernel",
    "scatter_canary_records",
]
