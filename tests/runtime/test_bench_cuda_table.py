"""bench/bench_cuda.py runs on a GPU only; its table is plain arithmetic, checked here: the byte-minimum share
of the copy bandwidth, ns per token of the writes, and the SM clock column (``-`` where a value is missing); and its
eager timing's guard against a late launch, on a fake stream and host clock; and the graphs it captures before
timing."""

from __future__ import annotations

import pytest

from support.bench_scripts import bench_module

bc = bench_module("bench_cuda")


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


class _FakeGpu:
    """One in-order stream and a host clock (µs): each op starts when both the stream is free and the host has
    enqueued it; an event's time is when the stream reaches it."""

    def __init__(self, kernel_us: float, host_us: list[float]):
        self.host = 0.0
        self.free = 0.0
        self.kernel_us = kernel_us
        self.host_us = host_us  # the host time of each fn() call, in call order (the last one repeats)
        self.calls = 0

    def enqueue(self, dur: float) -> float:
        self.host += 1.0
        start = max(self.free, self.host)
        self.free = start + dur
        return self.free

    def fn(self) -> None:
        self.host += self.host_us[min(self.calls, len(self.host_us) - 1)]
        self.calls += 1
        self.enqueue(self.kernel_us)


def test_eager_retakes_a_sample_the_sleep_did_not_cover(monkeypatch):
    """``Timer.eager``'s sleep is sized from three calls; a launch the host then enqueues later than the sleep
    covered puts GPU idle time between the events. Such a sample is taken again with a longer sleep, so a median
    over a host that slowed after the sizing is still the kernel's time."""
    gpu = _FakeGpu(kernel_us=100.0, host_us=[10.0] * 8 + [500.0])
    cycles_per_us = 1000.0

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = gpu.enqueue(0.0)

        def elapsed_time(self, end):
            return (end.t - self.t) / 1e3

    class Flush:
        def zero_(self):
            gpu.enqueue(50.0)

    monkeypatch.setattr(bc.torch.cuda, "Event", Event)
    monkeypatch.setattr(bc.torch.cuda, "_sleep", lambda cycles: gpu.enqueue(cycles / cycles_per_us))
    monkeypatch.setattr(bc.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bc.time, "perf_counter", lambda: gpu.host / 1e6)
    timer = object.__new__(bc.Timer)
    timer.retaken, timer.flush_buf, timer.cycles_per_us = 0, Flush(), cycles_per_us
    # 5 warmup calls and 3 sizing calls of 10 µs (a 53 µs sleep); then every call takes 500 µs of host time, more
    # than the GPU's backlog covers. Each sample is taken again at sleeps of 106, 212, 424 and 848 µs; the last covers
    # the launch. Taken once each, every sample would hold about 300 µs of waiting (402 µs in all).
    us = timer.eager(gpu.fn, runs=30, warmup=5)
    assert us == pytest.approx(100.0)
    assert timer.retaken == 4 * 30 and gpu.calls == 5 + 3 + 5 * 30


def test_settle_graphs_captures_graphs_before_anything_is_timed(monkeypatch):
    """A process's first graphs replay small kernels faster than every later one (docs/BENCHMARKS.md), so the timer
    captures ``GRAPHS_BEFORE_TIMING`` graphs before its first op is timed and reports the add's time per launch in
    the process's first graph and after them. Here a fake ``graph`` gets slower once graphs have been captured
    outside it, as the GPUs did."""
    events: list[tuple[object, ...]] = []

    def graph(self, fn, *, runs, reps):
        events.append(("timed", fn, runs, reps))
        return 2.0 if any(e[0] == "captured" for e in events) else 1.8

    def capture_graph(fn, reps, device):
        events.append(("captured", fn, reps))

    monkeypatch.setattr(bc.Timer, "graph", graph)
    monkeypatch.setattr(bc, "capture_graph", capture_graph)
    timer = object.__new__(bc.Timer)
    timer.device = "cuda:0"
    assert timer.settle_graphs() == (1.8, 2.0)
    n = bc.GRAPHS_BEFORE_TIMING
    assert n >= 2
    assert [(e[0], *e[2:]) for e in events] == [("timed", 30, 20)] + [("captured", 20)] * n + [("timed", 30, 20)]
    assert all(e[1] == timer.tiny for e in events)
