"""The device status block of a :class:`~kvcanary.KVCanary`: everything the host reads each step, in one array.

One contiguous int64 array holds the violation write index, the cumulative invalid-row count and a pair of
run counters per launch tag and kernel, so each step stages it to the host with a single copy. Its layout
(:class:`StatusLayout`) and the host-side reading of a staged copy (:class:`StatusSnapshot`) live here, with the
vocabulary of the counter indices (:class:`Kernel`, :class:`Count`) that the rest of the runtime uses.

SPEC §4 gives one ``kernel_run_counter``/``slot_run_counter`` pair per launch context. A canary gives every
launch tag *and* kernel (verify, write) its own pair, so the counters say which launch ran how often.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from kvcanary.consts import CanaryLaunchTag


class Kernel(enum.IntEnum):
    """Which kernel a counter pair belongs to."""

    VERIFY = 0
    WRITE = 1


class Count(enum.IntEnum):
    """Which counter of a pair: launches (SPEC's ``kernel_run_counter``) or slots (``slot_run_counter``)."""

    LAUNCHES = 0
    SLOTS = 1


class StatusLayout:
    """Element offsets in the int64 status block.

    ``WRITE_INDEX``: the SPEC's int32 violation write index lives in the low 4 bytes of this element (little
    endian), so kernels ``atomicAdd`` an int32 as the SPEC says while the block stays one int64 array.
    ``INVALID_ROWS``: batch rows rejected by the bounds rule, summed over steps. ``COUNTERS``: the start of the
    ``[tags, kernels, counts]`` counter array.
    """

    WRITE_INDEX = 0
    INVALID_ROWS = 1
    COUNTERS = 2
    COUNTER_SHAPE = (len(CanaryLaunchTag), len(Kernel), len(Count))
    LENGTH = COUNTERS + COUNTER_SHAPE[0] * COUNTER_SHAPE[1] * COUNTER_SHAPE[2]


def allocate_status(device: torch.device) -> torch.Tensor:
    """A zeroed status block, int64 ``[StatusLayout.LENGTH]`` on ``device``."""
    return torch.zeros(StatusLayout.LENGTH, dtype=torch.int64, device=device)


def write_index_view(status: torch.Tensor) -> torch.Tensor:
    """The int32 ``[1]`` violation write index inside ``status`` (a view)."""
    return status[StatusLayout.WRITE_INDEX:StatusLayout.WRITE_INDEX + 1].view(torch.int32)[0:1]


def counters_view(status: torch.Tensor) -> torch.Tensor:
    """The int64 ``[tags, kernels, counts]`` counters inside ``status`` (a view)."""
    return status[StatusLayout.COUNTERS:].view(StatusLayout.COUNTER_SHAPE)


def counter_view(status: torch.Tensor, tag: CanaryLaunchTag, kernel: Kernel, count: Count) -> torch.Tensor:
    """One launch's int64 ``[1]`` counter inside ``status`` (what a launch context's counter points at)."""
    i = StatusLayout.COUNTERS + (int(tag) * len(Kernel) + int(kernel)) * len(Count) + int(count)
    return status[i:i + 1]


@dataclass(frozen=True)
class StatusSnapshot:
    """A host copy of the status block (``values``: int64 ``[StatusLayout.LENGTH]``), staged at canary step
    ``step`` (-1: read directly, not staged)."""

    values: np.ndarray
    step: int = -1

    @property
    def write_index(self) -> int:
        """Violations appended so far (the int32 write index, which keeps counting past the ring)."""
        low = int(self.values[StatusLayout.WRITE_INDEX]) & 0xFFFFFFFF  # the int32 in the word's low half
        return low - (1 << 32) if low >= 1 << 31 else low

    @property
    def invalid_rows(self) -> int:
        return int(self.values[StatusLayout.INVALID_ROWS])

    @property
    def counters(self) -> np.ndarray:
        """int64 ``[tags, kernels, counts]``."""
        return self.values[StatusLayout.COUNTERS:].reshape(StatusLayout.COUNTER_SHAPE)

    def launches(self, tag: CanaryLaunchTag) -> int:
        """Kernel launches of ``tag`` (verify + write)."""
        return int(self.counters[int(tag), :, Count.LAUNCHES].sum())

    def count(self, tag: CanaryLaunchTag, kernel: Kernel, count: Count) -> int:
        return int(self.counters[int(tag), int(kernel), int(count)])
