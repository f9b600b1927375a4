"""Verify (SPEC §7) on the CPU, vectorized over entries.

:func:`check_entries` is the §7 check of a list of entries for one context; :func:`verify` runs it on a plan
and ``verify_table`` on the entries it computes from the table (SPEC §11).

Decisions for the bounds rule (SPEC §9), shared with ``kernels_cu/verify.cu``:

* an entry whose slot is outside ``[0, num_slots)`` or whose prev is ``>= num_slots`` yields one row
  ``(tag, slot, expected_position, -1, expected_token_or_-1, 0, prev, SLOT_OUT_OF_RANGE)``: the record
  is not read, so the stored fields are -1/0 and ``expected_aux`` carries the prev slot;
* when the launch folds real KV (mode != NONE and at least one source), an entry whose slot a source does not
  cover (``slot // page_size >= num_rows`` for any source) is treated exactly like an out-of-range slot:
  the same one row, no record read, no other check (see :mod:`kvcanary.ops.reference.realkv`).

Slot-0 entries are skipped before any of this (and still counted in ``slot_run_counter``).
"""

from __future__ import annotations

import numpy as np

from kvcanary import consts
from kvcanary.consts import FailReason
from kvcanary.ops.launches import ContextViews, VerifyLaunch
from kvcanary.ops.reference.hashing import records, slot_hash, u64
from kvcanary.ops.reference.log import add_counter, append_rows, rows_in_entry_order
from kvcanary.ops.reference.realkv import covered_slots, fingerprint


def verify(launch: VerifyLaunch) -> None:
    """Check the records named by ``launch``'s plan (SPEC §7): counters added, violations appended to the ring in
    entry order; the CUDA twin is ``kernels_cu/verify.cu``."""
    ctx, plan = launch.ctx, launch.plan
    add_counter(ctx.kernel_run_counter, 1)
    if int(plan.enable.host()[0]) == 0:
        return
    n = max(0, min(int(plan.num_valid.host()[0]), plan.capacity))
    add_counter(ctx.slot_run_counter, n)
    check_entries(ctx, slots=plan.slot_indices.host()[:n], prev=plan.prev_slot_indices.host()[:n],
                  expected_tokens=plan.expected_tokens.host()[:n], positions=plan.expected_positions.host()[:n],
                  check_token=launch.check_expected_token)


def check_entries(ctx: ContextViews, *, slots: np.ndarray, prev: np.ndarray, expected_tokens: np.ndarray,
                  positions: np.ndarray, check_token: bool) -> None:
    """SPEC §7 for each entry (int64 arrays of one length), appending its rows in entry order; counters are
    the caller's."""
    n = len(slots)
    if n == 0:
        return
    exp_tok, exp_pos = expected_tokens, positions
    num_slots = ctx.num_slots
    tag = ctx.kernel_kind
    # Expected token as reported: -1 when the token check is off or the plan says "unchecked".
    reported_tok = exp_tok if check_token else np.full(n, -1, np.int64)

    live = slots != consts.TOKEN_TO_KV_SLOT_PADDING
    oor = live & ((slots < 0) | (slots >= covered_slots(ctx)) | (prev >= num_slots))
    ok = np.flatnonzero(live & ~oor)

    oor_idx = np.flatnonzero(oor)
    oor_rows = np.stack([
        np.full(len(oor_idx), tag, np.int64), slots[oor_idx], exp_pos[oor_idx],
        np.full(len(oor_idx), -1, np.int64), reported_tok[oor_idx], np.zeros(len(oor_idx), np.int64),
        prev[oor_idx], np.full(len(oor_idx), int(FailReason.SLOT_OUT_OF_RANGE), np.int64),
    ], axis=1) if len(oor_idx) else np.zeros((0, 8), np.int64)

    recs = records(ctx.canary_buf.host())
    s = slots[ok]
    p = prev[ok]
    rec = np.take(recs[:, : consts.CANARY_FIELDS_PER_SLOT], s, axis=0)
    stored_tok = rec[:, consts.FIELD_TOKEN]
    stored_pos = rec[:, consts.FIELD_POSITION]
    stored_hash = u64(rec[:, consts.FIELD_PREV_HASH])
    stored_rkv = u64(rec[:, consts.FIELD_REAL_KV_HASH])
    # prev 0 = unknown predecessor: expected = stored, no chain check. prev < 0 = chain head (anchor).
    unknown_prev = p == consts.TOKEN_TO_KV_SLOT_PADDING
    expected_chain = np.where(unknown_prev, stored_hash, slot_hash(recs, np.where(unknown_prev, -1, p)))
    bits = np.zeros(len(ok), np.int64)
    bits |= np.where(~unknown_prev & (stored_hash != expected_chain), FailReason.VERIFY_CHAIN_HASH_MISMATCH, 0)
    if check_token:
        et = exp_tok[ok]
        bits |= np.where((et != -1) & (stored_tok != et), FailReason.VERIFY_TOKEN_MISMATCH, 0)
    bits |= np.where(stored_pos != exp_pos[ok], FailReason.VERIFY_POSITION_MISMATCH, 0)
    rkv = fingerprint(ctx.real_kv_sources, ctx.real_kv_hash_mode, s)
    bits |= np.where(stored_rkv != rkv, FailReason.VERIFY_REAL_KV_HASH_MISMATCH, 0)

    bad = np.flatnonzero(bits)
    bad_rows = np.stack([
        np.full(len(bad), tag, np.int64), s[bad], stored_pos[bad], stored_tok[bad], reported_tok[ok][bad],
        stored_hash[bad].view(np.int64), expected_chain[bad].view(np.int64), bits[bad],
    ], axis=1) if len(bad) else np.zeros((0, 8), np.int64)

    append_rows(ctx, rows_in_entry_order((oor_idx, oor_rows), (ok[bad], bad_rows)))
