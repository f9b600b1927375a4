"""CPU check (no GPU): every kernel specialization compiles with NVRTC exactly as CuPy's RawModule would.

Each :class:`kvcanary.ops.cuda.specs.KernelSpec` is compiled for sm_80 and sm_90 through the ``cuda-bindings``
NVRTC wrapper (the ``nvidia-cuda-nvrtc-cu12`` wheel supplies ``libnvrtc.so.12``; no driver or GPU needed),
with the options CuPy 14's ``RawModule(code=..., options=NVRTC_OPTIONS)`` hands NVRTC:

* ``NVRTC_OPTIONS`` (what kvcanary passes),
* ``-I<CuPy header dir>``, ``-I<CUDA include>``, the CCCL ``-I`` paths (``cupy._core.core.compile_with_cache``)
  - left out here: the sources are self-contained (no ``#include``, asserted below), so include paths
  cannot change what is compiled,
* ``-ftz=true`` (``cupy.cuda.compiler._compile_with_cache_cuda``),
* ``-arch=sm_XX`` (``_get_arch_for_options_for_nvrtc``: real-arch cubin whenever the arch is <= NVRTC's
  maximum, which holds for 80 and 90 on every NVRTC >= 12.0, unless ``CUPY_COMPILE_WITH_PTX`` is set),
* ``--device-as-default-execution-space`` (``_compile_using_nvrtc_no_warning`` with jitify off).

On top of these the check adds ``--ptxas-options=-v`` and ``--ptxas-options=--warn-on-spills``, which only
make ptxas report (registers, stack frame, spill bytes) and do not change the generated code. Because CuPy
asks for a real-arch cubin, ptxas runs inside NVRTC and its report lands in the program log. With NVRTC 12.9
and newer it also adds ``--no-cache``, so that ptxas runs (and reports) on every compile.

A specialization fails the check on a compile error, on any line in the log that is not a ptxas ``info``
line or a function-properties line (every NVRTC/ptxas warning or remark), on a spill (``N bytes spill
stores`` or ``spill loads`` > 0 for any function), or when the compiled entry functions are not exactly the
spec's ``entry_points``.

Where CuPy and a GPU are present (the device machine), ``test_option_model_matches_installed_cupy`` spies on
CuPy's own NVRTC call for one spec and checks that this option model is exactly what the installed CuPy
passes (less include paths); seen passing with CuPy 14.2 / NVRTC 13 on an H200.

The check is skipped only when the NVRTC library cannot be loaded at all (the reason is given); under CI
(``CI`` set, as ``.ci/run`` runs) that is a failure instead, so CI can never pass without compiling.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from support.bench_scripts import bench_module

ARCHS = ("80", "90")

# What CuPy 14.2 appends after the caller's options for RawModule(backend="nvrtc"), minus include paths
# (see the module docstring); the arch option sits between these two in CuPy's order.
CUPY_OPTIONS_BEFORE_ARCH = ("-ftz=true",)
CUPY_OPTIONS_AFTER_ARCH = ("--device-as-default-execution-space",)


def cupy_nvrtc_options(nvrtc_options: tuple[str, ...], arch: str, target: str = "sm") -> list[str]:
    """The option list CuPy gives NVRTC for ``RawModule(options=nvrtc_options)`` on an sm_``arch`` device
    (``target="compute"``: the same options asking for PTX of compute_``arch`` instead of a cubin)."""
    return [*nvrtc_options, *CUPY_OPTIONS_BEFORE_ARCH, f"-arch={target}_{arch}", *CUPY_OPTIONS_AFTER_ARCH]


def _load_nvrtc():
    """``(module, (major, minor), None)`` when NVRTC is usable here, else ``(None, None, reason)``."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        return None, None, f"cuda-bindings is not installed: {e}"
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # libnvrtc.so.* not found or not loadable
        return None, None, f"the NVRTC library cannot be loaded: {type(e).__name__}: {e}"
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return None, None, f"nvrtcVersion failed: {err}"
    return nvrtc, (major, minor), None


_NVRTC, _NVRTC_VERSION, _NVRTC_MISSING = _load_nvrtc()


def _report_options() -> tuple[str, ...]:
    """Report-only flags: ptxas's register/spill report goes to the NVRTC program log. NVRTC 12.9 and newer cache
    what they compiled where a driver is installed, and a program served from that cache runs no ptxas, so its log
    has no report (seen on the device machine: no entry function in the log of a compile repeated across two
    processes): ``--no-cache``."""
    opts = ("--ptxas-options=-v", "--ptxas-options=--warn-on-spills")
    if _NVRTC_VERSION is not None and _NVRTC_VERSION >= (12, 9):
        opts += ("--no-cache",)
    return opts


REPORT_OPTIONS = _report_options()


@pytest.fixture(scope="module")
def nvrtc():
    if _NVRTC is None:
        if os.environ.get("CI"):
            pytest.fail(f"NVRTC is required in CI (install the 'test' extra): {_NVRTC_MISSING}")
        pytest.skip(_NVRTC_MISSING)
    return _NVRTC


# ---------------------------------------------------------------------------------------------------------
# Compiling and reading the log
# ---------------------------------------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"^ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_PROPS_FOR_RE = re.compile(r"^ptxas info\s*: Function properties for (\S+)")
_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"^ptxas info\s*: Used (\d+) registers")


@dataclass
class CompileResult:
    ok: bool
    log: str
    cubin_bytes: int = 0
    entries: list[str] = field(default_factory=list)
    # function -> (stack frame bytes, spill store bytes, spill load bytes)
    frames: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    registers: list[int] = field(default_factory=list)
    # every log line that is neither a ptxas info line nor a function-properties line
    diagnostics: list[str] = field(default_factory=list)

    @property
    def spills(self) -> dict[str, tuple[int, int]]:
        return {f: (st, ld) for f, (_, st, ld) in self.frames.items() if st or ld}


def parse_log(log: str) -> CompileResult:
    res = CompileResult(ok=True, log=log)
    current = None
    for line in log.splitlines():
        if not line.strip():
            continue
        if m := _ENTRY_RE.match(line):
            res.entries.append(m.group(1))
        elif m := _PROPS_FOR_RE.match(line):
            current = m.group(1)
        elif line.startswith("ptxas") and (m := _SPILL_RE.search(line)):
            res.frames[current or "?"] = tuple(int(g) for g in m.groups())
        elif m := _REGS_RE.match(line):
            res.registers.append(int(m.group(1)))
        elif re.match(r"^ptxas info\s*:", line):
            pass  # gmem totals, compile time, ...
        else:
            res.diagnostics.append(line)
    return res


@contextlib.contextmanager
def nvrtc_program(nvrtc, source: str, name: str, options: list[str]) -> Iterator[tuple[object, object]]:
    """``source`` compiled by NVRTC with ``options``: yields (the compile's result code, the program), destroyed
    after the block."""
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"nvrtcCreateProgram: {err}"
    try:
        (rc,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        yield rc, prog
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def program_text(nvrtc, prog, what: str) -> str:
    """The program's log (``what`` = ``"ProgramLog"``) or PTX (``"PTX"``): ``nvrtcGet<what>Size``, then
    ``nvrtcGet<what>``."""
    err, size = getattr(nvrtc, f"nvrtcGet{what}Size")(prog)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"nvrtcGet{what}Size: {err}"
    buf = b" " * size
    (err,) = getattr(nvrtc, f"nvrtcGet{what}")(prog, buf)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"nvrtcGet{what}: {err}"
    return buf.rstrip(b"\0 ").decode(errors="replace")


def compile_nvrtc(nvrtc, source: str, name: str, options: list[str]) -> CompileResult:
    """Compile ``source`` to a cubin with NVRTC; return the parsed program log."""
    with nvrtc_program(nvrtc, source, name, options) as (rc, prog):
        res = parse_log(program_text(nvrtc, prog, "ProgramLog"))
        res.ok = rc == nvrtc.nvrtcResult.NVRTC_SUCCESS
        if res.ok:
            err, res.cubin_bytes = nvrtc.nvrtcGetCUBINSize(prog)
            assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"nvrtcGetCUBINSize: {err}"
        return res


# ---------------------------------------------------------------------------------------------------------
# The checker itself must be able to fail: a warning, a spill and an error are each caught.
# ---------------------------------------------------------------------------------------------------------

_SPILLY = r"""
extern "C" __global__ void spilly(unsigned long long* out, const unsigned long long* in, long long n) {
    unsigned long long a[40];
    #pragma unroll
    for (int i = 0; i < 40; ++i) a[i] = in[i * n + threadIdx.x];
    unsigned long long s = 0;
    #pragma unroll
    for (int r = 0; r < 4; ++r)
    #pragma unroll
    for (int i = 0; i < 40; ++i) { s = s * 0xBF58476D1CE4E5B9ULL ^ a[(i * 7 + r) % 40]; a[i] ^= s; }
    #pragma unroll
    for (int i = 0; i < 40; ++i) out[i * n + threadIdx.x] = a[i];
}
"""


def test_checker_reports_spills(nvrtc):
    opts = [*cupy_nvrtc_options((), "80"), "--maxrregcount=32", *REPORT_OPTIONS]
    res = compile_nvrtc(nvrtc, _SPILLY, "spilly.cu", opts)
    assert res.ok, res.log
    assert res.entries == ["spilly"], res.log
    assert "spilly" in res.spills and res.spills["spilly"][0] > 0, res.log
    assert any("spill" in d for d in res.diagnostics), res.log  # --warn-on-spills made it a warning too
    # the same kernel with the registers it needs: no spill, no diagnostic, a cubin
    clean = compile_nvrtc(nvrtc, _SPILLY, "spilly.cu", cupy_nvrtc_options((), "80") + list(REPORT_OPTIONS))
    assert clean.ok and not clean.spills and not clean.diagnostics and clean.cubin_bytes > 0, clean.log
    assert clean.registers and clean.registers[0] > 32


def test_checker_reports_warnings_and_errors(nvrtc):
    warn_src = 'extern "C" __global__ void w(int* o) { int unused; o[0] = 1; }\n'
    res = compile_nvrtc(nvrtc, warn_src, "w.cu", cupy_nvrtc_options((), "90") + list(REPORT_OPTIONS))
    assert res.ok and res.cubin_bytes > 0
    assert any("warning" in d for d in res.diagnostics), res.log
    bad = compile_nvrtc(nvrtc, 'extern "C" __global__ void b(int* o) { o[0] = ; }\n', "b.cu",
                        cupy_nvrtc_options((), "90") + list(REPORT_OPTIONS))
    assert not bad.ok and any("error" in d for d in bad.diagnostics), bad.log


# ---------------------------------------------------------------------------------------------------------
# Every kvcanary specialization, for each arch
# ---------------------------------------------------------------------------------------------------------

from kvcanary.ops.cuda import pdl  # noqa: E402 - the part of the file that needs it
from kvcanary.ops.cuda import specs as kspecs  # noqa: E402

_ALL_SPECS = list(kspecs.all_specs())


def test_specs_are_listed_and_distinct():
    assert _ALL_SPECS, "all_specs() returned nothing"
    keys = [s.key for s in _ALL_SPECS]
    assert len(set(keys)) == len(keys), f"duplicate spec keys: {keys}"
    opts = tuple(kspecs.NVRTC_OPTIONS)
    assert all(isinstance(o, str) for o in opts), opts
    # CuPy adds the arch itself; a second one would conflict with it
    assert not any(o.startswith(("-arch", "--gpu-architecture", "-gencode")) for o in opts), opts


def test_table_kernels_are_compiled_per_context_count():
    # A launch of n contexts runs the smallest module compiled for at least n: 1 -> 1, 2 -> 2, 3 and 4 -> 4.
    assert [kspecs.contexts_spec(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    with pytest.raises(ValueError, match="at most 4 contexts, got 5"):
        kspecs.contexts_spec(5)
    wt = [s for s in _ALL_SPECS if s.family == "write_table"]
    assert sorted({dict(s.defines)["KVC_CONTEXTS"] for s in wt}) == ["1", "2", "4"]
    assert len(wt) == 2 * 2 * 3  # input_assert x has_real_kv x contexts
    vt = [s for s in _ALL_SPECS if s.family == "verify_table"]
    assert sorted({dict(s.defines)["KVC_CONTEXTS"] for s in vt}) == ["1", "2", "4"]
    assert len(vt) == 2 * 2 * 2 * 3 * 2  # has_lut x check_token x has_real_kv x contexts x flat32
    assert len(_ALL_SPECS) == 74
    src = kspecs.spec_for("verify_table", has_lut=True, check_token=False, has_real_kv=False, contexts=1,
                          flat32=True).source()
    assert "#define KVC_CONTEXTS 1\n" in src and "#define KVC_HAS_LUT 1\n" in src and "#define KVC_FLAT32 1\n" in src
    src = kspecs.spec_for("write_table", input_assert=True, has_real_kv=False, contexts=2).source()
    assert "#define KVC_CONTEXTS 2\n" in src and "#define KVC_INPUT_ASSERT 1\n" in src
    # Every spec rebuilds from its own flags (what warmup() hands the loader).
    for spec in _ALL_SPECS:
        assert kspecs.spec_for(spec.family, **dict(zip(kspecs.family_flags(spec.family), spec.flags))) == spec
    assert kspecs.spec_for("write_table", input_assert=True, has_real_kv=False, contexts=4).flags == (True, False, 4)
    for bad in (3, True, 0):
        with pytest.raises(ValueError, match="contexts must be one of"):
            kspecs.spec_for("write_table", input_assert=False, has_real_kv=False, contexts=bad)


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm_{a}")
@pytest.mark.parametrize("spec", _ALL_SPECS, ids=lambda s: str(s.key))
def test_spec_compiles_clean(nvrtc, spec, arch):
    source = spec.source()
    # NVRTC has no standard headers and CuPy's include paths are left out above: the source must stand alone
    includes = [ln for ln in source.splitlines() if re.match(r"\s*#\s*include\b", ln)]
    assert not includes, f"{spec.key}: source still has #include lines: {includes}"
    opts = cupy_nvrtc_options(tuple(kspecs.NVRTC_OPTIONS), arch) + list(REPORT_OPTIONS)
    res = compile_nvrtc(nvrtc, source, f"{spec.family}.cu", opts)
    assert res.ok, f"{spec.key} sm_{arch}: compile failed\n{res.log}"
    assert res.cubin_bytes > 0
    # ptxas report, shown with `pytest -rP`: registers and stack frame per kernel
    print(f"{spec.key} sm_{arch}: registers {res.registers}, (stack, spill st, spill ld) {res.frames}")
    assert not res.spills, f"{spec.key} sm_{arch}: register spills (bytes stored, loaded) {res.spills}\n{res.log}"
    assert not res.diagnostics, f"{spec.key} sm_{arch}: warnings in the log:\n" + "\n".join(res.diagnostics)
    assert sorted(res.entries) == sorted(spec.entry_points), (
        f"{spec.key} sm_{arch}: compiled entry functions {sorted(res.entries)} != spec entry_points "
        f"{sorted(spec.entry_points)}"
    )


def compile_ptx(nvrtc, source: str, name: str, arch: str) -> str:
    """``source`` compiled by NVRTC to PTX for compute_``arch`` (CuPy's options otherwise)."""
    opts = cupy_nvrtc_options(tuple(kspecs.NVRTC_OPTIONS), arch, "compute")
    with nvrtc_program(nvrtc, source, name, opts) as (rc, prog):
        assert rc == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"{name}: {rc}\n{program_text(nvrtc, prog, 'ProgramLog')}"
        return program_text(nvrtc, prog, "PTX")


# A PTX instruction that touches memory other than the kernel's parameters, shared or local memory.
_MEMORY_OP = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld|st|atom|red|cp\.async|prefetch)\.(?!param|shared|local)", re.M)


def dependency_order(ptx: str, entry: str) -> tuple[int, int, int]:
    """Offsets, in ``entry``'s body, of its first ``griddepcontrol.launch_dependents``, first
    ``griddepcontrol.wait`` and first memory access (-1 where there is none)."""
    start = ptx.index(f".entry {entry}(")
    body = ptx[start:ptx.index("\n}\n", start)]
    mem = _MEMORY_OP.search(body)
    return (body.find("griddepcontrol.launch_dependents"), body.find("griddepcontrol.wait"),
            mem.start() if mem else -1)


@pytest.mark.parametrize("family", ["write_table", "verify_table"])
def test_plan_free_kernels_wait_before_any_memory_access(nvrtc, family, tmp_path):
    """kvcanary/ops/cuda/pdl.py launches these kernels to start before the kernel ahead of them has finished, so
    on sm_90 each must let its dependents go and wait before its first global access (common.cuh,
    kvc_grid_dependency); below sm_90 the instructions are not compiled in. Every specialization of the family."""
    family_specs = [s for s in _ALL_SPECS if s.family == family]
    for spec in family_specs:
        (entry,) = spec.entry_points
        go, wait, mem = dependency_order(compile_ptx(nvrtc, spec.source(), f"{family}.cu", "90"), entry)
        assert 0 <= go < wait < mem, f"{spec.key}: launch_dependents at {go}, wait at {wait}, first access at {mem}"
        assert "griddepcontrol" not in compile_ptx(nvrtc, spec.source(), f"{family}.cu", "80"), spec.key
    # The check can fail: without the call, the kernel's first access has no wait before it.
    from support.kernel_source import edited_copy, kernels_from

    source, define = pdl.DEFINES[family]
    call = f"kvc_grid_dependency<{define} != 0>();"
    dst = edited_copy(tmp_path / "no_wait", source, lambda text: text.replace(call, "", 1))
    with kernels_from(dst):
        spec = family_specs[0]
        src = kspecs.spec_for(family, **dict(zip(kspecs.family_flags(family), spec.flags))).source()
        assert call not in src
        go, wait, mem = dependency_order(compile_ptx(nvrtc, src, f"{family}.cu", "90"), spec.entry_points[0])
        assert go == wait == -1 and mem > 0


# ---------------------------------------------------------------------------------------------------------
# Where CuPy and a GPU are present (the device machine): the option model above is what CuPy really passes
# ---------------------------------------------------------------------------------------------------------


def test_option_model_matches_installed_cupy(monkeypatch):
    """Spy on CuPy's NVRTC program while ``RawModule`` compiles a spec; its options, less include paths,
    must be exactly :func:`cupy_nvrtc_options` for the GPU's arch. Skipped without CuPy and a CUDA GPU."""
    try:
        import cupy
        from cupy.cuda import compiler

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
    except Exception as e:
        pytest.skip(f"needs CuPy and a CUDA GPU: {type(e).__name__}: {e}")
    import uuid

    spec = _ALL_SPECS[0]
    # a comment makes the source unique, so CuPy's kernel cache misses and NVRTC really runs
    source = spec.source() + f"\n// kvcanary option probe {uuid.uuid4().hex}\n"
    seen = []
    original = compiler._NVRTCProgram.compile

    def spy(self, options=(), log_stream=None):
        seen.append((self.src, tuple(options)))
        return original(self, options, log_stream)

    monkeypatch.setattr(compiler._NVRTCProgram, "compile", spy)
    module = cupy.RawModule(code=source, options=tuple(kspecs.NVRTC_OPTIONS))
    module.get_function(spec.entry_points[0])
    used = [opts for src, opts in seen if src == source]
    assert len(used) == 1, f"expected one NVRTC compile of the probe source, saw {len(used)}"
    cc = cupy.cuda.Device().compute_capability
    got = [o for o in used[0] if not o.startswith("-I")]
    assert got == cupy_nvrtc_options(tuple(kspecs.NVRTC_OPTIONS), cc), (
        f"CuPy {cupy.__version__} passed {used[0]}; the CPU check models "
        f"{cupy_nvrtc_options(tuple(kspecs.NVRTC_OPTIONS), cc)} (+ include paths)"
    )


def test_warmup_loads_every_spec_by_its_flags(monkeypatch):
    # warmup() hands the loader each spec's flags; the loader rebuilds the spec from them (no GPU needed to check
    # that every spec, the integer-valued ones included, comes back as itself). It loads what the launchers can
    # take: the verify's 24 32-bit modules only while specs.FLAT32 is on.
    from kvcanary.ops.cuda import loader

    seen = []

    def fake_function(index, family, name, *flags):
        seen.append((kspecs.spec_for(family, **dict(zip(kspecs.family_flags(family), flags))), name))

    monkeypatch.setattr(loader, "function", fake_function)
    monkeypatch.setattr(loader, "_device_index", lambda device: 0)
    monkeypatch.setattr(loader, "sm_count", lambda index: 132)
    flat = [s for s in _ALL_SPECS if s.family == "verify_table" and dict(s.defines)["KVC_FLAT32"] == "1"]
    assert len(flat) == 24
    for on in (True, False):
        monkeypatch.setattr(kspecs, "FLAT32", on)
        seen.clear()
        n = loader.warmup(0)
        want = [(s, name) for s in _ALL_SPECS if on or s not in flat for name in s.entry_points]
        assert n == len(want) and seen == want


def test_tune_geometry_default_variants_compile_clean(nvrtc, tmp_path):
    """Every default variant of bench/tune_geometry.py (a device-only sweep) sets each of its defines once and
    compiles, one specialization each (no real KV, one context), so a sweep does not die on the device. Spills are
    allowed (some variants cap the registers low; the sweep reports them), any other warning is not."""
    from support.kernel_source import edited_copy, kernels_from

    tg = bench_module("tune_geometry")
    compiled = 0
    for kernel, (source, _, defines, variants, _, flags) in tg.KERNELS.items():
        for values in tg.parse_variants(kernel, variants):
            if not values:
                continue
            dst = edited_copy(tmp_path / f"{kernel}_{'_'.join(map(str, values))}", source,
                              lambda text, k=kernel, v=values: tg.variant_source(k, v, text))
            text = (dst / source).read_text()
            assert [int(re.search(rf"^#define {n} (\d+)", text, re.M).group(1)) for names, _ in zip(defines, values)
                    for n in names] == [v for names, v in zip(defines, values) for _ in names]
            spec_flags = flags(False)
            if kernel == "verify_table" and len(values) >= 5 and values[4] == 1:
                spec_flags["flat32"] = False  # KVC_VT_MUL3_ALL changes the 64-bit modules only
            with kernels_from(dst):
                spec = kspecs.spec_for(kernel, **spec_flags)
                opts = cupy_nvrtc_options(tuple(kspecs.NVRTC_OPTIONS), "90") + list(REPORT_OPTIONS)
                res = compile_nvrtc(nvrtc, spec.source(), source, opts)
            other = [d for d in res.diagnostics if "Registers are spilled" not in d]
            assert res.ok and res.cubin_bytes > 0 and not other, f"{kernel} {values}\n{res.log}"
            compiled += 1
    assert compiled >= 10
    assert tg.parse_variants("write_table", "shipped, 256x1x4x1x0") == [(), (256, 1, 4, 1, 0)]
    assert tg.variant_source("write_table", (), "#define KVC_WT_THREADS 256\n") == "#define KVC_WT_THREADS 256\n"
    assert tg.parse_variants("verify_table", "2x4,2x4x0,2x4x1x1") == [(2, 4), (2, 4, 0), (2, 4, 1, 1)]
    assert tg.parse_variants("verify_table", "2x4x1x4x0x0x1x1") == [(2, 4, 1, 4, 0, 0, 1, 1)]
    assert tg.parse_variants("verify_table", "2x4x1x4x0x0x1x1x1") == [(2, 4, 1, 4, 0, 0, 1, 1, 1)]
    # the ninth number sets the switch of the 32-bit and of the 64-bit modules
    both = tg.variant_source("verify_table", (2, 4, 1, 4, 0, 0, 1, 1, 7),
                             (kspecs.kernels_dir() / "verify_table.cu").read_text())
    for name in ("KVC_VT_HASH_ILP", "KVC_VT_HASH_ILP_64"):
        assert re.search(rf"^#define {name} 7$", both, flags=re.M), name
    with pytest.raises(ValueError, match="more than 9 numbers"):
        tg.parse_variants("verify_table", "2x4x1x1x1x1x1x1x1x1")
    with pytest.raises(ValueError, match="more than 7 numbers"):
        tg.parse_variants("write_table", "shipped,256x1x4x1x1x1x1x1")
    short = tg.variant_source("write_table", (128,), "#define KVC_WT_THREADS 256\n#define KVC_WT_SPREAD 1\n")
    assert short == "#define KVC_WT_THREADS 128\n#define KVC_WT_SPREAD 1\n"
    with pytest.raises(ValueError, match="has 0 lines '#define KVC_WT_THREADS <int>'"):
        tg.variant_source("write_table", (256, 1, 4, 1, 1), "#define KVC_WT_THREAD 256\n")


def test_probe_write_parts_variants_compile(nvrtc, tmp_path):
    """Every default variant of bench/probe_write_parts.py (a device-only probe) finds each of its edits once in
    today's write_table.cu and compiles (one context, no real KV), so the probe does not die on the device; its
    variant parser refuses unknown cuts and cuts without the cut they need."""
    from support.kernel_source import edited_copy, kernels_from

    pw = bench_module("probe_write_parts")
    variants = pw.parse(pw.DEFAULT)
    assert set(c for v in variants for c in v) == set(pw.CUTS)  # the defaults use every cut
    for cuts in variants:
        dst = edited_copy(tmp_path / pw.label(cuts), pw.SOURCE, lambda text, c=cuts: pw.cut_source(text, c))
        if cuts:
            assert (dst / pw.SOURCE).read_text() != (kspecs.kernels_dir() / pw.SOURCE).read_text()
        with kernels_from(dst):
            spec = kspecs.spec_for("write_table", input_assert=False, has_real_kv=False, contexts=1)
            opts = cupy_nvrtc_options(tuple(kspecs.NVRTC_OPTIONS), "90") + list(REPORT_OPTIONS)
            res = compile_nvrtc(nvrtc, spec.source(), pw.SOURCE, opts)
        assert res.ok and res.cubin_bytes > 0, f"{pw.label(cuts)}\n{res.log}"
    with pytest.raises(ValueError, match="unknown cut 'nope'"):
        pw.parse("shipped,nope")
    with pytest.raises(ValueError, match="cut 'barrier' needs 'loops'"):
        pw.parse("counters+barrier")
    with pytest.raises(ValueError, match="found 0 times"):
        pw.cut_source("// no kernel here\n", ("flags",))
