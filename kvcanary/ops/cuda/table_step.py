"""A canary step's plan-free launches on CUDA with their arguments packed once: the hot path of ``KVCanary.step``.

CPU twin: :class:`kvcanary.ops.table_step.RecordTableStep` (the CPU backend's: it builds the launch records of
SPEC §11 and §12 and runs the reference). Both take the same per-call arguments, already validated by the caller (``KVCanary``
checks every batch array on every call; the contexts were validated once, when the canary was built or its
buffers changed).

What is done once, when a canary prepares a (phase, group): the contexts' words (canary buffer, log, counters,
tag, real-KV descriptor table) are packed into the tail of a reusable argument buffer per kernel, and the grids
are computed. Per call: the table, batch (and token) words are packed into the head of that buffer with one
``struct.pack_into``, the kernel of the call's specialization is looked up in a small dict, and
``cuLaunchKernel`` is called (:func:`kvcanary.ops.cuda.launch.launch_prepared`). The result is byte for byte the
launch of :func:`kvcanary.ops.cuda.verify_table.verify_from_table` / :func:`~kvcanary.ops.cuda.write_table.
write_from_table` with the same arguments (the kernels are the same; a GPU test holds the two paths against each
other). A step object belongs to one canary, which is driven from one thread.
"""

from __future__ import annotations

import struct
from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda.grids import sm_count, verify_table_grid, write_table_grid
from kvcanary.ops.cuda.launch import (
    ArgBuffer,
    _RawStream,
    contexts_words,
    folds_real_kv,
    launch_prepared,
    resolve_stream,
    table_words,
)
from kvcanary.ops.cuda.loader import function
from kvcanary.ops.cuda.specs import contexts_spec
from kvcanary.ops.cuda.verify_table import flat32_fits
from kvcanary.ops.interop import ArrayView, Device
from kvcanary.ops.launches import ContextViews, TableViews

# Words before the contexts: table (9) + batch (10) + num_contexts + invalid_rows_total (verify); table + batch +
# tokens (6) + num_contexts (write). The layout test pins the struct layouts these offsets rely on.
_VERIFY_HEAD = P.TABLE.words + P.BATCH.words + 2
_WRITE_HEAD = P.TABLE.words + P.BATCH.words + P.TOKENS.words + 1
_VERIFY_PACK = struct.Struct(f"<{_VERIFY_HEAD}q")
_WRITE_PACK = struct.Struct(f"<{_WRITE_HEAD}q")
assert P.VERIFY_TABLE.words == _VERIFY_HEAD + P.CONTEXT.words * P.MAX_CONTEXTS
assert P.WRITE_TABLE.words == _WRITE_HEAD + P.CONTEXT.words * P.MAX_CONTEXTS


class CudaTableStep:
    """The verify-from-table and write-from-table launches of one (phase, group) of a canary.

    Args:
        device: the contexts' CUDA device.
        verify_contexts, write_contexts: validated contexts (1 .. ``params.MAX_CONTEXTS`` each; a canary has one
            per K/V half), sharing the table.
        stream: the stream the first launches go to (checked for a CUDA-graph capture when a real-KV descriptor
            table must be built).
    """

    def __init__(self, *, device: Device, verify_contexts: tuple[ContextViews, ...],
                 write_contexts: tuple[ContextViews, ...], stream: Any = None):
        if not (1 <= len(verify_contexts) <= P.MAX_CONTEXTS and 1 <= len(write_contexts) <= P.MAX_CONTEXTS):
            raise ValueError(f"kv-canary: a prepared step takes 1 to {P.MAX_CONTEXTS} contexts per kernel")
        self.device = device
        self.verify_contexts, self.write_contexts = verify_contexts, write_contexts
        dev = device.index
        s = resolve_stream(stream, device)
        sms = sm_count(dev)
        self._v_real_kv = any(folds_real_kv(c) for c in verify_contexts)
        self._w_real_kv = any(folds_real_kv(c) for c in write_contexts)
        # The modules compiled for this many contexts.
        self._v_contexts = contexts_spec(len(verify_contexts))
        self._w_contexts = contexts_spec(len(write_contexts))
        self._v_grid = verify_table_grid(self._v_real_kv, sms)
        self._w_grid = write_table_grid(sms)
        self._v_buf = ArgBuffer(P.VERIFY_TABLE.words)
        self._w_buf = ArgBuffer(P.WRITE_TABLE.words)
        # The contexts' words, packed once into the tail of each buffer.
        v_ctx = contexts_words(verify_contexts, dev, s)
        w_ctx = contexts_words(write_contexts, dev, s)
        struct.pack_into(f"<{len(v_ctx)}q", self._v_buf.words, _VERIFY_HEAD * P.WORD_BYTES, *v_ctx)
        struct.pack_into(f"<{len(w_ctx)}q", self._w_buf.words, _WRITE_HEAD * P.WORD_BYTES, *w_ctx)
        self._v_fns: dict[tuple[bool, bool, bool], Any] = {}
        self._w_fns: dict[bool, Any] = {}
        self._table_key: tuple[Any, Any] | None = None
        self._table_words: tuple[int, ...] = ()
        self._flat32 = False  # the verify of the current table takes the 32-bit modules

    def _table(self, table: TableViews, lut: ArrayView | None) -> tuple[int, ...]:
        if self._table_key is None or self._table_key[0] is not table or self._table_key[1] is not lut:
            self._table_words = tuple(table_words(table, lut))
            self._flat32 = flat32_fits(table, self.verify_contexts, self._v_grid)
            self._table_key = (table, lut)
        return self._table_words

    def _stream(self, stream: Any) -> _RawStream:
        return stream if type(stream) is _RawStream else resolve_stream(stream, self.device)

    def verify(self, *, table: TableViews, lut: ArrayView | None, req_pool_indices: Any, prefix_lens: Any,
               swa_window_size: int, expected_tokens_pool: Any, expected_tokens_valid_lens: Any, token_offset: int,
               check_expected_token: bool, invalid_rows_total: ArrayView | None, stream: Any = None) -> None:
        """``launch_canary_verify_from_table`` of the prepared contexts (SPEC §11); ``invalid_rows_total`` gets the
        invalid-row count added. Batch arrays: as :class:`~kvcanary.ops.table_step.TableStep` takes them."""
        pool = expected_tokens_pool
        check = check_expected_token and pool is not None
        table_w = self._table(table, lut)
        key = (lut is not None, check, self._flat32)
        fn = self._v_fns.get(key)
        dev = self.device.index
        if fn is None:
            fn = self._v_fns[key] = function(dev, "verify_table", "kvc_verify_from_table", key[0], key[1],
                                             self._v_real_kv, self._v_contexts, key[2])
        buf = self._v_buf
        _VERIFY_PACK.pack_into(
            buf.words, 0, *table_w,
            req_pool_indices.data_ptr(), prefix_lens.data_ptr(), 0, _addr(pool), _addr(expected_tokens_valid_lens), 0,
            req_pool_indices.shape[0], swa_window_size, pool.shape[1] if pool is not None else 0, token_offset,
            len(self.verify_contexts), _addr(invalid_rows_total))
        launch_prepared(fn, self._v_grid.blocks, self._v_grid.threads, buf, dev, self._stream(stream))

    def write(self, *, table: TableViews, lut: ArrayView | None, req_pool_indices: Any, prefix_lens: Any,
              extend_seq_lens: Any, input_ids: Any, positions: Any, out_cache_loc: Any, expected_input_tokens: Any,
              expected_input_positions: Any, stream: Any = None) -> None:
        """``launch_canary_write_from_table`` of the prepared contexts (SPEC §12); the input assert is on when the
        expected inputs are given."""
        assert_on = expected_input_tokens is not None
        fn = self._w_fns.get(assert_on)
        dev = self.device.index
        if fn is None:
            fn = self._w_fns[assert_on] = function(dev, "write_table", "kvc_write_from_table", assert_on,
                                                   self._w_real_kv, self._w_contexts)
        buf = self._w_buf
        _WRITE_PACK.pack_into(
            buf.words, 0, *self._table(table, lut),
            req_pool_indices.data_ptr(), prefix_lens.data_ptr(), extend_seq_lens.data_ptr(), 0, 0, 0,
            req_pool_indices.shape[0], 0, 0, 0,
            input_ids.data_ptr(), positions.data_ptr(), out_cache_loc.data_ptr(), _addr(expected_input_tokens),
            _addr(expected_input_positions), input_ids.shape[0],
            len(self.write_contexts))
        launch_prepared(fn, self._w_grid.blocks, self._w_grid.threads, buf, dev, self._stream(stream))


def _addr(a: Any) -> int:
    """The device address of a checked array (a torch tensor or an ArrayView), 0 for an absent one."""
    return 0 if a is None else a.data_ptr()
