"""The data structures of SPEC §3.1, §4 and §5: plans, real-KV sources, launch context, violation log.

All are frozen, keyword-only dataclasses holding caller-owned arrays (torch tensors by default, any
``__dlpack__`` array accepted). The ``allocate`` helpers create torch tensors on ``device``; their
addresses never change afterwards, so they are safe to capture in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from kvcanary import consts
from kvcanary.consts import RealKvHashMode
from kvcanary.errors import invalid
from kvcanary.ops.checks import check_positive
from kvcanary.ops.interop import view
from kvcanary.ops.launches import RealKvSourceView

_INT64 = 8
_INT32 = 4


def _positive(owner: str, name: str, value: int) -> int:
    return check_positive(f"{owner} {name}", value)


@dataclass(frozen=True, kw_only=True)
class VerifyPlan:
    """Flat verify work list (SPEC §5). Capacity ``C`` = ``verify_slot_indices.shape[0]``.

    ``verify_slot_indices``, ``verify_expected_tokens``, ``verify_expected_positions``,
    ``verify_prev_slot_indices``: int64 ``[C]``; ``verify_num_valid``: int32 ``[1]`` (active entries);
    ``enable``: int32 ``[1]`` (0 = the plan overflowed, verify skips the step).
    """

    verify_slot_indices: Any
    verify_expected_tokens: Any
    verify_expected_positions: Any
    verify_prev_slot_indices: Any
    verify_num_valid: Any
    enable: Any

    @classmethod
    def allocate(cls, *, verify_capacity: int, device: Any = "cpu") -> VerifyPlan:
        """Allocate a plan of capacity ``verify_capacity`` (> 0) on ``device``; ``enable`` starts at 1."""
        c = _positive("VerifyPlan", "verify_capacity", verify_capacity)

        def i64() -> torch.Tensor:
            return torch.full((c,), -1, dtype=torch.int64, device=device)

        return cls(
            verify_slot_indices=i64(),
            verify_expected_tokens=i64(),
            verify_expected_positions=i64(),
            verify_prev_slot_indices=i64(),
            verify_num_valid=torch.zeros(1, dtype=torch.int32, device=device),
            enable=torch.ones(1, dtype=torch.int32, device=device),
        )

    @staticmethod
    def allocation_bytes(capacity: int) -> int:
        """Bytes :meth:`allocate` takes for ``capacity`` entries."""
        return 4 * _INT64 * capacity + 2 * _INT32

    @property
    def capacity(self) -> int:
        return int(view("verify_slot_indices", self.verify_slot_indices).shape[0])


@dataclass(frozen=True, kw_only=True)
class WritePlan:
    """Per-request write metadata (SPEC §5). Request capacity ``R`` = ``write_seed_slot_indices.shape[0]``.

    ``write_offsets``: int64 ``[R + 1]`` (exclusive prefix sum of per-request write lengths);
    ``write_seed_slot_indices``: int64 ``[R]`` (-1 = no prefix); ``write_num_valid_reqs``: int32 ``[1]``.
    """

    write_offsets: Any
    write_seed_slot_indices: Any
    write_num_valid_reqs: Any

    @classmethod
    def allocate(cls, *, write_req_capacity: int, device: Any = "cpu") -> WritePlan:
        """Allocate a plan for up to ``write_req_capacity`` (> 0) requests per batch on ``device``."""
        r = _positive("WritePlan", "write_req_capacity", write_req_capacity)
        return cls(
            write_offsets=torch.zeros(r + 1, dtype=torch.int64, device=device),
            write_seed_slot_indices=torch.full((r,), -1, dtype=torch.int64, device=device),
            write_num_valid_reqs=torch.zeros(1, dtype=torch.int32, device=device),
        )

    @staticmethod
    def allocation_bytes(capacity: int) -> int:
        """Bytes :meth:`allocate` takes for ``capacity`` requests."""
        return _INT64 * (capacity + 1) + _INT64 * capacity + _INT32

    @property
    def capacity(self) -> int:
        return int(view("write_seed_slot_indices", self.write_seed_slot_indices).shape[0])


@dataclass(frozen=True, kw_only=True)
class RealKvSource:
    """Which bytes of a real KV pool belong to each slot (SPEC §3.1). Validated at construction.

    ``tensor`` (any dtype, ``ndim >= 2``, a live view of the pool) is seen as a uint8 array
    ``[rows, row_bytes]`` with row stride ``tensor.stride(0) * element_size``; slot ``s`` owns
    ``[s // page_size][(s % page_size) * num_bytes_per_token : + num_bytes_per_token]``. The fingerprint
    folds the first 16 bytes (PARTIAL) or ``read_bytes`` bytes (ALL) of that range. Covers
    ``rows * page_size`` slots.
    """

    tensor: Any
    page_size: int
    num_bytes_per_token: int
    read_bytes: int

    def __post_init__(self) -> None:
        for name in ("page_size", "num_bytes_per_token", "read_bytes"):
            _positive("RealKvSource", name, getattr(self, name))
        step = consts.REAL_KV_LOAD_BYTES
        if self.num_bytes_per_token % step:
            raise invalid(
                f"RealKvSource num_bytes_per_token must be a positive multiple of {step}, "
                f"got {self.num_bytes_per_token}"
            )
        if self.read_bytes % step:
            raise invalid(f"RealKvSource read_bytes must be a positive multiple of {step}, got {self.read_bytes}")
        if self.read_bytes > self.num_bytes_per_token:
            raise invalid(
                f"RealKvSource read_bytes must be <= num_bytes_per_token={self.num_bytes_per_token}, "
                f"got {self.read_bytes}"
            )
        self.describe()

    def describe(self, name: str = "RealKvSource") -> RealKvSourceView:
        """Check the tensor as it is now (it is the engine's live pool, which may have been re-allocated or
        resized since construction) and return its byte view; ``name`` prefixes the messages."""
        step = consts.REAL_KV_LOAD_BYTES
        v = view(f"{name}.tensor", self.tensor)
        if v.ndim < 2:
            raise invalid(f"{name} tensor must have ndim >= 2, got shape {v.shape}")
        inner = v._replace(shape=v.shape[1:], strides=v.strides[1:])
        if not inner.is_contiguous():
            raise invalid(
                f"{name} tensor must be contiguous within a row (dims 1..), got shape {v.shape} "
                f"and strides {v.strides}"
            )
        stride_bytes = v.strides[0] * v.itemsize
        if stride_bytes % step or stride_bytes < 0:
            raise invalid(f"{name} tensor row stride must be a multiple of {step} bytes, got {stride_bytes}")
        if v.ptr % step:
            raise invalid(f"{name} tensor data pointer must be {step}-byte aligned, got {v.ptr:#x}")
        need = self.page_size * self.num_bytes_per_token
        row_bytes = math.prod(v.shape[1:]) * v.itemsize
        if row_bytes < need:
            raise invalid(
                f"{name} tensor rows must be at least page_size * num_bytes_per_token = {need} bytes "
                f"wide, got {row_bytes}"
            )
        return RealKvSourceView(tensor=v, page_size=self.page_size, num_bytes_per_token=self.num_bytes_per_token,
                                read_bytes=self.read_bytes, row_bytes=row_bytes, row_stride_bytes=stride_bytes,
                                num_rows=v.shape[0])

    @property
    def row_bytes(self) -> int:
        v = view("RealKvSource.tensor", self.tensor)
        return math.prod(v.shape[1:]) * v.itemsize

    @property
    def row_stride_bytes(self) -> int:
        v = view("RealKvSource.tensor", self.tensor)
        return v.strides[0] * v.itemsize

    @property
    def num_slots(self) -> int:
        """Slots this source covers: ``rows * page_size``."""
        return int(view("RealKvSource.tensor", self.tensor).shape[0]) * self.page_size


@dataclass(frozen=True, kw_only=True)
class VerifyOrWriteContext:
    """Everything one write or verify launch reads and updates besides its plan (SPEC §4).

    ``canary_buf``: uint8 ``[num_slots, slot_stride_bytes]``, contiguous, stride >= 32 and a multiple of 8.
    ``kernel_kind``: a :class:`~kvcanary.consts.CanaryLaunchTag`. ``violation_ring``: int64
    ``[ring_capacity, 8]``; ``violation_write_index``: int32 ``[1]``; ``slot_run_counter``,
    ``kernel_run_counter``: int64 ``[1]``. ``real_kv_sources``: up to 4 :class:`RealKvSource`;
    ``real_kv_hash_mode``: :class:`~kvcanary.consts.RealKvHashMode`. ``enable_chain_position_assert``:
    int32 ``[1]`` device flag read by write (0 during warm-up and graph capture, 1 afterwards).
    """

    canary_buf: Any
    kernel_kind: int
    violation_ring: Any
    violation_write_index: Any
    slot_run_counter: Any
    kernel_run_counter: Any
    real_kv_sources: tuple = ()
    real_kv_hash_mode: int = RealKvHashMode.NONE
    enable_chain_position_assert: Any = None


@dataclass(frozen=True, kw_only=True)
class ViolationLog:
    """The violation ring and counters shared by every launch of one canary (SPEC §4).

    ``violation_ring``: int64 ``[ring_capacity, 8]``; ``violation_write_index``: int32 ``[1]`` (total
    violations ever appended, may exceed the capacity); ``slot_run_counter``, ``kernel_run_counter``:
    int64 ``[1]``.
    """

    violation_ring: Any
    violation_write_index: Any
    slot_run_counter: Any
    kernel_run_counter: Any

    @classmethod
    def allocate(cls, *, ring_capacity: int, device: Any = "cpu") -> ViolationLog:
        """Allocate a zeroed log with room for ``ring_capacity`` (> 0) rows on ``device``."""
        n = _positive("ViolationLog", "ring_capacity", ring_capacity)
        return cls(
            violation_ring=torch.zeros((n, consts.VIOLATION_FIELDS), dtype=torch.int64, device=device),
            violation_write_index=torch.zeros(1, dtype=torch.int32, device=device),
            slot_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
            kernel_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        )

    @staticmethod
    def allocation_bytes(ring_capacity: int) -> int:
        return ring_capacity * consts.VIOLATION_FIELDS * _INT64 + _INT32 + 2 * _INT64

    def context(
        self,
        *,
        canary_buf: Any,
        kernel_kind: int,
        real_kv_sources: tuple = (),
        real_kv_hash_mode: int = RealKvHashMode.NONE,
        enable_chain_position_assert: Any = None,
    ) -> VerifyOrWriteContext:
        """A launch context that appends to this log."""
        return VerifyOrWriteContext(
            canary_buf=canary_buf,
            kernel_kind=int(kernel_kind),
            violation_ring=self.violation_ring,
            violation_write_index=self.violation_write_index,
            slot_run_counter=self.slot_run_counter,
            kernel_run_counter=self.kernel_run_counter,
            real_kv_sources=tuple(real_kv_sources),
            real_kv_hash_mode=int(real_kv_hash_mode),
            enable_chain_position_assert=enable_chain_position_assert,
        )


def allocate_canary_buffer(num_slots: int, *, slot_stride_bytes: int = consts.CANARY_SLOT_BYTES,
                           device: Any = "cpu") -> torch.Tensor:
    """A zeroed canary buffer, uint8 ``[num_slots, slot_stride_bytes]``."""
    _positive("canary buffer", "num_slots", num_slots)
    _positive("canary buffer", "slot_stride_bytes", slot_stride_bytes)
    if slot_stride_bytes < consts.CANARY_SLOT_BYTES or slot_stride_bytes % 8:
        raise invalid(f"slot_stride_bytes must be a multiple of 8 and >= 32, got {slot_stride_bytes}")
    return torch.zeros((num_slots, slot_stride_bytes), dtype=torch.uint8, device=device)


def allocate_chain_position_flag(value: int = 1, *, device: Any = "cpu") -> torch.Tensor:
    """The int32 ``[1]`` ``enable_chain_position_assert`` flag."""
    return torch.full((1,), int(value), dtype=torch.int32, device=device)
