// kvcanary plan kernels (SPEC §5). CPU twin: kvcanary/ops/reference/plan.py; launcher: kvcanary/ops/cuda/plan.py.
//
// Specializations: KVC_HAS_LUT (T(x) goes through full_to_swa_index_mapping), KVC_HAS_POOL (expected
// tokens are gathered from req_to_verify_expected_tokens). Absent arrays are passed as null pointers.
//
// Three launches on one stream, none of which allocates:
//  1. kvc_plan_verify_offsets (one block): per-row verify lengths -> exclusive prefix sums, written into
//     write_offsets[0..bs] as *temporary* storage, plus verify_num_valid / enable. Using the plan's own
//     output as scratch keeps the op free of hidden per-device buffers (which would have to exist before
//     a CUDA-graph capture and would race between planners on different streams).
//  2. kvc_plan_verify_entries (fixed persistent grid): reads enable / verify_num_valid on the device; each
//     block takes a contiguous span of entries, each thread locates its entry's row by a galloping
//     search over the offsets from its previous row, and writes slot / expected token / position / prev.
//  3. kvc_plan_write_meta (one block): write lengths -> write_offsets (overwriting the temporary),
//     write_seed_slot_indices[0..bs], zeroes write_offsets[bs+1..R], write_num_valid_reqs = bs, and the
//     invalid-row count (only if invalid_rows is given).
// Any bs up to the write-request capacity runs in one launch each: the single-block scans loop over
// tiles of KVC_SCAN_THREADS * KVC_SCAN_ITEMS rows with a running carry.
//
// Bounds (SPEC §9), as the reference: T(x) for x >= lut_len is -2; a row with req_pool_indices outside
// [0, max_reqs) or prefix_lens > max_seq_len has no entries, no write entries and seed -1 and is counted
// as invalid; the expected-token gather also requires p + offset < max_context_len.

#include "common.cuh"

#ifndef KVC_HAS_LUT
#error "KVC_HAS_LUT must be defined (0 or 1)"
#endif
#ifndef KVC_HAS_POOL
#error "KVC_HAS_POOL must be defined (0 or 1)"
#endif

#define KVC_SCAN_THREADS 1024
#define KVC_SCAN_ITEMS 4
#define KVC_ENTRY_THREADS 256
#define KVC_ENTRY_BLOCKS_PER_SM 8

// T(x) of a req_to_token value.
__device__ __forceinline__ kvc_i64 kvc_plan_translate(kvc_i64 x, const kvc_i64* __restrict__ lut, kvc_i64 lut_len) {
#if KVC_HAS_LUT
    kvc_i64 v = (x >= 0 && x < lut_len) ? __ldg(lut + x) : 0;
    return kvc_translate(x, lut_len, v);
#else
    (void)lut;
    (void)lut_len;
    return x;
#endif
}

// Exclusive prefix sums of len_of(r) over rows [0, bs) into out[0..bs) by one block, in tiles of
// blockDim.x * KVC_SCAN_ITEMS rows with a running carry, so any bs runs in one launch. len_of is called
// once per row (it may record per-row outputs). Returns the total, in every thread.
template <class LenOf>
__device__ __forceinline__ kvc_i64 kvc_block_row_offsets(kvc_i64 bs, kvc_i64* scratch, kvc_i64* __restrict__ out,
                                                         LenOf len_of) {
    const kvc_i64 tile = (kvc_i64)blockDim.x * KVC_SCAN_ITEMS;
    kvc_i64 carry = 0;
    for (kvc_i64 base = 0; base < bs; base += tile) {
        const kvc_i64 first = base + (kvc_i64)threadIdx.x * KVC_SCAN_ITEMS;
        kvc_i64 len[KVC_SCAN_ITEMS];
        kvc_i64 sum = 0;
#pragma unroll
        for (int j = 0; j < KVC_SCAN_ITEMS; ++j) {
            len[j] = first + j < bs ? len_of(first + j) : 0;
            sum += len[j];
        }
        kvc_i64 tile_total;
        kvc_i64 run = carry + kvc_block_exclusive_sum(sum, scratch, tile_total);
#pragma unroll
        for (int j = 0; j < KVC_SCAN_ITEMS; ++j) {
            if (first + j < bs) out[first + j] = run;
            run += len[j];
        }
        carry += tile_total;
    }
    return carry;
}

extern "C" __global__ void __launch_bounds__(KVC_SCAN_THREADS)
kvc_plan_verify_offsets(const kvc_i64* __restrict__ req_pool_indices, const kvc_i64* __restrict__ prefix_lens,
                        kvc_i64 bs, kvc_i64 max_reqs, kvc_i64 max_seq_len, kvc_i64 swa_window_size,
                        kvc_i64 verify_capacity, kvc_i64* __restrict__ verify_offsets,
                        int* __restrict__ verify_num_valid, int* __restrict__ enable) {
    __shared__ kvc_i64 scratch[33];
    const kvc_i64 carry = kvc_block_row_offsets(bs, scratch, verify_offsets, [&](kvc_i64 r) {
        const kvc_i64 rp = req_pool_indices[r], prefix = prefix_lens[r];
        return kvc_verify_len(kvc_plan_row_active(rp, prefix, max_reqs, max_seq_len), prefix, swa_window_size);
    });
    if (threadIdx.x == 0) {
        verify_offsets[bs] = carry;
        const bool overflow = carry > verify_capacity;
        *verify_num_valid = (int)(overflow ? verify_capacity : carry);
        *enable = overflow ? 0 : 1;
    }
}

// The row r owning entry e: offsets[r] <= e < offsets[r + 1] (rows with no entries never own one).
// Searches forward from `from` (a row at or before the answer): gallop, then bisect.
__device__ __forceinline__ kvc_i64 kvc_find_row(const kvc_i64* __restrict__ offsets, kvc_i64 bs, kvc_i64 e,
                                                kvc_i64 from) {
    if (offsets[from + 1] > e) return from;
    // Invariant: offsets[lo + 1] <= e; find the first r > lo with offsets[r + 1] > e (r < bs).
    kvc_i64 lo = from, step = 1, hi;
    for (;;) {
        hi = lo + step;
        if (hi >= bs - 1) {
            hi = bs - 1;
            break;
        }
        if (offsets[hi + 1] > e) break;
        lo = hi;
        step <<= 1;
    }
    while (hi - lo > 1) {
        const kvc_i64 mid = lo + ((hi - lo) >> 1);
        if (offsets[mid + 1] > e) hi = mid;
        else lo = mid;
    }
    return hi;
}

extern "C" __global__ void __launch_bounds__(KVC_ENTRY_THREADS, KVC_ENTRY_BLOCKS_PER_SM)
kvc_plan_verify_entries(const kvc_i64* __restrict__ verify_offsets, kvc_i64 bs,
                        const kvc_i64* __restrict__ req_pool_indices, const kvc_i64* __restrict__ prefix_lens,
                        kvc_i64 swa_window_size, const int* __restrict__ req_to_token, kvc_i64 max_seq_len,
                        const kvc_i64* __restrict__ lut, kvc_i64 lut_len, const int* __restrict__ pool,
                        kvc_i64 pool_cols, const kvc_i64* __restrict__ valid_lens, kvc_i64 token_offset,
                        const int* __restrict__ verify_num_valid, const int* __restrict__ enable,
                        kvc_i64* __restrict__ out_slot, kvc_i64* __restrict__ out_expected_token,
                        kvc_i64* __restrict__ out_position, kvc_i64* __restrict__ out_prev) {
    if (*enable == 0) return;  // the plan overflowed: no entries are written
    const kvc_i64 n = *verify_num_valid;
    if (n <= 0) return;
    const kvc_i64 span = (n + gridDim.x - 1) / gridDim.x;
    const kvc_i64 lo = (kvc_i64)blockIdx.x * span;
    const kvc_i64 hi = kvc_min64(lo + span, n);
    kvc_i64 r = 0;
    for (kvc_i64 e = lo + threadIdx.x; e < hi; e += blockDim.x) {
        r = kvc_find_row(verify_offsets, bs, e, r);
        const kvc_i64 rp = req_pool_indices[r];
        const kvc_i64 p = kvc_window_start(prefix_lens[r], swa_window_size) + (e - verify_offsets[r]);
        const int* row = req_to_token + rp * max_seq_len;
        const kvc_i64 slot = kvc_plan_translate((kvc_i64)row[p], lut, lut_len);
        const kvc_i64 prev = p > 0 ? kvc_plan_translate((kvc_i64)row[p - 1], lut, lut_len) : (kvc_i64)NO_SLOT;
        kvc_i64 expected = NO_SLOT;
#if KVC_HAS_POOL
        const kvc_i64 q = p + token_offset;
        if (kvc_expected_token_ok(q, valid_lens[r], pool_cols)) expected = (kvc_i64)pool[rp * pool_cols + q];
#else
        (void)pool;
        (void)pool_cols;
        (void)valid_lens;
        (void)token_offset;
#endif
        out_slot[e] = slot;
        out_expected_token[e] = expected;
        out_position[e] = p;
        out_prev[e] = prev;
    }
}

extern "C" __global__ void __launch_bounds__(KVC_SCAN_THREADS)
kvc_plan_write_meta(const kvc_i64* __restrict__ req_pool_indices, const kvc_i64* __restrict__ prefix_lens,
                    const kvc_i64* __restrict__ extend_seq_lens, kvc_i64 bs, kvc_i64 max_reqs,
                    kvc_i64 max_seq_len, const int* __restrict__ req_to_token, const kvc_i64* __restrict__ lut,
                    kvc_i64 lut_len, kvc_i64 write_req_capacity, kvc_i64* __restrict__ write_offsets,
                    kvc_i64* __restrict__ write_seed_slot_indices, int* __restrict__ write_num_valid_reqs,
                    int* __restrict__ invalid_rows) {
    __shared__ kvc_i64 scratch[33];
    kvc_i64 invalid = 0;
    const kvc_i64 carry = kvc_block_row_offsets(bs, scratch, write_offsets, [&](kvc_i64 r) {
        const kvc_i64 rp = req_pool_indices[r], prefix = prefix_lens[r];
        const bool valid = kvc_plan_row_valid(rp, prefix, max_reqs, max_seq_len);
        const bool active = valid && rp != REQ_POOL_IDX_PADDING;
        const kvc_i64 len = kvc_write_len(active, extend_seq_lens[r]);
        kvc_i64 seed = NO_SLOT;
        if (kvc_has_seed(active, prefix, len))
            seed = kvc_plan_translate((kvc_i64)req_to_token[rp * max_seq_len + prefix - 1], lut, lut_len);
        write_seed_slot_indices[r] = seed;
        invalid += valid ? 0 : 1;
        return len;
    });
    for (kvc_i64 i = bs + 1 + threadIdx.x; i <= write_req_capacity; i += blockDim.x) write_offsets[i] = 0;
    kvc_i64 invalid_total;
    kvc_block_exclusive_sum(invalid, scratch, invalid_total);
    if (threadIdx.x == 0) {
        write_offsets[bs] = carry;
        *write_num_valid_reqs = (int)bs;
        if (invalid_rows != nullptr) *invalid_rows = (int)invalid_total;
    }
}
