"""bench/bench_host.py is run on a GPU by tests/gpu/run_all.sh only: keep its CPU mode working, and its per-layer
real-KV sources what a TAIL step checks (the HEAD and TAIL medians are reported apart)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.bench_scripts import bench_module

ROOT = Path(__file__).resolve().parents[2]


def test_bench_host_reports_head_and_tail_with_a_source_pair_per_layer():
    r = subprocess.run([sys.executable, "bench/bench_host.py", "--device", "cpu", "--null-backend", "--bs", "4",
                        "--prefix", "16", "--layers", "3", "--steps", "40"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "3 layers (K and V real-KV sources of each)" in out, out
    row = re.search(r"^\| step K\+V FULL \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) / ([\d.]+) \| - \| - \|$",
                    out, re.M)
    assert row, out
    assert all(float(x) > 0 for x in row.groups())
    assert re.search(r"^\| verify op \(SGLang-named\) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| - \| - \| - \|$", out, re.M), out


def test_the_bench_canary_folds_every_layer_at_tail():
    bench_host = bench_module("bench_host")
    import torch

    e = bench_host.Engine(torch.device("cpu"), swa=False, bs=2, prefix=8, layers=3)
    folded = {id(s.tensor) for (tag, _), ctx in e.canary.state.contexts.items() if tag.phase == "tail"
              for s in ctx.real_kv_sources}
    assert folded == {id(t) for t in (*e.k_pools, *e.v_pools)} and len(folded) == 6
    assert not any(ctx.real_kv_sources for (tag, _), ctx in e.canary.state.contexts.items() if tag.phase == "head")
    assert not e.canary.poll(sync=True)  # the prefill and its verify are clean
