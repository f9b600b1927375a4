"""Violation decoding and its two text forms (kvcanary.runtime.report)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kvcanary import CanaryLaunchTag, CanaryViolationError, FailReason, Violation
from kvcanary.runtime.report import VIOLATION_LINE_RE, format_violations, parse_violation_line, reasons_from_labels

# The test's own parser of SGLang's one-line format (independent of kvcanary.runtime.report.VIOLATION_LINE_RE).
LINE = re.compile(
    r"^kv_canary violation: launch_tag=([A-Z_]+|unknown\(-?\d+\)) fail_reason=([a-z_0-9+]+) slot_idx=(-?\d+) "
    r"position=(-?\d+) stored_token=(-?\d+) expected_token=(-?\d+) stored_chain_hash=0x([0-9a-f]{16}) "
    r"expected_aux=0x([0-9a-f]{16})$"
)
# SGLang's labels, written out here from its log format (not read from kvcanary).
LABELS = {1: "chain_hash", 2: "position", 4: "real_kv_hash", 8: "write_token", 16: "write_position",
          32: "verify_token", 64: "slot_out_of_range"}


def test_issue_example_line_exactly():
    # SGLang's example row: TAIL_K_SWA write_position; hashes given as u64 patterns.
    row = [8, 53504, 512, 1299, 1299, 0xE11E13AF98C23F7F - (1 << 64), 0x2100, 16]
    v = Violation.from_row(row)
    assert str(v) == (
        "kv_canary violation: launch_tag=TAIL_K_SWA fail_reason=write_position slot_idx=53504 position=512 "
        "stored_token=1299 expected_token=1299 stored_chain_hash=0xe11e13af98c23f7f expected_aux=0x0000000000002100"
    )
    assert v.tag == CanaryLaunchTag.TAIL_K_SWA and v.reasons == FailReason.WRITE_POSITION_MISMATCH
    assert (v.phase, v.kv, v.group, v.kernel) == ("tail", "k", "swa", "write")


def test_reasons_joined_in_bit_order():
    v = Violation.from_row([0, 5, 1, 2, 3, 4, 5, 3])
    assert "fail_reason=chain_hash+position " in str(v)
    v = Violation.from_row([0, 5, 1, 2, 3, 4, 5, 0])
    assert "fail_reason=none " in str(v)


def test_random_rows_parse_back_with_an_independent_regex():
    rng = np.random.default_rng(7)
    for _ in range(300):
        row = rng.integers(-(1 << 63), (1 << 63) - 1, size=8, dtype=np.int64, endpoint=True)
        row[0] = rng.integers(-3, 15)
        row[7] = rng.integers(0, 128)
        v = Violation.from_row(row, step=3, ring_index=9)
        m = LINE.match(str(v))
        assert m, str(v)
        tag, reasons, slot, pos, stok, etok, h, aux = m.groups()
        expected_tag = CanaryLaunchTag(int(row[0])).name if 0 <= row[0] < 12 else f"unknown({int(row[0])})"
        assert tag == expected_tag
        bits = [b for b in LABELS if int(row[7]) & b]
        assert reasons == ("+".join(LABELS[b] for b in bits) or "none")
        assert [int(slot), int(pos), int(stok), int(etok)] == [int(x) for x in row[1:5]]
        assert int(h, 16) == int(row[5]) % (1 << 64)
        assert int(aux, 16) == int(row[6]) % (1 << 64)
        assert v.to_row() == [int(x) for x in row]
        # The library's own parser and regex agree with the test's.
        assert VIOLATION_LINE_RE.search(str(v))
        back = parse_violation_line(str(v))
        assert back.to_row() == v.to_row() and back.step == -1


def test_row_length_checked():
    with pytest.raises(ValueError, match="kv-canary: a violation row must have 8 fields, got 7"):
        Violation.from_row([0] * 7)


def test_reasons_from_labels_round_trip_and_errors():
    assert reasons_from_labels("chain_hash+position+real_kv_hash") == (
        FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH
        | FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
    assert reasons_from_labels("none") == FailReason(0)
    with pytest.raises(ValueError, match="unknown fail_reason label 'bogus'"):
        reasons_from_labels("position+bogus")


@pytest.mark.parametrize("bits, present, absent", [
    (1 | 2, ["chain_hash", "position"], ["real_kv_hash", "write_token", "verify_token"]),
    (4, ["real_kv_hash"], ["chain_hash", "write_position"]),
    (8 | 16, ["write_token", "write_position"], ["chain_hash", "real_kv_hash"]),
    (32, ["verify_token"], ["write_token"]),
    (64, ["slot_out_of_range"], ["chain_hash"]),
])
def test_explain_names_exactly_the_failed_checks(bits, present, absent):
    v = Violation.from_row([2, 17, 42, 111, 112, 0x11, 0x22, bits], step=5, ring_index=0)
    text = v.explain()
    failed = re.findall(r"check failed: (\w+)", text)
    assert sorted(failed) == sorted(present)
    for name in absent:
        assert f"check failed: {name}" not in text
    assert "TAIL_K_FULL" in text and "step 5" in text and "slot 17" in text
    assert text.splitlines()[-1] == f"  log line: {v}"


def test_write_row_explains_expected_position_from_aux():
    v = Violation.from_row([0, 3, 9, 7, 7, 0, 6, 16])
    assert "expected: token 7, position 6" in v.explain()


def test_violation_error_lists_rows_and_overflow():
    vs = [Violation.from_row([0, s, s, 1, 2, 3, 4, 1]) for s in range(3)]
    err = CanaryViolationError(vs, total=10, kept=3)
    assert isinstance(err, RuntimeError)
    lines = str(err).splitlines()
    assert lines[0] == "kv-canary: 3 new KV canary violation(s):"
    assert lines[1:4] == [str(v) for v in vs]
    assert lines[4] == "violation ring overflowed: 10 violations in total, only the first 3 rows kept"
    assert err.violations == vs and err.total == 10 and err.kept == 3


def test_format_violations_limits_lines():
    vs = [Violation.from_row([0, s, s, 1, 2, 3, 4, 1]) for s in range(30)]
    text = format_violations(vs, limit=5)
    assert text.splitlines()[-1] == "... and 25 more"
    assert len(text.splitlines()) == 6
