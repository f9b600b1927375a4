"""kvcanary: detect silent corruption of an LLM serving engine's paged KV cache.

A 32-byte canary record per KV slot is stamped when tokens are written and re-verified before the cache
is read; mismatches land in a device-side violation log. Same on-device format as SGLang's KV-canary
(see docs/SPEC.md). Runs on the CPU (NumPy reference) or on CUDA (CuPy JIT kernels).

Layers: :mod:`kvcanary.ops` (kernel-level ops: structures, validation, CPU reference, CUDA backend),
:mod:`kvcanary.runtime` (planner, :class:`KVCanary`, reporting, health), :mod:`kvcanary.testing` (fault
injectors, an engine-shaped workload, the demo). Everything public is importable from ``kvcanary``.
"""

from kvcanary import faults
from kvcanary._version import __version__
from kvcanary.consts import (
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
    splitmix64,
    splitmix64_mix3,
)
from kvcanary.errors import CudaBackendUnavailableError, KvCanaryDTypeError
from kvcanary.ops import (
    RealKvSource,
    VerifyOrWriteContext,
    VerifyPlan,
    ViolationLog,
    WritePlan,
    allocate_canary_buffer,
    allocate_chain_position_flag,
    copy_canary_records,
    gather_canary_records,
    launch_canary_plan_kernels,
    launch_canary_verify_from_table,
    launch_canary_verify_kernel,
    launch_canary_write_from_table,
    launch_canary_write_kernel,
    launch_scatter_req_token_ids_kernel,
    scatter_canary_records,
)
from kvcanary.ops.cuda.loader import warmup
from kvcanary.runtime.canary import KVCanary, SwaConfig
from kvcanary.runtime.health import CanaryHealth, CanaryNotRunningError, CanaryWatchdog, TagCounters
from kvcanary.runtime.planner import CanaryPlanner
from kvcanary.runtime.report import CanaryViolationError, Violation
from kvcanary.testing.schedule import FaultNotDetectedError, FaultSchedule

__all__ = [
    "CanaryHealth",
    "CanaryLaunchTag",
    "CanaryNotRunningError",
    "CanaryPlanner",
    "CanaryViolationError",
    "CanaryWatchdog",
    "CudaBackendUnavailableError",
    "FailReason",
    "FaultNotDetectedError",
    "FaultSchedule",
    "KVCanary",
    "KvCanaryDTypeError",
    "RealKvHashMode",
    "RealKvSource",
    "SwaConfig",
    "TagCounters",
    "VerifyOrWriteContext",
    "VerifyPlan",
    "Violation",
    "ViolationLog",
    "WritePlan",
    "__version__",
    "allocate_canary_buffer",
    "allocate_chain_position_flag",
    "copy_canary_records",
    "faults",
    "gather_canary_records",
    "launch_canary_plan_kernels",
    "launch_canary_verify_from_table",
    "launch_canary_verify_kernel",
    "launch_canary_write_from_table",
    "launch_canary_write_kernel",
    "launch_scatter_req_token_ids_kernel",
    "scatter_canary_records",
    "splitmix64",
    "splitmix64_mix3",
    "warmup",
]


def __getattr__(name: str):
    # `LaunchTag` is the SPEC's spelling of CanaryLaunchTag; kept importable for older callers, not advertised.
    if name == "LaunchTag":
        import warnings

        warnings.warn("kvcanary.LaunchTag is deprecated; use kvcanary.CanaryLaunchTag", DeprecationWarning,
                      stacklevel=2)
        return CanaryLaunchTag
    raise AttributeError(f"module 'kvcanary' has no attribute {name!r}")
