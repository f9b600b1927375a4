"""Plan-free verify (SPEC §11) on CUDA: launches ``kvc_verify_from_table`` of ``kernels_cu/verify_table.cu``.

CPU twin: :mod:`kvcanary.ops.reference.verify_table`. One launch serves up to ``params.MAX_CONTEXTS`` contexts
(the table is walked once for all of them); a longer tuple is split into several launches. The grid is fixed
by the SM count, the batch is read on the device: no host sync, no allocation (once the contexts' real-KV
descriptor tables exist: see :mod:`kvcanary.ops.cuda.launch`), capturable in a CUDA graph.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda.grids import sm_count, verify_table_grid
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
from kvcanary.ops.cuda.specs import contexts_spec
from kvcanary.ops.launches import VerifyTableLaunch


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
        groups.append((any(folds_real_kv(c) for c in group), contexts_spec(len(group)), words))
    sms = sm_count(dev)
    for has_real_kv, contexts, words in groups:
        g = verify_table_grid(has_real_kv, sms)
        launch(function(dev, "verify_table", "kvc_verify_from_table", has_lut, check, has_real_kv, contexts),
               g.blocks, g.threads, words, dev, s)
