"""Kernel sources edited for one test: a copy of ``kernels_cu/`` with one file changed, made the source that
``kvcanary.ops.cuda.specs`` compiles and reads its launch defines from (the tests' counterpart of
``bench/bench_cuda.py``'s ``use_kernels_dir``, undone when the test leaves the block)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from kvcanary.ops.cuda import grids, specs


def edited_copy(dst: Path, source_file: str, edit: Callable[[str], str]) -> Path:
    """A copy of the current ``kernels_cu/`` at ``dst`` whose ``source_file`` is ``edit(its text)``."""
    shutil.copytree(specs.kernels_dir(), dst)
    f = dst / source_file
    f.write_text(edit(f.read_text()))
    return dst


@contextlib.contextmanager
def kernels_from(path: Path) -> Iterator[Path]:
    """Within the block the library's kernel source is ``path``; the caches built from a kernel source (file
    texts, defines, grids: ``grids.clear_source_caches``) are cleared on entry and on exit. Compiled CuPy modules
    are not (they are keyed by spec, not by text): for the emulated kernels and compile-only tests, not for GPU
    launches."""
    original = specs.kernels_dir
    specs.kernels_dir = lambda: path  # type: ignore[assignment]
    grids.clear_source_caches()
    try:
        yield path
    finally:
        specs.kernels_dir = original  # type: ignore[assignment]
        grids.clear_source_caches()
