"""Launch records: what :mod:`kvcanary.ops.validation` hands to a backend (SPEC §4-§13).

A launch record describes one validated op call: :class:`~kvcanary.ops.interop.ArrayView` objects (dtype,
shape, strides, device and data pointer already checked) and plain ints. Both backends
(:mod:`kvcanary.ops.reference` on the CPU, :mod:`kvcanary.ops.cuda` on a GPU) consume these records and
nothing else, so a backend never sees an argument that was not checked. Records are frozen and built with
keyword arguments only.

Naming: ``*Views`` records describe a long-lived object (a plan, a context, a table); ``*Launch`` records
describe one op call.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvcanary.ops.interop import ArrayView, Device

# ----------------------------------------------------------------------------------------------------------
# Long-lived objects


@dataclass(frozen=True, kw_only=True)
class VerifyPlanViews:
    """A validated :class:`~kvcanary.VerifyPlan` (SPEC §5): five int64/int32 arrays of capacity ``C``."""

    slot_indices: ArrayView
    expected_tokens: ArrayView
    expected_positions: ArrayView
    prev_slot_indices: ArrayView
    num_valid: ArrayView
    enable: ArrayView

    @property
    def capacity(self) -> int:
        return self.slot_indices.shape[0]

    def all(self) -> tuple[ArrayView, ...]:
        return (self.slot_indices, self.expected_tokens, self.expected_positions, self.prev_slot_indices,
                self.num_valid, self.enable)


@dataclass(frozen=True, kw_only=True)
class WritePlanViews:
    """A validated :class:`~kvcanary.WritePlan` (SPEC §5): request capacity ``R``."""

    offsets: ArrayView
    seed_slot_indices: ArrayView
    num_valid_reqs: ArrayView

    @property
    def capacity(self) -> int:
        return self.seed_slot_indices.shape[0]

    def all(self) -> tuple[ArrayView, ...]:
        return (self.offsets, self.seed_slot_indices, self.num_valid_reqs)


@dataclass(frozen=True, kw_only=True)
class RealKvSourceView:
    """A validated :class:`~kvcanary.RealKvSource`: the byte-view parameters of SPEC §3.1.

    ``num_rows`` rows of ``row_bytes`` bytes each ``row_stride_bytes`` apart; covers ``num_rows * page_size``
    slots (SPEC §9: a touched slot beyond that is reported, never read).
    """

    tensor: ArrayView
    page_size: int
    num_bytes_per_token: int
    read_bytes: int
    row_bytes: int
    row_stride_bytes: int
    num_rows: int

    @property
    def num_slots(self) -> int:
        return self.num_rows * self.page_size


@dataclass(frozen=True, kw_only=True)
class CanaryBufferView:
    """A validated canary buffer: uint8 ``[num_slots, slot_stride_bytes]``, contiguous, 8-byte aligned."""

    buf: ArrayView
    num_slots: int
    slot_stride_bytes: int


@dataclass(frozen=True, kw_only=True)
class ContextViews:
    """A validated :class:`~kvcanary.VerifyOrWriteContext` (SPEC §4).

    ``real_kv_sources`` holds every source of the context (the SGLang-named ops allow at most
    ``MAX_REAL_KV_SOURCES``; kvcanary's own ops any number, SPEC §13); ``real_kv_hash_mode`` is the mode as
    given (a backend folds no source in NONE mode).
    """

    canary_buf: ArrayView
    num_slots: int
    slot_stride_bytes: int
    kernel_kind: int
    violation_ring: ArrayView
    ring_capacity: int
    violation_write_index: ArrayView
    slot_run_counter: ArrayView
    kernel_run_counter: ArrayView
    real_kv_sources: tuple[RealKvSourceView, ...]
    real_kv_hash_mode: int
    chain_position_flag: ArrayView | None

    def all(self) -> tuple[ArrayView, ...]:
        extra = tuple(s.tensor for s in self.real_kv_sources)
        flag = (self.chain_position_flag,) if self.chain_position_flag is not None else ()
        return (self.canary_buf, self.violation_ring, self.violation_write_index, self.slot_run_counter, self.kernel_run_counter, *extra, *flag)

    @property
    def folds_real_kv(self) -> bool:
        """Whether launches of this context read real KV (a mode other than NONE and at least one source)."""
        return self.real_kv_hash_mode != 0 and bool(self.real_kv_sources)


@dataclass(frozen=True, kw_only=True)
class TableViews:
    """The per-position table of SPEC §10, in one of its two forms.

    Exactly one of ``req_to_token`` (int32 ``[max_reqs, max_seq_len]``) and ``block_table`` (int32
    ``[max_reqs, max_blocks]``, with ``block_size >= 1``) is set; ``block_size`` is 1 for the
    ``req_to_token`` form. ``RT(rp, p)`` is ``req_to_token[rp, p]``, or
    ``block_table[rp, p // block_size] * block_size + p % block_size`` (64-bit; a negative block id gives -1).
    ``pad_row``: a batch row whose ``req_pool_indices`` equals it is padding (0, SGLang's convention; -1 for
    tables without a padding row; validation accepts -1 or any row of the table).
    """

    req_to_token: ArrayView | None
    block_table: ArrayView | None
    block_size: int
    pad_row: int

    @property
    def array(self) -> ArrayView:
        """The table array, whichever form it is."""
        t = self.req_to_token if self.req_to_token is not None else self.block_table
        assert t is not None
        return t

    @property
    def paged(self) -> bool:
        return self.block_table is not None

    @property
    def max_reqs(self) -> int:
        return self.array.shape[0]

    @property
    def max_seq_len(self) -> int:
        return self.array.shape[1] * self.block_size


# ----------------------------------------------------------------------------------------------------------
# SGLang-named ops (SPEC §5-§8)


@dataclass(frozen=True, kw_only=True)
class PlanLaunch:
    """A validated ``launch_canary_plan_kernels`` call (SPEC §5, with the table of §10)."""

    device: Device
    verify: VerifyPlanViews
    write: WritePlanViews
    req_pool_indices: ArrayView
    prefix_lens: ArrayView
    extend_seq_lens: ArrayView
    table: TableViews
    swa_window_size: int
    lut: ArrayView | None
    expected_tokens_pool: ArrayView | None
    expected_tokens_valid_lens: ArrayView | None
    token_offset: int
    invalid_rows: ArrayView | None

    @property
    def bs(self) -> int:
        return self.req_pool_indices.shape[0]

    @property
    def max_reqs(self) -> int:
        return self.table.max_reqs

    @property
    def max_seq_len(self) -> int:
        return self.table.max_seq_len


@dataclass(frozen=True, kw_only=True)
class WriteLaunch:
    """A validated ``launch_canary_write_kernel`` call (SPEC §6)."""

    device: Device
    ctx: ContextViews
    plan: WritePlanViews
    input_ids: ArrayView
    positions: ArrayView
    out_cache_loc: ArrayView
    expected_input_tokens: ArrayView | None
    expected_input_positions: ArrayView | None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def input_assert(self) -> bool:
        return self.expected_input_tokens is not None


@dataclass(frozen=True, kw_only=True)
class VerifyLaunch:
    """A validated ``launch_canary_verify_kernel`` call (SPEC §7). ``kept``: validation keeps this record and
    returns this very object to later calls with the same arguments while nothing under them changes (so a
    backend may attach work done once to it)."""

    device: Device
    ctx: ContextViews
    plan: VerifyPlanViews
    check_expected_token: bool
    kept: bool = False


@dataclass(frozen=True, kw_only=True)
class ScatterLaunch:
    """A validated ``launch_scatter_req_token_ids_kernel`` call (SPEC §8)."""

    device: Device
    flat_in: ArrayView
    offsets: ArrayView
    req_pool_indices: ArrayView
    pool_out: ArrayView


# ----------------------------------------------------------------------------------------------------------
# Plan-free ops (SPEC §11, §12)


@dataclass(frozen=True, kw_only=True)
class VerifyTableLaunch:
    """A validated ``launch_canary_verify_from_table`` call (SPEC §11): verify every active row's prefix
    (its window for ``swa_window_size > 0``) straight from the table, once for each context."""

    device: Device
    contexts: tuple[ContextViews, ...]
    req_pool_indices: ArrayView
    prefix_lens: ArrayView
    table: TableViews
    swa_window_size: int
    lut: ArrayView | None
    expected_tokens_pool: ArrayView | None
    expected_tokens_valid_lens: ArrayView | None
    token_offset: int
    check_expected_token: bool
    invalid_rows: ArrayView | None
    # int64 [1] or None: the invalid-row count is *added* to it (kvcanary's runtime keeps a running count in its
    # status block this way; not part of the public op).
    invalid_rows_total: ArrayView | None = None

    @property
    def bs(self) -> int:
        return self.req_pool_indices.shape[0]


@dataclass(frozen=True, kw_only=True)
class WriteTableLaunch:
    """A validated ``launch_canary_write_from_table`` call (SPEC §12): §5's write metadata computed from the
    table, then §6, once for each context."""

    device: Device
    contexts: tuple[ContextViews, ...]
    req_pool_indices: ArrayView
    prefix_lens: ArrayView
    extend_seq_lens: ArrayView
    table: TableViews
    lut: ArrayView | None
    input_ids: ArrayView
    positions: ArrayView
    out_cache_loc: ArrayView
    expected_input_tokens: ArrayView | None
    expected_input_positions: ArrayView | None
    invalid_rows: ArrayView | None

    @property
    def bs(self) -> int:
        return self.req_pool_indices.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def input_assert(self) -> bool:
        return self.expected_input_tokens is not None


# ----------------------------------------------------------------------------------------------------------
# Records that move with the KV (SPEC §13)


# A record is the first 32 bytes of a slot (int64 token, position, prev_hash, real_kv_hash). A negative slot
# skips its entry (gather writes a zero record); a slot >= num_slots of its buffer is skipped too and counted in
# ``out_of_range`` (set, not added; copy counts an entry once). ``slots`` arrays are int64 ``[n]``.


@dataclass(frozen=True, kw_only=True)
class RecordGatherLaunch:
    """``gather_canary_records``: ``records_out[i] = record(slots[i])`` (int64 ``[n, 4]``)."""

    device: Device
    canary: CanaryBufferView
    slots: ArrayView
    records_out: ArrayView
    out_of_range: ArrayView | None


@dataclass(frozen=True, kw_only=True)
class RecordScatterLaunch:
    """``scatter_canary_records``: ``record(slots[i]) = records[i]``."""

    device: Device
    canary: CanaryBufferView
    slots: ArrayView
    records: ArrayView
    out_of_range: ArrayView | None


@dataclass(frozen=True, kw_only=True)
class RecordCopyLaunch:
    """``copy_canary_records``: ``dst record(dst_slots[i]) = src record(src_slots[i])``; ``dst`` is ``src``
    itself (the same view) when the caller gave no ``dst_canary_buf``."""

    device: Device
    src: CanaryBufferView
    src_slots: ArrayView
    dst: CanaryBufferView
    dst_slots: ArrayView
    out_of_range: ArrayView | None
