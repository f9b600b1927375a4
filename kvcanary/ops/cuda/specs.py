"""The compiled kernel specializations: which ``kernels_cu/*.cu`` file, with which defines, exporting what.

A :class:`KernelSpec` is one module handed to ``cupy.RawModule``: a family (``plan``, ``write``,
``verify``, ``scatter``), its source file, the compile-time defines that specialize it and the
``extern "C"`` entry points it exports. :meth:`KernelSpec.source` returns the *exact* text CuPy
compiles: the defines, then the ``.cu`` file with every local ``#include "x.cuh"`` inlined textually
(once each). Inlining means CuPy's on-disk cache (keyed by a hash of the source text and options)
sees a change in any header, and NVRTC needs no include path.

This module imports neither CuPy nor torch, so the CPU CI can compile every spec with NVRTC
exactly as CuPy would (:data:`NVRTC_OPTIONS` plus what CuPy adds, documented below).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# Options kvcanary passes to ``cupy.RawModule(code=..., options=NVRTC_OPTIONS)``.
#
# What CuPy 14.2 (NVRTC backend, RawModule from source, no jitify) hands NVRTC, observed on an H200 with
# CUDA 13 by wrapping ``cupy.cuda.compiler._NVRTCProgram.compile``, in this order:
#   -I<cupy>/_core/include/cupy/_cccl/cub  -I<cupy>/_core/include/cupy/_cccl/thrust
#   -I<cupy>/_core/include/cupy/_cccl/libcudacxx  <NVRTC_OPTIONS>  -I<cupy>/_core/include
#   -I<cuda toolkit>/include  -ftz=true  -arch=sm_XY  --device-as-default-execution-space
# (``-arch=compute_XY`` instead of ``sm_XY`` when ``CUPY_CUDA_COMPILE_WITH_PTX=1``; CuPy also compiles an
# empty program once with ``-arch=compute_XY`` to fingerprint the compiler). The include paths do not change
# the result (kvcanary's sources include nothing), so the CI check reproduces CuPy's compile with
# ``NVRTC_OPTIONS + ("-ftz=true", f"-arch=sm_{cc}", "--device-as-default-execution-space")``.
# ``-std=c++17`` is passed explicitly so the dialect does not depend on the NVRTC version's default.
NVRTC_OPTIONS: tuple[str, ...] = ("-std=c++17",)

# kernels_cu/ sits at the repository root and is installed as the package data ``kvcanary/kernels_cu``.
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")


def kernels_dir() -> Path:
    """The folder holding the ``.cu``/``.cuh`` sources (installed package data, else the source tree)."""
    package = Path(__file__).resolve().parents[2]  # kvcanary/ops/cuda -> kvcanary
    for candidate in (package / "kernels_cu", package.parent / "kernels_cu"):
        if (candidate / "consts.cuh").is_file():
            return candidate
    raise FileNotFoundError(
        "kv-canary: cannot find the CUDA sources (kernels_cu/consts.cuh) next to the kvcanary package; "
        f"looked in {package / 'kernels_cu'} and {package.parent / 'kernels_cu'}"
    )


def _inline(name: str, seen: set[str], out: list[str]) -> None:
    """Append ``name``'s lines to ``out`` with local includes inlined, each header at most once."""
    if name in seen:
        return
    seen.add(name)
    path = kernels_dir() / name
    text = path.read_text(encoding="utf-8")
    out.append(f'#line 1 "{name}"')
    for lineno, line in enumerate(text.splitlines(), start=1):
        m = _INCLUDE.match(line)
        if m:
            _inline(m.group(1), seen, out)
            out.append(f'#line {lineno + 1} "{name}"')
        elif _PRAGMA_ONCE.match(line):
            out.append("")  # keep line numbers; inlining already includes each header once
        else:
            out.append(line)


@cache
def _file_source(source_file: str) -> str:
    out: list[str] = []
    _inline(source_file, set(), out)
    return "\n".join(out) + "\n"


_INT_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)\s+(\d+)\s*$")


@cache
def int_define(source_file: str, name: str) -> int:
    """The value of ``#define NAME <integer>`` in ``source_file`` (launch geometry lives in the kernel
    source only; the launchers read it from there)."""
    for line in (kernels_dir() / source_file).read_text(encoding="utf-8").splitlines():
        m = _INT_DEFINE.match(line)
        if m and m.group(1) == name:
            return int(m.group(2))
    raise LookupError(f"kv-canary: no integer #define {name} in {source_file}")


def clear_source_caches() -> None:
    """Forget the kernel sources' texts and integer defines read so far (for a caller that points
    :func:`kernels_dir` at another copy of ``kernels_cu/``; :func:`kvcanary.ops.cuda.grids.clear_source_caches` also
    forgets the grids built from them)."""
    _file_source.cache_clear()
    int_define.cache_clear()


def set_int_define(text: str, name: str, value: int, where: str = "the text") -> str:
    """``text`` (a kernel source) with its one ``#define NAME <integer>`` line set to ``value`` (a trailing comment
    kept); ValueError unless there is exactly one such line (``where`` names the source in the message). For
    edited copies of the kernels: bench/tune_geometry.py's variants, the tests' switched sources."""
    out, n = re.subn(rf"^#define {name} \d+", f"#define {name} {value}", text, flags=re.M)
    if n != 1:
        raise ValueError(f"kv-canary: {where} has {n} lines '#define {name} <int>', not one")
    return out


@dataclass(frozen=True)
class KernelSpec:
    """One compiled module: ``source_file`` specialized by ``defines``, exporting ``entry_points``."""

    family: str
    source_file: str
    defines: tuple[tuple[str, str], ...]
    entry_points: tuple[str, ...]

    @property
    def key(self) -> str:
        """A stable, human-readable cache key, e.g. ``verify.cu[KVC_CHECK_TOKEN=1,KVC_HAS_REAL_KV=0]``."""
        return f"{self.source_file}[{','.join(f'{k}={v}' for k, v in self.defines)}]"

    @property
    def flags(self) -> tuple[bool | int, ...]:
        """The values this spec was built from, in define order (what :func:`spec_for` and the loader take)."""
        return tuple(int(v) if _flag_of(k) in _CHOICES else v == "1" for k, v in self.defines)

    def source(self) -> str:
        """The exact text compiled by NVRTC: the defines, then the file with its headers inlined."""
        head = "".join(f"#define {k} {v}\n" for k, v in self.defines)
        return f"// kvcanary kernel module {self.key}\n{head}{_file_source(self.source_file)}"


# family -> (source file, entry points, flag names in define order). Each flag becomes the define
# ``KVC_<FLAG>`` with value 0 or 1, except the integer parameters of _CHOICES (their value itself).
_FAMILIES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    # has_lut: swa_window_size > 0 (T(x) goes through full_to_swa_index_mapping);
    # has_pool: an expected-token pool is given.
    "plan": ("plan.cu", ("kvc_plan_verify_offsets", "kvc_plan_verify_entries", "kvc_plan_write_meta"),
             ("has_lut", "has_pool")),
    # input_assert: enable_write_input_assert; has_real_kv: real_kv_hash_mode != NONE and >= 1 source.
    "write": ("write.cu", ("kvc_write",), ("input_assert", "has_real_kv")),
    # check_token: check_verify_expected_token; has_real_kv as for write.
    "verify": ("verify.cu", ("kvc_verify",), ("check_token", "has_real_kv")),
    "scatter": ("scatter.cu", ("kvc_scatter",), ()),
    # Plan-free verify (SPEC §11): has_lut as for plan; check_token: check_verify_expected_token and a pool
    # given; has_real_kv: some context folds real KV; contexts as for write_table; flat32: the 32-bit modules
    # (verify_table.cu's KVC_VT_FLAT32_MAX_SEQ_LEN says when they apply; cuda/verify_table.py chooses).
    "verify_table": ("verify_table.cu", ("kvc_verify_from_table",),
                     ("has_lut", "check_token", "has_real_kv", "contexts", "flat32")),
    # Plan-free write (SPEC §12): input_assert and has_real_kv as for write (the LUT, read once per request for
    # the seed, is a runtime choice); contexts: the most contexts a launch of it takes (its per-context loops are
    # unrolled that far; see contexts_spec()).
    "write_table": ("write_table.cu", ("kvc_write_from_table",), ("input_assert", "has_real_kv", "contexts")),
    # Records that move with the KV (SPEC §13).
    "records": ("records.cu", ("kvc_gather_records", "kvc_scatter_records", "kvc_copy_records"), ()),
}

FAMILIES: tuple[str, ...] = tuple(_FAMILIES)

# Whether the verify's 32-bit modules (verify_table's flat32 specializations) are in use: the launchers take them
# where they fit (kvcanary.ops.cuda.verify_table.flat32_fits) and warmup() compiles them. On since they were timed
# (H200, 2026-12-05, docs/BENCHMARKS.md): never slower than the 64-bit modules in any case of bench/bench_cuda.py,
# A shuffled NONE in a graph 17.04 -> 15.93 us, A contiguous 14.42 -> 12.29, B contiguous 100.2 -> 89.0 (a clean
# 64-entry step 302 instructions against 407). The GPU tests run both kinds, and bench_cuda.py times the 64-bit
# modules beside them (verify_table_64). A prepared canary step reads it when it first sees a table.
FLAT32 = True

# Integer parameters: name -> the values compiled. ``contexts``: a verify or write from the table of one buffer or
# of a K/V pair compiles only that many contexts' code (measured on an H200, A decode write in a graph 5.2 -> 4.7 us
# with one context against the code for four), with each context's parameters at fixed offsets; 3 or 4 contexts
# share the general module.
_CHOICES: dict[str, tuple[int, ...]] = {"contexts": (1, 2, 4)}


def contexts_spec(n: int) -> int:
    """The ``contexts`` value of the module that launches ``n`` (1 .. 4) contexts: the smallest compiled one that
    holds them."""
    for c in _CHOICES["contexts"]:
        if n <= c:
            return c
    raise ValueError(f"kv-canary: a launch takes at most {_CHOICES['contexts'][-1]} contexts, got {n}")


def family_flags(family: str) -> tuple[str, ...]:
    """The flag names of ``family``, in define order."""
    if family not in _FAMILIES:
        raise ValueError(f"kv-canary: kernel family must be one of {FAMILIES}, got {family!r}")
    return _FAMILIES[family][2]


def _define_name(flag: str) -> str:
    return "KVC_" + flag.upper()


def _flag_of(define: str) -> str:
    return define[len("KVC_"):].lower()


def _choices(flag: str) -> tuple:
    return _CHOICES.get(flag, (False, True))


def _define_value(flag: str, value: bool | int) -> str:
    if flag in _CHOICES:
        if value not in _CHOICES[flag] or isinstance(value, bool):
            raise ValueError(f"kv-canary: {flag} must be one of {_CHOICES[flag]}, got {value!r}")
        return str(value)
    return "1" if value else "0"


def spec_for(family: str, **flags: bool | int) -> KernelSpec:
    """The spec of ``family`` with the given flags (every flag of the family must be given; the integer parameters
    of ``_CHOICES`` take one of their values)."""
    if family not in _FAMILIES:
        raise ValueError(f"kv-canary: kernel family must be one of {FAMILIES}, got {family!r}")
    source_file, entry_points, names = _FAMILIES[family]
    if set(flags) != set(names):
        raise ValueError(f"kv-canary: kernel family {family!r} takes flags {names}, got {tuple(sorted(flags))}")
    defines = tuple((_define_name(n), _define_value(n, flags[n])) for n in names)
    return KernelSpec(family, source_file, defines, entry_points)


def in_use(spec: KernelSpec) -> bool:
    """Whether a launcher can take ``spec``: every spec but the verify's 32-bit modules while :data:`FLAT32` is off
    (what :func:`kvcanary.warmup` compiles)."""
    return FLAT32 or spec.family != "verify_table" or not dict(zip(family_flags(spec.family), spec.flags))["flat32"]


@cache
def all_specs() -> tuple[KernelSpec, ...]:
    """Every specialization of every family (74 modules)."""
    specs = []
    for family, (_, _, names) in _FAMILIES.items():
        for values in itertools.product(*(_choices(n) for n in names)):
            specs.append(spec_for(family, **dict(zip(names, values))))
    return tuple(specs)
