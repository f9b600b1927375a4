"""kernels_cu/consts.cuh and kvcanary/consts.py define the same constants (SPEC §2: once per language).

The header is parsed, not compiled: every ``constexpr <type> NAME = value;`` must equal ``kvcanary.consts.NAME``
and every member of every ``enum`` must equal the Python enum member of the same name (header members of
``RealKvHashMode`` carry a ``REAL_KV_`` prefix). Both directions are checked. The header keeps no ``#define``
(kernel code names its constants in namespace ``kvc``); a ``#define`` in it fails the check.
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

import pytest

import kvcanary
from kvcanary import consts

HEADER = Path(__file__).resolve().parents[2] / "kernels_cu" / "consts.cuh"

# Python-only values derived from header constants (not constants of the format themselves).
PYTHON_ONLY = {"U64_MASK", "ANCHOR_HASH"}
ENUM_PREFIX = {"RealKvHashMode": "REAL_KV_"}

SPEC_TABLE = {
    "CANARY_CHAIN_ANCHOR": 0xC0FFEE1234567890,
    "REQ_POOL_IDX_PADDING": 0,
    "TOKEN_TO_KV_SLOT_PADDING": 0,
    "CANARY_FIELDS_PER_SLOT": 4,
    "CANARY_SLOT_BYTES": 32,
    "VIOLATION_FIELDS": 8,
    "MAX_REAL_KV_SOURCES": 4,
}


def _int(text: str) -> int:
    text = text.strip()
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    text = re.sub(r"(?i)(ull|ul|ll|u|l)$", "", text)
    return int(text, 0)


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    return re.sub(r"//[^\n]*", "", src)


def parse_header(path: Path = HEADER) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    src = _strip_comments(path.read_text())
    defines = {}
    assert not [ln for ln in src.splitlines() if ln.strip().startswith("#define")], "consts.cuh has a #define"
    const_lines = [ln for ln in src.splitlines() if ln.strip().startswith("constexpr")]
    for ln in const_lines:
        m = re.fullmatch(r"\s*constexpr\s+(?:unsigned\s+|signed\s+)?(?:long\s+long|long|int|short|char)\s+"
                         r"([A-Za-z_]\w*)\s*=\s*(.+?)\s*;\s*", ln)
        assert m, f"unparsable constexpr: {ln!r}"
        defines[m.group(1)] = _int(m.group(2))
    enums = {}
    for m in re.finditer(r"enum\s+(?:class\s+)?([A-Za-z_]\w*)\s*(?::\s*\w+\s*)?\{(.*?)\}\s*;", src, flags=re.S):
        members = {}
        for item in m.group(2).split(","):
            item = item.strip()
            if not item:
                continue
            mm = re.fullmatch(r"([A-Za-z_]\w*)\s*=\s*(.+)", item)
            assert mm, f"enum {m.group(1)} member without an explicit value: {item!r}"
            members[mm.group(1)] = _int(mm.group(2))
        enums[m.group(1)] = members
    assert src.count("enum ") == len(enums), "an enum of the header was not parsed"
    return defines, enums


DEFINES, ENUMS = parse_header()


def test_header_parsed():
    assert len(DEFINES) >= len(SPEC_TABLE)
    assert set(ENUMS) == {"CanaryLaunchTag", "FailReason", "RealKvHashMode"}


@pytest.mark.parametrize("name", sorted(DEFINES))
def test_define_matches_python(name):
    assert hasattr(consts, name), f"{name} is defined in consts.cuh but missing from kvcanary.consts"
    assert getattr(consts, name) == DEFINES[name]


def test_every_python_constant_is_in_header():
    py = {k for k, v in vars(consts).items() if k.isupper() and isinstance(v, int) and not isinstance(v, enum.Enum)}
    missing = py - set(DEFINES) - PYTHON_ONLY
    assert not missing, f"kvcanary.consts constants missing from consts.cuh: {sorted(missing)}"


def test_spec_table():
    for name, value in SPEC_TABLE.items():
        assert DEFINES[name] == value, name
        assert getattr(consts, name) == value, name


@pytest.mark.parametrize("enum_name", ["CanaryLaunchTag", "FailReason", "RealKvHashMode"])
def test_enum_matches_python(enum_name):
    py_enum = getattr(consts, enum_name)
    prefix = ENUM_PREFIX.get(enum_name, "")
    header = ENUMS[enum_name]
    for member, value in header.items():
        assert member.startswith(prefix), f"{enum_name}.{member} lacks the {prefix!r} prefix"
        py_name = member[len(prefix):]
        assert py_name in py_enum.__members__, f"{enum_name}.{py_name} missing in Python"
        assert int(py_enum[py_name]) == value, f"{enum_name}.{py_name}"
    assert {prefix + m for m in py_enum.__members__} == set(header), f"{enum_name} members differ"


def test_spec_enum_values():
    tags = ["HEAD_K_FULL", "HEAD_V_FULL", "TAIL_K_FULL", "TAIL_V_FULL", "SWEEP_K_FULL", "SWEEP_V_FULL",
            "HEAD_K_SWA", "HEAD_V_SWA", "TAIL_K_SWA", "TAIL_V_SWA", "SWEEP_K_SWA", "SWEEP_V_SWA"]
    assert {m.name: int(m) for m in consts.CanaryLaunchTag} == {t: i for i, t in enumerate(tags)}
    with pytest.warns(DeprecationWarning, match="use kvcanary.CanaryLaunchTag"):
        assert kvcanary.LaunchTag is consts.CanaryLaunchTag  # the SPEC's spelling, kept importable
    assert {m.name: int(m) for m in consts.FailReason} == {
        "VERIFY_CHAIN_HASH_MISMATCH": 1, "VERIFY_POSITION_MISMATCH": 2, "VERIFY_REAL_KV_HASH_MISMATCH": 4,
        "WRITE_TOKEN_MISMATCH": 8, "WRITE_POSITION_MISMATCH": 16, "VERIFY_TOKEN_MISMATCH": 32,
        "SLOT_OUT_OF_RANGE": 64}
    assert {m.name: int(m) for m in consts.RealKvHashMode} == {"NONE": 0, "PARTIAL": 1, "ALL": 2}


def test_parser_catches_drift(tmp_path):
    """The parser itself: a changed value or a missing member in a copy of the header is seen."""
    text = HEADER.read_text()
    bad = tmp_path / "consts.cuh"
    assert "constexpr int VIOLATION_FIELDS = 8;" in text and "    REAL_KV_ALL = 2,\n" in text
    bad.write_text(text.replace("constexpr int VIOLATION_FIELDS = 8;", "constexpr int VIOLATION_FIELDS = 9;")
                   .replace("    REAL_KV_ALL = 2,\n", ""))
    defines, enums = parse_header(bad)
    assert defines["VIOLATION_FIELDS"] == 9 != consts.VIOLATION_FIELDS
    assert "REAL_KV_ALL" not in enums["RealKvHashMode"]
    assert _int("(-2)") == -2 and _int("0xC0FFEE1234567890ULL") == 0xC0FFEE1234567890
