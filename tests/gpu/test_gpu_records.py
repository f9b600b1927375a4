"""Records that move with the KV (SPEC §13) on the GPU vs the CPU reference, byte for byte: gather, scatter and
copy (across buffers of different strides, and within one buffer between disjoint slot sets), with negative,
out-of-range and (for reads) repeated slots, poisoned outputs and counters, 16-byte-aligned and unaligned
record layouts, and an empty slot list."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kvcanary as kc
from support.gpu_util import assert_same_bytes, rng_for, size, t
from support.table_cases import make_records_case, to_device


def _both(fn, case):
    out = {}
    for dev in ("cpu", "cuda"):
        c = to_device(case, dev)
        fn(c)
        out[dev] = c
    torch.cuda.synchronize()
    return out["cpu"], to_device(out["cuda"], "cpu")


def _same(a, b, *names):
    for n in names:
        assert_same_bytes(getattr(a, n), getattr(b, n), n)


@pytest.mark.parametrize("stride", [32, 40, 48])
def test_gather_records_matches_reference(cuda_ready, stride):
    rng = rng_for("gather", stride)
    case = make_records_case(rng, n=size(5000, 300), num_slots=size(3000, 200), stride=stride)
    a, b = _both(lambda c: kc.gather_canary_records(canary_buf=c.canary, slots=c.slots, records_out=c.records_out,
                                                    out_of_range_out=c.out_of_range), case)
    _same(a, b, "records_out", "out_of_range", "canary")
    assert int(a.out_of_range[0]) > 0 and (a.records_out != 0).any()


@pytest.mark.parametrize("stride", [32, 40])
def test_scatter_records_matches_reference(cuda_ready, stride):
    rng = rng_for("scatter-records", stride)
    case = make_records_case(rng, n=size(3000, 200), other_slots=size(4000, 300), other_stride=stride)
    a, b = _both(lambda c: kc.scatter_canary_records(canary_buf=c.other, slots=c.dst_slots, records=c.records,
                                                     out_of_range_out=c.out_of_range), case)
    _same(a, b, "other", "out_of_range")
    assert int(a.out_of_range[0]) > 0


@pytest.mark.parametrize("where", ["other buffer", "same buffer"])
def test_copy_records_matches_reference(cuda_ready, where):
    rng = rng_for("copy-records", where)
    n, num_slots = size(3000, 200), size(8000, 600)
    case = make_records_case(rng, n=n, num_slots=num_slots, stride=40, other_slots=size(4000, 300), other_stride=48)
    if where == "same buffer":
        # Disjoint source and destination slots (an overlapping copy has an unspecified result on the GPU).
        perm = rng.permutation(num_slots)
        src, dst = perm[:n].astype(np.int64), perm[n:2 * n].astype(np.int64)
        src[rng.random(n) < 0.05] = -1
        dst[rng.random(n) < 0.05] = num_slots + 3
        case.slots, case.dst_slots = t(src), t(dst)

        def fn(c):
            kc.copy_canary_records(src_canary_buf=c.canary, src_slots=c.slots, dst_slots=c.dst_slots,
                                   out_of_range_out=c.out_of_range)
    else:
        def fn(c):
            kc.copy_canary_records(src_canary_buf=c.canary, src_slots=c.slots, dst_slots=c.dst_slots,
                                   dst_canary_buf=c.other, out_of_range_out=c.out_of_range)
    a, b = _both(fn, case)
    _same(a, b, "canary", "other", "out_of_range")
    assert int(a.out_of_range[0]) > 0


def test_records_ops_empty_and_without_counter(cuda_ready):
    rng = rng_for("records-empty")
    case = make_records_case(rng, n=50, num_slots=40)
    oor = {}
    for dev in ("cpu", "cuda"):
        c = to_device(case, dev)
        kc.gather_canary_records(canary_buf=c.canary, slots=torch.zeros(0, dtype=torch.int64, device=dev),
                                 records_out=torch.zeros((0, 4), dtype=torch.int64, device=dev),
                                 out_of_range_out=c.out_of_range)
        kc.scatter_canary_records(canary_buf=c.canary, slots=c.slots[:1].abs() % 40, records=c.records[:1])
        torch.cuda.synchronize()
        oor[dev] = c
    assert int(oor["cuda"].out_of_range[0]) == 0  # set to the count of an empty list, not added to
    assert_same_bytes(oor["cpu"].canary, oor["cuda"].canary.cpu(), "canary after a scatter without a counter")
