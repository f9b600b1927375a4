"""One-step-late host copies of small device tensors, without a host sync on the hot path.

The canary's hot path (plan, verify, write) must never wait for the device. Yet the host wants to know,
every step, whether anything happened (a new violation, a plan overflow, a stalled counter). A
:class:`HostStager` answers that one step late: :meth:`HostStager.stage` enqueues a copy of a few device
tensors into pinned host memory on a side stream (ordered after the work already queued on the caller's
stream); :meth:`HostStager.take_landed` returns the copies staged by *earlier* calls whose copy has
finished (checked with ``cudaEventQuery``, never waited for). On the CPU a copy "lands" at once, but the
same rule applies (only copies of earlier calls are returned), so CPU and CUDA behave alike.

Copies are kept in a small ring of pinned slots, so a copy that has not landed by the next step is still
returned, in order, a step later; only when ``depth`` copies are outstanding is the oldest one dropped
(the values staged are cumulative counters, so a dropped copy loses resolution, never information).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def is_capturing(device: torch.device) -> bool:
    """Whether torch's current stream on ``device`` is capturing a CUDA graph (False on the CPU)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@dataclass
class StagedCopy:
    """Host copies of the staged tensors (NumPy arrays, owned) and the caller's tag of the stage call."""

    label: int
    values: list[np.ndarray]


class HostStager:
    """Stage copies of ``sources`` (small device tensors with fixed addresses) to pinned host memory.

    Args:
        sources: the device tensors to copy each time (any dtype; all on ``device``).
        device: their device.
        depth: pinned slots (copies that may be outstanding at once).
    """

    def __init__(self, sources: Sequence[torch.Tensor], device: torch.device, depth: int = 8):
        # The sources live as long as their owner (a canary or planner), so no record_stream is needed.
        self.sources = list(sources)
        self.device = torch.device(device)
        self.depth = depth
        pin = self.device.type == "cuda"
        self._slots = [[torch.empty(s.shape, dtype=s.dtype, pin_memory=pin) for s in self.sources]
                       for _ in range(depth)]
        self._host = [[t.numpy() for t in slot] for slot in self._slots]  # NumPy views of the slots, built once
        self._labels = [0] * depth
        self._pending: list[int] = []  # slot indices staged but not yet taken, oldest first
        self._next = 0
        self.dropped = 0
        self._cuda = _CudaCopies(self.device, self.sources, self._slots) if pin else None

    @property
    def nbytes(self) -> int:
        """Pinned host bytes held."""
        return sum(t.numel() * t.element_size() for slot in self._slots for t in slot)

    def stage(self, label: int, stream: Any = None) -> None:
        """Enqueue a copy of every source, ordered after the work queued so far on ``stream`` (an object with the
        raw stream handle as ``ptr``; default: torch's current stream).

        Must not be called while the current stream is capturing a CUDA graph (the caller checks
        :func:`is_capturing`).
        """
        slot = self._next
        self._next = (self._next + 1) % self.depth
        if slot in self._pending:  # the oldest copy never landed or was never taken: drop it
            self._pending.remove(slot)
            self.dropped += 1
        if self._cuda is None:
            for d, s in zip(self._slots[slot], self.sources):
                d.copy_(s)
        else:
            self._cuda.copy(slot, stream)
        self._labels[slot] = label
        self._pending.append(slot)

    def take_landed(self, *, include_latest: bool = False, wait: bool = False) -> list[StagedCopy]:
        """The copies staged by earlier :meth:`stage` calls that have landed, oldest first, each returned once.

        ``include_latest=False`` (the hot-path rule) leaves the most recent copy for the next call, so
        results are one step late on the CPU and on CUDA alike. ``wait=True`` blocks until the copies have
        landed (off the hot path only, e.g. a final flush).
        """
        pending = self._pending
        n = len(pending) if include_latest else len(pending) - 1
        out = []
        for slot in pending[:n]:
            if self._cuda is not None and not self._cuda.landed(slot, wait=wait):
                break  # later copies are ordered after this one on the side stream
            out.append(StagedCopy(self._labels[slot], [a.copy() for a in self._host[slot]]))
        if out:
            del pending[:len(out)]
        return out


class _CudaCopies:
    """The device-to-host copies of a :class:`HostStager`, issued through the CUDA runtime directly.

    Per copy: an event on the caller's stream, the side stream waits for it, one ``cudaMemcpyAsync`` per source
    into pinned memory, an event on the side stream. Events are created once per slot; each call is a handful
    of runtime calls rather than torch stream/event objects (this runs once per canary step on the host).
    """

    def __init__(self, device: torch.device, sources: list[torch.Tensor], slots: list[list[torch.Tensor]]):
        from kvcanary.ops.interop import Device, import_cupy, stream_handle  # CUDA only

        self._rt = import_cupy().cuda.runtime
        self.device = device
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self._side = torch.cuda.Stream(device=device)
        self._side_ptr = int(self._side.cuda_stream)
        self._device = Device("cuda", self.index)
        self._stream_handle = stream_handle
        self._copies = [[(int(d.data_ptr()), int(s.data_ptr()), s.numel() * s.element_size())
                         for d, s in zip(slot, sources)] for slot in slots]
        with self._on_device():
            flags = self._rt.eventDisableTiming
            self._ready = [self._rt.eventCreateWithFlags(flags) for _ in slots]
            self._done = [self._rt.eventCreateWithFlags(flags) for _ in slots]

    def _on_device(self):
        return torch.cuda.device(self.index)

    def copy(self, slot: int, stream: Any = None) -> None:
        rt = self._rt
        prev = rt.getDevice()
        if prev != self.index:
            rt.setDevice(self.index)
        try:
            caller = self._stream_handle(None, self._device) if stream is None else stream.ptr
            rt.eventRecord(self._ready[slot], caller)
            rt.streamWaitEvent(self._side_ptr, self._ready[slot], 0)
            for dst, src, n in self._copies[slot]:
                rt.memcpyAsync(dst, src, n, rt.memcpyDeviceToHost, self._side_ptr)
            rt.eventRecord(self._done[slot], self._side_ptr)
        finally:
            if prev != self.index:
                rt.setDevice(prev)

    def landed(self, slot: int, *, wait: bool) -> bool:
        if wait:
            self._rt.eventSynchronize(self._done[slot])
            return True
        return self._rt.eventQuery(self._done[slot]) == 0

    def __del__(self) -> None:
        try:
            for ev in self._ready + self._done:
                self._rt.eventDestroy(ev)
        except Exception:  # interpreter shutdown: the runtime may be gone already
            pass
