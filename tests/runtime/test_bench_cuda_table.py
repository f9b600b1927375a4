"""bench/bench_cuda.py runs on a GPU only; its table is plain arithmetic, checked here: the byte-minimum share
of the copy bandwidth, ns per token of the writes, and the SM clock column (``-`` where a value is missing)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
try:
    import bench_cuda as bc
finally:
    sys.path.remove(str(ROOT / "bench"))


def _cells(table: str, op: str) -> list[str]:
    line = next(x for x in table.splitlines() if f"| {op} |" in x)
    return [c.strip() for c in line.strip("|").split("|")]


def test_table_columns():
    head = bc.table([], 4000.0).splitlines()[0]
    names = [c.strip() for c in head.strip("|").split("|")]
    assert names[-1] == "SM MHz" and names.index("graph % copy") == 9
    units = 1 << 20
    rows = [bc.Row("A", "shuffled", "PARTIAL", "verify_table", units, 40.0, 20.0, 12.5, 1980.4),
            bc.Row("A", "shuffled", "NONE", "write_table", 256, 7.0, 2.5, None, None)]
    table = bc.table(rows, 4000.0)
    v = _cells(table, "verify_table")
    # 68 B per entry in PARTIAL (36 + 32) over 4000 GB/s: units * 68 B / 20 µs is 3565 GB/s, 89.1 % of it
    assert v[5] == "68" and v[6:8] == ["40.00", "20.00"]
    assert v[9] == f"{100 * 68 * units / 20e3 / 4000:.1f}" == "89.1"
    assert v[10] == "12.5" and v[11] == "-" and v[12] == "1980"
    w = _cells(table, "write_table")
    # latency-bound: no byte share; ns per token from the better of eager and graph over A's one token per row
    assert w[5] == "-" and w[8] == w[9] == "-" and w[10] == "-"
    assert w[11] == f"{2.5 * 1e3 / bc.SHAPES['A']['extend']:.1f}" and w[12] == "-"
