"""The two backends behind every op, and the choice between them.

A backend runs validated launch records (:mod:`kvcanary.ops.launches`) and writes the caller's arrays in
place. :class:`CpuBackend` is the NumPy reference (:mod:`kvcanary.ops.reference`); :class:`CudaBackend`
launches the CuPy kernels of :mod:`kvcanary.ops.cuda` (imported on first use, so the CPU path never imports
CuPy). :func:`backend_for` picks one from the device every array of a launch lives on. Both implement
:class:`Backend`, method for method, so a reader can hold one against the other. :meth:`Backend.table_step`
prepares the plan-free launches of a canary step once per set of contexts (:mod:`kvcanary.ops.table_step`).
"""

from __future__ import annotations

from typing import Any, Protocol

from kvcanary.errors import CudaBackendUnavailableError
from kvcanary.ops.interop import Device
from kvcanary.ops.launches import (
    ContextViews,
    PlanLaunch,
    RecordCopyLaunch,
    RecordGatherLaunch,
    RecordScatterLaunch,
    ScatterLaunch,
    VerifyLaunch,
    VerifyTableLaunch,
    WriteLaunch,
    WriteTableLaunch,
)
from kvcanary.ops.table_step import RecordTableStep, TableStep


class Backend(Protocol):
    """What a backend does with each launch record; ``stream`` is ignored on the CPU."""

    name: str

    def plan(self, launch: PlanLaunch, stream: Any = None) -> None: ...
    def verify(self, launch: VerifyLaunch, stream: Any = None) -> None: ...
    def write(self, launch: WriteLaunch, stream: Any = None) -> None: ...
    def scatter(self, launch: ScatterLaunch, stream: Any = None) -> None: ...
    def verify_from_table(self, launch: VerifyTableLaunch, stream: Any = None) -> None: ...
    def write_from_table(self, launch: WriteTableLaunch, stream: Any = None) -> None: ...
    def gather_records(self, launch: RecordGatherLaunch, stream: Any = None) -> None: ...
    def scatter_records(self, launch: RecordScatterLaunch, stream: Any = None) -> None: ...
    def copy_records(self, launch: RecordCopyLaunch, stream: Any = None) -> None: ...
    def table_step(self, *, device: Device, verify_contexts: tuple[ContextViews, ...],
                   write_contexts: tuple[ContextViews, ...], stream: Any = None) -> TableStep: ...
    def launch_stream(self, stream: Any, device: Device) -> Any:
        """``stream`` (None: the current stream of ``device``) resolved once, for several launches in a row."""
        ...

    def capturing(self, launch_stream: Any) -> bool:
        """Whether ``launch_stream`` (what :meth:`launch_stream` returned) is capturing a CUDA graph."""
        ...


class CpuBackend:
    """The NumPy reference: the executable form of the SPEC, one module per paragraph."""

    name = "cpu"

    def __init__(self) -> None:
        from kvcanary.ops import reference

        self._ref = reference

    def plan(self, launch: PlanLaunch, stream: Any = None) -> None:
        self._ref.plan(launch)

    def verify(self, launch: VerifyLaunch, stream: Any = None) -> None:
        self._ref.verify(launch)

    def write(self, launch: WriteLaunch, stream: Any = None) -> None:
        self._ref.write(launch)

    def scatter(self, launch: ScatterLaunch, stream: Any = None) -> None:
        self._ref.scatter(launch)

    def verify_from_table(self, launch: VerifyTableLaunch, stream: Any = None) -> None:
        self._ref.verify_from_table(launch)

    def write_from_table(self, launch: WriteTableLaunch, stream: Any = None) -> None:
        self._ref.write_from_table(launch)

    def gather_records(self, launch: RecordGatherLaunch, stream: Any = None) -> None:
        self._ref.gather_records(launch)

    def scatter_records(self, launch: RecordScatterLaunch, stream: Any = None) -> None:
        self._ref.scatter_records(launch)

    def copy_records(self, launch: RecordCopyLaunch, stream: Any = None) -> None:
        self._ref.copy_records(launch)

    def table_step(self, *, device: Device, verify_contexts: tuple[ContextViews, ...],
                   write_contexts: tuple[ContextViews, ...], stream: Any = None) -> TableStep:
        return RecordTableStep(self, device=device, verify_contexts=verify_contexts, write_contexts=write_contexts)

    def launch_stream(self, stream: Any, device: Device) -> Any:
        return None

    def capturing(self, launch_stream: Any) -> bool:
        return False


class CudaBackend:
    """The CuPy kernels; ``stream`` is the caller's stream (``None``: torch's current stream of the device)."""

    name = "cuda"

    def __init__(self) -> None:
        try:
            from kvcanary.ops.cuda import backend
        except ImportError as e:  # the module or CuPy is missing
            raise CudaBackendUnavailableError(f"kv-canary: the CUDA backend is not available: {e}") from e
        self._cuda = backend
        from kvcanary.ops.cuda.launch import resolve_stream, stream_capturing

        self._resolve_stream = resolve_stream
        self._stream_capturing = stream_capturing

    def plan(self, launch: PlanLaunch, stream: Any = None) -> None:
        self._cuda.plan(launch, stream)

    def verify(self, launch: VerifyLaunch, stream: Any = None) -> None:
        self._cuda.verify(launch, stream)

    def write(self, launch: WriteLaunch, stream: Any = None) -> None:
        self._cuda.write(launch, stream)

    def scatter(self, launch: ScatterLaunch, stream: Any = None) -> None:
        self._cuda.scatter(launch, stream)

    def verify_from_table(self, launch: VerifyTableLaunch, stream: Any = None) -> None:
        self._cuda.verify_from_table(launch, stream)

    def write_from_table(self, launch: WriteTableLaunch, stream: Any = None) -> None:
        self._cuda.write_from_table(launch, stream)

    def gather_records(self, launch: RecordGatherLaunch, stream: Any = None) -> None:
        self._cuda.gather_records(launch, stream)

    def scatter_records(self, launch: RecordScatterLaunch, stream: Any = None) -> None:
        self._cuda.scatter_records(launch, stream)

    def copy_records(self, launch: RecordCopyLaunch, stream: Any = None) -> None:
        self._cuda.copy_records(launch, stream)

    def table_step(self, *, device: Device, verify_contexts: tuple[ContextViews, ...],
                   write_contexts: tuple[ContextViews, ...], stream: Any = None) -> TableStep:
        from kvcanary.ops.cuda.params import MAX_CONTEXTS
        from kvcanary.ops.cuda.table_step import CudaTableStep

        if max(len(verify_contexts), len(write_contexts)) > MAX_CONTEXTS:  # several launches: the records' path
            return RecordTableStep(self, device=device, verify_contexts=verify_contexts,
                                   write_contexts=write_contexts)
        return CudaTableStep(device=device, verify_contexts=verify_contexts, write_contexts=write_contexts,
                             stream=stream)

    def launch_stream(self, stream: Any, device: Device) -> Any:
        return self._resolve_stream(stream, device)   # its raw handle as ``ptr``

    def capturing(self, launch_stream: Any) -> bool:
        # The launch stream itself, not torch's current one: a step may be captured on a stream passed as
        # ``stream=`` while another stream is current.
        return self._stream_capturing(launch_stream.ptr)


_backends: dict[str, Backend] = {}


def backend_for(device: Device) -> Backend:
    """The backend that runs launches on ``device`` (created once per kind)."""
    b = _backends.get(device.kind)
    if b is None:
        b = CpuBackend() if device.kind == "cpu" else CudaBackend()
        _backends[device.kind] = b
    return b
