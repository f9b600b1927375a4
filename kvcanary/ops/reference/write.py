"""Write (SPEC §6) on the CPU: serial along each request's chain, requests in order.

:func:`write_requests` is the §6 loop over the requests of one context; :func:`write` runs it on a plan and
``write_table`` on the write metadata it computes from the table (SPEC §12).

Decisions for the bounds rule (SPEC §9), shared with ``kernels_cu/write.cu``:

* a token whose ``out_cache_loc >= num_slots`` gets the row
  ``(tag, slot, pos, tok, -1, running, -1, SLOT_OUT_OF_RANGE)`` and is skipped like a ``-1`` slot (it does
  not advance the chain, is not counted and is not position-checked);
* when the launch folds real KV (mode != NONE and at least one source), a token whose slot a source does not
  cover (``slot // page_size >= num_rows`` for any source) is treated exactly like a token with
  ``out_cache_loc >= num_slots`` (see :mod:`kvcanary.ops.reference.realkv`);
* a request whose seed is ``>= num_slots`` gets ``(tag, seed, -1, -1, -1, 0, -1, SLOT_OUT_OF_RANGE)`` and
  none of its tokens are stamped;
* a request whose token range ``[write_offsets[r], write_offsets[r+1])`` is non-empty and not inside
  ``[0, num_tokens)`` gets ``(tag, -1, start, -1, -1, 0, end, SLOT_OUT_OF_RANGE)`` and is skipped (checked
  before the seed, so such a request yields exactly one row).
"""

from __future__ import annotations

import numpy as np

from kvcanary import consts
from kvcanary.consts import ANCHOR_HASH, FailReason, splitmix64_mix3, to_int64
from kvcanary.ops.interop import ArrayView
from kvcanary.ops.launches import ContextViews, WriteLaunch
from kvcanary.ops.reference.hashing import records
from kvcanary.ops.reference.log import add_counter, append_rows
from kvcanary.ops.reference.realkv import covered_slots, fingerprint

_OOR = int(FailReason.SLOT_OUT_OF_RANGE)


def write(launch: WriteLaunch) -> None:
    """Stamp the records of ``launch``'s write plan (SPEC §6): records, counters and violation rows in place; the
    CUDA twin is ``kernels_cu/write.cu``."""
    ctx, plan = launch.ctx, launch.plan
    add_counter(ctx.kernel_run_counter, 1)
    n_req = max(0, min(int(plan.num_valid_reqs.host()[0]), plan.capacity))
    write_requests(ctx, offsets=plan.offsets.host(), seeds=plan.seed_slot_indices.host(), n_req=n_req,
                   input_ids=launch.input_ids.host(), positions=launch.positions.host(),
                   out_cache_loc=launch.out_cache_loc.host(),
                   expected_input_tokens=_host(launch.expected_input_tokens),
                   expected_input_positions=_host(launch.expected_input_positions))


def _host(v: ArrayView | None) -> np.ndarray | None:
    return v.host() if v is not None else None


def write_requests(ctx: ContextViews, *, offsets: np.ndarray, seeds: np.ndarray, n_req: int, input_ids: np.ndarray,
                   positions: np.ndarray, out_cache_loc: np.ndarray, expected_input_tokens: np.ndarray | None,
                   expected_input_positions: np.ndarray | None) -> None:
    """SPEC §6 for requests ``[0, n_req)`` (request ``r``: tokens ``[offsets[r], offsets[r+1])``, seed
    ``seeds[r]``); adds the stamped slots to ``slot_run_counter`` (``kernel_run_counter`` is the caller's)."""
    tag = ctx.kernel_kind
    num_slots = ctx.num_slots
    limit = covered_slots(ctx)
    ids, pos, loc = input_ids, positions, out_cache_loc
    exp_tok, exp_pos = expected_input_tokens, expected_input_positions
    n_tokens = len(ids)
    flag = ctx.chain_position_flag
    position_assert = flag is not None and int(flag.host()[0]) != 0
    recs = records(ctx.canary_buf.host())

    # The fingerprint reads real KV only (never the chain), so compute it for every touchable slot first.
    in_range = (loc >= 0) & (loc < limit)
    rkv = np.zeros(n_tokens, np.uint64)
    rkv[in_range] = fingerprint(ctx.real_kv_sources, ctx.real_kv_hash_mode, loc[in_range])
    rkv = rkv.view(np.int64)

    rows: list[tuple[int, ...]] = []
    stamped = 0
    for r in range(n_req):
        start, end = int(offsets[r]), int(offsets[r + 1])
        if end > start and (start < 0 or end > n_tokens):
            rows.append((tag, -1, start, -1, -1, 0, end, _OOR))
            continue
        seed = int(seeds[r])
        if seed >= num_slots:
            rows.append((tag, seed, -1, -1, -1, 0, -1, _OOR))
            continue
        if seed < 0:
            running = ANCHOR_HASH
        else:
            s_tok, s_pos, s_hash = (int(v) for v in recs[seed, : consts.FIELD_REAL_KV_HASH])
            running = splitmix64_mix3(s_hash, s_tok, s_pos)
        check_pos = seed >= 0 and position_assert
        last_pos = int(recs[seed, consts.FIELD_POSITION]) if check_pos else 0
        for i in range(start, end):
            slot = int(loc[i])
            if slot < 0:
                continue
            tok, p = int(ids[i]), int(pos[i])
            if slot >= limit:
                rows.append((tag, slot, p, tok, -1, to_int64(running), -1, _OOR))
                continue
            if exp_tok is not None and exp_pos is not None:
                et, ep = int(exp_tok[i]), int(exp_pos[i])
                bits = (FailReason.WRITE_TOKEN_MISMATCH if tok != et else 0) | (
                    FailReason.WRITE_POSITION_MISMATCH if p != ep else 0)
                if bits:
                    rows.append((tag, slot, p, tok, et, to_int64(running), ep, int(bits)))
            if check_pos:
                want = to_int64(last_pos + 1)
                if p != want:
                    rows.append((tag, slot, p, tok, tok, to_int64(running), want,
                                 int(FailReason.WRITE_POSITION_MISMATCH)))
                last_pos = p
            recs[slot, : consts.CANARY_FIELDS_PER_SLOT] = (tok, p, to_int64(running), int(rkv[i]))
            running = splitmix64_mix3(running, tok, p)
            stamped += 1
    add_counter(ctx.slot_run_counter, stamped)
    append_rows(ctx, np.array(rows, dtype=np.int64).reshape(-1, consts.VIOLATION_FIELDS))
