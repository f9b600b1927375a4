"""``KVCanary``: what a serving engine integrates, one per KV pool.

Wiring (per forward)::

    canary.step("head", **batch)      # before the model forward: verify the prefixes, stamp the new tokens
    model.forward(batch)              # writes K/V into the pool at out_cache_loc
    canary.step("tail", **batch)      # after it: verify again, stamp with the real-KV fingerprint
    ...
    canary.sweep(slots, positions, prev_slots)   # now and then: re-check cached-but-idle slots
    canary.poll()                     # new Violation records (also logged or raised as they are found)

A HEAD or TAIL step is one plan-free verify launch and one plan-free write launch per attention group (SPEC
§11, §12), whatever the number of K/V buffers: the launches read the engine's own table (``req_to_token``, or a
paged ``block_table``, SPEC §10) and fold every real-KV source given (SPEC §13).

The object coordinates parts that each do one job:

* :class:`~kvcanary.runtime.buffers.CanaryState`: buffers, violation ring, status block, flag and the launch
  contexts, validated once (and again only when an array under them changed);
* :class:`~kvcanary.runtime.swa.SwaLocations`: the SWA group's slot translation;
* :class:`~kvcanary.runtime.collector.ViolationCollector`: one-step-late staging, decoding and reporting;
* :class:`~kvcanary.runtime.phases.PhaseOrder`: HEAD before TAIL in every forward;
* :class:`~kvcanary.CanaryWatchdog`, :class:`~kvcanary.runtime.stats.StatsLine` and
  :class:`~kvcanary.runtime.stats.CanaryMetrics`: liveness, from the staged counters.

Reporting stays off the hot path: :meth:`KVCanary.end_step` (called by every ``step()``/``sweep()`` unless a
CUDA graph is being captured) stages the status block to pinned host memory on a side stream and reads the copy
staged by an *earlier* step; only when that copy shows new violations does it read the ring rows. Detection is
therefore one step late, on the CPU exactly as on CUDA.

CUDA graphs: allocate the canary before capture, run warm-up batches inside :meth:`KVCanary.warmup`, capture
``step("head")`` / ``step("tail")`` with the rest of the forward (they launch kernels and torch ops only), and
call :meth:`KVCanary.end_step` after every replay; refill the batch tensors in place between replays.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from kvcanary import consts
from kvcanary.consts import CanaryLaunchTag, RealKvHashMode
from kvcanary.errors import invalid
from kvcanary.ops.backends import backend_for
from kvcanary.ops.checks import check_capacity, check_int, check_non_negative
from kvcanary.ops.interop import ArrayView, Device, view
from kvcanary.ops.launches import TableViews, VerifyLaunch
from kvcanary.ops.structs import RealKvSource, VerifyPlan
from kvcanary.ops.table_step import TableStep
from kvcanary.ops.validation import ValidatedCache, array, array_on, batch_array, verify_plan_views
from kvcanary.runtime.buffers import CanaryState
from kvcanary.runtime.collector import ViolationCollector, check_mode
from kvcanary.runtime.config import DEFAULT_WATCHDOG_PATIENCE, CanaryConfig
from kvcanary.runtime.health import CanaryHealth, CanaryWatchdog, TagCounters
from kvcanary.runtime.phases import PhaseOrder
from kvcanary.runtime.planner import CanaryPlanner, stream_context
from kvcanary.runtime.report import Violation
from kvcanary.runtime.staging import is_capturing
from kvcanary.runtime.stats import CanaryMetrics, StatsLine
from kvcanary.runtime.status import Count, Kernel, StatusSnapshot
from kvcanary.runtime.swa import SwaConfig, SwaLocations

logger = logging.getLogger("kvcanary")

__all__ = ["KVCanary", "SwaConfig"]

STEP_PHASES = ("head", "tail")


def _device(device: Any) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise invalid(f"device must be a torch device (cpu or cuda), got {device!r}") from e
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cpu", "cuda"):
        raise invalid(f"device must be cpu or cuda, got {dev}")
    return dev


class KVCanary:
    """The canary of one KV pool: buffers, violation log, counters, reporting, health.

    Args:
        num_slots: slots of the (FULL) KV pool, slot 0 (padding) included; every canary buffer of the FULL
            group has this many 32-byte records.
        max_batch_size: most batch rows per step (padding rows included).
        verify_capacity: kept for callers of the two-pass design and checked (>= 0); the plan-free steps need
            no capacity. Default ``3 * num_slots``.
        max_tokens_per_step: most tokens one forward writes; required with ``swa`` when the engine does not
            pass ``swa_out_cache_loc`` (it sizes the translation scratch).
        device: where everything lives (``"cpu"`` or a CUDA device).
        with_v: keep V buffers too (HEAD_V_*, TAIL_V_*). Default: True iff V sources are given.
        k_sources, v_sources: :class:`~kvcanary.RealKvSource` sequences over the FULL K / V pools (any number:
            e.g. every layer's K), folded into the TAIL (and SWEEP) fingerprint; empty = no real-KV check.
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
        watchdog_patience: HEAD/TAIL steps (or ``end_step()`` calls after graph replays) an expected launch tag
            may go without running before :class:`~kvcanary.CanaryNotRunningError` is raised (default 16; ``None``
            turns the watchdog off). HEAD and TAIL tags are expected; SWEEP tags too when ``sweep_interval`` is set.
            Sweeps and polls do not count (an idle engine may sweep and poll without forwards).
        sweep_interval: the engine sweeps the groups ``sweep_groups`` at least every this many engine steps (see
            :meth:`sweep_due`); the watchdog then expects their SWEEP tags within ``2 * sweep_interval +
            watchdog_patience`` HEAD/TAIL steps.
        sweep_groups: the groups the engine's sweeps cover (default the FULL group: a prefix-cache walk).
        stats_interval: log a ``[canary] step=...`` stats line every this many canary steps (None: off).
        metrics: ``True`` (the global Prometheus registry), a ``prometheus_client.CollectorRegistry``, or None
            (off): Prometheus counters per launch tag, violations by reason, ring overflows.
        block_size: the page size of the engine's block table (SPEC §10): :meth:`step` then takes
            ``block_table=`` instead of ``req_to_token=``.
        pad_row: batch rows whose ``req_pool_indices`` equals this are padding (0, SGLang's convention; -1 for
            tables without a padding row, as vLLM's).
        name: label for log messages and metrics.
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
        watchdog_patience: int | None = DEFAULT_WATCHDOG_PATIENCE,
        sweep_interval: int | None = None,
        sweep_groups: Sequence[str] = ("full",),
        stats_interval: int | None = None,
        metrics: Any = None,
        block_size: int | None = None,
        pad_row: int = consts.REQ_POOL_IDX_PADDING,
        name: str = "kv",
    ):
        self.num_slots = check_capacity("num_slots", num_slots)
        self.verify_capacity = check_non_negative(
            "verify_capacity", 3 * self.num_slots if verify_capacity is None else verify_capacity)
        self.max_batch_size = check_capacity("max_batch_size", max_batch_size)
        self.max_tokens_per_step = (None if max_tokens_per_step is None
                                    else check_capacity("max_tokens_per_step", max_tokens_per_step))
        self.name = str(name)
        self._mode = check_mode(mode)
        self.device = _device(device)
        self._dev = Device(self.device.type, -1 if self.device.type == "cpu" else int(self.device.index))
        self.expected_tokens_shape = self._check_expected_shape(expected_tokens_shape)
        self.kv_token_id_vs_position_offset = check_int("kv_token_id_vs_position_offset",
                                                        kv_token_id_vs_position_offset)
        self.block_size = None if block_size is None else check_capacity("block_size", block_size)
        self.pad_row = check_int("pad_row", pad_row)
        if self.pad_row not in (0, -1):
            raise invalid(f"pad_row must be 0 or -1, got {self.pad_row}")
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
            real_kv_hash_mode = (RealKvHashMode.PARTIAL if (k_sources or v_sources or swa_k or swa_v)
                                 else RealKvHashMode.NONE)
        mode_value = check_int("real_kv_hash_mode", real_kv_hash_mode)
        if mode_value not in set(RealKvHashMode):
            raise invalid(f"real_kv_hash_mode must be a RealKvHashMode (0, 1 or 2), got {mode_value}")
        self.real_kv_hash_mode = RealKvHashMode(mode_value)
        self.ring_capacity = check_capacity("ring_capacity", ring_capacity)

        group_slots = {"full": self.num_slots}
        sources = {("k", "full"): k_sources, ("v", "full"): v_sources}
        self.swa = swa
        self.swa_window = 0
        self._swa_locs: SwaLocations | None = None
        if swa is not None:
            group_slots["swa"] = check_capacity("swa.num_slots", swa.num_slots)
            self.swa_window = check_capacity("swa.window_size", swa.window_size)
            lut = array("swa.full_to_swa_index_mapping", swa.full_to_swa_index_mapping, "int64")
            if lut.device != self._dev:
                raise invalid(f"swa.full_to_swa_index_mapping must be on {self.device}, got {lut.device}")
            if self.max_tokens_per_step is not None:
                self._swa_locs = SwaLocations(lut=swa.full_to_swa_index_mapping, swa_num_slots=group_slots["swa"],
                                              max_tokens=self.max_tokens_per_step, device=self.device)
            sources[("k", "swa")], sources[("v", "swa")] = swa_k, swa_v
        self.groups = tuple(group_slots)
        self.group_slots = group_slots

        self.state = CanaryState(group_slots=group_slots, kvs=self.kvs, sources=sources,
                                 real_kv_hash_mode=self.real_kv_hash_mode, ring_capacity=self.ring_capacity,
                                 slot_stride_bytes=slot_stride_bytes, device=self.device)
        self._backend = backend_for(self._dev)
        # The verify kernel adds each step's invalid-row count straight into the status block (no extra op).
        self._invalid_rows_total = view("status invalid_rows", self.state.invalid_rows_total)
        # Per phase: (the state's generation they were prepared at, (is SWA, prepared launches) per group).
        self._table_steps: dict[str, tuple[int, tuple[tuple[bool, TableStep], ...]]] = {}

        cap = (min(self.num_slots, 1 << 16) if sweep_capacity is None
               else check_capacity("sweep_capacity", sweep_capacity))
        self.sweep_capacity = cap
        self._sweep_plan = VerifyPlan.allocate(verify_capacity=cap, device=self.device)
        self._sweep_views = verify_plan_views(self._sweep_plan, "sweep plan")

        self.collector = ViolationCollector(status=self.state.status, violation_ring=self.state.violation_ring,
                                            write_index=self.state.violation_write_index, mode=mode, name=self.name)
        self.phases = PhaseOrder(self.name)
        self._step_no = 0                  # end_step() calls: the step number violations are attributed to
        self._calls = {"head": 0, "tail": 0, "sweep": 0}
        self._last_sweep_head = 0          # HEAD steps at the last sweep (for sweep_due)
        # The views of the tables and LUT the engine passes step after step, reused while unchanged (same tensor,
        # address, shape, strides, dtype and device).
        self._long_lived = ValidatedCache(capacity=8)

        self.sweep_interval = None if sweep_interval is None else check_capacity("sweep_interval", sweep_interval)
        self.sweep_groups = tuple(sweep_groups)
        for g in self.sweep_groups:
            if g not in self.groups:
                raise invalid(f"sweep_groups must name groups of this canary {self.groups}, got {g!r}")
        self.watchdog: CanaryWatchdog | None = None
        if watchdog_patience is not None:
            patience = check_capacity("watchdog_patience", watchdog_patience)
            swept = CanaryLaunchTag.select(("sweep",), self.kvs, self.sweep_groups) if self.sweep_interval else ()
            expected = tuple(sorted(self.tags(STEP_PHASES) + swept))
            # The watchdog observes HEAD and TAIL steps (two per engine step): a sweep every N engine steps moves
            # the SWEEP counters every 2N observations.
            sweep_patience = {t: patience + 2 * (self.sweep_interval or 0) for t in swept}
            self.watchdog = CanaryWatchdog(expected, patience=patience, patience_by_tag=sweep_patience)
        self.stats_line = None if stats_interval is None else StatsLine(stats_interval, self.name)
        self.metrics: CanaryMetrics | None = None
        if metrics is not None and metrics is not False:
            self.metrics = CanaryMetrics(name=self.name, tags=self.tags(), ring_capacity=self.ring_capacity,
                                         registry=None if metrics is True else metrics)
        logger.info(
            "kv-canary: KVCanary %r on %s: num_slots=%s kvs=%s groups=%s ring_capacity=%d mode=%s; allocated "
            "%d device bytes in all (canary buffers %d, log and status %d, sweep plan %d, scratch)",
            self.name, self.device, group_slots, self.kvs, self.groups, self.ring_capacity, self.mode,
            self.allocated_bytes, self.state.buffer_bytes, self.state.log_bytes, VerifyPlan.allocation_bytes(cap))

    # -- construction helpers ------------------------------------------------------------------------------

    @classmethod
    def from_pool_geometry(cls, *, pool_slots: int, max_running_requests: int, max_prefill_tokens: int,
                           num_draft_tokens: int = 0, verify_capacity: int | None = None,
                           **kwargs: Any) -> KVCanary:
        """A canary sized by :meth:`CanaryPlanner.capacities_from_pool_geometry`; ``kwargs`` go to the
        constructor (``device``, sources, ``swa``, ``mode``...)."""
        caps = CanaryPlanner.capacities_from_pool_geometry(
            pool_slots=pool_slots, max_running_requests=max_running_requests,
            max_prefill_tokens=max_prefill_tokens, num_draft_tokens=num_draft_tokens,
            verify_capacity=verify_capacity)
        return cls(num_slots=pool_slots, max_batch_size=caps.max_batch_size, verify_capacity=caps.verify_capacity,
                   max_tokens_per_step=caps.max_tokens_per_step, **kwargs)

    @classmethod
    def from_env(cls, *, config: CanaryConfig | None = None, environ: Any = None, **kwargs: Any) -> KVCanary:
        """A canary configured by the ``KVCANARY_*`` environment variables (:mod:`kvcanary.runtime.config`);
        ``kwargs`` (the pool geometry, sources...) go to the constructor and win over the environment."""
        cfg = CanaryConfig.from_env(environ) if config is None else config
        return cls(**{**cfg.canary_kwargs(), **kwargs})

    @staticmethod
    def _check_expected_shape(shape: Any) -> tuple[int, int] | None:
        if shape is None:
            return None
        if not isinstance(shape, (tuple, list)) or len(shape) != 2:
            raise invalid(f"expected_tokens_shape must be (max_reqs, max_context_len), got {shape!r}")
        return (check_capacity("expected_tokens_shape[0] (max_reqs)", shape[0]),
                check_capacity("expected_tokens_shape[1] (max_context_len)", shape[1]))

    @property
    def allocated_bytes(self) -> int:
        """Device bytes held by this canary (buffers, log and status, sweep plan, scratch)."""
        scratch = 0 if self._swa_locs is None else self._swa_locs.nbytes
        return (self.state.buffer_bytes + self.state.log_bytes + VerifyPlan.allocation_bytes(self.sweep_capacity)
                + scratch)

    # -- the state, by name --------------------------------------------------------------------------------

    @property
    def buffers(self) -> dict[CanaryLaunchTag, torch.Tensor]:
        """The canary buffers by the HEAD/TAIL tag that stamps them (uint8 ``[slots, stride]`` each)."""
        return self.state.buffers

    @property
    def violation_ring(self) -> torch.Tensor:
        """int64 ``[ring_capacity, 8]``: the violation log's rows (SPEC §4), shared by every launch of this canary."""
        return self.state.violation_ring

    @property
    def violation_write_index(self) -> torch.Tensor:
        """int32 ``[1]``: the ring's write index (rows appended so far, kept or not; a view into the status block)."""
        return self.state.violation_write_index

    @property
    def counters(self) -> torch.Tensor:
        """int64 ``[tags, kernels, counts]`` run counters (a view into the status block)."""
        return self.state.counters

    @property
    def chain_position_flag(self) -> torch.Tensor:
        """int32 ``[1]``: SPEC §4's ``enable_chain_position_assert`` of every launch (read by the writes: 0 during
        warm-up and graph capture, then 1, when a write checks each token's position against its predecessor's)."""
        return self.state.chain_position_flag

    @property
    def mode(self) -> str:
        """What a reported violation does: ``"log"`` (a WARNING), ``"raise"`` or ``"quiet"``; settable."""
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        self._mode = self.collector.mode = check_mode(value)

    def buffer(self, phase: str, kv: str = "k", group: str = "full") -> torch.Tensor:
        """The canary buffer (uint8 ``[slots, stride]``) of ``phase`` in ``("head", "tail", "sweep")``
        (SWEEP reads the TAIL buffer)."""
        phase = "tail" if phase == "sweep" else phase
        try:
            return self.state.buffers[CanaryLaunchTag.of(phase, kv, group)]
        except (KeyError, ValueError):
            raise invalid(f"this canary has no buffer for phase={phase!r} kv={kv!r} group={group!r}") from None

    def tags(self, phases: Sequence[str] = consts.PHASES) -> tuple[CanaryLaunchTag, ...]:
        """The launch tags this canary uses for ``phases``."""
        return self.state.tags(phases)

    # -- chain position assert -------------------------------------------------------------------------------

    @property
    def chain_position_assert(self) -> bool:
        """The ``enable_chain_position_assert`` device flag (reading it syncs)."""
        return bool(int(self.state.chain_position_flag[0]))

    @chain_position_assert.setter
    def chain_position_assert(self, on: bool) -> None:
        self.state.chain_position_flag.fill_(1 if on else 0)

    @contextlib.contextmanager
    def warmup(self) -> Iterator[KVCanary]:
        """Run warm-up batches and CUDA-graph capture inside this block: the chain position assert is off
        (dummy batches do not continue real chains); it is switched back on at exit (the flag is a device
        value, so captured write launches read 1 when replayed). On CUDA, entering also compiles and loads
        every kernel and prepares the real-KV source tables (neither may happen inside a capture)."""
        if self.device.type == "cuda":
            from kvcanary.ops.cuda import backend  # CuPy is imported only on the CUDA path

            backend.warmup(self.device)
            backend.prepare_real_kv_sources(list(self.state.views.values()))
        self.state.chain_position_flag.fill_(0)
        try:
            yield self
        finally:
            self.state.chain_position_flag.fill_(1)

    # -- phase order ---------------------------------------------------------------------------------------

    def nested_forward(self) -> contextlib.AbstractContextManager[None]:
        """Allow one forward nested inside another (``with canary.nested_forward(): head ... tail``), e.g. a
        vision-language model's inner forward inside the engine step; each level still runs HEAD before TAIL."""
        return self.phases.nested()

    def abort_forward(self) -> None:
        """Close a forward whose HEAD ran but whose TAIL never will (the model forward raised)."""
        self.phases.abort()

    # -- the hot path ------------------------------------------------------------------------------------

    def step(
        self,
        phase: str,
        *,
        req_pool_indices: Any,
        prefix_lens: Any,
        extend_seq_lens: Any,
        input_ids: Any,
        positions: Any,
        out_cache_loc: Any,
        req_to_token: Any = None,
        block_table: Any = None,
        swa_out_cache_loc: Any = None,
        expected_tokens: Any = None,
        expected_tokens_valid_lens: Any = None,
        expected_input_tokens: Any = None,
        expected_input_positions: Any = None,
        stream: Any = None,
    ) -> None:
        """One forward phase: verify every request's prefix, stamp the new tokens.

        ``phase="head"`` runs before the model forward (records without real KV); ``phase="tail"`` after
        it (records carry the real-KV fingerprint of the KV the forward just wrote, and the verify checks
        the prefix's real KV). Every group (FULL, SWA) and half (K, V) this canary tracks is done: one verify
        and one write launch per group.

        Args (``bs`` batch rows, ``N`` tokens; all on the canary's device; arrays are read in place):
            req_pool_indices: int64 ``[bs]`` (``pad_row`` = padding row).
            prefix_lens: int64 ``[bs]``: positions already in the cache.
            extend_seq_lens: int64 ``[bs]``: tokens written this step.
            req_to_token: int32 ``[max_reqs, max_seq_len]`` (FULL slots), or
            block_table: int32 ``[max_reqs, max_blocks]`` of pages of ``block_size`` slots (canaries built with
                ``block_size``); exactly one of the two.
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

        Raises a ``kv-canary:`` error, writing nothing, on a bad argument or a phase out of order (HEAD
        before TAIL in every forward; see :meth:`nested_forward` and :meth:`abort_forward`). No host sync on
        CUDA: capturable in a CUDA graph, on the current stream or on ``stream`` (the step asks whether its own
        launch stream is capturing, and then leaves the step's close to :meth:`end_step` after each replay).
        Violations are reported one step later (see :meth:`end_step`).
        """
        if phase not in STEP_PHASES:
            raise invalid(f"phase must be 'head' or 'tail', got {phase!r}")
        self.phases.check(phase)
        launch_stream = self._launch_step(
            phase, req_pool_indices, prefix_lens, extend_seq_lens, input_ids, positions, out_cache_loc, req_to_token,
            block_table, swa_out_cache_loc, expected_tokens, expected_tokens_valid_lens, expected_input_tokens,
            expected_input_positions, stream)
        self.phases.commit(phase)
        if not self._backend.capturing(launch_stream):
            self._calls[phase] += 1
            self._close_step(watchdog=True, stream=launch_stream)

    def _launch_step(self, phase: str, req_pool_indices: Any, prefix_lens: Any, extend_seq_lens: Any,
                     input_ids: Any, positions: Any, out_cache_loc: Any, req_to_token: Any, block_table: Any,
                     swa_out_cache_loc: Any, expected_tokens: Any, expected_tokens_valid_lens: Any,
                     expected_input_tokens: Any, expected_input_positions: Any, stream: Any) -> Any:
        """Check the batch and launch every group's verify and write; returns the backend's launch stream."""
        dev = self._dev
        rpi = batch_array("req_pool_indices", req_pool_indices, "int64", dev)
        bs = rpi.shape[0]
        if bs > self.max_batch_size:
            raise invalid(f"batch size {bs} exceeds max_batch_size={self.max_batch_size}")
        prefix = batch_array("prefix_lens", prefix_lens, "int64", dev, length=bs)
        extend = batch_array("extend_seq_lens", extend_seq_lens, "int64", dev, length=bs)
        table = self._table(req_to_token, block_table)
        ids = batch_array("input_ids", input_ids, "int64", dev)
        n = ids.shape[0]
        if self.max_tokens_per_step is not None and n > self.max_tokens_per_step:
            raise invalid(f"input_ids has {n} tokens, more than max_tokens_per_step={self.max_tokens_per_step}")
        pos = batch_array("positions", positions, "int64", dev, length=n)
        loc = batch_array("out_cache_loc", out_cache_loc, "int64", dev, length=n)
        if (expected_input_tokens is None) != (expected_input_positions is None):
            raise invalid("expected_input_tokens and expected_input_positions must be given together")
        exp_in_tok = exp_in_pos = None
        if expected_input_tokens is not None:
            exp_in_tok = batch_array("expected_input_tokens", expected_input_tokens, "int64", dev, length=n)
            exp_in_pos = batch_array("expected_input_positions", expected_input_positions, "int64", dev, length=n)
        pool = valid = None
        if (expected_tokens is None) != (expected_tokens_valid_lens is None):
            raise invalid("expected_tokens and expected_tokens_valid_lens must be given together")
        if expected_tokens is not None:
            pool = batch_array("expected_tokens", expected_tokens, "int32", dev, ndim=2)
            if self.expected_tokens_shape is not None and pool.shape != self.expected_tokens_shape:
                raise invalid(f"expected_tokens must have expected_tokens_shape={self.expected_tokens_shape}, "
                              f"got {tuple(pool.shape)}")
            if pool.shape[0] < table.max_reqs:
                raise invalid(f"expected_tokens must have at least the table's {table.max_reqs} rows, "
                              f"got {pool.shape[0]}")
            valid = batch_array("expected_tokens_valid_lens", expected_tokens_valid_lens, "int64", dev, length=bs)
        swa_loc: Any = None
        if "swa" in self.group_slots:
            if swa_out_cache_loc is not None:
                swa_loc = batch_array("swa_out_cache_loc", swa_out_cache_loc, "int64", dev, length=n)
            elif self._swa_locs is None:
                raise invalid("step() needs swa_out_cache_loc, or a canary built with max_tokens_per_step to "
                              "translate out_cache_loc through swa.full_to_swa_index_mapping")
        self.state.refresh(phase)

        if "swa" in self.group_slots and swa_loc is None:
            assert self._swa_locs is not None
            with stream_context(stream, self.device):   # the translation's torch ops go to the launch stream
                swa_loc = self._swa_locs.translate(out_cache_loc)
        launch_stream = self._backend.launch_stream(stream, dev)   # looked up once per step
        offset = self.kv_token_id_vs_position_offset
        for swa, launches in self._table_step(phase, launch_stream):
            lut = self._lut() if swa else None
            launches.verify(table=table, lut=lut, req_pool_indices=rpi, prefix_lens=prefix,
                            swa_window_size=self.swa_window if swa else 0, expected_tokens_pool=pool,
                            expected_tokens_valid_lens=valid, token_offset=offset, check_expected_token=pool is not None,
                            invalid_rows_total=None if swa else self._invalid_rows_total, stream=launch_stream)
            launches.write(table=table, lut=lut, req_pool_indices=rpi, prefix_lens=prefix, extend_seq_lens=extend,
                           input_ids=ids, positions=pos, out_cache_loc=swa_loc if swa else loc,
                           expected_input_tokens=exp_in_tok, expected_input_positions=exp_in_pos, stream=launch_stream)
        return launch_stream

    def _table_step(self, phase: str, stream: Any) -> tuple[tuple[bool, TableStep], ...]:
        """The prepared verify and write launches of ``phase``, per group (``(is the SWA group, launches)``), rebuilt
        when the contexts were validated again (a buffer or source replaced: ``state.refresh`` re-validates them
        into new objects and bumps its generation)."""
        gen = self.state.generation
        cached = self._table_steps.get(phase)
        if cached is not None and cached[0] == gen:
            return cached[1]
        steps = tuple((group == "swa", self._backend.table_step(
            device=self._dev, verify_contexts=self.state.context_views(phase, group, Kernel.VERIFY),
            write_contexts=self.state.context_views(phase, group, Kernel.WRITE), stream=stream))
            for group in self.groups)
        self._table_steps[phase] = (gen, steps)
        return steps

    def _table(self, req_to_token: Any, block_table: Any) -> TableViews:
        if (req_to_token is None) == (block_table is None):
            raise invalid("step() needs exactly one of req_to_token and block_table, got "
                          + ("both" if req_to_token is not None else "neither"))
        if block_table is not None:
            if self.block_size is None:
                raise invalid("step(block_table=...) needs a canary built with block_size")
            block_size = self.block_size
            return self._long_lived.get(block_table, (block_table,), lambda: TableViews(
                req_to_token=None, block_table=array_on("block_table", block_table, "int32", self._dev, ndim=2),
                block_size=block_size, pad_row=self.pad_row), "block_table")
        return self._long_lived.get(req_to_token, (req_to_token,), lambda: TableViews(
            req_to_token=array_on("req_to_token", req_to_token, "int32", self._dev, ndim=2), block_table=None,
            block_size=1, pad_row=self.pad_row), "req_to_token")

    def _lut(self) -> ArrayView:
        assert self.swa is not None
        lut = self.swa.full_to_swa_index_mapping
        return self._long_lived.get(lut, (lut,), lambda: array_on("swa.full_to_swa_index_mapping", lut, "int64",
                                                                   self._dev), "lut")

    def sweep_due(self) -> bool:
        """Whether a sweep is due under ``sweep_interval`` (engine steps = HEAD steps since the last sweep)."""
        return self.sweep_interval is not None and self._calls["head"] - self._last_sweep_head >= self.sweep_interval

    def sweep(self, slots: Any, positions: Any, prev_slots: Any, *, expected_tokens: Any = None,
              group: str = "full", stream: Any = None) -> None:
        """Verify arbitrary cached slots (e.g. a radix-cache walk) against the TAIL records, with SWEEP tags.

        Args (``n`` entries, all int64 ``[n]`` torch tensors on the canary's device, or any ``__dlpack__``
        array there):
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
        dev = self._dev
        s = array_on("slots", slots, "int64", dev)
        n = s.shape[0]
        args = [s, array_on("positions", positions, "int64", dev, length=n),
                array_on("prev_slots", prev_slots, "int64", dev, length=n)]
        if expected_tokens is not None:
            args.append(array_on("expected_tokens", expected_tokens, "int64", dev, length=n))
        # torch views of the checked arrays (zero-copy), for the chunk copies into the sweep plan.
        src = [a.obj if isinstance(a.obj, torch.Tensor) else torch.from_dlpack(a.obj) for a in args]
        plan = self._sweep_plan
        cap = self.sweep_capacity
        self.state.refresh("sweep")
        with stream_context(stream, self.device):
            for start in range(0, max(n, 1), cap):
                m = min(cap, n - start)
                plan.verify_slot_indices[:m].copy_(src[0][start:start + m])
                plan.verify_expected_positions[:m].copy_(src[1][start:start + m])
                plan.verify_prev_slot_indices[:m].copy_(src[2][start:start + m])
                if expected_tokens is not None:
                    plan.verify_expected_tokens[:m].copy_(src[3][start:start + m])
                else:
                    plan.verify_expected_tokens[:m].fill_(-1)
                plan.verify_num_valid.fill_(m)
                plan.enable.fill_(1)
                # The sweep keeps the plan-based verify (its entries are arbitrary slots, not a table walk), on
                # the contexts validated once (any number of real-KV sources).
                for ctx in self.state.context_views("sweep", group, Kernel.VERIFY):
                    self._backend.verify(VerifyLaunch(device=dev, ctx=ctx, plan=self._sweep_views,
                                                      check_expected_token=expected_tokens is not None), stream)
            if not is_capturing(self.device):
                self._calls["sweep"] += 1
                self._last_sweep_head = self._calls["head"]
                # A sweep closes a canary step of its own, but only engine steps feed the watchdog: an idle
                # engine may sweep without forwards.
                self._close_step(watchdog=False)

    # -- reporting ---------------------------------------------------------------------------------------

    def end_step(self) -> None:
        """Close one canary step: stage the status block to pinned host memory (side stream), take the copies
        of earlier steps that have landed, decode and report any new violation rows they reveal (per ``mode``),
        feed the watchdog, the stats line and the metrics.

        ``step()`` calls it itself (except while a CUDA graph is being captured); call it after every graph
        replay. Never waits for the device; does nothing during capture.
        """
        self._end_step(watchdog=True)

    def _end_step(self, *, watchdog: bool) -> None:
        if not is_capturing(self.device):
            self._close_step(watchdog=watchdog)

    def _close_step(self, *, watchdog: bool, stream: Any = None) -> None:
        """``stream``: the launch stream of the step's kernels (default: the current stream), which the status
        copy is ordered after."""
        self._step_no += 1
        snapshots, new = self.collector.end_step(self._step_no, stream)   # may raise CanaryViolationError
        self._observe(snapshots, new, watchdog=watchdog)

    def _observe(self, snapshots: list[StatusSnapshot], new: list[Violation], *, watchdog: bool = True) -> None:
        if self.metrics is not None and new:
            self.metrics.count_violations(new)
        for snap in snapshots:
            if self.metrics is not None:
                self.metrics.observe(snap)
            if self.stats_line is not None:
                self.stats_line.observe(snap)
            if watchdog and self.watchdog is not None:  # may raise CanaryNotRunningError
                self.watchdog.observe({t: snap.launches(t) for t in self.watchdog.tags})
        if self.stats_line is not None:
            self.stats_line.maybe_log(self._step_no, self._calls["sweep"])

    def poll(self, *, sync: bool = False) -> list[Violation]:
        """The violations decoded since the previous ``poll()`` (whatever the mode), oldest first.

        ``sync=False`` (the hot-path form) never waits: it returns what the steps so far have found, one
        step late. ``sync=True`` waits for the device and reads the current status, so violations of the latest
        step are included and the stats and metrics see the latest counters (off the hot path: at
        shutdown, in tests, after an alert). Newly found violations are reported per ``mode`` (``"raise"``
        raises here).
        """
        if sync:
            before = len(self.collector.history)
            snapshots = self.collector.flush()         # may raise CanaryViolationError
            # Not fed to the watchdog: a poll is not an engine step, and an idle engine may poll at will.
            self._observe(snapshots, self.collector.history[before:], watchdog=False)
        return self.collector.poll()

    @property
    def step_number(self) -> int:
        """Canary steps closed so far (``end_step()`` calls); :attr:`Violation.step` refers to this numbering."""
        return self._step_no

    @property
    def violations(self) -> list[Violation]:
        """Every violation decoded so far (a copy), oldest first."""
        return list(self.collector.history)

    def reset_log(self) -> list[Violation]:
        """Read every outstanding violation (host sync), then empty the ring and its write index so new
        violations are kept again. Returns the violations not yet returned by :meth:`poll`."""
        return self.collector.reset(self._step_no)

    # -- health ------------------------------------------------------------------------------------------

    def health(self) -> CanaryHealth:
        """Counters and statistics read now (a host sync: call it off the hot path)."""
        snap = StatusSnapshot(self.state.status.cpu().numpy())
        tags = {t: TagCounters(tag=t, verify_launches=snap.count(t, Kernel.VERIFY, Count.LAUNCHES),
                               verified_slots=snap.count(t, Kernel.VERIFY, Count.SLOTS),
                               write_launches=snap.count(t, Kernel.WRITE, Count.LAUNCHES),
                               stamped_slots=snap.count(t, Kernel.WRITE, Count.SLOTS))
                for t in self.tags()}
        total = snap.write_index
        return CanaryHealth(
            tags=tags,
            steps={**self._calls, "end_step": self._step_no},
            protected_tokens=tags[CanaryLaunchTag.HEAD_K_FULL].stamped_slots,
            verified_slots=sum(tags[t].verified_slots for t in self.tags(STEP_PHASES)),
            sweeps=self._calls["sweep"],
            swept_slots=sum(tags[t].verified_slots for t in self.tags(("sweep",)) if t.kv == "k"),
            violations_total=total,
            violations_kept=min(total, self.ring_capacity),
            ring_capacity=self.ring_capacity,
            plan_overflows=0,
            invalid_rows=snap.invalid_rows,
        )
