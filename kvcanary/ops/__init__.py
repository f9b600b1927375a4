"""The kernel-level ops: data structures, validation, launch records, and the two backends.

Layers, bottom up: :mod:`~kvcanary.ops.interop` (zero-copy views of caller arrays), :mod:`~kvcanary.ops.structs`
(plans, contexts, real-KV sources, the violation log), :mod:`~kvcanary.ops.checks` and
:mod:`~kvcanary.ops.validation` (SPEC §9), :mod:`~kvcanary.ops.launches` (what a backend receives),
:mod:`~kvcanary.ops.backends` with :mod:`~kvcanary.ops.reference` (CPU) and :mod:`~kvcanary.ops.cuda` (CUDA),
and the public ops in :mod:`~kvcanary.ops.sglang_ops` (SGLang's names).
"""

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

__all__ = [
    "RealKvSource",
    "VerifyOrWriteContext",
    "VerifyPlan",
    "ViolationLog",
    "WritePlan",
    "allocate_canary_buffer",
    "allocate_chain_position_flag",
    "launch_canary_plan_kernels",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "launch_scatter_req_token_ids_kernel",
]
