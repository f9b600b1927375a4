// kvcanary scatter of request token ids (SPEC §8). CPU twin: kvcanary/ops/reference/scatter.py;
// launcher: kvcanary/ops/cuda/scatter.py.
//
// A fixed grid strides over the batch rows; each block copies one row's tokens with coalesced loads
// and stores, narrowing int64 to int32 like a C cast.
//
// Bounds (SPEC §9), as the reference: a row whose req_pool_indices is outside [0, max_reqs) or whose
// start offset is outside [0, N] is skipped; a copy is clipped to the row's columns and to the end of
// flat_in. Rows naming the same pool row in one launch race (the reference keeps the last).

#include "common.cuh"

#define KVC_SCATTER_THREADS 256
#define KVC_SCATTER_BLOCKS_PER_SM 8

extern "C" __global__ void __launch_bounds__(KVC_SCATTER_THREADS)
kvc_scatter(const kvc_i64* __restrict__ flat_in, kvc_i64 n_flat, const kvc_i64* __restrict__ offsets,
            const kvc_i64* __restrict__ req_pool_indices, kvc_i64 bs, int* __restrict__ pool_out, kvc_i64 max_reqs,
            kvc_i64 cols) {
    for (kvc_i64 r = blockIdx.x; r < bs; r += gridDim.x) {
        const kvc_i64 row = req_pool_indices[r], start = offsets[r];
        if (row < 0 || row >= max_reqs || start < 0 || start > n_flat) continue;
        const kvc_i64 n = kvc_min64(kvc_min64(offsets[r + 1] - start, cols), n_flat - start);
        int* dst = pool_out + row * cols;
        const kvc_i64* src = flat_in + start;
        for (kvc_i64 j = threadIdx.x; j < n; j += blockDim.x) dst[j] = (int)src[j];
    }
}
