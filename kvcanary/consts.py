"""Constants, enums and scalar hashes of the canary format (SPEC §2, §3).

This module is the single Python definition of every value in SPEC §2. Its CUDA twin is
``kernels_cu/consts.cuh``; ``tests/test_consts_sync.py`` parses the header and checks that both agree.

The hashes here work on Python ints (any value; the result is the u64 bit pattern as a non-negative int).
Vectorized NumPy versions live in :mod:`kvcanary.ops.reference.hashing`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

U64_MASK = (1 << 64) - 1

CANARY_CHAIN_ANCHOR = 0xC0FFEE1234567890
REQ_POOL_IDX_PADDING = 0
TOKEN_TO_KV_SLOT_PADDING = 0
CANARY_FIELDS_PER_SLOT = 4
CANARY_SLOT_BYTES = 32
VIOLATION_FIELDS = 8
MAX_REAL_KV_SOURCES = 4
# Kernels load real KV 16 bytes at a time, so every real-KV size and stride is a multiple of this.
REAL_KV_LOAD_BYTES = 16

SPLITMIX64_MUL1 = 0xBF58476D1CE4E5B9
SPLITMIX64_MUL2 = 0x94D049BB133111EB

# Canary record fields (int64 each, at byte offset slot * slot_stride_bytes + 8 * field).
FIELD_TOKEN = 0
FIELD_POSITION = 1
FIELD_PREV_HASH = 2
FIELD_REAL_KV_HASH = 3

# Violation row fields (int64 each).
VFIELD_KERNEL_KIND = 0
VFIELD_SLOT_IDX = 1
VFIELD_POSITION = 2
VFIELD_STORED_TOKEN = 3
VFIELD_EXPECTED_TOKEN = 4
VFIELD_STORED_CHAIN_HASH = 5
VFIELD_EXPECTED_AUX = 6
VFIELD_FAIL_REASON = 7

# Value written by the plan's LUT translation T(x) for x >= the LUT length (SPEC §9, Bounds).
LUT_OUT_OF_RANGE_SLOT = -2
# "No slot" / "skip this check" sentinel used by plan and write.
NO_SLOT = -1


# The three parts of a launch tag's name, PHASE_KV_GROUP: when the launch runs (HEAD = before the model forward,
# TAIL = after it, SWEEP = a periodic check of cached-but-idle slots), which half of the KV pool, and which
# attention group (full attention or sliding window).
PHASES = ("head", "tail", "sweep")
KVS = ("k", "v")
GROUPS = ("full", "swa")


class CanaryLaunchTag(enum.IntEnum):
    """Which launch produced a violation row (violation field 0); the name is ``PHASE_KV_GROUP``.

    Build one from its parts with :meth:`of` and read them back with :attr:`phase`, :attr:`kv` and
    :attr:`group` (lower case, as in :data:`PHASES`, :data:`KVS`, :data:`GROUPS`).
    """

    HEAD_K_FULL = 0
    HEAD_V_FULL = 1
    TAIL_K_FULL = 2
    TAIL_V_FULL = 3
    SWEEP_K_FULL = 4
    SWEEP_V_FULL = 5
    HEAD_K_SWA = 6
    HEAD_V_SWA = 7
    TAIL_K_SWA = 8
    TAIL_V_SWA = 9
    SWEEP_K_SWA = 10
    SWEEP_V_SWA = 11

    @classmethod
    def of(cls, phase: str, kv: str, group: str) -> CanaryLaunchTag:
        """``CanaryLaunchTag.of("tail", "k", "swa") is CanaryLaunchTag.TAIL_K_SWA``; a ``ValueError`` naming
        the parts otherwise."""
        if phase not in PHASES or kv not in KVS or group not in GROUPS:
            raise ValueError(f"kv-canary: a launch tag needs phase in {PHASES}, kv in {KVS} and group in {GROUPS}, "
                             f"got phase={phase!r} kv={kv!r} group={group!r}")
        return cls[f"{phase}_{kv}_{group}".upper()]

    @property
    def phase(self) -> str:
        """``"head"``, ``"tail"`` or ``"sweep"``."""
        return self.name.split("_")[0].lower()

    @property
    def kv(self) -> str:
        """``"k"`` or ``"v"``."""
        return self.name.split("_")[1].lower()

    @property
    def group(self) -> str:
        """``"full"`` or ``"swa"``."""
        return self.name.split("_")[2].lower()

    @classmethod
    def select(cls, phases: Iterable[str] = PHASES, kvs: Iterable[str] = KVS,
               groups: Iterable[str] = GROUPS) -> tuple[CanaryLaunchTag, ...]:
        """Every tag whose parts are among the given ones, in tag order."""
        ps, ks, gs = set(phases), set(kvs), set(groups)
        return tuple(t for t in cls if t.phase in ps and t.kv in ks and t.group in gs)


class FailReason(enum.IntFlag):
    """Violation reason bits (violation field 7)."""

    VERIFY_CHAIN_HASH_MISMATCH = 1
    VERIFY_POSITION_MISMATCH = 2
    VERIFY_REAL_KV_HASH_MISMATCH = 4
    WRITE_TOKEN_MISMATCH = 8
    WRITE_POSITION_MISMATCH = 16
    VERIFY_TOKEN_MISMATCH = 32
    # kvcanary's own: a slot, prev slot or seed outside [0, num_slots) (SPEC §9, Bounds).
    SLOT_OUT_OF_RANGE = 64


class RealKvHashMode(enum.IntEnum):
    """How much of each slot's real KV bytes the fingerprint folds (SPEC §3.1)."""

    NONE = 0
    PARTIAL = 1
    ALL = 2


def splitmix64(x: int) -> int:
    """The splitmix64 finalizer on the u64 bit pattern of ``x``; returns a non-negative int < 2**64."""
    x &= U64_MASK
    x = ((x ^ (x >> 30)) * SPLITMIX64_MUL1) & U64_MASK
    x = ((x ^ (x >> 27)) * SPLITMIX64_MUL2) & U64_MASK
    return x ^ (x >> 31)


def splitmix64_mix3(a: int, b: int, c: int) -> int:
    """``mix3(a, b, c) = splitmix64(splitmix64(splitmix64(a) ^ b) ^ c)`` on u64 bit patterns."""
    return splitmix64(splitmix64(splitmix64(a) ^ (b & U64_MASK)) ^ (c & U64_MASK))


def to_int64(x: int) -> int:
    """Bit-cast a u64 value to the signed int64 stored in canary and violation buffers."""
    x &= U64_MASK
    return x - (1 << 64) if x >= (1 << 63) else x


def to_u64(x: int) -> int:
    """Bit-cast a signed int64 (or any int) to its u64 pattern."""
    return x & U64_MASK


# slot_hash(s) for s < 0: the hash every chain starts from.
ANCHOR_HASH = splitmix64(CANARY_CHAIN_ANCHOR)
