"""Write (SPEC §6) on CUDA: launches ``kvc_write`` of ``kernels_cu/write.cu``.

CPU twin: :mod:`kvcanary.ops.reference.write`. Short requests are written by one warp each, longer ones by
one block each (a chain walker plus workers, see ``kernels_cu/write_core.cuh``); the grid is fixed by the
request capacity and the SM count, and the kernel reads ``write_num_valid_reqs`` on the device. Up to four
real-KV sources, by value (SGLang's limit; more are refused).
"""

from __future__ import annotations

from typing import Any

from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda.grids import sm_count, write_grid
from kvcanary.ops.cuda.launch import folds_real_kv, launch, resolve_stream, sglang_context_words, token_words
from kvcanary.ops.cuda.loader import function
from kvcanary.ops.launches import WriteLaunch


def write(launch_rec: WriteLaunch, stream: Any = None) -> None:
    """Stamp the canary records of ``launch_rec`` on its CUDA device, on ``stream``."""
    rec = launch_rec
    dev = rec.device.index
    ctx_rkv = sglang_context_words(rec.ctx)  # refuses more than four sources
    s = resolve_stream(stream, rec.device)
    words = P.WRITE.pack(
        ctx=ctx_rkv[:P.CONTEXT.words], rkv=ctx_rkv[P.CONTEXT.words:],
        tokens=token_words(input_ids=rec.input_ids, positions=rec.positions, out_cache_loc=rec.out_cache_loc,
                           expected_input_tokens=rec.expected_input_tokens,
                           expected_input_positions=rec.expected_input_positions),
        write_offsets=rec.plan.offsets.ptr, seed_slot_indices=rec.plan.seed_slot_indices.ptr,
        num_valid_reqs=rec.plan.num_valid_reqs.ptr, write_req_capacity=rec.plan.capacity)
    g = write_grid(rec.plan.capacity, sm_count(dev))
    launch(function(dev, "write", "kvc_write", rec.input_assert, folds_real_kv(rec.ctx)), g.blocks, g.threads, words,
           dev, s)
