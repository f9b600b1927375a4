// kvcanary verify straight from the table (SPEC §11). CPU twin: kvcanary/ops/reference/verify_table.py;
// launcher: kvcanary/ops/cuda/verify_table.py.
//
// Specializations: KVC_HAS_LUT (T(x) through full_to_swa_index_mapping), KVC_CHECK_TOKEN (check the expected
// tokens: check_verify_expected_token and a pool given), KVC_HAS_REAL_KV (some context folds real KV, from its
// device descriptor table of any number of sources), KVC_CONTEXTS (1, 2 or 4: the most contexts a launch passes;
// the context loop is unrolled that far, as in write_table.cu, so each context's parameters are read from fixed
// constant-bank offsets, not through a register index; one context: 56 registers instead of 64, same time on an
// H200). One parameter: KvcVerifyTableParams, with 1 to KVC_CONTEXTS contexts that share the table (K and V of a
// group: the table is walked once for all).
//
// Work distribution (no plan, no scratch, a grid fixed by the SM count). The entries of the batch are numbered
// request by request, position by position, as §5 lays them out, and cut into chunks of kvc::kVtUnroll *
// KVC_VT_THREADS entries; block b takes chunks b, b + G, b + 2G, ... Every block walks the rows in tiles of
// KVC_VT_THREADS rows (one per thread: pool index, prefix; a block-wide exclusive sum of the rows' entry counts
// gives the tile's offsets in shared memory), and processes the part of each of its chunks that falls in the
// tile: thread t takes entries lo + t, lo + t + KVC_VT_THREADS, ..., finds its row by a galloping search over
// the tile's offsets from its previous row (usually one comparison: consecutive entries share a row) and its
// position from the row's window start. So consecutive lanes read consecutive table entries (coalesced), the
// active counts are read on the device, and every chunk's share is fixed before any entry is read.
//
// Bytes per entry (shuffled pool, NONE): 4 B of table (a 128-byte line per 32 lanes) + the slot's 32-byte record;
// the predecessor's record is the neighbouring lane's: lane l computes slot_hash of its own record and passes it
// to lane l + 1 with a shuffle (and its slot, which is the next entry's prev). Only lane 0 of a warp and the
// first entry of a window load their predecessor themselves (table entry, likely a cache hit, and 24 bytes of
// record): about 1/32 of the entries. PARTIAL adds one 32-byte sector of real KV per entry per source (its first
// 16 bytes are loaded together with the record, so both latencies overlap). With several contexts the row
// mapping, table, LUT and pool reads are done once; each context adds its record (and KV) reads.
// Numbers (H200, shuffled pool, docs/BENCHMARKS.md): B (8.4 M entries) runs within 7 % of a bare kernel that
// reads the same table entries and records in the same order and checks nothing (237 against 221 us; random
// 32-byte records cost a 64-byte DRAM access each, and the memory system tops out near 2.4 TB/s for them); A
// (1 M entries) is 34 us eager, 26 us in a graph, where the records sit in L2 and the kernel's own instructions
// bound it: 14.4 warp instructions per entry (Nsight Compute: 15.1 M per launch), 14.6 us if every scheduler
// issued on every cycle; measured, the issue slots are 52 % busy. The row walk every block repeats costs ~16 B
// per row from L2 (B: 1024 rows x 528 blocks = 8.7 MB, about 3 % of the bytes).
// Occupancy: 4 blocks of 256 threads per SM within 64 registers; 2 entries per thread per step without real KV,
// 1 with it (2048 and 1024 entries in flight per SM): more in flight made the random reads slower, not faster.
//
// Per step a thread keeps kvc::kVtUnroll entries: all table loads, then per context all record loads, then the
// hashing, so several independent DRAM requests are in flight per thread. Violations are appended per warp
// (one atomicAdd per warp, step and context). Block 0, which walks every row, adds the counters at the end
// (kernel_run_counter += 1, slot_run_counter += the number of entries, per context), sets invalid_rows and adds
// the same count to invalid_rows_total (a canary's running count, so it needs no extra op per step).
//
// Rows, windows, RT(), T(), expected tokens and bounds (SPEC §5, §9, §10) as the reference: an invalid or
// padding row has no entries; slot 0 entries are skipped; an entry whose slot is outside [0, num_slots) or not
// covered by a folded source (>= slot_limit), or whose prev is >= num_slots, gets the single row
// (tag, slot, position, -1, expected_token or -1, 0, prev, SLOT_OUT_OF_RANGE).

#include "common.cuh"

#ifndef KVC_HAS_LUT
#error "KVC_HAS_LUT must be defined (0 or 1)"
#endif
#ifndef KVC_CHECK_TOKEN
#error "KVC_CHECK_TOKEN must be defined (0 or 1)"
#endif
#ifndef KVC_HAS_REAL_KV
#error "KVC_HAS_REAL_KV must be defined (0 or 1)"
#endif
#ifndef KVC_CONTEXTS
#error "KVC_CONTEXTS must be defined (1, 2 or 4)"
#endif
static_assert(KVC_CONTEXTS >= 1 && KVC_CONTEXTS <= kvc::kMaxContexts, "contexts per launch");

// Launch geometry (kvcanary/ops/cuda/grids.py reads these defines): the grid is this many blocks per SM, and
// each thread takes this many entries per step. Chosen by bench/tune_geometry.py on an H200 (2026-12-03):
// without real KV, 2 entries x 4 blocks (64 registers) beat every other pair at B (more entries or blocks in
// flight made the random record reads slower); with real KV, 1 entry x 4 blocks (64 registers) beat 2 x 2
// (116 registers) by 6-20 %.
#define KVC_VT_THREADS 256
#define KVC_VT_BLOCKS_PER_SM 4
#define KVC_VT_UNROLL 2
#define KVC_VT_BLOCKS_PER_SM_REAL_KV 4
#define KVC_VT_UNROLL_REAL_KV 1

namespace kvc {
constexpr int kVtMinBlocks = KVC_HAS_REAL_KV ? KVC_VT_BLOCKS_PER_SM_REAL_KV : KVC_VT_BLOCKS_PER_SM;
constexpr int kVtUnroll = KVC_HAS_REAL_KV ? KVC_VT_UNROLL_REAL_KV : KVC_VT_UNROLL;  // entries per thread per step
#if KVC_HAS_REAL_KV
constexpr int kVtFoldLoads = 2;  // loads in flight per real-KV fold batch (ALL mode)
#endif
constexpr int kVtTile = KVC_VT_THREADS;                         // rows per tile: one per thread
constexpr kvc_i64 kVtChunk = (kvc_i64)kVtUnroll * KVC_VT_THREADS;  // entries per chunk: one block step
}  // namespace kvc

// The shared (context-independent) part of a step's entries.
struct KvcVtEntries {
    kvc_i64 slot[kvc::kVtUnroll];
    kvc_i64 prev[kvc::kVtUnroll];
    kvc_i64 pos[kvc::kVtUnroll];
    kvc_i64 exp_tok[kvc::kVtUnroll];  // -1: unchecked
    bool act[kvc::kVtUnroll];         // a real entry (else a padding lane: slot 0, skipped)
    bool nb[kvc::kVtUnroll];          // the predecessor is lane - 1's entry
};

// The checks of one context for a step's entries (every lane calls it: the appends are warp-collective).
__device__ __forceinline__ void kvc_vt_context(const KvcContextParams& x, const KvcVtEntries& en) {
    const unsigned char* canary = x.canary;
    const kvc_i64 stride = x.slot_stride, num_slots = x.num_slots, limit = x.slot_limit;
    const bool vec16 = kvc_records_vec16(canary, stride);
#if KVC_HAS_REAL_KV
    const kvc_i64 nsrc = x.num_sources;
#endif
    kvc_i64 tok[kvc::kVtUnroll], spos[kvc::kVtUnroll], hash[kvc::kVtUnroll], rkv[kvc::kVtUnroll];
#if KVC_HAS_REAL_KV
    kvc_u64 w0[kvc::kVtUnroll], w1[kvc::kVtUnroll];
#endif
    bool own[kvc::kVtUnroll];
    // All loads first: the slot's record (also when the entry itself will be out of range: a covered-or-not
    // slot inside the buffer is the next entry's predecessor), and the first real-KV bytes of a covered slot.
#pragma unroll
    for (int u = 0; u < kvc::kVtUnroll; ++u) {
        const kvc_i64 s = en.slot[u];
        own[u] = s > kvc::TOKEN_TO_KV_SLOT_PADDING && s < num_slots;
        tok[u] = spos[u] = hash[u] = rkv[u] = 0;
        if (own[u]) kvc_load_record_ro(canary, s, stride, vec16, tok[u], spos[u], hash[u], rkv[u]);
#if KVC_HAS_REAL_KV
        w0[u] = w1[u] = 0;
        if (nsrc > 0 && own[u] && s < limit) kvc_load16(kvc_source_bytes(x.sources, s), w0[u], w1[u]);
#endif
    }
    const KvcLog log = kvc_log_of(x);
#pragma unroll
    for (int u = 0; u < kvc::kVtUnroll; ++u) {
        const kvc_i64 s = en.slot[u], prev = en.prev[u];
        // slot_hash of this lane's record, handed to the next lane (whose prev is this slot).
        const kvc_i64 h = own[u] ? (kvc_i64)kvc_record_hash(hash[u], tok[u], spos[u]) : 0;
        const kvc_i64 from_prev_lane = __shfl_up_sync(kvc::kFullMask, h, 1);
        const bool live = en.act[u] && s != kvc::TOKEN_TO_KV_SLOT_PADDING;
        const bool oor = live && kvc_verify_out_of_range(s, prev, num_slots, limit);
        kvc_i64 bits = 0, expected_chain = 0;
        if (live && !oor) {
            // prev 0: unknown predecessor, no chain check; prev < 0: chain head (anchor).
            if (prev == kvc::TOKEN_TO_KV_SLOT_PADDING) {
                expected_chain = hash[u];
            } else if (prev < 0) {
                expected_chain = (kvc_i64)kvc_anchor_hash();
            } else if (en.nb[u]) {
                expected_chain = from_prev_lane;  // lane - 1 holds slot `prev`, in [1, num_slots): it loaded it
            } else {
                const kvc_i64* pr = kvc_record(canary, prev, stride);
                expected_chain = (kvc_i64)kvc_record_hash(__ldg(pr + kvc::FIELD_PREV_HASH), __ldg(pr + kvc::FIELD_TOKEN),
                                                          __ldg(pr + kvc::FIELD_POSITION));
            }
            if (prev != kvc::TOKEN_TO_KV_SLOT_PADDING && hash[u] != expected_chain)
                bits |= kvc::VERIFY_CHAIN_HASH_MISMATCH;
#if KVC_CHECK_TOKEN
            if (en.exp_tok[u] != kvc::NO_SLOT && tok[u] != en.exp_tok[u]) bits |= kvc::VERIFY_TOKEN_MISMATCH;
#endif
            if (spos[u] != en.pos[u]) bits |= kvc::VERIFY_POSITION_MISMATCH;
            kvc_i64 fingerprint = 0;
#if KVC_HAS_REAL_KV
            if (nsrc > 0) fingerprint = (kvc_i64)kvc_fingerprint_table<kvc::kVtFoldLoads>(x.sources, nsrc, s, w0[u], w1[u]);
#endif
            if (rkv[u] != fingerprint) bits |= kvc::VERIFY_REAL_KV_HASH_MISMATCH;
        }
        const bool want = oor || bits != 0;
        kvc_append_row_warp(log, want, s, oor ? en.pos[u] : spos[u], oor ? kvc::NO_SLOT : tok[u], en.exp_tok[u],
                            oor ? 0 : hash[u], oor ? prev : expected_chain,
                            oor ? (kvc_i64)kvc::SLOT_OUT_OF_RANGE : bits);
    }
}

extern "C" __global__ void __launch_bounds__(KVC_VT_THREADS, kvc::kVtMinBlocks)
kvc_verify_from_table(const __grid_constant__ KvcVerifyTableParams p) {
    __shared__ kvc_i64 s_off[kvc::kVtTile + 1];  // tile-local exclusive offsets of the rows' entries
    __shared__ kvc_i64 s_rp[kvc::kVtTile];       // req_pool_indices
    __shared__ kvc_i64 s_ws[kvc::kVtTile];       // window start
#if KVC_CHECK_TOKEN
    __shared__ kvc_i64 s_vlen[kvc::kVtTile];     // expected-token valid lengths
#endif
    __shared__ kvc_i64 scratch[kvc::kScanScratch];

    const KvcTableParams& t = p.table;
    const KvcBatchParams& b = p.batch;
    const int nctx = (int)p.num_contexts;
    const int tid = (int)threadIdx.x, lane = tid & 31;
    const kvc_i64 grid_stride = kvc::kVtChunk * gridDim.x;
    kvc_i64 next = (kvc_i64)blockIdx.x * kvc::kVtChunk;  // first entry of this block's next chunk
    kvc_i64 carry = 0;                                      // entries of the rows before the tile
    kvc_i64 invalid = 0;                                    // invalid rows this thread saw

    for (kvc_i64 tile = 0; tile < b.bs; tile += kvc::kVtTile) {
        const kvc_i64 r = tile + tid;
        kvc_i64 len = 0;
        if (r < b.bs) {
            const kvc_i64 rp = b.req_pool_indices[r], prefix = b.prefix_lens[r];
            const bool valid = kvc_row_valid(rp, prefix, t.max_reqs, t.max_seq_len, t.pad_row);
            invalid += valid ? 0 : 1;
            len = kvc_verify_len(valid && rp != t.pad_row, prefix, b.swa_window_size);
            s_rp[tid] = rp;
            s_ws[tid] = kvc_window_start(prefix, b.swa_window_size);
#if KVC_CHECK_TOKEN
            s_vlen[tid] = b.valid_lens[r];
#endif
        }
        // Rows past bs have no entries, so their offsets equal the tile total and no search selects them.
        kvc_i64 tile_total;
        s_off[tid] = kvc_block_exclusive_sum(len, scratch, tile_total);
        if (tid == 0) s_off[kvc::kVtTile] = tile_total;
        __syncthreads();

        const kvc_i64 tile_end = carry + tile_total;
        kvc_i64 hint = 0;  // this thread's last row in the tile (its entries only move forward)
        while (next < tile_end) {  // block-uniform
            const kvc_i64 lo = kvc_max64(next, carry), hi = kvc_min64(next + kvc::kVtChunk, tile_end);
            KvcVtEntries en;
#pragma unroll
            for (int u = 0; u < kvc::kVtUnroll; ++u) {
                const kvc_i64 e = lo + (kvc_i64)u * KVC_VT_THREADS + tid;
                en.act[u] = e < hi;
                en.nb[u] = false;
                en.slot[u] = kvc::TOKEN_TO_KV_SLOT_PADDING;
                en.prev[u] = en.pos[u] = 0;
                en.exp_tok[u] = kvc::NO_SLOT;
                if (en.act[u]) {
                    const kvc_i64 el = e - carry;
                    const kvc_i64 row = kvc_find_row(s_off, kvc::kVtTile, el, hint);
                    hint = row;
                    const kvc_i64 rp = s_rp[row], first = s_off[row];
                    const kvc_i64 pos = s_ws[row] + (el - first);
                    en.pos[u] = pos;
                    en.slot[u] = kvc_lut_translate<KVC_HAS_LUT>(t, kvc_table_rt(t, rp, pos));
                    // Lane - 1 holds entry e - 1 (same step): it is this entry's predecessor unless e starts the
                    // row's entries. A window's first entry keeps its real predecessor (windows do not restart
                    // the chain); position 0 is a chain head.
                    en.nb[u] = lane > 0 && el > first;
                    if (!en.nb[u])
                        en.prev[u] = pos > 0 ? kvc_lut_translate<KVC_HAS_LUT>(t, kvc_table_rt(t, rp, pos - 1))
                                             : kvc::NO_SLOT;
#if KVC_CHECK_TOKEN
                    const kvc_i64 q = pos + b.token_offset;
                    if (kvc_expected_token_ok(q, s_vlen[row], b.pool_cols)) en.exp_tok[u] = (kvc_i64)b.pool[rp * b.pool_cols + q];
#endif
                }
            }
#pragma unroll
            for (int u = 0; u < kvc::kVtUnroll; ++u) {
                const kvc_i64 s = __shfl_up_sync(kvc::kFullMask, en.slot[u], 1);
                if (en.nb[u]) en.prev[u] = s;
            }
#pragma unroll
            for (int c = 0; c < KVC_CONTEXTS; ++c)  // the launcher never passes more (specs.contexts_spec)
                if (c < nctx) kvc_vt_context(p.ctx[c], en);  // block-uniform condition
            if (next + kvc::kVtChunk > tile_end) break;  // the chunk continues in the next tile
            next += grid_stride;
        }
        carry = tile_end;
        __syncthreads();  // the tile's shared rows are read until here
    }

    if (blockIdx.x == 0) {  // block 0 walked every row: it knows the totals
        kvc_i64 invalid_total;
        kvc_block_exclusive_sum(invalid, scratch, invalid_total);
        if (tid == 0) {
#pragma unroll
            for (int c = 0; c < KVC_CONTEXTS; ++c) {
                if (c < nctx) {
                    kvc_counter_add(p.ctx[c].kernel_run_counter, 1);
                    if (carry > 0) kvc_counter_add(p.ctx[c].slot_run_counter, carry);
                }
            }
            if (b.invalid_rows != nullptr) *b.invalid_rows = (int)invalid_total;
            if (p.invalid_rows_total != nullptr && invalid_total != 0)
                atomicAdd(reinterpret_cast<unsigned long long*>(p.invalid_rows_total),
                          (unsigned long long)invalid_total);
        }
    }
}
