"""bench/sass_counts.py: its reading of cuobjdump's output, how it matches modules across trees, and (where nvcc and
cuobjdump are installed, not in CI) a whole run against HEAD."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kvcanary.ops.cuda import specs
from support.bench_scripts import bench_module

ROOT = Path(__file__).resolve().parents[2]
sc = bench_module("sass_counts")

# The shape of cuobjdump 13.2's output for a two-function module: each instruction line is followed by a line with
# the second half of its encoding, and headers name the arch and the function.
_SASS = """
\tcode for sm_90
\t.target\tsm_90

\t\tFunction : kvc_b
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
                                                                               /* 0x000ff00000000800 */
        /*0010*/                   EXIT ;                                      /* 0x000000000000794d */
                                                                               /* 0x000fea0003800000 */
\t\t..........

\t\tFunction : kvc_a
        /*0000*/                   S2R R0, SR_TID.X ;                          /* 0x0000000000007919 */
                                                                               /* 0x000e220000002100 */
        /*0010*/                   BRA 0x10;                                   /* 0xfffffffc00fc7947 */
                                                                               /* 0x000fc0000383ffff */
        /*0020*/                   NOP;                                        /* 0x0000000000007918 */
                                                                               /* 0x000fc00000000000 */
"""

_RES = """
Resource usage:
 Common:
  GLOBAL:0
 Function kvc_b:
  REG:22 STACK:16 SHARED:0 LOCAL:8 CONSTANT[0]:592 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function kvc_a:
  REG:40 STACK:0 SHARED:1288 LOCAL:0 CONSTANT[0]:600 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_counts_every_instruction_line_of_every_function():
    assert sc.count_sass(_SASS) == 5
    assert sc.count_sass(_SASS.replace("        /*0010*/                   EXIT", "        EXIT")) == 4


def test_resources_are_the_most_of_any_function():
    assert sc.parse_resources(_RES) == (40, 1288, 24)  # registers, shared, stack + local (16 + 8 of kvc_b)
    with pytest.raises(ValueError, match="no function resource lines"):
        sc.parse_resources("Resource usage:\n Common:\n  GLOBAL:0\n")


def test_a_flag_a_tree_lacks_is_its_off_state():
    off = specs.spec_for("verify_table", has_lut=False, check_token=True, has_real_kv=False, contexts=2, flat32=False)
    on = specs.spec_for("verify_table", has_lut=False, check_token=True, has_real_kv=False, contexts=2, flat32=True)
    before_flag = specs.KernelSpec(off.family, off.source_file, off.defines[:-1], off.entry_points)
    assert [d[0] for d in off.defines][-1] == "KVC_FLAT32" and "KVC_FLAT32" not in before_flag.key
    assert sc.module_id(off) == sc.module_id(before_flag)
    assert sc.module_id(on) != sc.module_id(before_flag)
    # integer parameters are never 0, so every context count stays its own module
    ids = {sc.module_id(s) for s in specs.all_specs()}
    assert len(ids) == len(specs.all_specs())


def test_loads_a_trees_specs_without_importing_the_package():
    loaded = sc._load_specs(ROOT)
    assert loaded is not specs
    assert [s.key for s in loaded.all_specs()] == [s.key for s in specs.all_specs()]
    assert loaded.all_specs()[0].source() == specs.all_specs()[0].source()


def test_a_commits_tree(tmp_path):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    tree = sc.tree_at("HEAD", tmp_path)
    assert (tree / "kernels_cu" / "common.cuh").is_file()
    assert {p.name for p in tree.iterdir()} == {"kernels_cu", "kvcanary"}
    assert len(sc._load_specs(tree).all_specs()) >= 1


@pytest.mark.skipif(not (shutil.which("nvcc") and shutil.which("cuobjdump")), reason="needs nvcc and cuobjdump")
def test_whole_run_against_head(capsys):
    assert sc.main(["--family", "scatter", "--family", "records", "--against", "HEAD"]) == 0
    out = capsys.readouterr().out
    assert "| scatter.cu[] | " in out and "| records.cu[] | " in out
    assert out.count(" same |") == 2 and "2 of 2 modules have the same SASS as at " in out
