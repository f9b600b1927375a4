"""Run kvcanary's CUDA kernels on the CPU: the real kernel sources, the real launchers and parameter packing.

:func:`build` compiles one :class:`~kvcanary.ops.cuda.specs.KernelSpec` (its exact source) with ``cuda_emu.h``
into a shared library (cached per source text); :func:`emulated_cuda` patches the CUDA backend so that its
launchers (``kvcanary.ops.cuda.*``) call those libraries instead of CuPy: a launch record validated from CPU
tensors then runs through the CUDA code path, pointers being host addresses. Used by
``tests/ops/test_kernels_emulated.py`` to check the kernels against the CPU reference without a GPU. The
emulation is slow (one OS thread per CUDA thread), so grids come from a small SM count.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from kvcanary.ops.cuda import specs

HERE = Path(__file__).resolve().parent
_CACHE = Path(tempfile.gettempdir()) / "kvcanary_cuda_emu"
_libs: dict[str, Any] = {}
TIMEOUT_S = float(os.environ.get("KVCANARY_EMU_TIMEOUT", "300"))


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


# The emulated kernels under AddressSanitizer and UndefinedBehaviorSanitizer (tests/ops/test_kernels_sanitized.py):
# every report stops the run (UBSan's too), so a finding cannot scroll past as a warning.
SANITIZER_CFLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer")


@functools.cache
def asan_runtime() -> str | None:
    """The compiler's AddressSanitizer runtime (``libasan.so``), or None (no compiler, or one without it, e.g.
    clang, whose runtime has another name). A Python that loads sanitized kernels must preload it: ASan's
    allocator has to come before every other library's. Asked once per process (the skip condition and every
    sanitized run read it)."""
    cxx = compiler()
    if cxx is None:
        return None
    proc = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=60)
    path = proc.stdout.strip()
    # gcc answers the bare name when it has no such file.
    return path if proc.returncode == 0 and os.path.isabs(path) and os.path.isfile(path) else None


def sanitized_env() -> dict[str, str] | None:
    """The environment of a Python process whose emulated kernels are built and run with ASan and UBSan, or None
    when the compiler has no ASan runtime. Both report on stderr (GCC's UBSan ignores a log path when ASan is
    loaded), so run pytest with ``-s`` there: a capture would hold the report when the process stops. Leak checks
    are off: the interpreter and torch keep allocations until exit by design."""
    runtime = asan_runtime()
    if runtime is None:
        return None
    env = dict(os.environ)
    env.update(LD_PRELOAD=runtime, KVCANARY_EMU_CFLAGS=" ".join(SANITIZER_CFLAGS), ASAN_OPTIONS="detect_leaks=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    return env


# The first line of an ASan report and of a UBSan one.
SANITIZER_FINDING = re.compile(r"ERROR: AddressSanitizer|runtime error: ")


def build(spec: specs.KernelSpec) -> Any:
    """The ctypes library running ``spec``'s kernels (``emu_launch(name, grid, block, params)``)."""
    driver = ['extern "C" int emu_launch(const char* name, int grid, int block, const void* params) {']
    for name in spec.entry_points:
        driver.append(f'    if (std::strcmp(name, "{name}") == 0) {{ emu_run({name}, grid, block, params); return 0; }}')
    driver += ["    return 1;", "}"]
    text = '#include "cuda_emu.h"\n' + spec.source() + "\n".join(driver) + "\n"
    extra = os.environ.get("KVCANARY_EMU_CFLAGS", "").split()  # SANITIZER_CFLAGS, or -fsanitize=thread
    key = hashlib.sha256((text + " ".join(extra)).encode()).hexdigest()[:24]
    if key in _libs:
        return _libs[key]
    _CACHE.mkdir(parents=True, exist_ok=True)
    so = _CACHE / f"{spec.family}_{key}.so"
    if not so.exists():
        src = _CACHE / f"{spec.family}_{key}.cpp"
        src.write_text(text)
        cxx = compiler()
        assert cxx is not None, "no C++ compiler"
        tmp = so.with_suffix(f".{os.getpid()}.tmp")
        cmd = [cxx, "-std=c++20", "-O1", "-g", "-pthread", "-shared", "-fPIC", "-w", *extra, "-I", str(HERE), str(src),
               "-o", str(tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"emulated build of {spec.key} failed:\n{proc.stderr[-4000:]}"
        os.replace(tmp, so)
    lib = ctypes.CDLL(str(so))
    lib.emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    lib.emu_launch.restype = ctypes.c_int
    _libs[key] = lib
    return lib


class EmuFunction:
    """What the launchers call in place of a ``cupy.cuda.function.Function``."""

    def __init__(self, spec: specs.KernelSpec, name: str):
        self.lib, self.name, self.spec = build(spec), name, spec
        self.launches: list[tuple[int, int]] = []

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0, stream: Any = None) -> None:
        (arg,) = args
        assert isinstance(arg, np.ndarray) and arg.size == 1, "one by-value struct argument"
        self.launches.append((grid[0], block[0]))
        result: list[int] = []
        # In a thread of its own, so that a kernel stuck at a barrier (a __syncthreads or warp collective not every
        # thread reaches, a deadlock on the GPU too) fails the test instead of hanging it.
        worker = threading.Thread(target=lambda: result.append(
            self.lib.emu_launch(self.name.encode(), int(grid[0]), int(block[0]), arg.ctypes.data)), daemon=True)
        worker.start()
        worker.join(TIMEOUT_S)
        assert not worker.is_alive(), (
            f"{self.name} ({self.spec.key}) did not finish in {TIMEOUT_S} s: a barrier or warp collective that not "
            "every thread reaches")
        assert result == [0], f"{self.name} is not an entry point of {self.spec.key}"


class _HostArray:
    """Stands in for a CuPy array: host memory with ``.data.ptr``."""

    def __init__(self, a: np.ndarray):
        self.a = np.ascontiguousarray(a)
        self.data = type("D", (), {"ptr": self.a.ctypes.data})()


class _FakeCupy:
    class cuda:  # mirrors CuPy's module layout
        class runtime:
            @staticmethod
            def getDevice() -> int:
                return -1

            @staticmethod
            def memsetAsync(ptr: int, value: int, size: int, stream: int) -> None:
                ctypes.memset(ptr, value, size)

            @staticmethod
            def streamIsCapturing(stream: int) -> bool:
                return False

        @staticmethod
        def Device(index: int) -> Any:
            return contextlib.nullcontext()

        @staticmethod
        def get_current_stream() -> Any:
            return type("S", (), {"synchronize": staticmethod(lambda: None)})()

    @staticmethod
    def asarray(a: np.ndarray) -> _HostArray:
        return _HostArray(a)


_LAUNCHERS = ("plan", "verify", "write", "scatter", "verify_table", "write_table", "records")


class EmuState:
    """``on``: whether the public ops on CPU arrays go to the (emulated) CUDA backend instead of the reference;
    ``launched``: (kernel, grid, block) of every emulated launch; ``specs``: the module each one ran."""

    def __init__(self) -> None:
        self.on = False
        self.launched: list[tuple[str, int, int]] = []
        self.specs: list[specs.KernelSpec] = []

    def modules(self, family: str) -> list[int]:
        """The ``contexts`` values of the modules of ``family`` launched so far, sorted, each once."""
        return sorted({dict(zip(specs.family_flags(s.family), s.flags))["contexts"] for s in self.specs if s.family == family})

    @contextlib.contextmanager
    def cuda(self):
        self.on = True
        try:
            yield self
        finally:
            self.on = False


class _EmuBackend:
    """The CUDA backend, on the stream handle 0 (no torch stream on the CPU)."""

    name = "cuda-emulated"

    def __init__(self) -> None:
        from kvcanary.ops.backends import CudaBackend

        self._b = CudaBackend()

    def __getattr__(self, op: str) -> Any:
        f = getattr(self._b, op)
        return lambda launch, stream=None: f(launch, 0)


@contextlib.contextmanager
def emulated_cuda(monkeypatch: Any, sms: int = 1):
    """Within the block, ``kvcanary.ops.cuda`` launchers run the emulated kernels on host memory, with grids
    sized for ``sms`` SMs, and the public ops on CPU arrays go to them while ``state.on`` (``with
    state.cuda(): ...``). Yields the :class:`EmuState`."""
    import importlib

    from kvcanary.ops import backends
    from kvcanary.ops.cuda import launch

    state = EmuState()
    launched = state.launched
    emu_backend = _EmuBackend()
    real = backends.backend_for

    def backend_for(device: Any) -> Any:
        return emu_backend if state.on else real(device)

    for mod in ("sglang_ops", "table_ops", "record_ops"):
        monkeypatch.setattr(importlib.import_module(f"kvcanary.ops.{mod}"), "backend_for", backend_for)
    functions: dict[tuple, EmuFunction] = {}

    def function(device_index: int, family: str, name: str, *flags: bool | int) -> Any:
        key = (family, name, flags)
        if key not in functions:
            spec = specs.spec_for(family, **dict(zip(specs.family_flags(family), flags)))
            functions[key] = EmuFunction(spec, name)
        fn = functions[key]

        def call(grid, block, args, shared_mem=0, stream=None):
            launched.append((name, grid[0], block[0]))
            state.specs.append(fn.spec)
            fn(grid, block, args, shared_mem, stream)

        return call

    monkeypatch.setattr(launch, "import_cupy", lambda: _FakeCupy)
    monkeypatch.setattr(launch, "_tables", {})
    monkeypatch.setattr(launch, "_ctx_cache", {})
    monkeypatch.setattr(launch, "_prepared", {})
    for mod in _LAUNCHERS:
        m = importlib.import_module(f"kvcanary.ops.cuda.{mod}")
        monkeypatch.setattr(m, "function", function)
        monkeypatch.setattr(m, "sm_count", lambda index, n=sms: n)
    yield state
