"""Planted kernel bugs for test_kernels_sanitized.py to catch (not collected by itself: its name is not ``test_*``).

The write from the table is edited to do one of three things whose results are thrown away, so the emulation alone
cannot tell; only a sanitizer sees them:

* ``read_past_the_batch``: read ``req_pool_indices[bs]``, one row past the batch (AddressSanitizer);
* ``signed_overflow``: add to the largest ``int64`` (UndefinedBehaviorSanitizer);
* ``read_past_shared``: read the int64 after the block's ``__shared__`` row offsets (AddressSanitizer).
"""

from __future__ import annotations

import pytest

import kvcanary as kc
from kvcanary import RealKvHashMode as Mode
from support.cuda_emu import emulated_cuda
from support.gpu_util import rng_for
from support.kernel_source import edited_copy, kernels_from
from support.table_cases import make_canary_cases, make_table_batch, make_write_tokens

# In kvc_wt_rows, the row scan every write tile runs (a batch of up to 256 rows takes it with one row per thread).
ANCHOR = "    const kvc_i64 first = tile + (kvc_i64)tid * items;\n"
PLANTED = {
    "read_past_the_batch": "    if (tid == 0) { volatile kvc_i64 sink = b.req_pool_indices[b.bs]; (void)sink; }\n",
    "signed_overflow": "    if (tid == 0) { volatile kvc_i64 big = 0x7fffffffffffffffLL; big = big + b.bs; }\n",
    "read_past_shared": "    if (tid == 0) { volatile kvc_i64 sink = s_start[kvc::kWtRows + 1]; (void)sink; }\n",
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_write_table_with_a_planted_bug(monkeypatch, tmp_path, bug):
    def plant(text: str) -> str:
        assert text.count(ANCHOR) == 1, "the anchor moved: update sanitizer_probe.ANCHOR"
        return text.replace(ANCHOR, ANCHOR + PLANTED[bug])

    src = edited_copy(tmp_path / "kernels_cu", "write_table.cu", plant)
    rng = rng_for("sanitizer-probe")
    b = make_table_batch(rng, block_size=16, max_blocks=4, pad_row=0, n_active=6, max_reqs=10)
    (case,) = make_canary_cases(rng, b.num_slots, 1, n_sources=0, mode=Mode.NONE, ring_capacity=256, stride=32)
    tokens = make_write_tokens(rng, b)
    with kernels_from(src), emulated_cuda(monkeypatch, sms=1) as emu, emu.cuda():
        kc.launch_canary_write_from_table(contexts=(case.context(),), **b.write_kwargs(False), **tokens.kwargs())
    assert ("kvc_write_from_table", 1, 256) in emu.launched
