"""The scripts of ``bench/`` (not a package) as modules, for the CPU tests that keep them working."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    """Module ``name`` of ``bench/``, imported with ``bench/`` on ``sys.path`` for the import only (a script that
    imports its neighbours later puts its own folder on the path itself)."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
