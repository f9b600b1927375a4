"""Plan-free verify (SPEC §11) on CUDA: launches ``kvc_verify_from_table`` of ``kernels_cu/verify_table.cu``.

CPU twin: :mod:`kvcanary.ops.reference.verify_table`. One launch serves up to ``params.MAX_CONTEXTS`` contexts
(the table is walked once for all of them); a longer tuple is split into several launches. The grid is fixed
by the SM count, the batch is read on the device: no host sync, no allocation (once the contexts' real-KV
descriptor tables exist: see :mod:`kvcanary.ops.cuda.launch`), capturable in a CUDA graph. A launch takes the
kernel's 32-bit modules where :func:`flat32_fits` says so (only while ``specs.FLAT32`` is on).
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda import specs
from kvcanary.ops.cuda.grids import Grid, sm_count, verify_table_grid
from kvcanary.ops.cuda.launch import (
    batch_words,
    contexts_words,
    folds_real_kv,
    launch,
    ptr,
    resolve_stream,
    table_words,
)
from kvcanary.ops.cuda.loader import function
from kvcanary.ops.cuda.specs import contexts_spec, int_define
from kvcanary.ops.launches import ContextViews, TableViews, VerifyTableLaunch


def flat32_fits(table: TableViews, contexts: tuple[ContextViews, ...], grid: Grid) -> bool:
    """Whether a launch over ``table`` for ``contexts`` on ``grid`` takes the 32-bit modules: ``specs.FLAT32`` is set,
    the table is per-position with rows of at most ``KVC_VT_FLAT32_MAX_SEQ_LEN`` positions, every context's slots
    and record stride are at most ``KVC_VT_FLAT32_MAX_SLOTS`` and its records 16-byte aligned (buffer address and
    stride), and the grid has fewer than 2**24 threads (what ``kernels_cu/verify_table.cu`` relies on there)."""
    if not specs.FLAT32 or table.paged:
        return False
    most = int_define("verify_table.cu", "KVC_VT_FLAT32_MAX_SLOTS")
    return (table.array.shape[1] <= int_define("verify_table.cu", "KVC_VT_FLAT32_MAX_SEQ_LEN")
            and all(c.num_slots <= most and c.slot_stride_bytes <= most
                    and (c.canary_buf.ptr | c.slot_stride_bytes) % 16 == 0 for c in contexts)
            and grid.blocks * grid.threads < 2**24)


def verify_from_table(launch_rec: VerifyTableLaunch, stream: Any = None) -> None:
    """Verify every active row's prefix (its window with SWA) straight from the table, for each context of
    ``launch_rec``, on its CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device.index
    s = resolve_stream(stream, rec.device)
    has_lut = rec.lut is not None
    check = rec.check_expected_token and rec.expected_tokens_pool is not None
    head = {
        "table": table_words(rec.table, rec.lut),
        "batch": batch_words(req_pool_indices=rec.req_pool_indices, prefix_lens=rec.prefix_lens, extend_seq_lens=None,
                             pool=rec.expected_tokens_pool, valid_lens=rec.expected_tokens_valid_lens,
                             invalid_rows=rec.invalid_rows, swa_window_size=rec.swa_window_size,
                             token_offset=rec.token_offset),
    }
    # Every group's words first: a missing real-KV table inside a capture raises before anything is enqueued.
    groups = []
    for i in range(0, len(rec.contexts), P.MAX_CONTEXTS):
        group = rec.contexts[i:i + P.MAX_CONTEXTS]
        # The running invalid-row count is added once, by the first launch.
        total = ptr(rec.invalid_rows_total) if i == 0 else 0
        words = P.VERIFY_TABLE.pack(**head, num_contexts=len(group), invalid_rows_total=total,
                                    ctx=contexts_words(group, dev, s))
        groups.append((group, any(folds_real_kv(c) for c in group), contexts_spec(len(group)), words))
    sms = sm_count(dev)
    for group, has_real_kv, contexts, words in groups:
        g = verify_table_grid(has_real_kv, sms)
        flat32 = flat32_fits(rec.table, group, g)
        launch(function(dev, "verify_table", "kvc_verify_from_table", has_lut, check, has_real_kv, contexts, flat32),
               g.blocks, g.threads, words, dev, s)
