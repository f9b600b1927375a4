"""Exception classes. Every message raised by kvcanary starts with ``kv-canary:`` (SPEC §9)."""

from __future__ import annotations

PREFIX = "kv-canary: "


class KvCanaryDTypeError(TypeError, ValueError):
    """A wrong dtype. Derives from both ``TypeError`` and ``ValueError`` so either ``except`` catches it."""


class CudaBackendUnavailableError(RuntimeError):
    """Arrays live on a CUDA device but the CUDA backend (CuPy) cannot be used."""


class RealKvSourcesNotPreparedError(RuntimeError):
    """A plan-free CUDA launch inside a CUDA-graph capture needs a real-KV descriptor table that does not exist
    yet (building one allocates); run the op once, or ``kvcanary.ops.cuda.backend.prepare_real_kv_sources``,
    before capturing."""


def invalid(message: str) -> ValueError:
    """A ``ValueError`` with the ``kv-canary:`` prefix."""
    return ValueError(PREFIX + message)


def wrong_dtype(name: str, expected: str, actual: str) -> KvCanaryDTypeError:
    """A :class:`KvCanaryDTypeError` naming the argument, the dtype it must have and the one it has."""
    return KvCanaryDTypeError(f"{PREFIX}{name} must have dtype {expected}, got {actual}")
