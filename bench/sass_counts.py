"""Static counts of every kernel module's machine code, and whether it is the same as at another commit.

No GPU needed. Each module of ``kvcanary.ops.cuda.specs.all_specs()`` (the exact text CuPy compiles) is compiled
by nvcc to a cubin for one arch with the options CuPy uses (``specs.NVRTC_OPTIONS`` and ``-ftz=true``), and
cuobjdump reads it: registers, static shared memory, local memory per thread (stack and spills), the number of
SASS instructions (every instruction line of ``cuobjdump -sass``, the end's padding included) and a hash of the
SASS text. Run from the repository root::

    python3 bench/sass_counts.py                                  # every module, sm_90
    python3 bench/sass_counts.py --family verify_table --against HEAD~2

``--against REV`` compiles the modules of the tree at REV too (``git archive`` of ``kernels_cu`` and
``kvcanary/ops/cuda/specs.py``) and says per module whether its SASS is the same there; a flag that one tree's
family lacks counts as 0 (off) in it, so a new flag's off state is compared with the module before the flag. The
script exits with status 1 when a module does not compile.

Needs nvcc (``--nvcc``, else PATH, ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``) and cuobjdump with nvdisasm
beside it or on PATH (a CUDA toolkit, or the wheels ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``,
whose ``nvidia/cu*/bin`` folders are searched too). Counts depend on the compiler version, which the table's
header names; CuPy compiles with the NVRTC of its CUDA, which gives the same code as the nvcc of that version.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s")
_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


@dataclass(frozen=True)
class Counts:
    registers: int  # the most of any entry point of the module
    shared: int     # static shared memory, bytes (the most of any entry point)
    local: int      # stack + local memory per thread, bytes (spills land here)
    instructions: int
    sass_hash: str


def _tool(name: str, explicit: str | None) -> str:
    """The path of CUDA tool ``name``: ``explicit``, else PATH, the CUDA install, or an NVIDIA wheel's folder."""
    if explicit:
        return explicit
    found = shutil.which(name)
    if found:
        return found
    folders = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin"]
    folders += sorted(Path(sysconfig.get_paths()["purelib"]).glob("nvidia/*/bin"))
    for folder in folders:
        if (folder / name).is_file():
            return str(folder / name)
    raise SystemExit(f"sass_counts: {name} not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, nvidia/*/bin wheels)")


def _load_specs(tree: Path):
    """``kvcanary/ops/cuda/specs.py`` of ``tree`` as a module of its own (it imports only the standard library and
    finds the sources at ``tree/kernels_cu``)."""
    path = tree / "kvcanary" / "ops" / "cuda" / "specs.py"
    spec = importlib.util.spec_from_file_location(f"_specs_{abs(hash(str(tree)))}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"sass_counts: no {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def module_id(spec) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What identifies a module across trees: its source file and the defines that are not 0."""
    return spec.source_file, tuple(d for d in spec.defines if d[1] != "0")


def count_sass(sass: str) -> int:
    """The instruction lines of ``cuobjdump -sass`` output."""
    return sum(1 for line in sass.splitlines() if _INSTRUCTION.match(line))


def parse_resources(text: str) -> tuple[int, int, int]:
    """(registers, static shared bytes, stack + local bytes), the most over the functions of ``cuobjdump -res-usage``
    output."""
    rows = [tuple(int(g) for g in m.groups()) for m in _RESOURCES.finditer(text)]
    if not rows:
        raise ValueError("no function resource lines in the cuobjdump -res-usage output")
    return max(r[0] for r in rows), max(r[2] for r in rows), max(r[1] + r[3] for r in rows)


def compile_counts(source: str, options: list[str], nvcc: str, cuobjdump: str, workdir: Path, name: str) -> Counts:
    cu, cubin = workdir / f"{name}.cu", workdir / f"{name}.cubin"
    cu.write_text(source, encoding="utf-8")
    done = subprocess.run([nvcc, "-cubin", *options, "-o", str(cubin), "-x", "cu", str(cu)], capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(done.stderr.strip() or done.stdout.strip())
    env = {**os.environ, "PATH": f"{Path(cuobjdump).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env, check=True).stdout
    res = subprocess.run([cuobjdump, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    registers, shared, local = parse_resources(res)
    return Counts(registers, shared, local, count_sass(sass), hashlib.sha1(sass.encode()).hexdigest()[:10])


def tree_counts(specs_module, families: set[str] | None, arch: str, nvcc: str, cuobjdump: str,
                jobs: int) -> dict[tuple, tuple[str, Counts | str]]:
    """module_id -> (spec key, counts or the compile error), for every spec of ``specs_module`` in ``families``."""
    options = [*specs_module.NVRTC_OPTIONS, "-ftz=true", f"-arch=sm_{arch}"]
    specs = [s for s in specs_module.all_specs() if families is None or s.family in families]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(1, jobs)) as pool:
        def one(i_spec):
            i, spec = i_spec
            try:
                return compile_counts(spec.source(), options, nvcc, cuobjdump, Path(tmp), f"m{i}")
            except RuntimeError as e:
                return str(e).splitlines()[0] if str(e) else "compile failed"
        results = list(pool.map(one, enumerate(specs)))
    return {module_id(s): (s.key, r) for s, r in zip(specs, results)}


def tree_at(rev: str, into: Path) -> Path:
    """The kernel sources and specs.py of commit ``rev``, extracted under ``into``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "kernels_cu", "kvcanary/ops/cuda/specs.py"],
                         capture_output=True, check=True).stdout
    (into / "tree").mkdir()
    subprocess.run(["tar", "-x", "-C", str(into / "tree")], input=tar, check=True)
    return into / "tree"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", help="only this kernel family (repeatable; default: all)")
    ap.add_argument("--arch", default="90", help="compute capability to compile for (default 90)")
    ap.add_argument("--against", metavar="REV", help="also compile the modules at this commit and compare the SASS")
    ap.add_argument("--nvcc")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    nvcc, cuobjdump = _tool("nvcc", args.nvcc), _tool("cuobjdump", args.cuobjdump)
    families = set(args.family) if args.family else None

    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    now = tree_counts(_load_specs(ROOT), families, args.arch, nvcc, cuobjdump, args.jobs)
    then: dict = {}
    if args.against:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.against], capture_output=True,
                             text=True, check=True).stdout.strip()
        with tempfile.TemporaryDirectory() as tmp:
            then = tree_counts(_load_specs(tree_at(rev, Path(tmp))), families, args.arch, nvcc, cuobjdump, args.jobs)

    print(f"{version.splitlines()[-1]}, sm_{args.arch}, {len(now)} modules of {ROOT}")
    head = "| module | registers | shared B | local B | instructions | SASS |"
    rule = "|---|---|---|---|---|---|"
    if args.against:
        head, rule = head + f" at {rev} |", rule + "---|"
    print(head)
    print(rule)
    failed = same = 0
    for mid, (key, c) in now.items():
        if isinstance(c, str):
            failed += 1
            print(f"| {key} | compile error: {c} |" + " |" * (5 if args.against else 4))
            continue
        row = f"| {key} | {c.registers} | {c.shared:,} | {c.local} | {c.instructions:,} | {c.sass_hash} |"
        if args.against:
            old = then.get(mid)
            if old is None:
                row += " new |"
            elif isinstance(old[1], str):
                row += " did not compile |"
            elif old[1].sass_hash == c.sass_hash:
                same += 1
                row += " same |"
            else:
                row += f" differs ({old[1].instructions:,} instructions, {old[1].registers} registers) |"
        print(row)
    if args.against:
        gone = [key for mid, (key, _) in then.items() if mid not in now]
        print(f"\n{same} of {len(now)} modules have the same SASS as at {rev}"
              + (f"; gone since: {', '.join(gone)}" if gone else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
