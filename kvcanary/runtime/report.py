"""Decoded violation records and their two text forms (SGLang one-liner, human-readable block).

A violation row (SPEC §4) is 8 int64 fields. :class:`Violation` is its decoded, host-side form plus
where it came from (the :class:`~kvcanary.KVCanary` step and ring index). ``str(violation)`` is exactly
SGLang's one-line log format, so log scrapers written for SGLang keep working::

    kv_canary violation: launch_tag=TAIL_K_SWA fail_reason=write_position slot_idx=53504 position=512 \
stored_token=1299 expected_token=1299 stored_chain_hash=0xe11e13af98c23f7f expected_aux=0x0000000000002100

(one line). Reason names are the SGLang labels: lower case, without "mismatch", joined with ``+`` in bit
order; unknown bits print as ``bit<N>``; a row with no bit set prints ``none``. Hashes print as 16 hex
digits of their u64 pattern. An unknown launch tag prints as ``unknown(<value>)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvcanary import consts
from kvcanary.consts import CanaryLaunchTag, FailReason, to_int64, to_u64

# SGLang's labels for the FailReason bits (kvcanary's own SLOT_OUT_OF_RANGE gets the analogous label).
REASON_LABELS: dict[FailReason, str] = {
    FailReason.VERIFY_CHAIN_HASH_MISMATCH: "chain_hash",
    FailReason.VERIFY_POSITION_MISMATCH: "position",
    FailReason.VERIFY_REAL_KV_HASH_MISMATCH: "real_kv_hash",
    FailReason.WRITE_TOKEN_MISMATCH: "write_token",
    FailReason.WRITE_POSITION_MISMATCH: "write_position",
    FailReason.VERIFY_TOKEN_MISMATCH: "verify_token",
    FailReason.SLOT_OUT_OF_RANGE: "slot_out_of_range",
}
_LABEL_TO_REASON = {v: k for k, v in REASON_LABELS.items()}

_VERIFY_BITS = (FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH
                | FailReason.VERIFY_REAL_KV_HASH_MISMATCH | FailReason.VERIFY_TOKEN_MISMATCH)
_WRITE_BITS = FailReason.WRITE_TOKEN_MISMATCH | FailReason.WRITE_POSITION_MISMATCH

# What each failed check means, for Violation.explain(), in the order the lines are printed.
_CHECK_EXPLANATIONS = {
    FailReason.WRITE_TOKEN_MISMATCH: "write_token - the token being written is not the token the engine expected "
                                     "at this position (wrong input_ids)",
    FailReason.WRITE_POSITION_MISMATCH: "write_position - the position does not continue the request's chain "
                                        "(expected the previous position + 1): a shifted or repeated position",
    FailReason.VERIFY_CHAIN_HASH_MISMATCH: "chain_hash - the slot was not written as the successor of the slot the "
                                           "request maps to the previous position: a remapped, recycled or "
                                           "overwritten slot",
    FailReason.VERIFY_POSITION_MISMATCH: "position - the slot holds a token of another position: the request reads "
                                         "a slot that belongs elsewhere",
    FailReason.VERIFY_TOKEN_MISMATCH: "verify_token - the slot holds another token than the request's known token "
                                      "ids",
    FailReason.VERIFY_REAL_KV_HASH_MISMATCH: "real_kv_hash - the real K/V bytes changed since they were written: a "
                                             "stray write, bit flip or bad offload/transfer",
}


def _failed_checks(bits: int) -> list[str]:
    return [f"  check failed: {text}" for flag, text in _CHECK_EXPLANATIONS.items() if bits & int(flag)]

#: Regular expression matching one ``str(Violation)`` line; groups are named after the fields.
VIOLATION_LINE_RE = re.compile(
    r"kv_canary violation: launch_tag=(?P<launch_tag>\S+) fail_reason=(?P<fail_reason>\S+) "
    r"slot_idx=(?P<slot_idx>-?\d+) position=(?P<position>-?\d+) stored_token=(?P<stored_token>-?\d+) "
    r"expected_token=(?P<expected_token>-?\d+) stored_chain_hash=0x(?P<stored_chain_hash>[0-9a-f]{16}) "
    r"expected_aux=0x(?P<expected_aux>[0-9a-f]{16})"
)


def reason_labels(bits: int) -> list[str]:
    """The labels of the set bits of ``bits``, lowest bit first (``bit<N>`` for bits kvcanary does not define)."""
    bits = int(bits) & consts.U64_MASK
    out = []
    n = 0
    while bits >> n:
        if (bits >> n) & 1:
            flag = 1 << n
            try:
                out.append(REASON_LABELS[FailReason(flag)])
            except (ValueError, KeyError):
                out.append(f"bit{n}")
        n += 1
    return out


def reasons_from_labels(text: str) -> FailReason:
    """Inverse of the ``fail_reason=`` field: ``"chain_hash+position"`` -> the FailReason flags."""
    out = FailReason(0)
    if text == "none":
        return out
    for label in text.split("+"):
        if label not in _LABEL_TO_REASON:
            raise ValueError(f"kv-canary: unknown fail_reason label {label!r} in {text!r}")
        out |= _LABEL_TO_REASON[label]
    return out


def tag_name(tag: int) -> str:
    """``"HEAD_K_FULL"`` etc., or ``"unknown(<value>)"``."""
    try:
        return CanaryLaunchTag(int(tag)).name
    except ValueError:
        return f"unknown({int(tag)})"


def _hex64(x: int) -> str:
    return f"0x{to_u64(int(x)):016x}"


@dataclass(frozen=True)
class Violation:
    """One decoded violation row (SPEC §4) and where it came from.

    Fields (all plain Python ints; hashes are the non-negative u64 pattern):
        tag: the launch tag (a :class:`~kvcanary.CanaryLaunchTag` value; field 0).
        slot: canary slot index (field 1); for a write-range row of the bounds rule, -1.
        position: stored position (verify) or written position (write) (field 2).
        stored_token: stored token (verify) or written token (write) (field 3); -1 when not read.
        expected_token: the token the plan / input assert expected (field 4); -1 = not checked.
        stored_chain_hash: stored ``prev_hash`` (verify) or the running chain hash (write) (field 5).
        expected_aux: the expected chain hash (verify), the expected position (write), or the prev slot /
            range end for a ``SLOT_OUT_OF_RANGE`` row (field 6).
        reasons: the :class:`~kvcanary.FailReason` flags (field 7).
        step: the canary step whose launches appended the row: the value of
            :attr:`kvcanary.KVCanary.step_number` after the ``end_step()`` that closed it (each ``step()``
            and ``sweep()`` call closes one; so does each ``end_step()`` after a graph replay); -1 when
            unknown (rows appended after the last ``end_step()`` or outside the canary object).
        ring_index: the row's index in the violation ring (= its ordinal among all violations).
    """

    tag: int
    slot: int
    position: int
    stored_token: int
    expected_token: int
    stored_chain_hash: int
    expected_aux: int
    reasons: FailReason
    step: int = -1
    ring_index: int = -1

    @classmethod
    def from_row(cls, row: Sequence[int], *, step: int = -1, ring_index: int = -1) -> Violation:
        """Decode an int64 row of 8 fields (any int sequence, e.g. a NumPy row)."""
        if len(row) != consts.VIOLATION_FIELDS:
            raise ValueError(f"kv-canary: a violation row must have {consts.VIOLATION_FIELDS} fields, "
                             f"got {len(row)}")
        f = [int(x) for x in row]
        return cls(
            tag=f[consts.VFIELD_KERNEL_KIND],
            slot=f[consts.VFIELD_SLOT_IDX],
            position=f[consts.VFIELD_POSITION],
            stored_token=f[consts.VFIELD_STORED_TOKEN],
            expected_token=f[consts.VFIELD_EXPECTED_TOKEN],
            stored_chain_hash=to_u64(f[consts.VFIELD_STORED_CHAIN_HASH]),
            expected_aux=to_u64(f[consts.VFIELD_EXPECTED_AUX]),
            # IntFlag keeps undefined bits (boundary KEEP), so any row round-trips.
            reasons=FailReason(to_u64(f[consts.VFIELD_FAIL_REASON])),
            step=step,
            ring_index=ring_index,
        )

    def to_row(self) -> list[int]:
        """The 8 int64 fields (hashes bit-cast back to int64)."""
        return [int(self.tag), self.slot, self.position, self.stored_token, self.expected_token,
                to_int64(self.stored_chain_hash), to_int64(self.expected_aux), int(self.reasons)]

    # -- decoded views ---------------------------------------------------------------------------------

    @property
    def tag_name(self) -> str:
        return tag_name(self.tag)

    @property
    def reason_labels(self) -> list[str]:
        return reason_labels(int(self.reasons))

    def _tag(self) -> CanaryLaunchTag | None:
        try:
            return CanaryLaunchTag(self.tag)
        except ValueError:
            return None

    @property
    def phase(self) -> str:
        """``"head"``, ``"tail"`` or ``"sweep"`` (``"unknown"`` for an unknown tag)."""
        t = self._tag()
        return "unknown" if t is None else t.phase

    @property
    def kv(self) -> str:
        """``"k"`` or ``"v"`` (``"unknown"`` for an unknown tag)."""
        t = self._tag()
        return "unknown" if t is None else t.kv

    @property
    def group(self) -> str:
        """``"full"`` or ``"swa"`` (``"unknown"`` for an unknown tag)."""
        t = self._tag()
        return "unknown" if t is None else t.group

    @property
    def kernel(self) -> str:
        """Which kernel appended the row: ``"verify"``, ``"write"``, or ``"verify|write"`` when the bits do
        not tell (a ``SLOT_OUT_OF_RANGE``-only row)."""
        bits = int(self.reasons)
        if bits & int(_WRITE_BITS):
            return "write"
        if bits & int(_VERIFY_BITS):
            return "verify"
        return "verify|write"

    # -- text forms ------------------------------------------------------------------------------------

    def __str__(self) -> str:
        labels = "+".join(self.reason_labels) or "none"
        return (
            f"kv_canary violation: launch_tag={self.tag_name} fail_reason={labels} slot_idx={self.slot} "
            f"position={self.position} stored_token={self.stored_token} expected_token={self.expected_token} "
            f"stored_chain_hash={_hex64(self.stored_chain_hash)} expected_aux={_hex64(self.expected_aux)}"
        )

    def explain(self) -> str:
        """A multi-line, human-readable account: which launch, what was found, what was expected, which
        checks failed and what each failure usually means."""
        bits = int(self.reasons)
        where = f"canary step {self.step}" if self.step >= 0 else "an unknown canary step"
        lines = [
            f"KV canary violation #{self.ring_index if self.ring_index >= 0 else '?'}: {self.kernel} kernel of "
            f"launch {self.tag_name} ({self.phase} phase, {self.kv.upper()} half, {self.group} group) at {where}",
            f"  slot {self.slot}, position {self.position}",
        ]
        if bits & int(FailReason.SLOT_OUT_OF_RANGE):
            lines.append("  check failed: slot_out_of_range - an index outside [0, num_slots) reached the kernel; "
                         "it was reported and not followed (nothing was read or written there)")
            lines.append(f"  aux value (prev slot / range end): {to_int64(self.expected_aux)}")
        if bits & int(_WRITE_BITS):
            exp_pos = to_int64(self.expected_aux)
            lines.append(f"  written:  token {self.stored_token}, position {self.position}, "
                         f"running chain {_hex64(self.stored_chain_hash)}")
            lines.append(f"  expected: token {self.expected_token}, position {exp_pos}")
            lines += _failed_checks(bits & int(_WRITE_BITS))
        if bits & int(_VERIFY_BITS):
            exp_tok = "unchecked" if self.expected_token == -1 else str(self.expected_token)
            lines.append(f"  stored:   token {self.stored_token}, position {self.position}, "
                         f"prev_hash {_hex64(self.stored_chain_hash)}")
            lines.append(f"  expected: token {exp_tok}, prev_hash {_hex64(self.expected_aux)} "
                         f"(hash of the predecessor slot's record)")
            lines += _failed_checks(bits & int(_VERIFY_BITS))
        if not bits:
            lines.append("  no fail-reason bit set (malformed row)")
        lines.append(f"  log line: {self}")
        return "\n".join(lines)


def parse_violation_line(line: str) -> Violation:
    """Parse one ``str(Violation)`` line back into a :class:`Violation` (``step``/``ring_index`` = -1)."""
    m = VIOLATION_LINE_RE.search(line)
    if m is None:
        raise ValueError(f"kv-canary: not a kv_canary violation line: {line!r}")
    tag_text = m["launch_tag"]
    unknown = re.fullmatch(r"unknown\((-?\d+)\)", tag_text)
    if unknown:
        tag = int(unknown[1])
    elif tag_text in CanaryLaunchTag.__members__:
        tag = int(CanaryLaunchTag[tag_text])
    else:
        raise ValueError(f"kv-canary: unknown launch_tag {tag_text!r}")
    return Violation(tag=tag, slot=int(m["slot_idx"]), position=int(m["position"]),
                     stored_token=int(m["stored_token"]), expected_token=int(m["expected_token"]),
                     stored_chain_hash=int(m["stored_chain_hash"], 16), expected_aux=int(m["expected_aux"], 16),
                     reasons=reasons_from_labels(m["fail_reason"]))


def format_violations(violations: Iterable[Violation], *, total: int | None = None, kept: int | None = None,
                      limit: int = 20) -> str:
    """The one-line form of up to ``limit`` violations, one per line, with the ring overflow stated."""
    vs = list(violations)
    lines = [str(v) for v in vs[:limit]]
    if len(vs) > limit:
        lines.append(f"... and {len(vs) - limit} more")
    if total is not None and kept is not None and total > kept:
        lines.append(f"violation ring overflowed: {total} violations in total, only the first {kept} rows kept")
    return "\n".join(lines)


class CanaryViolationError(RuntimeError):
    """Raised by a :class:`~kvcanary.KVCanary` in ``mode="raise"`` when new violations are found.

    Attributes: ``violations`` (the new :class:`Violation` records), ``total`` (violations counted by the
    device so far, including rows the ring could not keep) and ``kept`` (rows the ring holds).
    """

    def __init__(self, violations: Sequence[Violation], *, total: int | None = None, kept: int | None = None):
        self.violations = list(violations)
        self.total = total if total is not None else len(self.violations)
        self.kept = kept if kept is not None else len(self.violations)
        head = f"kv-canary: {len(self.violations)} new KV canary violation(s)"
        body = format_violations(self.violations, total=self.total, kept=self.kept)
        super().__init__(f"{head}:\n{body}" if body else head)
