"""Fault injectors: prove in your own integration tests that the canary is wired in.

Each injector plants one realistic KV-cache bug by editing the engine's own tensors in place (torch
tensors, CPU or CUDA; nothing is copied; arguments are checked before anything is edited) and returns an
:class:`ExpectedViolation`: the launch tag that must report it, the :class:`~kvcanary.FailReason` bits that
row must carry, the slot(s) it names and when it is seen. After running the engine for the documented
number of steps, check with :meth:`ExpectedViolation.found_in`::

    exp = faults.remap_req_to_token(engine.req_to_token, req_pool_index=3, position=5, new_slot=77)
    engine.step(); engine.step()
    assert exp.found_in(canary.poll(sync=True))

The tag's K/V half and FULL/SWA group default to K and FULL; pass ``kv``/``group`` when you inject into a
V pool or an SWA pool (or to name the tag you check). A fault may produce further rows (the V half, the
SWA group when the slot is inside the window, the TAIL launch after the HEAD one, a later step): the
expectation names the first launch that must see it, and the reasons that row must have at least.

**The registry.** Beside each injector sits its *target finder* for the engine model
(:class:`kvcanary.testing.engine.ServingSimulation`), registered with :func:`target_finder`: given a batch
the engine built, it picks a target the fault can hit and the canary must then report (a request with a
long enough prefix, two decode rows, an idle cached page...), plants the fault with the injector and
returns an :class:`Injection` (the expectation, and how the engine contains the damage once it is
reported). :data:`FAULTS` maps each injector's name to its :class:`FaultKind`; :func:`fault_kind` looks one
up. The scenario runner (:mod:`kvcanary.testing.scenarios`) and :class:`FaultSchedule` (random faults with
a detection bound, for an engine's CI; configurable from the environment) only look faults up there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvcanary.consts import CanaryLaunchTag, FailReason
from kvcanary.errors import invalid
from kvcanary.ops.structs import RealKvSource
from kvcanary.runtime.report import Violation, reason_labels
from kvcanary.testing.engine_types import Batch, EngineView, Row

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
        return CanaryLaunchTag.of(phase, kv, group)
    except ValueError:
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
# The registry


@dataclass(frozen=True)
class Injection:
    """A fault planted into a running engine.

    Attributes:
        expected: what the canary must report.
        contain: what the engine does once the fault was reported (or given up on), so that the damage
            stops producing reports: e.g. abort the requests that read the corrupted slots and drop the
            pages holding them from the prefix cache. None: nothing to do.
    """

    expected: ExpectedViolation
    contain: Callable[[], None] | None = None


#: ``find(sim, batch, rng, *, kv, group) -> Injection | None``: plant the fault into an engine-model batch.
TargetFinder = Callable[..., "Injection | None"]


@dataclass(frozen=True)
class FaultKind:
    """A registered fault: its injector, its target finder for the engine model, the attention groups the
    finder can target (``"full"``, ``"swa"``) and the launch phase whose row reports it (``"head"``,
    ``"tail"`` or ``"sweep"``: a sweep fault is seen only when the cache is swept)."""

    name: str
    injector: Callable[..., ExpectedViolation]
    find_target: TargetFinder
    groups: tuple[str, ...]
    detected_by: str


#: The injectors, by name, in the order the demo runs them.
INJECTORS: dict[str, Callable[..., ExpectedViolation]] = {}
#: Every injector's :class:`FaultKind`, by name (same order).
FAULTS: dict[str, FaultKind] = {}


def injector(fn: Callable[..., ExpectedViolation]) -> Callable[..., ExpectedViolation]:
    """Register ``fn`` as an injector under its name."""
    INJECTORS[fn.__name__] = fn
    return fn


def target_finder(inj: Callable[..., ExpectedViolation], *, groups: tuple[str, ...] = ("full",),
                  detected_by: str = "head") -> Callable[[TargetFinder], TargetFinder]:
    """Register the decorated function as the engine-model target finder of injector ``inj``."""
    if INJECTORS.get(getattr(inj, "__name__", "")) is not inj:
        raise invalid(f"{getattr(inj, '__name__', inj)!r} is not a registered injector")

    def register(find: TargetFinder) -> TargetFinder:
        FAULTS[inj.__name__] = FaultKind(inj.__name__, inj, find, groups, detected_by)
        return find

    return register


def fault_kind(name: str) -> FaultKind:
    """The registered fault ``name``; a clear error for an unknown one."""
    try:
        return FAULTS[name]
    except (KeyError, TypeError):
        raise invalid(f"unknown fault {name!r}; choose from {tuple(FAULTS)}") from None


def _pick(rng: np.random.Generator, items: list[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _continuing(batch: Batch, *, decode: bool, min_prefix: int = 1) -> list[Row]:
    """Target rows whose request has ``min_prefix`` positions cached and is still running next step
    (decode: decode and verify rows only)."""
    return [row for row in batch.rows
            if row.prefix >= min_prefix and row.req.remaining > row.n
            and (not decode or row.kind in ("decode", "verify"))]


def _quarantine(sim: EngineView, *, slots: Iterable[int] = (), requests: Iterable[Any] = ()) -> Callable[[], None]:
    # The containment of a fault in the engine model (arguments bound now, not when it runs).
    slots, requests = list(slots), list(requests)
    return lambda: sim.quarantine(slots=slots, requests=requests)


def _swa_slot(sim: EngineView, full_slot: int) -> int:
    # The SWA slot the canary reads for a FULL slot: the table entry (0 = none).
    return int(sim.lut_host[full_slot])


# --------------------------------------------------------------------------------------------------------
# req_to_token bugs


@injector
def remap_req_to_token(req_to_token: torch.Tensor, *, req_pool_index: int, position: int, new_slot: int,
                       kv: str = "k", group: str = "full",
                       full_to_swa_index_mapping: torch.Tensor | None = None) -> ExpectedViolation:
    """Point ``req_to_token[req_pool_index, position]`` at ``new_slot``, another live slot.

    The bug: a stale or wrong page-table entry (radix-cache reuse, index translation), so the request
    attends to someone else's KV.

    Must produce, at the first HEAD verify of that request after the edit (``position`` < its prefix): a row of
    ``HEAD_<kv>_<group>`` naming ``new_slot`` with ``chain_hash + position``. Conditions: ``new_slot``
    holds a token written at another position than ``position`` (otherwise only the chain check fires,
    and nothing fires if it holds identical content, which is harmless). Also expect a ``chain_hash`` row
    for the slot at ``position + 1`` (its predecessor changed), and the TAIL launch and the SWA group
    (when ``position`` is in the window) report it too.

    For ``group="swa"`` the row names the SWA slot of ``new_slot``: pass the engine's
    ``full_to_swa_index_mapping`` to name it (else the expectation accepts any slot); ``position`` and
    ``position - 1`` must be inside the request's window (the chain check needs the predecessor's SWA slot).
    """
    r2t = _torch("req_to_token", req_to_token, torch.int32)
    if r2t.ndim != 2:
        raise invalid(f"req_to_token must be 2-D, got shape {tuple(r2t.shape)}")
    _index("req_pool_index", req_pool_index, r2t.shape[0])
    _index("position", position, r2t.shape[1])
    tag = _tag("head", kv, group)
    slots: frozenset[int] | None = frozenset({int(new_slot)})
    if group == "swa":
        slots = None
        if full_to_swa_index_mapping is not None:
            lut = _torch("full_to_swa_index_mapping", full_to_swa_index_mapping, torch.int64)
            slots = frozenset({int(lut[_index("new_slot", int(new_slot), lut.shape[0])])})
    old = int(r2t[req_pool_index, position])
    if int(new_slot) == old:
        raise invalid(f"new_slot must differ from the current slot {old}")
    r2t[req_pool_index, position] = int(new_slot)
    return ExpectedViolation(
        "remap_req_to_token", tag,
        FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH, slots,
        WHEN_FIRST_HEAD_VERIFY, f"req_to_token[{req_pool_index}, {position}]: {old} -> {int(new_slot)}")


@target_finder(remap_req_to_token, groups=("full", "swa"))
def _remap_target(sim: EngineView, batch: Batch, rng: np.random.Generator, *, kv: str,
                  group: str) -> Injection | None:
    # A request continuing with at least 3 cached positions; remap its position prefix - 2 (its successor is
    # cached too, and for SWA both it and its predecessor are inside the window) to another request's slot.
    if group == "swa" and sim.window < 3:
        return None
    cands = _continuing(batch, decode=False, min_prefix=3)
    if not cands:
        return None
    req = _pick(rng, cands).req
    p = req.computed - 2
    others = [r.slot(q) for r in sim.running if r is not req for q in range(r.computed) if q != p]
    if group == "swa":
        others = [s for s in others if _swa_slot(sim, s) > 0]
    if not others:
        return None
    exp = remap_req_to_token(sim.r2t_host, req_pool_index=req.row, position=p, new_slot=_pick(rng, others), kv=kv,
                             group=group, full_to_swa_index_mapping=sim.lut_host if group == "swa" else None)
    return Injection(exp, lambda: sim.quarantine(requests=[req]))


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


@injector
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


@target_finder(flip_real_kv_byte, groups=("full", "swa"), detected_by="tail")
def _flip_real_target(sim: EngineView, batch: Batch, rng: np.random.Generator, *, kv: str,
                      group: str) -> Injection | None:
    # A cached position of a request in this batch (for SWA: inside its window). For the FULL group prefer
    # pages only that request holds, so that only its TAIL verify (no sweep) reads the slot.
    cands = _continuing(batch, decode=False, min_prefix=1)
    if not cands:
        return None
    row = _pick(rng, cands)
    req = row.req
    if group == "swa":
        full = [s for s in (req.slot(p) for p in range(max(0, row.prefix - sim.window), row.prefix))
                if _swa_slot(sim, s) > 0]
        if not full:
            return None
        full_slot = _pick(rng, full)
        slot, source = _swa_slot(sim, full_slot), (sim.swa_k_source if kv == "k" else sim.swa_v_source)
    else:
        private = [p for p in range(row.prefix) if req.pages[p // sim.cfg.page_size] not in sim.page_key]
        full_slot = slot = req.slot(_pick(rng, private or list(range(row.prefix))))
        source = sim.k_source if kv == "k" else sim.v_source
    exp = flip_real_kv_byte(source, slot=slot, byte=int(rng.integers(16)), mask=0x10, kv=kv, group=group)
    return Injection(exp, lambda: sim.quarantine(slots=[full_slot]))


@injector
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


@target_finder(flip_idle_slot_byte, detected_by="sweep")
def _flip_idle_target(sim: EngineView, batch: Batch, rng: np.random.Generator, *, kv: str,
                      group: str) -> Injection | None:
    # A cached page no running request holds; pinned, so no request attends to it until it is contained.
    idle = sim.idle_cache_pages()
    if not idle:
        return None
    page = _pick(rng, idle)
    sim.pinned.add(page)
    slot = page * sim.cfg.page_size + int(rng.integers(sim.cfg.page_size))
    exp = flip_idle_slot_byte(sim.k_source if kv == "k" else sim.v_source, slot=slot, byte=int(rng.integers(16)),
                              mask=0x01, kv=kv)
    return Injection(exp, lambda: sim.quarantine(slots=[slot]))


# --------------------------------------------------------------------------------------------------------
# Batch assembly bugs


@injector
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


def _group_loc(sim: EngineView, batch: Batch, group: str) -> torch.Tensor | None:
    # The slots a batch writes in the group's index space (they name the rows of that group's launches).
    return batch.out_cache_loc if group == "full" else batch.swa_out_cache_loc


@target_finder(swap_input_tokens, groups=("full", "swa"))
def _swap_target(sim: EngineView, batch: Batch, rng: np.random.Generator, *, kv: str,
                 group: str) -> Injection | None:
    # The first (known) tokens of two decode rows that both run next step; for SWA, their positions stay
    # inside the window next step.
    cands = [r for r in _continuing(batch, decode=True) if group == "full" or r.n <= sim.window]
    ids = batch.input_ids
    pairs = [(a, b) for a in cands for b in cands if a.req.rid < b.req.rid and int(ids[a.start]) != int(ids[b.start])]
    if not pairs:
        return None
    a, b = _pick(rng, pairs)
    exp = swap_input_tokens(ids, i=a.start, j=b.start, out_cache_loc=_group_loc(sim, batch, group), kv=kv, group=group)
    return Injection(exp, lambda: sim.quarantine(requests=[a.req, b.req]))


@injector
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


@target_finder(shift_position, groups=("full", "swa"))
def _shift_target(sim: EngineView, batch: Batch, rng: np.random.Generator, *, kv: str,
                  group: str) -> Injection | None:
    # The first token of a decode row (it continues a cached prefix, so the HEAD write checks its position).
    cands = _continuing(batch, decode=True)
    if not cands:
        return None
    row = _pick(rng, cands)
    exp = shift_position(batch.positions, index=row.start, delta=1, out_cache_loc=_group_loc(sim, batch, group),
                         kv=kv, group=group)
    return Injection(exp, lambda: sim.quarantine(requests=[row.req]))


# --------------------------------------------------------------------------------------------------------
# Allocator bugs


@injector
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


@target_finder(recycle_slot)
def _recycle_target(sim: EngineView, batch: Batch, rng: np.random.Generator, *, kv: str,
                    group: str) -> Injection | None:
    # A decode row's token (the thief) written to a slot another request of the batch (the victim, running
    # next step) still reads, at a position that is neither the thief's nor the victim's last one.
    thieves = _continuing(batch, decode=True)
    for i in rng.permutation(len(thieves)).tolist():
        thief = thieves[i]
        pos = int(batch.positions[thief.start])
        victims = [(v.req, q) for v in _continuing(batch, decode=False, min_prefix=3)
                   if v.req is not thief.req for q in range(v.prefix - 1) if q != pos]
        if victims:
            victim, q = _pick(rng, victims)
            live = victim.slot(q)
            exp = recycle_slot(batch.out_cache_loc, sim.r2t_host, token_index=thief.start,
                               req_pool_index=thief.req.row, position=pos, live_slot=live, kv=kv, group=group)
            return Injection(exp, _quarantine(sim, slots=[live], requests=[thief.req]))
    return None


#: Fault names in the order the demo runs them.
FAULT_NAMES = tuple(FAULTS)

__all__ = [
    "FAULTS",
    "FAULT_NAMES",
    "INJECTORS",
    "ExpectedViolation",
    "FaultKind",
    "Injection",
    "fault_kind",
    "flip_idle_slot_byte",
    "flip_real_kv_byte",
    "injector",
    "recycle_slot",
    "remap_req_to_token",
    "shift_position",
    "swap_input_tokens",
    "target_finder",
]
