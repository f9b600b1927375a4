"""Kernel sources edited for one test: a copy of ``kernels_cu/`` with one file changed, made the source that
``kvcanary.ops.cuda.specs`` compiles and reads its launch defines from (the tests' counterpart of
``bench/bench_cuda.py``'s ``use_kernels_dir``, undone when the test leaves the block)."""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from kvcanary.ops.cuda import grids, specs


def set_define(text: str, name: str, value: int) -> str:
    """``text`` with its one ``#define name <int>`` line set to ``value`` (asserts there is exactly one)."""
    out, n = re.subn(rf"^#define {name} \d+", f"#define {name} {value}", text, flags=re.M)
    assert n == 1, f"{n} lines '#define {name} <int>'"
    return out


def edited_copy(dst: Path, source_file: str, edit: Callable[[str], str]) -> Path:
    """A copy of the current ``kernels_cu/`` at ``dst`` whose ``source_file`` is ``edit(its text)``."""
    shutil.copytree(specs.kernels_dir(), dst)
    f = dst / source_file
    f.write_text(edit(f.read_text()))
    return dst


def _clear_source_caches() -> None:
    for fn in (specs._file_source, specs.int_define, grids.verify_table_grid, grids.write_table_grid):
        fn.cache_clear()


@contextlib.contextmanager
def kernels_from(path: Path) -> Iterator[Path]:
    """Within the block the library's kernel source is ``path``; the caches built from a kernel source (file
    texts, defines, the plan-free grids) are cleared on entry and on exit. Compiled CuPy modules are not (they are
    keyed by spec, not by text): for the emulated kernels and compile-only tests, not for GPU launches."""
    original = specs.kernels_dir
    specs.kernels_dir = lambda: path  # type: ignore[assignment]
    _clear_source_caches()
    try:
        yield path
    finally:
        specs.kernels_dir = original  # type: ignore[assignment]
        _clear_source_caches()
