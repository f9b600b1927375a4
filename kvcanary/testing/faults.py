"""Fault injectors: prove in your own integration tests that the canary is wired in.

Each injector plants one realistic KV-cache bug by editing the engine's own tensors in place (torch
tensors, CPU or CUDA; nothing is copied; arguments are checked before anything is edited) and returns an :class:`ExpectedViolation`: the launch tag that must
report it, the :class:`~kvcanary.FailReason` bits that row must carry, the slot(s) it names and when it
is seen. After running the engine for the documented number of steps, check with
:meth:`ExpectedViolation.found_in`::

    exp = faults.remap_req_to_token(engine.req_to_token, req_pool_index=3, position=5, new_slot=77)
    engine.step(); engine.step()
    assert exp.found_in(canary.poll(sync=True))

The tag's K/V half and FULL/SWA group default to K and FULL; pass ``kv``/``group`` when you inject into a
V pool or an SWA pool (or to name the tag you check). A fault may produce further rows (the V half, the
SWA group when the slot is inside the window, the TAIL launch after the HEAD one, a later step): the
expectation names the first launch that must see it, and the reasons that row must have at least.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from kvcanary.consts import CanaryLaunchTag, FailReason
from kvcanary.errors import invalid
from kvcanary.ops.structs import RealKvSource
from kvcanary.runtime.report import Violation, reason_labels

# When the expected row appears, relative to the edit (faults edit a batch after the scheduler built it
# and before step("head"), or the tables / pools between steps).
WHEN_FIRST_HEAD_VERIFY = "first HEAD verify after the edit"
WHEN_THIS_HEAD_WRITE = "HEAD write of the edited batch"
WHEN_NEXT_STEP_HEAD_VERIFY = "HEAD verify of the step after the edited batch"
WHEN_FIRST_TAIL_VERIFY = "first TAIL verify after the edit"
WHEN_FIRST_SWEEP = "first sweep after the edit"


@dataclass(frozen=True)
class ExpectedViolation:
    """What an injected fault must produce.

    Attributes:
        fault: the injector's name.
        tag: the launch tag that must report it.
        reasons: bits the reporting row must carry (it may carry more).
        slots: the slots the row may name (None = any).
        when: which launch reports it first, relative to the edit (one of the ``WHEN_*`` strings of this
            module). Reporting to the host is one canary step later still (see :meth:`KVCanary.end_step`).
        description: what was changed.
    """

    fault: str
    tag: CanaryLaunchTag
    reasons: FailReason
    slots: frozenset[int] | None
    when: str
    description: str

    def matches(self, v: Violation) -> bool:
        """Whether ``v`` is the expected report: same tag, all expected bits, a named slot."""
        return (v.tag == int(self.tag) and (int(v.reasons) & int(self.reasons)) == int(self.reasons)
                and (self.slots is None or v.slot in self.slots))

    def found_in(self, violations: Iterable[Violation]) -> list[Violation]:
        """The violations that match (empty = not detected)."""
        return [v for v in violations if self.matches(v)]

    def __str__(self) -> str:
        slots = "any" if self.slots is None else ",".join(str(s) for s in sorted(self.slots))
        return (f"{self.fault}: {self.tag.name} {'+'.join(reason_labels(int(self.reasons)))} at slot(s) {slots} "
                f"({self.when}) - {self.description}")


def _tag(phase: str, kv: str, group: str) -> CanaryLaunchTag:
    try:
        return CanaryLaunchTag[f"{phase}_{kv}_{group}".upper()]
    except KeyError:
        raise invalid(f"kv must be 'k' or 'v' and group 'full' or 'swa', got kv={kv!r} group={group!r}") from None


def _torch(name: str, x: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"kv-canary: {name} must be a torch tensor, got {type(x).__name__}")
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"kv-canary: {name} must have dtype {str(dtype).removeprefix('torch.')}, "
                        f"got {str(x.dtype).removeprefix('torch.')}")
    return x


def _index(name: str, value: int, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"kv-canary: {name} must be an int, got {type(value).__name__}")
    if not 0 <= value < size:
        raise invalid(f"{name} must be in [0, {size}), got {value}")
    return value


# --------------------------------------------------------------------------------------------------------
# req_to_token and allocator bugs


def remap_req_to_token(req_to_token: torch.Tensor, *, req_pool_index: int, position: int, new_slot: int,
                       kv: str = "k", group: str = "full") -> ExpectedViolation:
    """Point ``req_to_token[req_pool_index, position]`` at ``new_slot``, another live slot.

    The bug: a stale or wrong page-table entry (radix-cache reuse, index translation), so the request
    attends to someone else's KV.

    Must produce, at the first HEAD verify of that request after the edit (``position`` < its prefix): a row of
    ``HEAD_<kv>_<group>`` naming ``new_slot`` with ``chain_hash + position``. Conditions: ``new_slot``
    holds a token written at another position than ``position`` (otherwise only the chain check fires,
    and nothing fires if it holds identical content, which is harmless). Also expect a ``chain_hash`` row
    for the slot at ``position + 1`` (its predecessor changed), and the TAIL launch and the SWA group
    (when ``position`` is in the window) report it too.
    """
    r2t = _torch("req_to_token", req_to_token, torch.int32)
    if r2t.ndim != 2:
        raise invalid(f"req_to_token must be 2-D, got shape {tuple(r2t.shape)}")
    _index("req_pool_index", req_pool_index, r2t.shape[0])
    _index("position", position, r2t.shape[1])
    tag = _tag("head", kv, group)
    old = int(r2t[req_pool_index, position])
    if int(new_slot) == old:
        raise invalid(f"new_slot must differ from the current slot {old}")
    r2t[req_pool_index, position] = int(new_slot)
    return ExpectedViolation(
        "remap_req_to_token", tag,
        FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH, frozenset({int(new_slot)}),
        WHEN_FIRST_HEAD_VERIFY, f"req_to_token[{req_pool_index}, {position}]: {old} -> {int(new_slot)}")


def recycle_slot(out_cache_loc: torch.Tensor, req_to_token: torch.Tensor, *, token_index: int,
                 req_pool_index: int, position: int, live_slot: int, kv: str = "k",
                 group: str = "full") -> ExpectedViolation:
    """Hand a slot that a live request still reads to a new token: the allocator recycled it too early.

    Sets ``out_cache_loc[token_index] = live_slot`` (the token of this step that request
    ``req_pool_index`` writes at ``position``) and ``req_to_token[req_pool_index, position] = live_slot``,
    as an engine whose allocator returned a still-referenced slot would. Call it after the batch is built
    and before ``step("head")``.

    Must produce, at the HEAD verify of the step after the edited batch, for the *victim* (the live reader
    that still maps ``live_slot`` at its own position ``q``): a row of ``HEAD_<kv>_<group>`` naming
    ``live_slot`` with ``chain_hash + position``, provided ``q != position`` and the victim's prefix covers
    ``q`` (and ``q`` is not the victim's last position, whose record also seeds its next write). With
    real-KV sources the TAIL verify of the edited step already reports ``real_kv_hash`` for the slot when
    the victim is in that batch (the forward overwrote its KV).
    """
    loc = _torch("out_cache_loc", out_cache_loc, torch.int64)
    r2t = _torch("req_to_token", req_to_token, torch.int32)
    _index("token_index", token_index, loc.shape[0])
    _index("req_pool_index", req_pool_index, r2t.shape[0])
    _index("position", position, r2t.shape[1])
    tag = _tag("head", kv, group)
    old = int(loc[token_index])
    loc[token_index] = int(live_slot)
    r2t[req_pool_index, position] = int(live_slot)
    return ExpectedViolation(
        "recycle_slot", tag,
        FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH, frozenset({int(live_slot)}),
        WHEN_NEXT_STEP_HEAD_VERIFY, f"token {token_index} (request row {req_pool_index}, position {position}) written to live "
        f"slot {int(live_slot)} instead of {old}")


# --------------------------------------------------------------------------------------------------------
# Batch assembly bugs


def swap_input_tokens(input_ids: torch.Tensor, *, i: int, j: int, out_cache_loc: torch.Tensor | None = None,
                      check: str = "verify", kv: str = "k", group: str = "full") -> ExpectedViolation:
    """Swap the tokens at flat indices ``i`` and ``j`` of this step's ``input_ids`` (two requests' tokens
    crossed while assembling the batch). Call it after the batch is built and before ``step("head")``;
    the tokens must differ.

    The chain stays self-consistent (it hashes what was written), so only a token check sees it:

    * ``check="verify"`` (the engine passes its expected-token pool to ``step()``): at the HEAD verify of
      the next step, ``HEAD_<kv>_<group>`` with ``verify_token`` at the two slots (both requests must still
      be running);
    * ``check="write"`` (the engine passes ``expected_input_tokens``): at the HEAD write of this batch,
      ``HEAD_<kv>_<group>`` with ``write_token`` at the two slots.

    ``out_cache_loc`` (optional) names the slots in the expectation.
    """
    ids = _torch("input_ids", input_ids, torch.int64)
    _index("i", i, ids.shape[0])
    _index("j", j, ids.shape[0])
    if check == "verify":
        reasons, when = FailReason.VERIFY_TOKEN_MISMATCH, WHEN_NEXT_STEP_HEAD_VERIFY
    elif check == "write":
        reasons, when = FailReason.WRITE_TOKEN_MISMATCH, WHEN_THIS_HEAD_WRITE
    else:
        raise invalid(f"check must be 'verify' or 'write', got {check!r}")
    tag = _tag("head", kv, group)
    slots = None
    if out_cache_loc is not None:
        loc = _torch("out_cache_loc", out_cache_loc, torch.int64)
        slots = frozenset({int(loc[_index("i", i, loc.shape[0])]), int(loc[_index("j", j, loc.shape[0])])})
    a, b = int(ids[i]), int(ids[j])
    if a == b:
        raise invalid(f"swap_input_tokens needs two different tokens, got {a} at both i={i} and j={j}")
    ids[i], ids[j] = b, a
    return ExpectedViolation("swap_input_tokens", tag, reasons, slots, when,
                             f"input_ids[{i}] and input_ids[{j}] swapped ({a} <-> {b})")


def shift_position(positions: torch.Tensor, *, index: int, delta: int = 1, out_cache_loc: torch.Tensor | None = None,
                   kv: str = "k", group: str = "full") -> ExpectedViolation:
    """Add ``delta`` (!= 0) to ``positions[index]`` of this step (a chunked-prefill or spec-decode position
    slip). Call it after the batch is built and before ``step("head")``.

    Must produce, at this HEAD step's write: ``HEAD_<kv>_<group>`` with ``write_position`` at the token's
    slot, provided the token continues a cached prefix (its request has ``prefix_len > 0``, or it is not
    the request's first token of the step) and the chain position assert is on (outside ``warmup()``).
    At the next step, the verify also reports ``position`` for that slot.
    """
    pos = _torch("positions", positions, torch.int64)
    _index("index", index, pos.shape[0])
    if isinstance(delta, bool) or not isinstance(delta, int) or delta == 0:
        raise invalid(f"delta must be a non-zero int, got {delta!r}")
    tag = _tag("head", kv, group)
    slots = None
    if out_cache_loc is not None:
        loc = _torch("out_cache_loc", out_cache_loc, torch.int64)
        slots = frozenset({int(loc[_index("index", index, loc.shape[0])])})
    old = int(pos[index])
    pos[index] = old + delta
    return ExpectedViolation("shift_position", tag, FailReason.WRITE_POSITION_MISMATCH, slots,
                             WHEN_THIS_HEAD_WRITE, f"positions[{index}]: {old} -> {old + delta}")


# --------------------------------------------------------------------------------------------------------
# Memory corruption


def _flip(source: RealKvSource, slot: int, byte: int, mask: int) -> tuple[int, int]:
    if not isinstance(source, RealKvSource):
        raise TypeError(f"kv-canary: source must be a RealKvSource, got {type(source).__name__}")
    t = _torch("source.tensor", source.tensor)
    _index("slot", slot, source.num_slots)
    _index("byte", byte, source.num_bytes_per_token)
    if isinstance(mask, bool) or not isinstance(mask, int) or not 0 < mask <= 0xFF:
        raise invalid(f"mask must be in [1, 255], got {mask!r}")
    row = slot // source.page_size
    col = (slot % source.page_size) * source.num_bytes_per_token + byte
    # A row is contiguous (RealKvSource checks it), so its bytes are a flat uint8 view of the live pool.
    row_bytes = t[row].reshape(-1).view(torch.uint8)
    before = int(row_bytes[col])
    row_bytes[col] = before ^ mask
    return before, before ^ mask


def flip_real_kv_byte(source: RealKvSource, *, slot: int, byte: int = 0, mask: int = 0x01, kv: str = "k",
                      group: str = "full") -> ExpectedViolation:
    """Flip bits (``mask``) of byte ``byte`` of ``slot``'s KV in the pool ``source`` views (a stray write
    or a bit flip in a live slot). ``byte`` must be among the fingerprinted bytes: ``< 16`` in PARTIAL
    mode, ``< read_bytes`` in ALL mode.

    Must produce, at the first TAIL verify after the edit that reads ``slot`` (a running request's prefix):
    ``TAIL_<kv>_<group>`` with ``real_kv_hash`` naming ``slot``. HEAD launches do not fingerprint KV and
    do not see it.
    """
    tag = _tag("tail", kv, group)
    before, after = _flip(source, slot, byte, mask)
    return ExpectedViolation("flip_real_kv_byte", tag, FailReason.VERIFY_REAL_KV_HASH_MISMATCH,
                             frozenset({int(slot)}), WHEN_FIRST_TAIL_VERIFY,
                             f"slot {slot} byte {byte}: {before:#04x} -> {after:#04x}")


def flip_idle_slot_byte(source: RealKvSource, *, slot: int, byte: int = 0, mask: int = 0x01, kv: str = "k",
                        group: str = "full") -> ExpectedViolation:
    """Flip bits of an *idle cached* slot's KV: a slot the prefix cache holds but no running request
    reads (bit rot, a bad offload/reload). No HEAD or TAIL launch reads it, so only a sweep sees it.

    Must produce, at the first :meth:`~kvcanary.KVCanary.sweep` after the edit that covers ``slot``: ``SWEEP_<kv>_<group>``
    with ``real_kv_hash`` naming ``slot`` (and nothing before that sweep, while the slot stays idle).
    """
    tag = _tag("sweep", kv, group)
    before, after = _flip(source, slot, byte, mask)
    return ExpectedViolation("flip_idle_slot_byte", tag, FailReason.VERIFY_REAL_KV_HASH_MISMATCH,
                             frozenset({int(slot)}), WHEN_FIRST_SWEEP,
                             f"idle slot {slot} byte {byte}: {before:#04x} -> {after:#04x}")


#: The injectors, by name, in the order the demo runs them.
INJECTORS = {
    "remap_req_to_token": remap_req_to_token,
    "flip_real_kv_byte": flip_real_kv_byte,
    "flip_idle_slot_byte": flip_idle_slot_byte,
    "swap_input_tokens": swap_input_tokens,
    "shift_position": shift_position,
    "recycle_slot": recycle_slot,
}
