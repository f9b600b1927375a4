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
        self._events: list = [None] * depth
        self._labels = [0] * depth
        self._pending: list[int] = []  # slot indices staged but not yet taken, oldest first
        self._next = 0
        self._side = torch.cuda.Stream(device=self.device) if pin else None
        self.dropped = 0

    @property
    def nbytes(self) -> int:
        """Pinned host bytes held."""
        return sum(t.numel() * t.element_size() for slot in self._slots for t in slot)

    def stage(self, label: int) -> None:
        """Enqueue a copy of every source, ordered after the work queued so far on the current stream.

        Must not be called while the current stream is capturing a CUDA graph (the caller checks
        :func:`is_capturing`).
        """
        slot = self._next
        self._next = (self._next + 1) % self.depth
        if slot in self._pending:  # the oldest copy never landed or was never taken: drop it
            self._pending.remove(slot)
            self.dropped += 1
        dst = self._slots[slot]
        if self._side is None:
            for d, s in zip(dst, self.sources):
                d.copy_(s)
        else:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._side):
                self._side.wait_event(ready)
                for d, s in zip(dst, self.sources):
                    d.copy_(s, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self._side)
            self._events[slot] = done
        self._labels[slot] = label
        self._pending.append(slot)

    def take_landed(self, *, include_latest: bool = False, wait: bool = False) -> list[StagedCopy]:
        """The copies staged by earlier :meth:`stage` calls that have landed, oldest first, each returned once.

        ``include_latest=False`` (the hot-path rule) leaves the most recent copy for the next call, so
        results are one step late on the CPU and on CUDA alike. ``wait=True`` blocks until the copies have
        landed (off the hot path only, e.g. a final flush).
        """
        out = []
        candidates = self._pending if include_latest else self._pending[:-1]
        taken = []
        for slot in candidates:
            ev = self._events[slot]
            if ev is not None:
                if wait:
                    ev.synchronize()
                elif not ev.query():
                    break  # later copies are ordered after this one on the side stream
            out.append(StagedCopy(self._labels[slot], [t.numpy().copy() for t in self._slots[slot]]))
            taken.append(slot)
        for slot in taken:
            self._pending.remove(slot)
        return out
