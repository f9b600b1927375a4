"""The device state of a :class:`~kvcanary.KVCanary` and the launch contexts over it, built once.

:class:`CanaryState` allocates, for one KV pool,

* one canary buffer per (phase, K/V half, group) it tracks: HEAD and TAIL, K and optionally V, FULL and
  optionally SWA (SWEEP launches verify the TAIL buffers: only TAIL records carry a real-KV fingerprint);
* one violation ring shared by every launch and the status block (:mod:`kvcanary.runtime.status`: the ring's
  write index, the invalid-row count and a counter pair per launch tag and kernel);
* the ``enable_chain_position_assert`` flag (0 inside ``KVCanary.warmup()``, 1 otherwise);
* a :class:`~kvcanary.VerifyOrWriteContext` per launch tag and kernel, validated here once (SPEC §9) into the
  :class:`~kvcanary.ops.launches.ContextViews` the backends take, so the hot path re-checks none of it.

Every address is fixed from then on, so a captured CUDA graph stays valid. :meth:`CanaryState.refresh`
re-validates when an array changed under the canary (a real-KV pool or the SWA table re-allocated or resized
by the engine, a buffer replaced): the canary never launches on stale views.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kvcanary import consts
from kvcanary.consts import CanaryLaunchTag, RealKvHashMode
from kvcanary.errors import invalid
from kvcanary.ops.interop import common_device
from kvcanary.ops.launches import ContextViews
from kvcanary.ops.structs import RealKvSource, VerifyOrWriteContext, allocate_canary_buffer
from kvcanary.ops.validation import context_views
from kvcanary.runtime.status import (
    Count,
    Kernel,
    StatusLayout,
    allocate_status,
    counter_view,
    counters_view,
    write_index_view,
)

# Which buffer each phase's launches use: SWEEP verifies the TAIL records.
BUFFER_PHASE = {"head": "head", "tail": "tail", "sweep": "tail"}
# Which kernels each phase launches.
PHASE_KERNELS = {"head": (Kernel.VERIFY, Kernel.WRITE), "tail": (Kernel.VERIFY, Kernel.WRITE),
                 "sweep": (Kernel.VERIFY,)}


def _signature(t: torch.Tensor) -> tuple:
    """What must not change under a validated view of a torch tensor: its address, shape and strides (the tensor
    itself first, so a check is one pass over these tuples). Other arrays (CuPy, DLPack) cannot be resized or
    re-pointed in place, so they are not watched."""
    return (t, t.data_ptr(), t.shape, t.stride())


class CanaryState:
    """Buffers, ring, status block, flag and validated contexts of one canary (see the module docstring).

    Args:
        group_slots: ``{"full": n}`` or ``{"full": n, "swa": m}``: canary slots per attention group.
        kvs: ``("k",)`` or ``("k", "v")``.
        sources: real-KV sources per ``(kv, group)`` (used by TAIL and SWEEP launches).
        real_kv_hash_mode: the mode of TAIL and SWEEP launches (HEAD launches use NONE: the KV is not written yet).
        ring_capacity, slot_stride_bytes, device: as in :class:`~kvcanary.KVCanary`.
    """

    def __init__(self, *, group_slots: dict[str, int], kvs: tuple[str, ...],
                 sources: Mapping[tuple[str, str], Sequence[RealKvSource]], real_kv_hash_mode: RealKvHashMode,
                 ring_capacity: int, slot_stride_bytes: int, device: torch.device) -> None:
        self.group_slots = dict(group_slots)
        self.groups = tuple(group_slots)
        self.kvs = kvs
        self.device = device
        self.buffers: dict[CanaryLaunchTag, torch.Tensor] = {}
        for group, n in group_slots.items():
            for kv in kvs:
                for phase in ("head", "tail"):
                    self.buffers[CanaryLaunchTag.of(phase, kv, group)] = allocate_canary_buffer(
                        n, slot_stride_bytes=slot_stride_bytes, device=device)
        self.violation_ring = torch.zeros((ring_capacity, consts.VIOLATION_FIELDS), dtype=torch.int64, device=device)
        self.status = allocate_status(device)
        self.violation_write_index = write_index_view(self.status)
        self.counters = counters_view(self.status)
        self.chain_position_flag = torch.ones(1, dtype=torch.int32, device=device)
        # Rows the bounds rule rejected, summed over steps (the FULL verify adds to it): a view into the status block.
        self.invalid_rows_total = self.status[StatusLayout.INVALID_ROWS:StatusLayout.INVALID_ROWS + 1]

        self.contexts: dict[tuple[CanaryLaunchTag, Kernel], VerifyOrWriteContext] = {}
        for group in self.groups:
            for kv in kvs:
                srcs = tuple(sources.get((kv, group), ()))
                for phase, kernels in PHASE_KERNELS.items():
                    tag = CanaryLaunchTag.of(phase, kv, group)
                    head = phase == "head"
                    for kernel in kernels:
                        self.contexts[(tag, kernel)] = VerifyOrWriteContext(
                            canary_buf=self.buffers[CanaryLaunchTag.of(BUFFER_PHASE[phase], kv, group)],
                            kernel_kind=int(tag),
                            violation_ring=self.violation_ring,
                            violation_write_index=self.violation_write_index,
                            slot_run_counter=counter_view(self.status, tag, kernel, Count.SLOTS),
                            kernel_run_counter=counter_view(self.status, tag, kernel, Count.LAUNCHES),
                            real_kv_sources=() if head else srcs,
                            real_kv_hash_mode=RealKvHashMode.NONE if head else real_kv_hash_mode,
                            enable_chain_position_assert=self.chain_position_flag,
                        )
        self.views: dict[tuple[CanaryLaunchTag, Kernel], ContextViews] = {}
        self._launch_views: dict[tuple[str, str, Kernel], tuple[ContextViews, ...]] = {}
        # The torch tensors under each phase's contexts (each once), whose signatures are compared at every step.
        self._watched: dict[str, list[torch.Tensor]] = {}
        for phase in PHASE_KERNELS:
            seen: dict[int, Any] = {}
            for (tag, _), ctx in self.contexts.items():
                if tag.phase == phase:
                    for a in (ctx.canary_buf, ctx.violation_ring, self.status, ctx.enable_chain_position_assert,
                              *(s.tensor for s in ctx.real_kv_sources)):
                        if isinstance(a, torch.Tensor):
                            seen.setdefault(id(a), a)
            self._watched[phase] = list(seen.values())
        self._signatures: dict[str, tuple[tuple, ...]] = {}
        self.generation = 0   # bumped at every validation: what was prepared from older views is stale
        self.refresh(force=True)

    # -- validation once, and again only when something changed --------------------------------------------

    def _unchanged(self, phase: str) -> bool:
        for t, p, shape, strides in self._signatures[phase]:
            if t.data_ptr() != p or t.shape != shape or t.stride() != strides:
                return False
        return True

    def refresh(self, phase: str = "head", *, force: bool = False) -> bool:
        """Re-validate every context if an array under ``phase``'s contexts changed (address, shape or strides)
        since the last validation; returns whether it did (and then bumps :attr:`generation`). Raises the SPEC §9
        error if the change made a context invalid. (``force``: validate now, whatever changed.)"""
        if not force and self._unchanged(phase):
            return False
        views = {key: context_views(ctx, max_sources=None) for key, ctx in self.contexts.items()}
        for v in views.values():
            common_device("KVCanary", list(v.all()))
            if v.canary_buf.device.kind != self.device.type:
                raise invalid(f"KVCanary buffers must be on {self.device}, got {v.canary_buf.device}")
        self.views = views
        self._launch_views = {
            (phase_, group, kernel): tuple(views[(CanaryLaunchTag.of(phase_, kv, group), kernel)] for kv in self.kvs)
            for phase_, kernels in PHASE_KERNELS.items() for group in self.groups for kernel in kernels}
        self._signatures = {ph: tuple(_signature(t) for t in self._watched[ph]) for ph in PHASE_KERNELS}
        self.generation += 1
        return True

    # -- lookups -----------------------------------------------------------------------------------------

    def context_views(self, phase: str, group: str, kernel: Kernel) -> tuple[ContextViews, ...]:
        """The validated contexts of ``phase`` in ``group`` for ``kernel``, one per K/V half (K first)."""
        return self._launch_views[(phase, group, kernel)]

    def tags(self, phases: Sequence[str] = consts.PHASES) -> tuple[CanaryLaunchTag, ...]:
        """The launch tags this canary uses for ``phases``, in tag order."""
        return CanaryLaunchTag.select(phases, self.kvs, self.groups)

    @property
    def buffer_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers.values())

    @property
    def log_bytes(self) -> int:
        return self.violation_ring.numel() * 8 + self.status.numel() * 8 + self.chain_position_flag.numel() * 4
