"""``KVCanary``: what a serving engine integrates, one per KV pool.

Wiring (per forward)::

    canary.step("head", **batch)      # before the model forward: verify the prefixes, stamp the new tokens
    model.forward(batch)              # writes K/V into the pool at out_cache_loc
    canary.step("tail", **batch)      # after it: verify again, stamp with the real-KV fingerprint
    ...
    canary.sweep(slots, positions, prev_slots)   # now and then: re-check cached-but-idle slots
    canary.poll()                     # new Violation records (also logged or raised as they are found)

A :class:`KVCanary` owns

* one canary buffer per launch tag it uses: HEAD and TAIL, K and optionally V, FULL and optionally SWA
  (SWEEP launches verify the TAIL buffers: only TAIL records carry a real-KV fingerprint);
* one violation ring and write index shared by every launch, and a pair of run counters per launch tag
  and kernel (see :mod:`kvcanary.runtime.health`);
* a :class:`~kvcanary.CanaryPlanner` per attention group (the SWA plan has its own window and LUT);
* the ``enable_chain_position_assert`` flag (0 inside :meth:`KVCanary.warmup`, 1 otherwise).

Reporting stays off the hot path: :meth:`KVCanary.end_step` (called by every ``step()``/``sweep()``
unless a CUDA graph is being captured) stages the violation write index and the counters to pinned host
memory on a side stream and reads the copy staged by the *previous* step; only when that copy shows new
violations does it read the ring rows. Detection is therefore one step late, on the CPU exactly as on CUDA
(where it can be later still if a copy has not landed; it is never waited for).

CUDA graphs: allocate the canary before capture, run warm-up batches inside :meth:`KVCanary.warmup`,
capture ``step("head")`` / ``step("tail")`` with the rest of the forward (they launch kernels and torch
ops only), and call :meth:`KVCanary.end_step` after every replay; refill the batch tensors in place
between replays.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvcanary import consts, ops
from kvcanary.consts import CanaryLaunchTag, RealKvHashMode
from kvcanary.errors import invalid
from kvcanary.ops.checks import check_capacity, check_int
from kvcanary.ops.interop import common_device
from kvcanary.ops.structs import RealKvSource, VerifyOrWriteContext, VerifyPlan, allocate_canary_buffer
from kvcanary.ops.validation import array, context_views
from kvcanary.runtime.health import (
    KERNEL_RUNS,
    SLOT_RUNS,
    VERIFY,
    WRITE,
    CanaryHealth,
    CanaryWatchdog,
    TagCounters,
    expected_tags,
)
from kvcanary.runtime.planner import CanaryPlanner, stream_context
from kvcanary.runtime.report import CanaryViolationError, Violation
from kvcanary.runtime.staging import HostStager, is_capturing

logger = logging.getLogger("kvcanary")

MODES = ("log", "raise", "quiet")
PHASES = ("head", "tail")


@dataclass(frozen=True, kw_only=True)
class SwaConfig:
    """The sliding-window (SWA) attention group of a pool.

    Args:
        num_slots: slots of the SWA KV pool (its canary buffers have this many records; slot 0 is padding).
        window_size: the sliding window (> 0): HEAD/TAIL verify positions ``[prefix - window_size, prefix)``.
        full_to_swa_index_mapping: the engine's live int64 ``[full_pool_size + 1]`` table from a FULL slot to
            its SWA slot (0 = none/freed: the plan then skips the slot and the chain check across it). Read
            in place at every step; the engine updates it as it allocates and frees SWA slots.
        k_sources, v_sources: :class:`~kvcanary.RealKvSource` tuples over the SWA K / V pools (TAIL
            real-KV fingerprint), at most 4 each.
    """

    num_slots: int
    window_size: int
    full_to_swa_index_mapping: Any
    k_sources: tuple = ()
    v_sources: tuple = ()


def launch_tag(phase: str, kv: str, group: str) -> CanaryLaunchTag:
    """``launch_tag("tail", "k", "swa") -> CanaryLaunchTag.TAIL_K_SWA``."""
    return CanaryLaunchTag[f"{phase}_{kv}_{group}".upper()]


class KVCanary:
    """The canary of one KV pool: buffers, violation log, counters, planners, reporting and health.

    Args:
        num_slots: slots of the (FULL) KV pool, slot 0 (padding) included; every canary buffer of the FULL
            group has this many 32-byte records.
        max_batch_size: most batch rows per step (padding rows included).
        verify_capacity: most verify entries per step (default ``3 * num_slots``: shared prefixes let the
            summed prefix lengths exceed the pool). The SWA group uses ``min(verify_capacity,
            max_batch_size * window_size)`` unless that is smaller than 1.
        max_tokens_per_step: most tokens one forward writes; required with ``swa`` when the engine does not
            pass ``swa_out_cache_loc`` (it sizes the translation scratch).
        device: where everything lives (``"cpu"`` or a CUDA device).
        with_v: keep V buffers too (HEAD_V_*, TAIL_V_*). Default: True iff V sources are given.
        k_sources, v_sources: :class:`~kvcanary.RealKvSource` tuples over the FULL K / V pools, folded into
            the TAIL (and SWEEP) fingerprint; empty = no real-KV check.
        real_kv_hash_mode: :class:`~kvcanary.RealKvHashMode` for TAIL/SWEEP launches (default PARTIAL when
            any source is given, else NONE). HEAD launches always use NONE (the KV is not written yet).
        swa: optional :class:`SwaConfig` for a sliding-window group.
        ring_capacity: violation rows kept (more are counted, not kept; see :meth:`reset_log`).
        mode: ``"log"`` (each new violation is logged as a WARNING), ``"raise"`` (new violations raise
            :class:`~kvcanary.CanaryViolationError`) or ``"quiet"`` (only :meth:`poll` returns them).
        expected_tokens_shape: optional ``(max_reqs, max_context_len)`` of the expected-token pool passed
            to :meth:`step` (checked every step).
        kv_token_id_vs_position_offset: 0, or +1 for an EAGLE draft pool (SPEC §5).
        slot_stride_bytes: bytes per canary record (>= 32, multiple of 8).
        sweep_capacity: verify entries per sweep launch (longer sweeps run in chunks); default
            ``min(num_slots, 65536)``.
        watchdog_patience: when set, :meth:`end_step` feeds the staged kernel counters of the HEAD and TAIL
            tags to a :class:`~kvcanary.runtime.health.CanaryWatchdog` with this patience (raises
            :class:`~kvcanary.runtime.health.CanaryNotRunningError` when one stops increasing). Patience counts
            ``end_step()`` calls (HEAD and TAIL steps alternate, sweeps count too): use at least 3.
        name: label for log messages.
    """

    def __init__(
        self,
        *,
        num_slots: int,
        max_batch_size: int,
        verify_capacity: int | None = None,
        max_tokens_per_step: int | None = None,
        device: Any = "cpu",
        with_v: bool | None = None,
        k_sources: Sequence[RealKvSource] = (),
        v_sources: Sequence[RealKvSource] = (),
        real_kv_hash_mode: int | None = None,
        swa: SwaConfig | None = None,
        ring_capacity: int = 1024,
        mode: str = "log",
        expected_tokens_shape: tuple[int, int] | None = None,
        kv_token_id_vs_position_offset: int = 0,
        slot_stride_bytes: int = consts.CANARY_SLOT_BYTES,
        sweep_capacity: int | None = None,
        watchdog_patience: int | None = None,
        name: str = "kv",
    ):
        self.num_slots = check_capacity("num_slots", num_slots)
        if verify_capacity is None:
            verify_capacity = 3 * self.num_slots
        self.mode = mode
        self.name = str(name)
        if swa is not None and not isinstance(swa, SwaConfig):
            raise TypeError(f"kv-canary: swa must be a SwaConfig, got {type(swa).__name__}")
        k_sources, v_sources = tuple(k_sources), tuple(v_sources)
        swa_k = tuple(swa.k_sources) if swa is not None else ()
        swa_v = tuple(swa.v_sources) if swa is not None else ()
        if with_v is None:
            with_v = bool(v_sources or swa_v)
        elif not with_v and (v_sources or swa_v):
            raise invalid("v_sources were given but with_v is False")
        self.kvs = ("k", "v") if with_v else ("k",)
        if real_kv_hash_mode is None:
            real_kv_hash_mode = RealKvHashMode.PARTIAL if (k_sources or v_sources or swa_k or swa_v) else RealKvHashMode.NONE
        mode_value = check_int("real_kv_hash_mode", real_kv_hash_mode)
        if mode_value not in set(RealKvHashMode):
            raise invalid(f"real_kv_hash_mode must be a RealKvHashMode (0, 1 or 2), got {mode_value}")
        self.real_kv_hash_mode = RealKvHashMode(mode_value)
        self.ring_capacity = check_capacity("ring_capacity", ring_capacity)

        self.planners: dict[str, CanaryPlanner] = {
            "full": CanaryPlanner(max_batch_size=max_batch_size, verify_capacity=verify_capacity, device=device,
                                  max_tokens_per_step=max_tokens_per_step,
                                  expected_tokens_shape=expected_tokens_shape,
                                  kv_token_id_vs_position_offset=kv_token_id_vs_position_offset, name="full"),
        }
        self.device = self.planners["full"].device
        self.max_batch_size = self.planners["full"].max_batch_size
        self.max_tokens_per_step = self.planners["full"].max_tokens_per_step
        self.swa = swa
        self._swa_loc = None
        group_slots = {"full": self.num_slots}
        sources = {("k", "full"): k_sources, ("v", "full"): v_sources}
        if swa is not None:
            group_slots["swa"] = check_capacity("swa.num_slots", swa.num_slots)
            window = check_capacity("swa.window_size", swa.window_size)
            lut = array("swa.full_to_swa_index_mapping", swa.full_to_swa_index_mapping, "int64")
            if str(lut.device) != str(self.device):
                raise invalid(f"swa.full_to_swa_index_mapping must be on {self.device}, got {lut.device}")
            swa_cap = max(1, min(self.planners["full"].verify_capacity, self.max_batch_size * window))
            self.planners["swa"] = CanaryPlanner(
                max_batch_size=max_batch_size, verify_capacity=swa_cap, device=self.device,
                max_tokens_per_step=max_tokens_per_step, expected_tokens_shape=expected_tokens_shape,
                swa_window_size=window, kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
                name="swa")
            if self.max_tokens_per_step is not None:
                # Translation scratch, allocated once so a captured step allocates nothing.
                n = self.max_tokens_per_step
                self._swa_loc = torch.full((n,), -1, dtype=torch.int64, device=self.device)
                self._swa_idx = torch.zeros((n,), dtype=torch.int64, device=self.device)
                self._swa_mask = torch.zeros((n,), dtype=torch.bool, device=self.device)
            sources[("k", "swa")] = swa_k
            sources[("v", "swa")] = swa_v
        self.groups = tuple(group_slots)
        self.group_slots = group_slots

        # Buffers: HEAD and TAIL per kv and group; SWEEP launches verify the TAIL buffer.
        self.buffers: dict[CanaryLaunchTag, torch.Tensor] = {}
        for group, n in group_slots.items():
            for kv in self.kvs:
                for phase in PHASES:
                    self.buffers[launch_tag(phase, kv, group)] = allocate_canary_buffer(
                        n, slot_stride_bytes=slot_stride_bytes, device=self.device)
        self.violation_ring = torch.zeros((self.ring_capacity, consts.VIOLATION_FIELDS), dtype=torch.int64,
                                          device=self.device)
        self.violation_write_index = torch.zeros(1, dtype=torch.int32, device=self.device)
        # [tag, kernel (VERIFY/WRITE), (KERNEL_RUNS, SLOT_RUNS)]; each [1] slice is one launch's counter.
        self.counters = torch.zeros((len(CanaryLaunchTag), 2, 2), dtype=torch.int64, device=self.device)
        self.chain_position_flag = torch.ones(1, dtype=torch.int32, device=self.device)

        self._contexts: dict[tuple[CanaryLaunchTag, int], VerifyOrWriteContext] = {}
        for group in self.groups:
            for kv in self.kvs:
                srcs = tuple(sources[(kv, group)])
                for phase in ("head", "tail", "sweep"):
                    tag = launch_tag(phase, kv, group)
                    buf = self.buffers[launch_tag("head" if phase == "head" else "tail", kv, group)]
                    head = phase == "head"
                    for kernel in (VERIFY, WRITE):
                        if phase == "sweep" and kernel == WRITE:
                            continue
                        self._contexts[(tag, kernel)] = VerifyOrWriteContext(
                            canary_buf=buf,
                            kernel_kind=int(tag),
                            violation_ring=self.violation_ring,
                            violation_write_index=self.violation_write_index,
                            slot_run_counter=self.counters[int(tag), kernel, SLOT_RUNS:SLOT_RUNS + 1],
                            kernel_run_counter=self.counters[int(tag), kernel, KERNEL_RUNS:KERNEL_RUNS + 1],
                            real_kv_sources=() if head else srcs,
                            real_kv_hash_mode=RealKvHashMode.NONE if head else self.real_kv_hash_mode,
                            enable_chain_position_assert=self.chain_position_flag,
                        )
        # Validate every context once now (sources cover the buffer, sizes, devices), not at the first step.
        for ctx in self._contexts.values():
            common_device("KVCanary", list(context_views(ctx).all()))

        cap = min(self.num_slots, 1 << 16) if sweep_capacity is None else check_capacity("sweep_capacity", sweep_capacity)
        self.sweep_capacity = cap
        self._sweep_plan = VerifyPlan.allocate(verify_capacity=cap, device=self.device)

        self._stager = HostStager([self.violation_write_index, self.counters], self.device)
        self._step_no = 0                  # end_step() calls: the step number violations are attributed to
        self._marks: list[tuple[int, int]] = []  # (step number, write index after it), from staged copies
        self._reported = 0                 # violations (device count) already decoded
        self._dropped_reported = 0
        self._unpolled: list[Violation] = []
        self._history: list[Violation] = []
        self._calls = {"head": 0, "tail": 0, "sweep": 0}
        self.watchdog = None
        if watchdog_patience is not None:
            self.watchdog = CanaryWatchdog(expected_tags(PHASES, self.kvs, self.groups), patience=watchdog_patience)
        logger.info(
            "kv-canary: KVCanary %r on %s: num_slots=%s kvs=%s groups=%s ring_capacity=%d mode=%s; allocated "
            "%d device bytes in all (canary buffers %d, log+counters %d, sweep plan %d, planners and scratch)",
            self.name, self.device, group_slots, self.kvs, self.groups, self.ring_capacity, self.mode,
            self.allocated_bytes, self._buffer_bytes(), self._log_bytes(), VerifyPlan.allocation_bytes(cap))

    # -- construction helpers ------------------------------------------------------------------------------

    @classmethod
    def from_pool_geometry(
        cls,
        *,
        pool_slots: int,
        max_running_requests: int,
        max_prefill_tokens: int,
        num_draft_tokens: int = 0,
        verify_capacity: int | None = None,
        **kwargs: Any,
    ) -> KVCanary:
        """A canary sized by :meth:`CanaryPlanner.capacities_from_pool_geometry`; ``kwargs`` go to the
        constructor (``device``, sources, ``swa``, ``mode``...)."""
        caps = CanaryPlanner.capacities_from_pool_geometry(
            pool_slots=pool_slots, max_running_requests=max_running_requests,
            max_prefill_tokens=max_prefill_tokens, num_draft_tokens=num_draft_tokens,
            verify_capacity=verify_capacity)
        return cls(num_slots=pool_slots, max_batch_size=caps.max_batch_size, verify_capacity=caps.verify_capacity,
                   max_tokens_per_step=caps.max_tokens_per_step, **kwargs)

    def _buffer_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers.values())

    def _log_bytes(self) -> int:
        return self.violation_ring.numel() * 8 + 4 + self.counters.numel() * 8 + 4

    @property
    def allocated_bytes(self) -> int:
        """Device bytes held by this canary (buffers, log, counters, sweep plan, scratch, planners)."""
        scratch = 0 if self._swa_loc is None else sum(
            t.numel() * t.element_size() for t in (self._swa_loc, self._swa_idx, self._swa_mask))
        return (self._buffer_bytes() + self._log_bytes() + VerifyPlan.allocation_bytes(self.sweep_capacity)
                + scratch + sum(p.allocated_bytes for p in self.planners.values()))

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        if value not in MODES:
            raise invalid(f"mode must be one of {MODES}, got {value!r}")
        self._mode = value

    def buffer(self, phase: str, kv: str = "k", group: str = "full") -> torch.Tensor:
        """The canary buffer (uint8 ``[slots, stride]``) of ``phase`` in ``("head", "tail", "sweep")``
        (SWEEP reads the TAIL buffer)."""
        phase = "tail" if phase == "sweep" else phase
        try:
            return self.buffers[launch_tag(phase, kv, group)]
        except KeyError:
            raise invalid(f"this canary has no buffer for phase={phase!r} kv={kv!r} group={group!r}") from None

    def tags(self, phases: Sequence[str] = ("head", "tail", "sweep")) -> tuple[CanaryLaunchTag, ...]:
        """The launch tags this canary uses for ``phases``."""
        return expected_tags(phases, self.kvs, self.groups)

    # -- chain position assert -------------------------------------------------------------------------------

    @property
    def chain_position_assert(self) -> bool:
        """The ``enable_chain_position_assert`` device flag (reading it syncs)."""
        return bool(int(self.chain_position_flag[0]))

    @chain_position_assert.setter
    def chain_position_assert(self, on: bool) -> None:
        self.chain_position_flag.fill_(1 if on else 0)

    @contextlib.contextmanager
    def warmup(self) -> Iterator[KVCanary]:
        """Run warm-up batches and CUDA-graph capture inside this block: the chain position assert is off
        (dummy batches do not continue real chains); it is switched back on at exit (the flag is a device
        value, so captured write launches read 1 when replayed). On CUDA, entering also compiles and loads
        every kernel (module loading must not happen inside a capture)."""
        if self.device.type == "cuda":
            from kvcanary.ops.cuda import backend

            backend.warmup(self.device)
        self.chain_position_flag.fill_(0)
        try:
            yield self
        finally:
            self.chain_position_flag.fill_(1)

    # -- the hot path ------------------------------------------------------------------------------------

    def step(
        self,
        phase: str,
        *,
        req_pool_indices: Any,
        prefix_lens: Any,
        extend_seq_lens: Any,
        req_to_token: Any,
        input_ids: Any,
        positions: Any,
        out_cache_loc: Any,
        swa_out_cache_loc: Any = None,
        expected_tokens: Any = None,
        expected_tokens_valid_lens: Any = None,
        expected_input_tokens: Any = None,
        expected_input_positions: Any = None,
        stream: Any = None,
    ) -> None:
        """One forward phase: plan, verify every request's prefix, stamp the new tokens.

        ``phase="head"`` runs before the model forward (records without real KV); ``phase="tail"`` after
        it (records carry the real-KV fingerprint of the KV the forward just wrote, and the verify checks
        the prefix's real KV). Every group (FULL, SWA) and half (K, V) this canary tracks is done.

        Args (``bs`` batch rows, ``N`` tokens; all on the canary's device; arrays are read in place):
            req_pool_indices: int64 ``[bs]`` (0 = padding row).
            prefix_lens: int64 ``[bs]``: positions already in the cache.
            extend_seq_lens: int64 ``[bs]``: tokens written this step.
            req_to_token: int32 ``[max_reqs, max_seq_len]`` (FULL slots).
            input_ids, positions: int64 ``[N]``; request ``r``'s tokens follow those of rows ``< r``; a
                padding tail beyond ``sum(extend_seq_lens of real rows)`` is ignored.
            out_cache_loc: int64 ``[N]``: the FULL slot each token is written to (-1 = not written).
            swa_out_cache_loc: optional int64 ``[N]``: the SWA slot of each token. Default: translated from
                ``out_cache_loc`` through ``swa.full_to_swa_index_mapping`` (needs ``max_tokens_per_step``):
                -1 stays -1, an index past the table becomes ``swa.num_slots`` (reported as
                ``slot_out_of_range`` by the write).
            expected_tokens: optional int32 ``[max_reqs, max_context_len]`` pool of each request's known token
                ids, with ``expected_tokens_valid_lens`` int64 ``[bs]``: turns on the verify token check.
            expected_input_tokens, expected_input_positions: optional int64 ``[N]`` (both or neither): turns
                on the write input assert (what the engine meant to write).
            stream: CUDA stream (default: torch's current stream).

        No host sync on CUDA: capturable in a CUDA graph. Violations are reported one step later (see
        :meth:`end_step`).
        """
        if phase not in PHASES:
            raise invalid(f"phase must be 'head' or 'tail', got {phase!r}")
        if (expected_input_tokens is None) != (expected_input_positions is None):
            raise invalid("expected_input_tokens and expected_input_positions must be given together")
        assert_inputs = expected_input_tokens is not None
        check_token = expected_tokens is not None
        n_tokens = _leading_dim("input_ids", input_ids)
        if self.max_tokens_per_step is not None and n_tokens > self.max_tokens_per_step:
            raise invalid(f"input_ids has {n_tokens} tokens, more than max_tokens_per_step={self.max_tokens_per_step}")
        with stream_context(stream, self.device):
            for group in self.groups:
                vplan, wplan = self.planners[group].plan(
                    req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, extend_seq_lens=extend_seq_lens,
                    req_to_token=req_to_token,
                    full_to_swa_index_mapping=self.swa.full_to_swa_index_mapping if group == "swa" else None,
                    expected_tokens=expected_tokens, expected_tokens_valid_lens=expected_tokens_valid_lens)
                loc = out_cache_loc if group == "full" else self._swa_locations(out_cache_loc, swa_out_cache_loc)
                for kv in self.kvs:
                    tag = launch_tag(phase, kv, group)
                    ops.launch_canary_verify_kernel(context=self._contexts[(tag, VERIFY)], plan=vplan,
                                                    check_verify_expected_token=check_token)
                    ops.launch_canary_write_kernel(
                        context=self._contexts[(tag, WRITE)], plan=wplan, input_ids=input_ids, positions=positions,
                        out_cache_loc=loc, enable_write_input_assert=assert_inputs,
                        expected_input_tokens=expected_input_tokens,
                        expected_input_positions=expected_input_positions)
            capturing = is_capturing(self.device)
            if not capturing:
                self._calls[phase] += 1
                self.end_step()

    def _swa_locations(self, out_cache_loc: Any, swa_out_cache_loc: Any) -> Any:
        if swa_out_cache_loc is not None:
            return swa_out_cache_loc
        if self._swa_loc is None:
            raise invalid("step() needs swa_out_cache_loc, or a canary built with max_tokens_per_step to translate "
                          "out_cache_loc through swa.full_to_swa_index_mapping")
        loc = out_cache_loc
        if not isinstance(loc, torch.Tensor):
            raise TypeError("kv-canary: translating out_cache_loc for the SWA group needs a torch tensor; "
                            "pass swa_out_cache_loc for other array types")
        array("out_cache_loc", loc, "int64")
        lut = self.swa.full_to_swa_index_mapping
        n = loc.shape[0]
        # Gather with clamped indices (never out of bounds), then restore the sentinels: -1 stays "skip",
        # an index past the table becomes swa.num_slots so the write reports it as slot_out_of_range.
        # Every op writes into preallocated scratch (out=, in place): nothing is allocated inside a capture.
        idx, mask, dst = self._swa_idx[:n], self._swa_mask[:n], self._swa_loc[:n]
        torch.clamp(loc, 0, lut.shape[0] - 1, out=idx)
        torch.index_select(lut, 0, idx, out=dst)
        torch.lt(loc, 0, out=mask)
        dst.masked_fill_(mask, -1)
        torch.ge(loc, lut.shape[0], out=mask)
        dst.masked_fill_(mask, self.group_slots["swa"])
        return dst

    def sweep(self, slots: Any, positions: Any, prev_slots: Any, *, expected_tokens: Any = None,
              group: str = "full", stream: Any = None) -> None:
        """Verify arbitrary cached slots (e.g. a radix-cache walk) against the TAIL records, with SWEEP tags.

        Args (``n`` entries, all int64 ``[n]`` on the canary's device):
            slots: canary slots of ``group`` to check (0 = skip).
            positions: the position each slot must hold.
            prev_slots: each slot's predecessor in its sequence (-1 = the sequence's first position, checked
                against the chain anchor; 0 = unknown, no chain check).
            expected_tokens: optional expected token per slot (-1 = skip), turns on the token check.
            group: ``"full"`` or ``"swa"`` (slots in that group's index space).

        Real KV is checked with the TAIL sources: this is what catches corruption of idle cached KV (a
        slot nobody attends to is never seen by HEAD/TAIL). Runs in chunks of ``sweep_capacity``.
        """
        if group not in self.groups:
            raise invalid(f"group must be one of {self.groups}, got {group!r}")
        s = array("slots", slots, "int64")
        n = s.shape[0]
        array("positions", positions, "int64", length=n)
        array("prev_slots", prev_slots, "int64", length=n)
        if expected_tokens is not None:
            array("expected_tokens", expected_tokens, "int64", length=n)
        plan = self._sweep_plan
        cap = self.sweep_capacity
        with stream_context(stream, self.device):
            for start in range(0, max(n, 1), cap):
                m = min(cap, n - start)
                plan.verify_slot_indices[:m].copy_(slots[start:start + m])
                plan.verify_expected_positions[:m].copy_(positions[start:start + m])
                plan.verify_prev_slot_indices[:m].copy_(prev_slots[start:start + m])
                if expected_tokens is not None:
                    plan.verify_expected_tokens[:m].copy_(expected_tokens[start:start + m])
                else:
                    plan.verify_expected_tokens[:m].fill_(-1)
                plan.verify_num_valid.fill_(m)
                plan.enable.fill_(1)
                for kv in self.kvs:
                    tag = launch_tag("sweep", kv, group)
                    ops.launch_canary_verify_kernel(context=self._contexts[(tag, VERIFY)], plan=plan,
                                                    check_verify_expected_token=expected_tokens is not None)
            if not is_capturing(self.device):
                self._calls["sweep"] += 1
                self.end_step()

    # -- reporting ---------------------------------------------------------------------------------------

    def end_step(self) -> None:
        """Close one canary step: stage the write index and counters to pinned host memory (side stream),
        take the copies of earlier steps that have landed, decode any new violation rows they reveal and
        report them (per ``mode``), warn about plan overflows and feed the watchdog.

        ``step()`` and ``sweep()`` call it themselves (except while a CUDA graph is being captured); call it
        after every graph replay. Never waits for the device; does nothing during capture.
        """
        if is_capturing(self.device):
            return
        self._step_no += 1
        for planner in self.planners.values():
            planner.end_step(self._step_no)
        self._stager.stage(self._step_no)
        landed = self._stager.take_landed()
        for copy in landed:
            self._marks.append((copy.label, int(copy.values[0][0])))
        self._collect()          # may raise CanaryViolationError (mode "raise")
        if self.watchdog is not None:
            for copy in landed:  # may raise CanaryNotRunningError
                runs = copy.values[1][:, :, KERNEL_RUNS].sum(axis=1)
                self.watchdog.observe({t: int(runs[int(t)]) for t in CanaryLaunchTag})

    def _collect(self) -> None:
        if not self._marks:
            return
        total = self._marks[-1][1]
        if total <= self._reported:
            return
        start, stop = self._reported, min(total, self.ring_capacity)
        new: list[Violation] = []
        if stop > start:
            rows = self.violation_ring[start:stop].cpu().numpy()
            labels = np.array([m[0] for m in self._marks], dtype=np.int64)
            ends = np.array([m[1] for m in self._marks], dtype=np.int64)
            for i, row in enumerate(rows):
                ring_index = start + i
                k = int(np.searchsorted(ends, ring_index, side="right"))
                step = int(labels[k]) if k < len(labels) else -1
                new.append(Violation.from_row(row, step=step, ring_index=ring_index))
        self._reported = total
        self._marks = self._marks[-1:]
        dropped = max(0, total - self.ring_capacity)
        self._unpolled.extend(new)
        self._history.extend(new)
        self._report(new, total, dropped)

    def _report(self, new: list[Violation], total: int, dropped: int) -> None:
        newly_dropped = dropped - self._dropped_reported
        self._dropped_reported = dropped
        if self._mode == "raise" and (new or newly_dropped > 0):
            raise CanaryViolationError(new, total=total, kept=min(total, self.ring_capacity))
        if self._mode == "log":
            for v in new:
                logger.warning("%s", v)
                logger.debug("%s", v.explain())
        if newly_dropped > 0 and self._mode != "quiet":
            logger.warning(
                "kv-canary: violation ring of %r overflowed: %d violations in total, only the first %d rows kept "
                "(%d new ones not kept); call reset_log() after reading them", self.name, total,
                self.ring_capacity, newly_dropped)

    def poll(self, *, sync: bool = False) -> list[Violation]:
        """The violations decoded since the previous ``poll()`` (whatever the mode), oldest first.

        ``sync=False`` (the hot-path form) never waits: it returns what the steps so far have found, one
        step late. ``sync=True`` waits for the device and reads the current write index, so violations of
        the latest step are included (off the hot path: at shutdown, in tests, after an alert). Newly found
        violations are reported per ``mode`` (``"raise"`` raises here).
        """
        if sync:
            self._flush()
        out, self._unpolled = self._unpolled, []
        return out

    def _flush(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for planner in self.planners.values():
            planner.flush()
        for copy in self._stager.take_landed(include_latest=True, wait=True):
            self._marks.append((copy.label, int(copy.values[0][0])))
        index = int(self.violation_write_index.cpu()[0])
        if index > (self._marks[-1][1] if self._marks else 0):
            # Rows appended after the last end_step() (a graph replay not followed by end_step(), or launches
            # outside this object) cannot be attributed to a step.
            self._marks.append((-1, index))
        self._collect()

    @property
    def step_number(self) -> int:
        """Canary steps closed so far (``end_step()`` calls); :attr:`Violation.step` refers to this numbering."""
        return self._step_no

    @property
    def violations(self) -> list[Violation]:
        """Every violation decoded so far (a copy), oldest first."""
        return list(self._history)

    def reset_log(self) -> list[Violation]:
        """Read every outstanding violation (host sync), then empty the ring and its write index so new
        violations are kept again. Returns the violations not yet returned by :meth:`poll`."""
        out = self.poll(sync=True)
        self.violation_ring.zero_()
        self.violation_write_index.zero_()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._reported = 0
        self._dropped_reported = 0
        self._marks = [(self._step_no, 0)]
        return out

    # -- health ------------------------------------------------------------------------------------------

    def health(self) -> CanaryHealth:
        """Counters and statistics read now (a host sync: call it off the hot path)."""
        c = self.counters.cpu().numpy()
        total = int(self.violation_write_index.cpu()[0])
        tags = {}
        for t in self.tags():
            row = c[int(t)]
            tags[t] = TagCounters(tag=t, verify_launches=int(row[VERIFY, KERNEL_RUNS]),
                                  verified_slots=int(row[VERIFY, SLOT_RUNS]),
                                  write_launches=int(row[WRITE, KERNEL_RUNS]), stamped_slots=int(row[WRITE, SLOT_RUNS]))
        stats = [p.stats() for p in self.planners.values()]
        k_full = [CanaryLaunchTag.HEAD_K_FULL, CanaryLaunchTag.TAIL_K_FULL]
        return CanaryHealth(
            tags=tags,
            steps={**self._calls, "end_step": self._step_no},
            protected_tokens=max(tags[t].stamped_slots for t in k_full),
            verified_slots=sum(tags[t].verified_slots for t in self.tags(("head", "tail"))),
            sweeps=self._calls["sweep"],
            swept_slots=sum(tags[t].verified_slots for t in self.tags(("sweep",)) if t.name.split("_")[1] == "K"),
            violations_total=total,
            violations_kept=min(total, self.ring_capacity),
            ring_capacity=self.ring_capacity,
            plan_overflows=sum(s.overflows for s in stats),
            invalid_rows=sum(s.invalid_rows for s in stats),
        )


def _leading_dim(name: str, x: Any) -> int:
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 1:
        raise invalid(f"{name} must be a 1-D array, got shape {shape}")
    return int(shape[0])
