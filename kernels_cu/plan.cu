// kvcanary plan kernels (SPEC §5, §10). CPU twin: kvcanary/ops/reference/plan.py; launcher: kvcanary/ops/cuda/plan.py.
//
// Specializations: KVC_HAS_LUT (T(x) goes through full_to_swa_index_mapping), KVC_HAS_POOL (expected
// tokens are gathered from req_to_verify_expected_tokens). Absent arrays are null pointers. The table is
// req_to_token or a block table (KvcTableParams.paged, a runtime flag: RT() is one shared helper, so both
// forms give identical bytes); pad_row is a parameter.
//
// Three launches on one stream, none of which allocates, all taking one KvcPlanParams:
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
// tiles of KVC_SCAN_THREADS * kvc::kScanItems rows with a running carry.
//
// Bounds (SPEC §9), as the reference: T(x) for x >= lut_len is -2; a row whose req_pool_indices is outside
// [0, max_reqs) and not pad_row, or whose prefix_lens > max_seq_len, has no entries, no write entries and
// seed -1 and is counted as invalid; the expected-token gather also requires p + offset < max_context_len.

#include "common.cuh"

#ifndef KVC_HAS_LUT
#error "KVC_HAS_LUT must be defined (0 or 1)"
#endif
#ifndef KVC_HAS_POOL
#error "KVC_HAS_POOL must be defined (0 or 1)"
#endif

// Launch geometry (kvcanary/ops/cuda/grids.py reads these defines).
#define KVC_SCAN_THREADS 1024
#define KVC_ENTRY_THREADS 256
#define KVC_ENTRY_BLOCKS_PER_SM 8

namespace kvc {
constexpr int kScanItems = 4;  // rows per thread per tile of the single-block scans
}  // namespace kvc

// Exclusive prefix sums of len_of(r) over rows [0, bs) into out[0..bs) by one block, in tiles of
// blockDim.x * kvc::kScanItems rows with a running carry, so any bs runs in one launch. len_of is called
// once per row (it may record per-row outputs). Returns the total, in every thread.
template <class LenOf>
__device__ __forceinline__ kvc_i64 kvc_block_row_offsets(kvc_i64 bs, kvc_i64* scratch, kvc_i64* __restrict__ out,
                                                         LenOf len_of) {
    const kvc_i64 tile = (kvc_i64)blockDim.x * kvc::kScanItems;
    kvc_i64 carry = 0;
    for (kvc_i64 base = 0; base < bs; base += tile) {
        const kvc_i64 first = base + (kvc_i64)threadIdx.x * kvc::kScanItems;
        kvc_i64 len[kvc::kScanItems];
        kvc_i64 sum = 0;
#pragma unroll
        for (int j = 0; j < kvc::kScanItems; ++j) {
            len[j] = first + j < bs ? len_of(first + j) : 0;
            sum += len[j];
        }
        kvc_i64 tile_total;
        kvc_i64 run = carry + kvc_block_exclusive_sum(sum, scratch, tile_total);
#pragma unroll
        for (int j = 0; j < kvc::kScanItems; ++j) {
            if (first + j < bs) out[first + j] = run;
            run += len[j];
        }
        carry += tile_total;
    }
    return carry;
}

extern "C" __global__ void __launch_bounds__(KVC_SCAN_THREADS) kvc_plan_verify_offsets(const __grid_constant__ KvcPlanParams p) {
    __shared__ kvc_i64 scratch[kvc::kScanScratch];
    const KvcTableParams& t = p.table;
    const KvcBatchParams& b = p.batch;
    const kvc_i64 carry = kvc_block_row_offsets(b.bs, scratch, p.write_offsets, [&](kvc_i64 r) {
        return kvc_row_verify_len(t, b, b.req_pool_indices[r], b.prefix_lens[r]);
    });
    if (threadIdx.x == 0) {
        p.write_offsets[b.bs] = carry;
        const bool overflow = carry > p.verify_capacity;
        *p.verify_num_valid = (int)(overflow ? p.verify_capacity : carry);
        *p.verify_enable = overflow ? 0 : 1;
    }
}

extern "C" __global__ void __launch_bounds__(KVC_ENTRY_THREADS, KVC_ENTRY_BLOCKS_PER_SM)
kvc_plan_verify_entries(const __grid_constant__ KvcPlanParams p) {
    const KvcTableParams& t = p.table;
    const KvcBatchParams& b = p.batch;
    if (*p.verify_enable == 0) return;  // the plan overflowed: no entries are written
    const kvc_i64 n = *p.verify_num_valid;
    if (n <= 0) return;
    const kvc_i64* __restrict__ offsets = p.write_offsets;
    const kvc_i64 span = (n + gridDim.x - 1) / gridDim.x;
    const kvc_i64 lo = (kvc_i64)blockIdx.x * span;
    const kvc_i64 hi = kvc_min64(lo + span, n);
    kvc_i64 r = 0;
    for (kvc_i64 e = lo + threadIdx.x; e < hi; e += blockDim.x) {
        r = kvc_find_row(offsets, b.bs, e, r);
        const kvc_i64 rp = b.req_pool_indices[r];
        const kvc_i64 pos = kvc_window_start(b.prefix_lens[r], b.swa_window_size) + (e - offsets[r]);
        const kvc_i64 slot = kvc_lut_translate<KVC_HAS_LUT>(t, kvc_table_rt(t, rp, pos));
        const kvc_i64 prev = pos > 0 ? kvc_lut_translate<KVC_HAS_LUT>(t, kvc_table_rt(t, rp, pos - 1)) : kvc::NO_SLOT;
        kvc_i64 expected = kvc::NO_SLOT;
#if KVC_HAS_POOL
        const kvc_i64 q = pos + b.token_offset;
        if (kvc_expected_token_ok(q, b.valid_lens[r], b.pool_cols)) expected = (kvc_i64)b.pool[rp * b.pool_cols + q];
#endif
        p.verify_slot_indices[e] = slot;
        p.verify_expected_tokens[e] = expected;
        p.verify_expected_positions[e] = pos;
        p.verify_prev_slot_indices[e] = prev;
    }
}

extern "C" __global__ void __launch_bounds__(KVC_SCAN_THREADS) kvc_plan_write_meta(const __grid_constant__ KvcPlanParams p) {
    __shared__ kvc_i64 scratch[kvc::kScanScratch];
    const KvcTableParams& t = p.table;
    const KvcBatchParams& b = p.batch;
    kvc_i64 invalid = 0;
    const kvc_i64 carry = kvc_block_row_offsets(b.bs, scratch, p.write_offsets, [&](kvc_i64 r) {
        const kvc_i64 rp = b.req_pool_indices[r], prefix = b.prefix_lens[r];
        const bool valid = kvc_row_valid(rp, prefix, t.max_reqs, t.max_seq_len, t.pad_row);
        const bool active = valid && rp != t.pad_row;
        const kvc_i64 len = kvc_write_len(active, b.extend_seq_lens[r]);
        kvc_i64 seed = kvc::NO_SLOT;
        if (kvc_has_seed(active, prefix, len)) seed = kvc_lut_translate<KVC_HAS_LUT>(t, kvc_table_rt(t, rp, prefix - 1));
        p.write_seed_slot_indices[r] = seed;
        invalid += valid ? 0 : 1;
        return len;
    });
    for (kvc_i64 i = b.bs + 1 + threadIdx.x; i <= p.write_req_capacity; i += blockDim.x) p.write_offsets[i] = 0;
    kvc_i64 invalid_total;
    kvc_block_exclusive_sum(invalid, scratch, invalid_total);
    if (threadIdx.x == 0) {
        p.write_offsets[b.bs] = carry;
        *p.write_num_valid_reqs = (int)b.bs;
        if (b.invalid_rows != nullptr) *b.invalid_rows = (int)invalid_total;
    }
}
