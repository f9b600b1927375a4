// kvcanary verify kernel (SPEC §7). CPU twin: kvcanary/ops/reference/verify.py; launcher: kvcanary/ops/cuda/verify.py.
//
// Specializations: KVC_CHECK_TOKEN (check_verify_expected_token), KVC_HAS_REAL_KV (fingerprint real KV;
// 0 = NONE mode or no sources, the fingerprint is 0). One parameter: KvcVerifyParams (up to four real-KV
// sources by value: SGLang's ABI; or, for kvcanary's own callers, the context's device descriptor table of any
// number of sources, used when ctx.num_sources > 0).
//
// Design: a fixed persistent grid (sized from the capacity and the SM count, never from the active
// count) strides over the entries; the active count and `enable` are read on the device. Each thread
// takes KVC_VERIFY_UNROLL entries per step, a block-width apart so every plan-array load is coalesced,
// and issues all their loads (plan fields, then the slot's record and the predecessor's) before any
// hashing, so a thread keeps several independent DRAM requests in flight. Records are read with 16-byte
// loads when the canary buffer and its stride allow it. The counters are bumped once per launch by one
// thread (the active count is known on the device); violations are appended per warp: one atomicAdd per
// warp and step, rows in lane order.
//
// Bounds (SPEC §9), as the reference: slot 0 is skipped; an entry whose slot is outside [0, num_slots)
// (or, when real KV is folded, not covered by every source: slot >= slot_limit) or whose prev is
// >= num_slots gets the single row (tag, slot, expected_position, -1, expected_token or -1, 0, prev,
// SLOT_OUT_OF_RANGE) and no record is read; a negative prev is a chain head.

#include "common.cuh"

#ifndef KVC_CHECK_TOKEN
#error "KVC_CHECK_TOKEN must be defined (0 or 1)"
#endif
#ifndef KVC_HAS_REAL_KV
#error "KVC_HAS_REAL_KV must be defined (0 or 1)"
#endif

#define KVC_VERIFY_THREADS 256
// Resident blocks per SM the register budget is sized for (256 threads: 64 registers at 4, 80 at 3;
// the real-KV fold needs the larger budget to stay spill-free on sm_80). The launcher sizes the grid
// as this many blocks per SM (capped by the capacity).
#define KVC_VERIFY_BLOCKS_PER_SM 4
#define KVC_VERIFY_BLOCKS_PER_SM_REAL_KV 3
#define KVC_VERIFY_UNROLL 2

namespace kvc {
constexpr int kVerifyMinBlocks = KVC_HAS_REAL_KV ? KVC_VERIFY_BLOCKS_PER_SM_REAL_KV : KVC_VERIFY_BLOCKS_PER_SM;
}  // namespace kvc

// Fields 0..2 of the predecessor's record (all slot_hash needs).
__device__ __forceinline__ void kvc_load_chain_fields(const unsigned char* canary, kvc_i64 slot, kvc_i64 stride,
                                                      bool vec16, kvc_i64& token, kvc_i64& position,
                                                      kvc_i64& prev_hash) {
    const kvc_i64* rec = kvc_record(canary, slot, stride);
    if (vec16) {
        const longlong2 a = __ldg(reinterpret_cast<const longlong2*>(rec));
        token = a.x;
        position = a.y;
    } else {
        token = __ldg(rec + kvc::FIELD_TOKEN);
        position = __ldg(rec + kvc::FIELD_POSITION);
    }
    prev_hash = __ldg(rec + kvc::FIELD_PREV_HASH);
}

extern "C" __global__ void __launch_bounds__(KVC_VERIFY_THREADS, kvc::kVerifyMinBlocks)
kvc_verify(const __grid_constant__ KvcVerifyParams p) {
    const KvcContextParams& c = p.ctx;
    const KvcLog log = kvc_log_of(c);
    const unsigned char* canary = c.canary;
    const kvc_i64 stride = c.slot_stride, num_slots = c.num_slots, slot_limit = c.slot_limit;
    const bool leader = blockIdx.x == 0 && threadIdx.x == 0;
    if (leader) kvc_counter_add(c.kernel_run_counter, 1);
    if (*p.enable == 0) return;
    const kvc_i64 n = kvc_max64(0, kvc_min64((kvc_i64)*p.num_valid, p.capacity));
    if (leader && n > 0) kvc_counter_add(c.slot_run_counter, n);
    const bool vec16 = kvc_records_vec16(canary, stride);
    const kvc_i64 step = (kvc_i64)gridDim.x * blockDim.x * KVC_VERIFY_UNROLL;

    for (kvc_i64 base = (kvc_i64)blockIdx.x * blockDim.x * KVC_VERIFY_UNROLL + threadIdx.x; base < n + threadIdx.x;
         base += step) {
        // Warp-uniform loop condition (base - threadIdx.x is the block's start): every lane reaches the
        // warp-aggregated appends below.
        kvc_i64 slot[KVC_VERIFY_UNROLL], prev[KVC_VERIFY_UNROLL], exp_pos[KVC_VERIFY_UNROLL];
#if KVC_CHECK_TOKEN
        kvc_i64 exp_tok[KVC_VERIFY_UNROLL];
#endif
#pragma unroll
        for (int u = 0; u < KVC_VERIFY_UNROLL; ++u) {
            const kvc_i64 e = base + (kvc_i64)u * blockDim.x;
            slot[u] = kvc::TOKEN_TO_KV_SLOT_PADDING;  // lanes past the end act as skipped entries
            prev[u] = exp_pos[u] = 0;
#if KVC_CHECK_TOKEN
            exp_tok[u] = 0;
#endif
            if (e < n) {
                slot[u] = p.slot_indices[e];
                prev[u] = p.prev_slot_indices[e];
                exp_pos[u] = p.expected_positions[e];
#if KVC_CHECK_TOKEN
                exp_tok[u] = p.expected_tokens[e];
#endif
            }
        }
        kvc_i64 tok[KVC_VERIFY_UNROLL], pos[KVC_VERIFY_UNROLL], hash[KVC_VERIFY_UNROLL], rkv[KVC_VERIFY_UNROLL];
        kvc_i64 p_tok[KVC_VERIFY_UNROLL], p_pos[KVC_VERIFY_UNROLL], p_hash[KVC_VERIFY_UNROLL];
        bool live[KVC_VERIFY_UNROLL], oor[KVC_VERIFY_UNROLL];
#pragma unroll
        for (int u = 0; u < KVC_VERIFY_UNROLL; ++u) {
            live[u] = slot[u] != kvc::TOKEN_TO_KV_SLOT_PADDING;
            oor[u] = live[u] && kvc_verify_out_of_range(slot[u], prev[u], num_slots, slot_limit);
            tok[u] = pos[u] = hash[u] = rkv[u] = p_tok[u] = p_pos[u] = p_hash[u] = 0;
            if (live[u] && !oor[u]) {
                kvc_load_record_ro(canary, slot[u], stride, vec16, tok[u], pos[u], hash[u], rkv[u]);
                if (prev[u] > 0) kvc_load_chain_fields(canary, prev[u], stride, vec16, p_tok[u], p_pos[u], p_hash[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < KVC_VERIFY_UNROLL; ++u) {
#if KVC_CHECK_TOKEN
            const kvc_i64 reported_tok = exp_tok[u];
#else
            const kvc_i64 reported_tok = kvc::NO_SLOT;
#endif
            kvc_i64 bits = 0, expected_chain = 0;
            if (live[u] && !oor[u]) {
                // prev 0: unknown predecessor, no chain check; prev < 0: chain head (anchor).
                expected_chain = prev[u] == kvc::TOKEN_TO_KV_SLOT_PADDING ? hash[u]
                                 : prev[u] < 0 ? (kvc_i64)kvc_anchor_hash()
                                               : (kvc_i64)kvc_record_hash(p_hash[u], p_tok[u], p_pos[u]);
                if (prev[u] != kvc::TOKEN_TO_KV_SLOT_PADDING && hash[u] != expected_chain)
                    bits |= kvc::VERIFY_CHAIN_HASH_MISMATCH;
#if KVC_CHECK_TOKEN
                if (exp_tok[u] != kvc::NO_SLOT && tok[u] != exp_tok[u]) bits |= kvc::VERIFY_TOKEN_MISMATCH;
#endif
                if (pos[u] != exp_pos[u]) bits |= kvc::VERIFY_POSITION_MISMATCH;
#if KVC_HAS_REAL_KV
                // Four sources or fewer come by value (SGLang's ABI); kvcanary's own callers (the canary
                // object's sweep) may fold any number through the context's descriptor table.
                kvc_i64 fingerprint;
                if (p.ctx.num_sources > 0) {
                    kvc_u64 w0, w1;
                    kvc_load16(kvc_source_bytes(p.ctx.sources, slot[u]), w0, w1);
                    fingerprint = (kvc_i64)kvc_fingerprint_table<kvc::kFoldLoadsInFlight>(p.ctx.sources,
                                                                                          p.ctx.num_sources, slot[u],
                                                                                          w0, w1);
                } else {
                    fingerprint = (kvc_i64)kvc_fingerprint4(p.rkv, slot[u]);
                }
#else
                const kvc_i64 fingerprint = 0;
#endif
                if (rkv[u] != fingerprint) bits |= kvc::VERIFY_REAL_KV_HASH_MISMATCH;
            }
            // One call for every lane (the append is warp-collective).
            const bool want = oor[u] || bits != 0;
            kvc_append_row_warp(log, want, slot[u], oor[u] ? exp_pos[u] : pos[u], oor[u] ? kvc::NO_SLOT : tok[u],
                                reported_tok, oor[u] ? 0 : hash[u], oor[u] ? prev[u] : expected_chain,
                                oor[u] ? (kvc_i64)kvc::SLOT_OUT_OF_RANGE : bits);
        }
    }
}
