"""The hashes as the verify's and the write's modules compile them on the GPU, against the CPU reference (SPEC §3).

The 32-bit verify modules (``KVC_FLAT32``) and the write from the table (``KVC_WT_MUL3``) define ``KVC_MUL3``:
``kvc_mul64`` in ``common.cuh`` is then inline PTX (a 32 x 32 -> 64-bit multiply and two multiply-adds), which
neither the host compile of the helpers nor the emulated kernels run (they take the plain multiply). Here a probe
kernel appended to each kind of module's exact source reports which multiply it runs and computes ``kvc_mul64`` of
random pairs and ``kvc_mix3`` of random triples, compared with NumPy's wrapping multiply and
``kvcanary.ops.reference.hashing.mix3``; SPEC's known answer for the anchor is checked too.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcanary.consts import ANCHOR_HASH
from kvcanary.ops.cuda import specs
from kvcanary.ops.reference.hashing import mix3
from support.gpu_util import rng_for

_PROBE = r"""
extern "C" __global__ void kvc_probe_hashes(const unsigned long long* a, const unsigned long long* b,
                                            const unsigned long long* c, unsigned long long* mul,
                                            unsigned long long* mixed, unsigned long long* anchor, int* mul3,
                                            long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        mul[i] = kvc_mul64(a[i], b[i]);
        mixed[i] = kvc_mix3(a[i], b[i], c[i]);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *anchor = kvc_anchor_hash();
#if defined(KVC_MUL3) && KVC_MUL3
        *mul3 = 1;  // this module's kvc_mul64 is the PTX one
#else
        *mul3 = 0;
#endif
    }
}
"""


_MODULES = {  # kind -> (family, flags, whether its kvc_mul64 is the PTX one)
    "vt64": ("verify_table", dict(has_lut=False, check_token=False, has_real_kv=False, contexts=1, flat32=False),
             False),
    "flat32": ("verify_table", dict(has_lut=False, check_token=False, has_real_kv=False, contexts=1, flat32=True),
               True),
    "write_table": ("write_table", dict(input_assert=False, has_real_kv=False, contexts=1), True),
}


@pytest.mark.parametrize("kind", list(_MODULES))
def test_device_hashes_match_the_reference(cuda_ready, kind):
    import cupy as cp

    family, flags, ptx_mul = _MODULES[kind]
    src = specs.spec_for(family, **flags).source()
    fn = cp.RawModule(code=src + _PROBE, options=specs.NVRTC_OPTIONS).get_function("kvc_probe_hashes")
    rng = rng_for("device-hashes", kind)
    n = 1 << 16
    host = [rng.integers(0, 2**64, size=n, dtype=np.uint64) for _ in range(3)]
    host[0][:4] = [0, 1, 2**32 - 1, 2**64 - 1]  # carries across the word boundary
    host[1][:4] = [2**64 - 1, 2**32 + 1, 2**32 - 1, 2**64 - 1]
    a, b, c = (cp.asarray(x) for x in host)
    mul, mixed = cp.full(n, 7, dtype=cp.uint64), cp.full(n, 7, dtype=cp.uint64)
    anchor = cp.zeros(1, dtype=cp.uint64)
    mul3 = cp.full(1, 7, dtype=cp.int32)
    fn((64,), (256,), (a, b, c, mul, mixed, anchor, mul3, np.int64(n)))
    assert int(mul3.get()[0]) == int(ptx_mul)  # the multiply this module runs is the one the test means
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(cp.asnumpy(mul), host[0] * host[1])
    np.testing.assert_array_equal(cp.asnumpy(mixed), mix3(*host))
    assert int(anchor.get()[0]) == ANCHOR_HASH
