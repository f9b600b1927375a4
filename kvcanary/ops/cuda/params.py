"""The kernel parameter structs of ``kernels_cu/params.cuh``, one field list per struct, and their packing.

Every kernel takes one parameter struct by value. Every field is 8 bytes (a device pointer or an int64), so a
struct is a plain sequence of 8-byte words in field order with no padding: :meth:`Struct.pack` turns keyword
values into that word list (nested structs and fixed-size arrays are given as word sequences of the right
length), and :func:`kernel_arg` turns a word list into the argument CuPy passes by value. The NumPy dtype of
each struct (:attr:`Struct.dtype`, built with C alignment rules from the same field list) documents the layout;
``tests/ops/test_param_layout.py`` compiles ``params.cuh`` with the host compiler and checks ``sizeof`` and
``offsetof`` of every field against it, so the field order here and in C cannot drift apart.

Importing this module imports neither CuPy nor torch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

# Fields: "i64" (int64) or "ptr" (a device address, passed as a uint64 with the same bytes).
I64 = "i64"
PTR = "ptr"
WORD_BYTES = 8

# C: kvc::kMaxContexts, kvc::kSourceDescFields and the descriptor columns (kernels_cu/params.cuh).
MAX_CONTEXTS = 4
SOURCE_DESC_FIELDS = 6
SRC_PTR, SRC_PAGE_SIZE, SRC_BYTES_PER_TOKEN, SRC_ROW_STRIDE, SRC_FOLD_BYTES, SRC_NUM_ROWS = range(SOURCE_DESC_FIELDS)
MAX_BY_VALUE_SOURCES = 4  # KvcRealKv4: the SGLang-named kernels' sources (SPEC §2 MAX_REAL_KV_SOURCES)


@dataclass(frozen=True)
class Field:
    name: str
    kind: str | Struct
    count: int = 1

    @property
    def words(self) -> int:
        per = 1 if isinstance(self.kind, str) else self.kind.words
        return per * self.count


class Struct:
    """A C struct of 8-byte fields: ``name`` is the C type name, ``fields`` the members in declaration order.

    :meth:`pack` is generated from the field list (a function whose keyword-only parameters are the fields, in
    order, returning the flattened words), so binding values to fields costs one Python call and a wrong, missing
    or extra name is a ``TypeError``.
    """

    def __init__(self, name: str, fields: Sequence[Field]):
        self.name = name
        self.fields = tuple(fields)
        self.names = tuple(f.name for f in self.fields)
        self.words = sum(f.words for f in self.fields)
        parts = [f.name if isinstance(f.kind, str) and f.count == 1 else f"*{f.name}" for f in self.fields]
        checks = "".join(
            f"    if len({f.name}) != {f.words}: raise ValueError('kv-canary: {name}.{f.name} needs {f.words} words, "
            f"got ' + str(len({f.name})))\n"
            for f in self.fields if not (isinstance(f.kind, str) and f.count == 1))
        src = (f"def pack(*, {', '.join(self.names)}):\n{checks}    return [{', '.join(parts)}]\n")
        ns: dict[str, Any] = {}
        exec(compile(src, f"<kvcanary params {name}>", "exec"), ns)
        self.pack = ns["pack"]

    @property
    def nbytes(self) -> int:
        return self.words * WORD_BYTES

    @cached_property
    def dtype(self) -> np.dtype:
        """The NumPy structured dtype of this struct (C layout: ``align=True``)."""
        spec = []
        for f in self.fields:
            base = np.dtype(np.int64 if f.kind == I64 else np.uint64) if isinstance(f.kind, str) else f.kind.dtype
            spec.append((f.name, base, (f.count,)) if f.count > 1 else (f.name, base))
        return np.dtype(spec, align=True)

    def zeros(self) -> list[int]:
        return [0] * self.words


def _f(name: str, kind: str | Struct = I64, count: int = 1) -> Field:
    return Field(name, kind, count)


REAL_KV4 = Struct("KvcRealKv4", [
    _f("ptr", PTR, 4), _f("page_size", I64, 4), _f("bytes_per_token", I64, 4), _f("row_stride", I64, 4),
    _f("nbytes", I64, 4), _f("count"),
])

CONTEXT = Struct("KvcContextParams", [
    _f("canary", PTR), _f("ring", PTR), _f("write_index", PTR), _f("slot_run_counter", PTR),
    _f("kernel_run_counter", PTR), _f("chain_position_flag", PTR), _f("sources", PTR), _f("num_sources"),
    _f("num_slots"), _f("slot_limit"), _f("slot_stride"), _f("ring_capacity"), _f("tag"),
])

TABLE = Struct("KvcTableParams", [
    _f("table", PTR), _f("lut", PTR), _f("lut_len"), _f("max_reqs"), _f("cols"), _f("block_size"), _f("paged"),
    _f("max_seq_len"), _f("pad_row"),
])

BATCH = Struct("KvcBatchParams", [
    _f("req_pool_indices", PTR), _f("prefix_lens", PTR), _f("extend_seq_lens", PTR), _f("pool", PTR),
    _f("valid_lens", PTR), _f("invalid_rows", PTR), _f("bs"), _f("swa_window_size"), _f("pool_cols"),
    _f("token_offset"),
])

TOKENS = Struct("KvcTokenParams", [
    _f("input_ids", PTR), _f("positions", PTR), _f("out_cache_loc", PTR), _f("expected_input_tokens", PTR),
    _f("expected_input_positions", PTR), _f("num_tokens"),
])

PLAN = Struct("KvcPlanParams", [
    _f("table", TABLE), _f("batch", BATCH), _f("verify_slot_indices", PTR), _f("verify_expected_tokens", PTR),
    _f("verify_expected_positions", PTR), _f("verify_prev_slot_indices", PTR), _f("verify_num_valid", PTR),
    _f("verify_enable", PTR), _f("write_offsets", PTR), _f("write_seed_slot_indices", PTR),
    _f("write_num_valid_reqs", PTR), _f("verify_capacity"), _f("write_req_capacity"),
])

VERIFY = Struct("KvcVerifyParams", [
    _f("ctx", CONTEXT), _f("rkv", REAL_KV4), _f("slot_indices", PTR), _f("expected_tokens", PTR),
    _f("expected_positions", PTR), _f("prev_slot_indices", PTR), _f("num_valid", PTR), _f("enable", PTR),
    _f("capacity"),
])

WRITE = Struct("KvcWriteParams", [
    _f("ctx", CONTEXT), _f("rkv", REAL_KV4), _f("tokens", TOKENS), _f("write_offsets", PTR),
    _f("seed_slot_indices", PTR), _f("num_valid_reqs", PTR), _f("write_req_capacity"),
])

SCATTER = Struct("KvcScatterParams", [
    _f("flat_in", PTR), _f("offsets", PTR), _f("req_pool_indices", PTR), _f("pool_out", PTR), _f("n_flat"), _f("bs"),
    _f("max_reqs"), _f("cols"),
])

VERIFY_TABLE = Struct("KvcVerifyTableParams", [
    _f("table", TABLE), _f("batch", BATCH), _f("num_contexts"), _f("invalid_rows_total", PTR),
    _f("ctx", CONTEXT, MAX_CONTEXTS),
])

WRITE_TABLE = Struct("KvcWriteTableParams", [
    _f("table", TABLE), _f("batch", BATCH), _f("tokens", TOKENS), _f("num_contexts"),
    _f("ctx", CONTEXT, MAX_CONTEXTS),
])

RECORDS = Struct("KvcRecordsParams", [
    _f("src", PTR), _f("dst", PTR), _f("src_slots", PTR), _f("dst_slots", PTR), _f("records_in", PTR),
    _f("records_out", PTR), _f("out_of_range", PTR), _f("n"), _f("src_num_slots"), _f("src_stride"),
    _f("dst_num_slots"), _f("dst_stride"),
])

# Every struct of params.cuh (the layout test walks these).
ALL_STRUCTS: tuple[Struct, ...] = (REAL_KV4, CONTEXT, TABLE, BATCH, TOKENS, PLAN, VERIFY, WRITE, SCATTER, VERIFY_TABLE,
                                   WRITE_TABLE, RECORDS)


# ----------------------------------------------------------------------------------------------------------
# Kernel arguments

_formats: dict[int, tuple[struct.Struct, np.dtype]] = {}


def kernel_arg(words: Sequence[int]) -> np.ndarray:
    """The argument CuPy passes by value for a struct of ``words``: a size-one NumPy array of the struct's raw
    bytes (CuPy hands cuLaunchKernel the array's data pointer with a size-one array, its documented way of passing
    a user struct; CUDA copies the bytes when the launch is enqueued). A raw-bytes dtype keeps CuPy's
    ``__array_interface__`` cheap (a structured dtype would make CuPy describe every field)."""
    n = len(words)
    f = _formats.get(n)
    if f is None:
        f = _formats[n] = (struct.Struct(f"<{n}q"), np.dtype((np.void, n * WORD_BYTES)))
    return np.frombuffer(f[0].pack(*words), dtype=f[1])
