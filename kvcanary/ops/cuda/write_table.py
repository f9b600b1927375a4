"""Plan-free write (SPEC §12) on CUDA: launches ``kvc_write_from_table`` of ``kernels_cu/write_table.cu``.

CPU twin: :mod:`kvcanary.ops.reference.write_table`. One launch serves up to ``params.MAX_CONTEXTS`` contexts
(each with its own chain); a longer tuple is split into several launches. The grid is fixed by the SM count,
the batch is read on the device: no host sync, no allocation (once the contexts' real-KV descriptor tables
exist: see :mod:`kvcanary.ops.cuda.launch`), capturable in a CUDA graph.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda.grids import sm_count, write_table_grid
from kvcanary.ops.cuda.launch import (
    batch_words,
    contexts_words,
    folds_real_kv,
    launch,
    resolve_stream,
    table_words,
    token_words,
)
from kvcanary.ops.cuda.loader import function
from kvcanary.ops.cuda.specs import contexts_spec
from kvcanary.ops.launches import WriteTableLaunch


def write_from_table(launch_rec: WriteTableLaunch, stream: Any = None) -> None:
    """Stamp the batch's new tokens (write metadata from the table) for each context of ``launch_rec``, on its
    CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device.index
    s = resolve_stream(stream, rec.device)
    head = {
        "table": table_words(rec.table, rec.lut),
        "batch": batch_words(req_pool_indices=rec.req_pool_indices, prefix_lens=rec.prefix_lens,
                             extend_seq_lens=rec.extend_seq_lens, pool=None, valid_lens=None,
                             invalid_rows=rec.invalid_rows, swa_window_size=0, token_offset=0),
        "tokens": token_words(input_ids=rec.input_ids, positions=rec.positions, out_cache_loc=rec.out_cache_loc,
                              expected_input_tokens=rec.expected_input_tokens,
                              expected_input_positions=rec.expected_input_positions),
    }
    groups = []
    for i in range(0, len(rec.contexts), P.MAX_CONTEXTS):
        group = rec.contexts[i:i + P.MAX_CONTEXTS]
        words = P.WRITE_TABLE.pack(**head, num_contexts=len(group), ctx=contexts_words(group, dev, s))
        groups.append((any(folds_real_kv(c) for c in group), contexts_spec(len(group)), words))
    g = write_table_grid(sm_count(dev))
    for has_real_kv, contexts, words in groups:
        launch(function(dev, "write_table", "kvc_write_from_table", rec.input_assert, has_real_kv, contexts),
               g.blocks, g.threads, words, dev, s)
