"""Plan-free verify (SPEC §11) on the CPU: §5's verify entries straight from the table, then §7 per context.

The entries are :func:`kvcanary.ops.reference.plan.verify_entries` (the plan's own code, without a capacity)
and each context runs :func:`kvcanary.ops.reference.verify.check_entries` (the verify's own code), so the
rows are those of plan -> verify with an unlimited capacity, in the same order. Per context:
``kernel_run_counter += 1`` and ``slot_run_counter +=`` the number of entries (slot-0 entries included),
contexts in order. ``invalid_rows`` (when given) is set to the number of invalid rows (see
:mod:`kvcanary.ops.reference.table`), and ``invalid_rows_total`` (kvcanary's runtime only) gets it added.
"""

from __future__ import annotations

from kvcanary.ops.launches import VerifyTableLaunch
from kvcanary.ops.reference.log import add_counter
from kvcanary.ops.reference.plan import verify_entries
from kvcanary.ops.reference.verify import check_entries


def verify_from_table(launch: VerifyTableLaunch) -> None:
    """Verify straight from the table (SPEC §11): §7's checks on the entries §5 would plan, for every context of
    ``launch``; the CUDA twin is ``kernels_cu/verify_table.cu``."""
    e = verify_entries(launch)
    for ctx in launch.contexts:
        add_counter(ctx.kernel_run_counter, 1)
        add_counter(ctx.slot_run_counter, e.total)
        check_entries(ctx, slots=e.slots, prev=e.prev, expected_tokens=e.expected_tokens, positions=e.positions,
                      check_token=launch.check_expected_token)
    if launch.invalid_rows is not None:
        launch.invalid_rows.host()[0] = e.rows.num_invalid
    if launch.invalid_rows_total is not None:
        launch.invalid_rows_total.host()[0] += e.rows.num_invalid
