"""``CanaryPlanner``: capacities validated once, preallocated plans, launch-grid sizing, plan warnings.

An engine builds one planner per attention group (the :class:`~kvcanary.KVCanary` does it for you) at
start-up, before any CUDA-graph capture. The planner

* validates its capacities with SPEC §9 messages and logs them, with the bytes it allocates, at INFO;
* owns a :class:`~kvcanary.VerifyPlan`, a :class:`~kvcanary.WritePlan` and scratch (``invalid_rows`` and
  cumulative plan statistics) whose addresses never change, so a captured graph stays valid;
* sizes the launch grids: ``sm_count`` and ``grids`` (launch name -> blocks x threads) are exactly what
  the CUDA backend launches for these capacities (:mod:`kvcanary.ops.cuda.grids`, SM count queried once per
  device); fixed by the capacities, so every batch uses the same grids. On the CPU both are empty (0, {});
* :meth:`CanaryPlanner.plan` fills the plans for a batch (SPEC §5), on the caller's stream, without a
  host sync;
* surfaces plan overflow (``enable = 0``: that step's verify was skipped) and ``invalid_rows`` as WARNING
  log records, one step late, through :meth:`CanaryPlanner.end_step` (SPEC §9 says the host should warn;
  reading the flags at once would be a host sync). The device accumulates them into cumulative counters
  (plans, overflows, invalid rows), so a copy that lands late loses nothing.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvcanary import ops
from kvcanary.errors import invalid
from kvcanary.ops.checks import check_capacity, check_int, check_non_negative
from kvcanary.ops.interop import Device, stream_handle
from kvcanary.ops.structs import VerifyPlan, WritePlan
from kvcanary.runtime.staging import HostStager, is_capturing

logger = logging.getLogger("kvcanary")

# Index of each cumulative statistic in the planner's int64 stats tensor.
STAT_PLANS, STAT_OVERFLOWS, STAT_INVALID_ROWS = 0, 1, 2


def launch_grids(device: torch.device, *, verify_capacity: int, write_req_capacity: int) -> tuple[int, dict]:
    """``(sm_count, {launch name: Grid})`` the CUDA backend uses for these capacities on ``device`` (the
    same functions size the real launches: :mod:`kvcanary.ops.cuda.grids`); ``(0, {})`` on the CPU, whose
    reference backend has no grid."""
    if device.type != "cuda":
        return 0, {}
    from kvcanary.ops.cuda import grids

    sms = grids.sm_count(device.index)
    real_kv = {"verify": grids.verify_grid(verify_capacity, False, sms),
               "verify_real_kv": grids.verify_grid(verify_capacity, True, sms),
               "write": grids.write_grid(write_req_capacity, sms)}
    return sms, {**{f"plan_{k}": g for k, g in grids.plan_grids(verify_capacity, sms).items()}, **real_kv}


@dataclass(frozen=True)
class PlannerCapacities:
    """Capacities derived from an engine's pool geometry (see :meth:`CanaryPlanner.capacities_from_pool_geometry`)."""

    max_batch_size: int
    verify_capacity: int
    max_tokens_per_step: int


@dataclass(frozen=True)
class PlanStats:
    """Cumulative plan statistics (device counters): plans run, plans that overflowed ``verify_capacity``
    (their verify was skipped), and batch rows rejected by the plan's bounds rule."""

    plans: int
    overflows: int
    invalid_rows: int


class CanaryPlanner:
    """Preallocated plans for one attention group and the :func:`~kvcanary.launch_canary_plan_kernels` call.

    Args:
        max_batch_size: write-request capacity ``R``: the most batch rows (padding rows included) a step
            passes. Positive.
        verify_capacity: verify-plan capacity ``C``: the most verify entries (summed prefix lengths, or
            window lengths for SWA) of one step; a step above it is not verified and warned about.
            Positive.
        device: where the plans live (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).
        max_tokens_per_step: optional, the most tokens one forward writes (checked by callers that size
            token scratch from it, e.g. the SWA out_cache_loc translation of :class:`~kvcanary.KVCanary`).
        expected_tokens_shape: optional ``(max_reqs, max_context_len)`` of the engine's expected-token pool;
            when given, :meth:`plan` requires a pool of exactly that shape (a graph captured with it stays
            valid).
        swa_window_size: 0 for a full-attention group, the sliding window for an SWA group (then
            :meth:`plan` needs ``full_to_swa_index_mapping``).
        kv_token_id_vs_position_offset: 0, or +1 for an EAGLE draft pool (SPEC §5).
        block_size: page size of the engine's block table, for :meth:`plan` with ``block_table=`` (SPEC §10).
        pad_row: batch rows whose ``req_pool_indices`` equals this are padding (0, or -1 for tables without a
            padding row).
        name: a label for log messages (``"full"``, ``"swa"``).

    Raises ``ValueError``/``TypeError`` with SPEC §9 ``kv-canary:`` messages, e.g.
    ``CanaryPlanner(max_batch_size=4, verify_capacity=-3, device="cpu")`` raises
    ``ValueError("kv-canary: verify_capacity must be non-negative, got -3")``.
    """

    def __init__(
        self,
        *,
        max_batch_size: int,
        verify_capacity: int,
        device: Any = "cpu",
        max_tokens_per_step: int | None = None,
        expected_tokens_shape: tuple[int, int] | None = None,
        swa_window_size: int = 0,
        kv_token_id_vs_position_offset: int = 0,
        block_size: int | None = None,
        pad_row: int = 0,
        name: str = "full",
    ):
        # Each value's own range first (SPEC §9), so a negative capacity is reported as negative; the plan
        # structs need at least one entry, so 0 is refused here rather than at every plan.
        self.verify_capacity = check_capacity("verify_capacity", verify_capacity)
        self.max_batch_size = check_capacity("max_batch_size", max_batch_size)
        self.max_tokens_per_step = (None if max_tokens_per_step is None
                                    else check_capacity("max_tokens_per_step", max_tokens_per_step))
        if expected_tokens_shape is not None:
            if not isinstance(expected_tokens_shape, (tuple, list)) or len(expected_tokens_shape) != 2:
                raise invalid(f"expected_tokens_shape must be (max_reqs, max_context_len), "
                              f"got {expected_tokens_shape!r}")
            expected_tokens_shape = (check_capacity("expected_tokens_shape[0] (max_reqs)", expected_tokens_shape[0]),
                                     check_capacity("expected_tokens_shape[1] (max_context_len)",
                                               expected_tokens_shape[1]))
        self.expected_tokens_shape = expected_tokens_shape
        self.swa_window_size = check_non_negative("swa_window_size", swa_window_size)
        self.kv_token_id_vs_position_offset = check_int("kv_token_id_vs_position_offset",
                                                        kv_token_id_vs_position_offset)
        self.block_size = None if block_size is None else check_capacity("block_size", block_size)
        self.pad_row = check_int("pad_row", pad_row)
        self.name = str(name)
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise invalid(f"device must be a torch device (cpu or cuda), got {device!r}") from e
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type not in ("cpu", "cuda"):
            raise invalid(f"device must be cpu or cuda, got {self.device}")

        self.verify_plan = VerifyPlan.allocate(verify_capacity=self.verify_capacity, device=self.device)
        self.write_plan = WritePlan.allocate(write_req_capacity=self.max_batch_size, device=self.device)
        self.invalid_rows = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._stats = torch.zeros(3, dtype=torch.int64, device=self.device)
        self._stager = HostStager([self._stats], self.device)
        self._seen = np.zeros(3, dtype=np.int64)

        self.sm_count, self.grids = launch_grids(self.device, verify_capacity=self.verify_capacity,
                                                 write_req_capacity=self.max_batch_size)
        logger.info(
            "kv-canary: planner %r on %s: max_batch_size=%d verify_capacity=%d max_tokens_per_step=%s "
            "expected_tokens_shape=%s swa_window_size=%d; allocated %d device bytes, %d host staging bytes; "
            "sm_count=%d grids (blocks x threads) %s",
            self.name, self.device, self.max_batch_size, self.verify_capacity, self.max_tokens_per_step,
            self.expected_tokens_shape, self.swa_window_size, self.allocated_bytes, self._stager.nbytes,
            self.sm_count, {k: f"{g.blocks}x{g.threads}" for k, g in self.grids.items()} or "none (CPU reference)",
        )

    # -- sizing helpers ----------------------------------------------------------------------------------

    @staticmethod
    def capacities_from_pool_geometry(
        *,
        pool_slots: int,
        max_running_requests: int,
        max_prefill_tokens: int,
        num_draft_tokens: int = 0,
        verify_capacity: int | None = None,
    ) -> PlannerCapacities:
        """Capacities for an engine with a pool of ``pool_slots`` KV slots.

        ``max_batch_size = max_running_requests`` (plus one row for a chunked-prefill request that is not
        yet running); ``max_tokens_per_step = max_prefill_tokens + max_running_requests * (1 +
        num_draft_tokens)`` (a mixed batch: one prefill chunk plus a decode or draft-verify token block per
        running request); ``verify_capacity`` defaults to ``3 * pool_slots`` because prefix sharing lets the
        summed prefixes of a batch exceed the pool.
        """
        slots = check_capacity("pool_slots", pool_slots)
        running = check_capacity("max_running_requests", max_running_requests)
        prefill = check_capacity("max_prefill_tokens", max_prefill_tokens)
        draft = check_non_negative("num_draft_tokens", num_draft_tokens)
        vc = 3 * slots if verify_capacity is None else verify_capacity
        check_non_negative("verify_capacity", vc)
        return PlannerCapacities(max_batch_size=running + 1, verify_capacity=vc,
                                 max_tokens_per_step=prefill + running * (1 + draft))

    @classmethod
    def from_pool_geometry(
        cls,
        *,
        pool_slots: int,
        max_running_requests: int,
        max_prefill_tokens: int,
        num_draft_tokens: int = 0,
        device: Any = "cpu",
        verify_capacity: int | None = None,
        **kwargs: Any,
    ) -> CanaryPlanner:
        """A planner sized by :meth:`capacities_from_pool_geometry`; ``kwargs`` go to the constructor."""
        caps = cls.capacities_from_pool_geometry(
            pool_slots=pool_slots, max_running_requests=max_running_requests,
            max_prefill_tokens=max_prefill_tokens, num_draft_tokens=num_draft_tokens,
            verify_capacity=verify_capacity)
        return cls(max_batch_size=caps.max_batch_size, verify_capacity=caps.verify_capacity,
                   max_tokens_per_step=caps.max_tokens_per_step, device=device, **kwargs)

    @property
    def allocated_bytes(self) -> int:
        """Device bytes this planner allocated (plans, ``invalid_rows``, statistics)."""
        return (VerifyPlan.allocation_bytes(self.verify_capacity) + WritePlan.allocation_bytes(self.max_batch_size)
                + 4 + 3 * 8)

    # -- the hot path ------------------------------------------------------------------------------------

    def plan(
        self,
        *,
        req_pool_indices: Any,
        prefix_lens: Any,
        extend_seq_lens: Any,
        req_to_token: Any = None,
        full_to_swa_index_mapping: Any = None,
        expected_tokens: Any = None,
        expected_tokens_valid_lens: Any = None,
        block_table: Any = None,
        stream: Any = None,
    ) -> tuple[VerifyPlan, WritePlan]:
        """Fill this planner's plans for one batch (SPEC §5) and return them.

        Args (``bs`` = batch rows, ``bs <= max_batch_size``; all on the planner's device):
            req_pool_indices: int64 ``[bs]``; 0 = padding row.
            prefix_lens: int64 ``[bs]``: positions already in the cache.
            extend_seq_lens: int64 ``[bs]``: tokens written this step.
            req_to_token: int32 ``[max_reqs, max_seq_len]``, contiguous (the engine's live table), or
            block_table: int32 ``[max_reqs, max_blocks]`` of pages of ``block_size`` slots (a planner built with
                ``block_size``; SPEC §10); exactly one of the two.
            full_to_swa_index_mapping: int64 ``[full_pool_size + 1]``, required iff ``swa_window_size > 0``.
            expected_tokens: optional int32 ``[max_reqs, max_context_len]`` expected-token pool (of
                ``expected_tokens_shape`` when that was given); with ``expected_tokens_valid_lens`` int64 ``[bs]``.
            stream: CUDA stream (default: torch's current stream).

        No host sync, no allocation on CUDA: safe inside a CUDA-graph capture. Overflow and invalid rows
        are reported by :meth:`end_step`, one step late.
        """
        bs = _leading_dim("req_pool_indices", req_pool_indices)
        if bs > self.max_batch_size:
            raise invalid(f"planner {self.name!r}: batch size {bs} exceeds max_batch_size={self.max_batch_size}")
        if expected_tokens is not None and self.expected_tokens_shape is not None:
            shape = tuple(expected_tokens.shape)
            if shape != self.expected_tokens_shape:
                raise invalid(f"planner {self.name!r}: expected_tokens must have expected_tokens_shape="
                              f"{self.expected_tokens_shape}, got {shape}")
        with stream_context(stream, self.device):
            ops.launch_canary_plan_kernels(
                verify_plan_out=self.verify_plan,
                write_plan_out=self.write_plan,
                req_pool_indices=req_pool_indices,
                prefix_lens=prefix_lens,
                extend_seq_lens=extend_seq_lens,
                req_to_token=req_to_token,
                swa_window_size=self.swa_window_size,
                full_to_swa_index_mapping=full_to_swa_index_mapping,
                verify_capacity=self.verify_capacity,
                req_to_verify_expected_tokens=expected_tokens,
                req_to_verify_expected_tokens_valid_lens=expected_tokens_valid_lens,
                kv_token_id_vs_position_offset=self.kv_token_id_vs_position_offset,
                invalid_rows_out=self.invalid_rows,
                block_table=block_table,
                block_size=self.block_size if block_table is not None else None,
                pad_row=self.pad_row,
            )
            # Cumulative statistics on the device (no sync): plans, overflows (enable == 0), invalid rows.
            self._stats[STAT_PLANS:STAT_PLANS + 1].add_(1)
            # overflows += 1 - enable, in place: a temporary would allocate inside a graph capture
            self._stats[STAT_OVERFLOWS:STAT_OVERFLOWS + 1].sub_(self.verify_plan.enable).add_(1)
            self._stats[STAT_INVALID_ROWS:STAT_INVALID_ROWS + 1].add_(self.invalid_rows)
        return self.verify_plan, self.write_plan

    # -- off the hot path ----------------------------------------------------------------------------------

    def end_step(self, label: int = 0) -> PlanStats | None:
        """Stage this step's statistics to pinned host memory and warn about what earlier steps' copies show.

        Call once per step after :meth:`plan` (a :class:`~kvcanary.KVCanary` does). Never waits for the
        device: the copy staged now is read by a later call. Returns the newest statistics read, or None
        when no earlier copy has landed yet. Does nothing while a CUDA graph is being captured.
        """
        if is_capturing(self.device):
            return None
        self._stager.stage(label)
        latest = None
        for copy in self._stager.take_landed():
            latest = copy.values[0]
            self._warn(latest)
        return None if latest is None else PlanStats(*(int(x) for x in latest))

    def flush(self) -> PlanStats:
        """Read the statistics now (host sync; off the hot path) and warn about anything not yet reported."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for copy in self._stager.take_landed(include_latest=True, wait=True):
            self._warn(copy.values[0])
        now = self._stats.cpu().numpy()
        self._warn(now)
        return PlanStats(*(int(x) for x in now))

    def stats(self) -> PlanStats:
        """Cumulative statistics read now (host sync)."""
        return PlanStats(*(int(x) for x in self._stats.cpu().numpy()))

    def _warn(self, stats: np.ndarray) -> None:
        new = stats - self._seen
        if new[STAT_OVERFLOWS] > 0:
            logger.warning(
                "kv-canary: planner %r: %d plan(s) had more verify entries than verify_capacity=%d; the verify "
                "of those steps was skipped (raise verify_capacity)", self.name, int(new[STAT_OVERFLOWS]),
                self.verify_capacity)
        if new[STAT_INVALID_ROWS] > 0:
            logger.warning(
                "kv-canary: planner %r: %d batch row(s) had req_pool_indices outside [0, max_reqs) or "
                "prefix_lens > max_seq_len; they were neither verified nor stamped", self.name,
                int(new[STAT_INVALID_ROWS]))
        self._seen = np.maximum(self._seen, stats)


def _leading_dim(name: str, x: Any) -> int:
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 1:
        raise TypeError(f"kv-canary: {name} must be a 1-D array, got {type(x).__name__}")
    return int(shape[0])


def stream_context(stream: Any, device: torch.device):
    """Make ``stream`` torch's current stream on ``device`` for the block (so the torch ops issued next to
    the kernels run on the same stream); a no-op on the CPU or when ``stream`` is None."""
    if stream is None or device.type != "cuda":
        return contextlib.nullcontext()
    if isinstance(stream, torch.cuda.Stream):
        return torch.cuda.stream(stream)
    handle = stream_handle(stream, Device("cuda", device.index))
    return torch.cuda.stream(torch.cuda.ExternalStream(handle, device=device))
