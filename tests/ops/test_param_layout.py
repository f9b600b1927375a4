"""The kernel parameter structs: ``kernels_cu/params.cuh`` (C) against ``kvcanary.ops.cuda.params`` (Python).

A generated C++ program includes ``params.cuh`` and prints ``sizeof`` of every struct and ``sizeof`` /
``offsetof`` of every field the Python field lists name (a field missing in C does not compile), plus the
constants Python mirrors. Each is compared with the NumPy dtype built from the Python field list (C alignment
rules), so a reordered, added, removed or resized field on either side fails here instead of silently
shifting kernel arguments. ``Struct.pack`` is checked against the same dtype: packed words read back through
the dtype give every field its value.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kvcanary.ops.cuda import params

KERNELS = Path(__file__).resolve().parents[2] / "kernels_cu"


def _cxx() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _program() -> str:
    lines = ["#include <cstdio>", "#include <cstddef>", '#include "params.cuh"', "int main() {"]
    for s in params.ALL_STRUCTS:
        lines.append(f'    std::printf("struct {s.name} %zu\\n", sizeof({s.name}));')
        for f in s.fields:
            lines.append(f'    std::printf("field {s.name} {f.name} %zu %zu\\n", sizeof((({s.name}*)nullptr)->{f.name}), '
                         f"offsetof({s.name}, {f.name}));")
    for name in ("kMaxContexts", "kSourceDescFields", "kSrcPtr", "kSrcPageSize", "kSrcBytesPerToken", "kSrcRowStride",
                 "kSrcFoldBytes", "kSrcNumRows"):
        lines.append(f'    std::printf("const {name} %d\\n", (int)kvc::{name});')
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> dict:
    cxx = _cxx()
    if cxx is None:
        if os.environ.get("CI"):
            pytest.fail("no C++ compiler found; CI must check the parameter layout")
        pytest.skip("no C++ compiler (g++, c++ or clang++) found")
    tmp = tmp_path_factory.mktemp("param_layout")
    src, exe = tmp / "layout.cpp", tmp / "layout"
    src.write_text(_program())
    cmd = [cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-Wno-invalid-offsetof", "-I", str(KERNELS), str(src),
           "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"host compile of params.cuh failed:\n{' '.join(cmd)}\n{proc.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout
    got: dict = {"struct": {}, "field": {}, "const": {}}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "struct":
            got["struct"][rest[0]] = int(rest[1])
        elif kind == "field":
            got["field"][(rest[0], rest[1])] = (int(rest[2]), int(rest[3]))
        else:
            got["const"][rest[0]] = int(rest[1])
    return got


@pytest.mark.parametrize("struct", params.ALL_STRUCTS, ids=lambda s: s.name)
def test_struct_layout_matches_c(layout, struct):
    dt = struct.dtype
    assert layout["struct"][struct.name] == dt.itemsize == struct.nbytes, (
        f"{struct.name}: C sizeof {layout['struct'][struct.name]}, NumPy {dt.itemsize}, "
        f"{struct.words} words of 8 bytes")
    for f in struct.fields:
        size, offset = layout["field"][(struct.name, f.name)]
        field_dtype, field_offset = dt.fields[f.name][:2]
        assert (size, offset) == (field_dtype.itemsize, field_offset), (
            f"{struct.name}.{f.name}: C (sizeof, offsetof) = ({size}, {offset}), NumPy ({field_dtype.itemsize}, "
            f"{field_offset})")
    # Words in field order with no padding: each field starts where the previous one ends.
    ends = [layout["field"][(struct.name, f.name)] for f in struct.fields]
    starts = [0] + [o + s for s, o in ends[:-1]]
    assert [o for _, o in ends] == starts, f"{struct.name} has padding between fields"


def test_constants_match_c(layout):
    c = layout["const"]
    assert c["kMaxContexts"] == params.MAX_CONTEXTS
    assert c["kSourceDescFields"] == params.SOURCE_DESC_FIELDS
    assert [c[n] for n in ("kSrcPtr", "kSrcPageSize", "kSrcBytesPerToken", "kSrcRowStride", "kSrcFoldBytes",
                           "kSrcNumRows")] == [params.SRC_PTR, params.SRC_PAGE_SIZE, params.SRC_BYTES_PER_TOKEN,
                                               params.SRC_ROW_STRIDE, params.SRC_FOLD_BYTES, params.SRC_NUM_ROWS]


def _values(struct: params.Struct, rng: np.random.Generator) -> tuple[dict, dict]:
    """Random keyword values for ``struct.pack`` and the same values per field as NumPy arrays."""
    kw, expect = {}, {}
    for f in struct.fields:
        words = rng.integers(-(1 << 62), 1 << 62, f.words, dtype=np.int64) if f.kind == params.I64 else \
            rng.integers(0, 1 << 48, f.words, dtype=np.int64)
        if isinstance(f.kind, str) and f.count == 1:
            kw[f.name] = int(words[0])
        else:
            kw[f.name] = [int(w) for w in words]
        expect[f.name] = words
    return kw, expect


@pytest.mark.parametrize("struct", params.ALL_STRUCTS, ids=lambda s: s.name)
def test_pack_matches_dtype(struct):
    rng = np.random.default_rng(sum(map(ord, struct.name)))
    kw, expect = _values(struct, rng)
    words = struct.pack(**kw)
    assert len(words) == struct.words
    rec = np.array(words, dtype=np.int64).view(struct.dtype)[0]
    for name, want in expect.items():
        got = np.frombuffer(np.ascontiguousarray(rec[name]).tobytes(), dtype=np.int64)
        np.testing.assert_array_equal(got, want, err_msg=f"{struct.name}.{name}")


def test_pack_rejects_missing_unknown_and_short_fields():
    kw, _ = _values(params.VERIFY_TABLE, np.random.default_rng(1))
    params.VERIFY_TABLE.pack(**kw)
    with pytest.raises(TypeError, match="num_contexts"):
        params.VERIFY_TABLE.pack(**{k: v for k, v in kw.items() if k != "num_contexts"})
    with pytest.raises(TypeError, match="bogus"):
        params.VERIFY_TABLE.pack(**kw, bogus=1)
    with pytest.raises(ValueError, match="ctx needs 52 words, got 51"):
        params.VERIFY_TABLE.pack(**{**kw, "ctx": kw["ctx"][:-1]})
    with pytest.raises(TypeError):
        params.CONTEXT.pack(*range(params.CONTEXT.words))  # keyword-only: no positional binding


def test_kernel_arg_bytes():
    words = list(range(-3, 20))
    arg = params.kernel_arg(words)
    assert arg.shape == (1,) and arg.size == 1  # CuPy passes size-one NumPy arrays by value
    assert arg.tobytes() == np.array(words, dtype="<i8").tobytes()
    assert arg.dtype.names is None  # raw bytes: CuPy's __array_interface__ stays cheap
