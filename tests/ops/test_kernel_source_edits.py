"""An edited copy of ``kernels_cu/`` made the library's source (``support.kernel_source.kernels_from``, as
bench/tune_geometry.py does with ``bench_cuda.use_kernels_dir``): every value read from the source before is
forgotten on entry and on exit (``grids.clear_source_caches``), and ``specs.set_int_define`` edits one define."""

from __future__ import annotations

import pytest

from kvcanary.ops.cuda import grids, specs
from support.kernel_source import edited_copy, kernels_from


def test_grids_and_defines_follow_the_source_in_use(tmp_path):
    sms, capacity = 10, 1 << 20
    vt_per_sm = specs.int_define("verify_table.cu", "KVC_VT_BLOCKS_PER_SM")
    entry_per_sm = specs.int_define("plan.cu", "KVC_ENTRY_BLOCKS_PER_SM")
    before_vt, before_plan = grids.verify_table_grid(False, sms), grids.plan_grids(capacity, sms)["verify_entries"]
    assert before_vt.blocks == vt_per_sm * sms and before_plan.blocks == entry_per_sm * sms
    src = edited_copy(tmp_path / "vt", "verify_table.cu",
                      lambda text: specs.set_int_define(text, "KVC_VT_BLOCKS_PER_SM", vt_per_sm + 1))
    (src / "plan.cu").write_text(specs.set_int_define((src / "plan.cu").read_text(), "KVC_ENTRY_BLOCKS_PER_SM",
                                                      entry_per_sm + 1))
    with kernels_from(src):
        assert specs.int_define("verify_table.cu", "KVC_VT_BLOCKS_PER_SM") == vt_per_sm + 1
        assert grids.verify_table_grid(False, sms).blocks == (vt_per_sm + 1) * sms
        assert grids.plan_grids(capacity, sms)["verify_entries"].blocks == (entry_per_sm + 1) * sms
        assert f"#define KVC_VT_BLOCKS_PER_SM {vt_per_sm + 1}" in specs.spec_for(
            "verify_table", has_lut=False, check_token=False, has_real_kv=False, contexts=1, flat32=True).source()
    assert grids.verify_table_grid(False, sms) == before_vt
    assert grids.plan_grids(capacity, sms)["verify_entries"] == before_plan


def test_set_int_define_sets_exactly_one_line():
    text = "#define KVC_A 1  // why\n#define KVC_AB 2\n"
    assert specs.set_int_define(text, "KVC_A", 7) == "#define KVC_A 7  // why\n#define KVC_AB 2\n"
    with pytest.raises(ValueError, match=r"kv-canary: plan.cu has 0 lines '#define KVC_B <int>', not one"):
        specs.set_int_define(text, "KVC_B", 1, "plan.cu")
    with pytest.raises(ValueError, match="has 2 lines"):
        specs.set_int_define(text + "#define KVC_A 3\n", "KVC_A", 1)
