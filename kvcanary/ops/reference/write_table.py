"""Plan-free write (SPEC §12) on the CPU: §5's write metadata straight from the table, then §6 per context.

The metadata is :func:`kvcanary.ops.reference.plan.write_meta` (the plan's own code): request ``r``'s tokens
are ``[sum of write_len of rows < r, + write_len[r])`` of the flattened token arrays (invalid and padding rows
have ``write_len`` 0 and consume no tokens), its seed is §5's. Each context then runs
:func:`kvcanary.ops.reference.write.write_requests` (the write's own loop) over all ``bs`` rows, contexts in
order: ``kernel_run_counter += 1``, ``slot_run_counter +=`` its stamped slots. Each context has its own
canary buffer (validation refuses overlapping ones), so each keeps its own chains. ``invalid_rows`` (when
given) is set to the number of invalid rows.
"""

from __future__ import annotations

import numpy as np

from kvcanary.ops.launches import WriteTableLaunch
from kvcanary.ops.reference.log import add_counter
from kvcanary.ops.reference.plan import write_meta
from kvcanary.ops.reference.write import write_requests


def write_from_table(launch: WriteTableLaunch) -> None:
    """Write straight from the table (SPEC §12): §6 on the metadata §5 would plan, for every context of
    ``launch``; the CUDA twin is ``kernels_cu/write_table.cu``."""
    write_len, seeds, rows = write_meta(launch)
    offsets = np.zeros(launch.bs + 1, np.int64)
    np.cumsum(write_len, out=offsets[1:])
    exp_tok = launch.expected_input_tokens.host() if launch.expected_input_tokens is not None else None
    exp_pos = launch.expected_input_positions.host() if launch.expected_input_positions is not None else None
    for ctx in launch.contexts:
        add_counter(ctx.kernel_run_counter, 1)
        write_requests(ctx, offsets=offsets, seeds=seeds, n_req=launch.bs, input_ids=launch.input_ids.host(),
                       positions=launch.positions.host(), out_cache_loc=launch.out_cache_loc.host(),
                       expected_input_tokens=exp_tok, expected_input_positions=exp_pos)
    if launch.invalid_rows is not None:
        launch.invalid_rows.host()[0] = rows.num_invalid
