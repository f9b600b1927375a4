"""``python -m kvcanary demo``: the main job runs, stays clean and prints the detection table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvcanary import __main__ as cli
from kvcanary import faults
from kvcanary.testing.demo import DemoResult, pick_device
from kvcanary.testing.scenarios import FAULT_NAMES

ROOT = Path(__file__).resolve().parents[2]


def test_demo_command_prints_the_table_and_succeeds():
    proc = subprocess.run([sys.executable, "-m", "kvcanary", "demo", "--steps", "20"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    device = "cuda" if torch.cuda.is_available() and pick_device()[0] == "cuda" else "cpu"
    assert re.search(rf"^kvcanary demo - device: {device} \(", out, re.M)
    assert "violations on clean steps: 0 (device total 0)" in out
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^  (\w+)\s+(yes|NO)\s.*$", out, re.M)}
    assert set(rows) == set(FAULT_NAMES)
    for name, line in rows.items():
        assert re.match(rf"^  {name}\s+yes\s+\+\d+ steps?\s+[A-Z]+_[KV]_(FULL|SWA): [a-z_+]+", line), line
    assert "OK: clean steps stayed clean and every fault was detected as documented." in out
    assert "kv_canary violation: launch_tag=" in out
    # The speculative workload (two canaries) is clean, and the fault schedule's faults were all reported.
    assert re.search(r"^Speculative decoding \(EAGLE, up to 3 draft tokens\): 13 steps in [\d.]+ s: \d+ draft tokens "
                     r"verified, \d+ accepted, \d+ draft forwards$", out, re.M)
    assert re.search(r"^  violations on clean steps: 0$", out, re.M)
    m = re.search(r"^  (\d+) faults injected, (\d+) reported within \d+ steps \(bound 12\), 0 missed, "
                  r"0 violations on clean steps$", out, re.M)
    assert m and int(m.group(1)) == int(m.group(2)) > 0, out


def test_demo_fails_when_anything_is_missed_or_unclean():
    ok = DemoResult("cpu", 1, 0, [], 0, None)
    assert ok.ok
    assert not DemoResult("cpu", 1, 1, [], 0, None).ok
    assert not DemoResult("cpu", 1, 0, [], 2, None).ok
    empty = faults.FaultSchedule({"shift_position": 0.5})
    assert not DemoResult("cpu", 1, 0, [], 0, empty).ok           # a schedule that injected nothing proves nothing


def test_cli_usage_and_unknown_command(capsys):
    assert cli.main([]) == 2
    assert "usage: python -m kvcanary demo" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_pick_device_says_why_it_uses_the_cpu():
    dev, why = pick_device("cpu")
    assert (dev, why) == ("cpu", "CPU reference backend (requested)")
    dev, why = pick_device()
    if not torch.cuda.is_available():
        assert (dev, why) == ("cpu", "CPU reference backend (no CUDA GPU)")


def test_demo_on_the_transformers_engine():
    pytest.importorskip("transformers", reason="the transformers extra is not installed")
    proc = subprocess.run([sys.executable, "-m", "kvcanary", "demo", "--engine", "transformers", "--device", "cpu"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "violations: 0; tokens identical to the engine without the canary: True" in out
    from kvcanary.testing.transformers_engine import BUGS

    rows = {m.group(1): m.group(2) for m in re.finditer(r"^  (\w+)\s+(yes|NO)\s", out, re.M)}
    assert rows == dict.fromkeys(BUGS, "yes")
    assert "OK: the clean run stayed clean and every planted bug was reported as documented." in out
