// kvcanary scatter of request token ids (SPEC §8). CPU twin: kvcanary/ops/reference/scatter.py;
// launcher: kvcanary/ops/cuda/scatter.py.
//
// A fixed grid strides over the batch rows; each block copies one row's tokens with coalesced loads
// and stores, narrowing int64 to int32 like a C cast. One parameter: KvcScatterParams.
//
// Bounds (SPEC §9), as the reference: a row whose req_pool_indices is outside [0, max_reqs) or whose
// start offset is outside [0, N] is skipped; a copy is clipped to the row's columns and to the end of
// flat_in. Rows naming the same pool row in one launch race (the reference keeps the last).

#include "common.cuh"

#define KVC_SCATTER_THREADS 256
#define KVC_SCATTER_BLOCKS_PER_SM 8

extern "C" __global__ void __launch_bounds__(KVC_SCATTER_THREADS) kvc_scatter(const __grid_constant__ KvcScatterParams p) {
    for (kvc_i64 r = blockIdx.x; r < p.bs; r += gridDim.x) {
        const kvc_i64 row = p.req_pool_indices[r], start = p.offsets[r];
        if (row < 0 || row >= p.max_reqs || start < 0 || start > p.n_flat) continue;
        const kvc_i64 n = kvc_min64(kvc_min64(p.offsets[r + 1] - start, p.cols), p.n_flat - start);
        int* dst = p.pool_out + row * p.cols;
        const kvc_i64* src = p.flat_in + start;
        for (kvc_i64 j = threadIdx.x; j < n; j += blockDim.x) dst[j] = (int)src[j];
    }
}
