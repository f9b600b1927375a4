"""Verify (SPEC §7) on CUDA: launches ``kvc_verify`` of ``kernels_cu/verify.cu``.

CPU twin: :mod:`kvcanary.ops.reference.verify`. A persistent grid fixed by the plan capacity and the SM
count; ``enable`` and ``verify_num_valid`` are read on the device. Up to four real-KV sources by value
(SGLang's limit, which the SGLang-named op enforces); more, from kvcanary's own callers, through the context's
device descriptor table.
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda.grids import sm_count, verify_grid
from kvcanary.ops.cuda.launch import (
    folds_real_kv,
    launch,
    launch_prepared,
    prepare_launch,
    prepared_launch,
    resolve_stream,
    sglang_context_words,
    table_context_words,
)
from kvcanary.ops.cuda.loader import function
from kvcanary.ops.launches import VerifyLaunch


def verify(launch_rec: VerifyLaunch, stream: Any = None) -> None:
    """Check the records named by ``launch_rec``'s plan on its CUDA device, on ``stream``.

    A record validation keeps (``rec.kept``: the same context and plan, nothing under them changed) relaunches the
    words packed the first time; with more than four sources (a device descriptor table) the words are built
    anew."""
    rec = launch_rec
    dev = rec.device.index
    s = resolve_stream(stream, rec.device)
    key = ("verify", id(rec), dev)
    hit = prepared_launch(key, (rec,))
    if hit is not None:
        fn, g, buf = hit
        launch_prepared(fn, g.blocks, g.threads, buf, dev, s)
        return
    by_value = len(rec.ctx.real_kv_sources) <= P.MAX_BY_VALUE_SOURCES
    if by_value:
        ctx_rkv = sglang_context_words(rec.ctx)
    else:
        # More than four sources reach here only from kvcanary's own callers (the canary object's sweep; the
        # SGLang-named op refuses them in validation): the kernel folds them through the descriptor table.
        ctx_rkv = (*table_context_words(rec.ctx, dev, s), *P.REAL_KV4.pack(
            ptr=[0] * 4, page_size=[0] * 4, bytes_per_token=[0] * 4, row_stride=[0] * 4, nbytes=[0] * 4, count=0))
    has_real_kv = folds_real_kv(rec.ctx)
    p = rec.plan
    words = P.VERIFY.pack(
        ctx=ctx_rkv[:P.CONTEXT.words], rkv=ctx_rkv[P.CONTEXT.words:], slot_indices=p.slot_indices.ptr,
        expected_tokens=p.expected_tokens.ptr, expected_positions=p.expected_positions.ptr,
        prev_slot_indices=p.prev_slot_indices.ptr, num_valid=p.num_valid.ptr, enable=p.enable.ptr,
        capacity=p.capacity)
    g = verify_grid(p.capacity, has_real_kv, sm_count(dev))
    fn = function(dev, "verify", "kvc_verify", rec.check_expected_token, has_real_kv)
    if by_value and rec.kept:  # a record made anew every call would only be held alive by an entry
        launch_prepared(fn, g.blocks, g.threads, prepare_launch(key, (rec,), fn, g, words), dev, s)
    else:
        launch(fn, g.blocks, g.threads, words, dev, s)
