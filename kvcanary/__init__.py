"""kvcanary: detect silent corruption of an LLM serving engine's paged KV cache.

A 32-byte canary record per KV slot is stamped when tokens are written and re-verified before the cache
is read; mismatches land in a device-side violation log. Same on-device format as SGLang's KV-canary
(see SPEC.md). Runs on the CPU (NumPy reference) or on CUDA (CuPy JIT kernels).
"""

from . import faults
from .canary import KVCanary, SwaConfig
from .consts import (
    CanaryLaunchTag,
    FailReason,
    LaunchTag,
    RealKvHashMode,
    splitmix64,
    splitmix64_mix3,
)
from .cuda.loader import warmup
from .errors import CudaBackendUnavailableError, KvCanaryDTypeError
from .health import CanaryHealth, CanaryNotRunningError, CanaryWatchdog, TagCounters
from .ops import (
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_scatter_req_token_ids_kernel,
)
from .planner import CanaryPlanner
from .report import CanaryViolationError, Violation
from .structs import (
    RealKvSource,
    VerifyOrWriteContext,
    VerifyPlan,
    ViolationLog,
    WritePlan,
    allocate_canary_buffer,
    allocate_chain_position_flag,
)

__version__ = "0.1.0"

__all__ = [
    "CanaryHealth",
    "CanaryNotRunningError",
    "CanaryPlanner",
    "CanaryViolationError",
    "CanaryWatchdog",
    "KVCanary",
    "SwaConfig",
    "TagCounters",
    "Violation",
    "faults",
    "CanaryLaunchTag",
    "CudaBackendUnavailableError",
    "FailReason",
    "KvCanaryDTypeError",
    "LaunchTag",
    "RealKvHashMode",
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
    "splitmix64",
    "splitmix64_mix3",
    "warmup",
]
