"""Violation collection and reporting of a :class:`~kvcanary.KVCanary`, off the hot path.

Each canary step ends with :meth:`ViolationCollector.end_step`: the status block (:mod:`kvcanary.runtime.status`)
is staged to pinned host memory on a side stream, and the copies staged by *earlier* steps that have landed are
read (never waited for). Only when a copy shows the violation write index moved are the new ring rows read and
decoded into :class:`~kvcanary.Violation` records, attributed to the step whose copy first showed them, and
reported per the mode: ``"log"`` (a WARNING per violation), ``"raise"`` (:class:`~kvcanary.CanaryViolationError`)
or ``"quiet"`` (only :meth:`ViolationCollector.poll` returns them). Detection is therefore one step late, on the
CPU exactly as on CUDA.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from kvcanary.errors import invalid
from kvcanary.runtime.report import CanaryViolationError, Violation
from kvcanary.runtime.staging import HostStager
from kvcanary.runtime.status import StatusSnapshot

logger = logging.getLogger("kvcanary")

MODES = ("log", "raise", "quiet")


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`; else a ``kv-canary:`` ValueError naming them."""
    if mode not in MODES:
        raise invalid(f"mode must be one of {MODES}, got {mode!r}")
    return mode


class ViolationCollector:
    """Stages the status block each step and turns new ring rows into reported :class:`Violation` records.

    Args:
        status: the canary's int64 status block (staged whole each step).
        violation_ring: int64 ``[ring_capacity, 8]``; ``write_index``: its int32 ``[1]`` write index (a view
            into ``status``).
        mode: ``"log"``, ``"raise"`` or ``"quiet"``.
        name: the canary's name, for log messages.
    """

    def __init__(self, *, status: torch.Tensor, violation_ring: torch.Tensor, write_index: torch.Tensor,
                 mode: str, name: str) -> None:
        self.mode = check_mode(mode)
        self.name = name
        self.ring = violation_ring
        self.ring_capacity = int(violation_ring.shape[0])
        self.write_index = write_index
        self.device = status.device
        self._stager = HostStager([status], status.device)
        self._marks: list[tuple[int, int]] = []  # (step number, write index after it), from staged copies
        self._reported = 0                       # violations (device count) already decoded
        self._dropped_reported = 0
        self._unpolled: list[Violation] = []
        self.history: list[Violation] = []

    @property
    def staging_bytes(self) -> int:
        return self._stager.nbytes

    def end_step(self, step_no: int, stream: Any = None) -> tuple[list[StatusSnapshot], list[Violation]]:
        """Stage this step's status (ordered after the work on ``stream``, an object with the raw handle as
        ``ptr``; default: the current stream); return the snapshots of earlier steps that landed (oldest first)
        and the violations they revealed (already reported per the mode; ``"raise"`` raises here)."""
        self._stager.stage(step_no, stream)
        snapshots = []
        for copy in self._stager.take_landed():
            snap = StatusSnapshot(copy.values[0], copy.label)
            self._marks.append((copy.label, snap.write_index))
            snapshots.append(snap)
        return snapshots, self._collect()

    def poll(self, *, sync: bool = False) -> list[Violation]:
        """The violations decoded since the previous ``poll()``, oldest first; ``sync=True`` first waits for the
        device and reads the current write index (off the hot path)."""
        if sync:
            self.flush()
        out, self._unpolled = self._unpolled, []
        return out

    def flush(self) -> list[StatusSnapshot]:
        """Wait for the device, take every staged copy and decode every row appended so far. Returns the
        snapshots taken."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        snaps = []
        for copy in self._stager.take_landed(include_latest=True, wait=True):
            snap = StatusSnapshot(copy.values[0], copy.label)
            self._marks.append((copy.label, snap.write_index))
            snaps.append(snap)
        index = int(self.write_index.cpu()[0])
        if index > (self._marks[-1][1] if self._marks else 0):
            # Rows appended after the last end_step() (a graph replay not followed by end_step(), or launches
            # outside the canary object) cannot be attributed to a step.
            self._marks.append((-1, index))
        self._collect()
        return snaps

    def reset(self, step_no: int) -> list[Violation]:
        """Read every outstanding violation (host sync), then empty the ring and its write index. Returns the
        violations not yet returned by :meth:`poll`."""
        out = self.poll(sync=True)
        self.ring.zero_()
        self.write_index.zero_()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._reported = 0
        self._dropped_reported = 0
        self._marks = [(step_no, 0)]
        return out

    def _collect(self) -> list[Violation]:
        if not self._marks:
            return []
        total = self._marks[-1][1]
        if total <= self._reported:
            return []
        start, stop = self._reported, min(total, self.ring_capacity)
        new: list[Violation] = []
        if stop > start:
            rows = self.ring[start:stop].cpu().numpy()
            labels = np.array([m[0] for m in self._marks], dtype=np.int64)
            ends = np.array([m[1] for m in self._marks], dtype=np.int64)
            for i, row in enumerate(rows):
                ring_index = start + i
                k = int(np.searchsorted(ends, ring_index, side="right"))
                step = int(labels[k]) if k < len(labels) else -1
                new.append(Violation.from_row(row, step=step, ring_index=ring_index))
        self._reported = total
        self._marks = self._marks[-1:]
        self._unpolled.extend(new)
        self.history.extend(new)
        self._report(new, total, max(0, total - self.ring_capacity))
        return new

    def _report(self, new: list[Violation], total: int, dropped: int) -> None:
        newly_dropped = dropped - self._dropped_reported
        self._dropped_reported = dropped
        if self.mode == "raise" and (new or newly_dropped > 0):
            raise CanaryViolationError(new, total=total, kept=min(total, self.ring_capacity))
        if self.mode == "log":
            for v in new:
                logger.warning("%s", v)
                logger.debug("%s", v.explain())
        if newly_dropped > 0 and self.mode != "quiet":
            logger.warning(
                "kv-canary: violation ring of %r overflowed: %d violations in total, only the first %d rows kept "
                "(%d new ones not kept); call reset_log() after reading them", self.name, total,
                self.ring_capacity, newly_dropped)
