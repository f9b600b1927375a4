"""Set-up of the GPU tests: everything under ``tests/gpu`` is *skipped* (never failed) without CuPy, a CUDA
build of torch or a CUDA GPU, and individual tests are skipped by capability:

* ``@pytest.mark.min_gpus(n)``: needs at least ``n`` GPUs;
* ``@pytest.mark.min_compute_capability(m)``: needs compute capability >= ``m`` (e.g. ``90``) on GPU 0.

Every kernel needs sm_70 or newer (warp-synchronous intrinsics, independent thread scheduling), so the
whole directory is skipped below that. ``KVCANARY_GPU_SMALL=1`` shrinks the sizes (used under
compute-sanitizer, which is much slower); see ``support.gpu_util.size``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
_MIN_CC = 70


def _probe() -> tuple[str | None, int, int]:
    """(reason to skip or None, number of GPUs, compute capability of GPU 0 as major*10+minor)."""
    try:
        import torch
    except Exception as e:  # pragma: no cover - torch is a hard dependency
        return f"torch not importable: {e}", 0, 0
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch", 0, 0
    try:
        import cupy
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as e:
        return f"CuPy not usable ({type(e).__name__}: {e})", 0, 0
    if n == 0:
        return "no CUDA GPU visible to CuPy", 0, 0
    major, minor = torch.cuda.get_device_capability(0)
    cc = 10 * major + minor
    if cc < _MIN_CC:
        return f"GPU 0 has compute capability {cc}, kvcanary's kernels need >= {_MIN_CC}", n, cc
    return None, n, cc


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "min_gpus(n): needs at least n CUDA GPUs")
    config.addinivalue_line("markers", "min_compute_capability(m): needs compute capability >= m on GPU 0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [it for it in items if _HERE in Path(str(it.fspath)).resolve().parents]
    if not mine:
        return
    reason, n_gpus, cc = _probe()
    for it in mine:
        if reason is not None:
            it.add_marker(pytest.mark.skip(reason=reason))
            continue
        m = it.get_closest_marker("min_gpus")
        if m is not None and n_gpus < m.args[0]:
            it.add_marker(pytest.mark.skip(reason=f"needs {m.args[0]} GPUs, found {n_gpus}"))
        m = it.get_closest_marker("min_compute_capability")
        if m is not None and cc < m.args[0]:
            it.add_marker(pytest.mark.skip(reason=f"needs compute capability >= {m.args[0]}, GPU 0 has {cc}"))


@pytest.fixture(scope="session")
def cuda_ready():
    """Compile and load every kernel on GPU 0 once (also exercises ``kvcanary.warmup``)."""
    import kvcanary as kc

    n = kc.warmup(device=0)
    assert n >= 13
    return n
