"""The emulated kernels under AddressSanitizer and UndefinedBehaviorSanitizer: a memcheck on the CPU.

``test_kernels_emulated.py`` runs again in a Python process that preloads the compiler's ASan runtime, with every
kernel library built with ``-fsanitize=address,undefined`` (``support.cuda_emu.sanitized_env``). The first report
stops that run:

* a read or write past any tensor a kernel is given (torch gives each tensor its own heap block, which ASan
  surrounds with guard bytes) or past a ``__shared__`` array (function statics in the emulation, also guarded);
* signed overflow, an out-of-range shift, a misaligned or null access: undefined behaviour in CUDA C++ too, which
  nvcc may compile into anything.

compute-sanitizer's memcheck on the GPU stays the reference (the GPU's own addressing, the real ``__shared__``);
this pass runs wherever the CPU suite runs, CI included, where no GPU is. Its limit: a wrong index that still lands
inside the same tensor is no memory error, so the differential tests' byte comparison has to catch it.

The other tests show that the wiring catches something: ``sanitizer_probe.py`` plants, in the write from the table, a
read one row past the batch, a signed overflow and a read past a ``__shared__`` array, none of which changes a result.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.cuda_emu import SANITIZER_FINDING, asan_runtime, compiler, sanitized_env

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

pytestmark = pytest.mark.skipif(compiler() is None or asan_runtime() is None,
                                reason="no C++ compiler with an AddressSanitizer runtime")


def _pytest_sanitized(module: str, timeout: float, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """``pytest -s tests/ops/<module> *args`` in a sanitized Python; the completed process and the sanitizer
    report in its stderr ("" when none: no line of ``SANITIZER_FINDING``)."""
    env = sanitized_env()
    assert env is not None
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(HERE / module),
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    found = SANITIZER_FINDING.search(proc.stderr)
    return proc, proc.stderr[found.start():][:8000] if found else ""


def test_emulated_kernels_under_sanitizers():
    proc, reports = _pytest_sanitized("test_kernels_emulated.py", 2400)
    assert not reports, f"sanitizer report(s):\n{reports}"
    assert proc.returncode == 0, f"rc {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 100 and "skipped" not in summary, summary


@pytest.mark.parametrize("bug, finding", [
    ("read_past_the_batch", r"AddressSanitizer: heap-buffer-overflow.*\nREAD of size 8"),
    ("signed_overflow", r"runtime error: signed integer overflow"),
    ("read_past_shared", r"AddressSanitizer: global-buffer-overflow.*\nREAD of size 8"),
])
def test_sanitizers_catch_a_planted_bug(bug, finding):
    proc, reports = _pytest_sanitized("sanitizer_probe.py", 600, "-k", bug)
    assert proc.returncode != 0, f"the planted {bug} went unseen:\n{proc.stdout[-4000:]}"
    assert re.search(finding, reports), reports or proc.stdout[-4000:]
    # The report names the kernel function and the kernel source file with the line.
    assert re.search(r"kvc_wt_rows<.*write_table\.cu:\d+", reports), reports
