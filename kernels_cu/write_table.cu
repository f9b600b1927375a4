// kvcanary write straight from the table (SPEC §12). CPU twin: kvcanary/ops/reference/write_table.py;
// launcher: kvcanary/ops/cuda/write_table.py.
//
// Specializations: KVC_INPUT_ASSERT, KVC_HAS_REAL_KV (some context folds real KV, from its device descriptor
// table of any number of sources), KVC_CONTEXTS (1, 2 or 4: the most contexts a launch passes; the per-context
// loops are unrolled that far, so a one-buffer or K/V launch does not carry four contexts' code: on an H200, A
// decode in a graph 5.2 -> 4.7 us for one context). One parameter: KvcWriteTableParams, with 1 to KVC_CONTEXTS
// contexts that share the table and the tokens (K and V of a group); each context has its own canary buffer, so
// its own seed record and chain.
//
// §5's write metadata is computed in the kernel, with no plan and no scratch: every block walks the rows in
// tiles of items * KVC_WT_THREADS rows (each thread `items` consecutive rows, 1 .. kvc::kWtRowItems, as few as
// cover the batch in one tile: pool index, prefix, extend; a block-wide exclusive sum of the write lengths gives
// the rows' token offsets in shared memory, except in a tile whose rows all have one token, a decode batch's,
// where a row's offset is its index and the barrier that publishes the rows tells whether that held: on an H200,
// A decode in a graph 3.01 -> 2.75 us, B 4.18 -> 4.07); a row's seed (the table entry of position prefix - 1,
// through the LUT) is read only by the block that writes the row, right after the row itself, so its latency
// overlaps the scan. Then:
//  * one-token requests (a decode batch): by the thread that scanned the row (kvc_wt_single); it issued the
//    token loads with its row loads (at the row's index, right while every earlier row has one token) and the
//    seed records right after the table, so only the record store is left after the scan (on an H200, with the
//    loads reordered below, A decode in a graph 3.85 -> 3.01 us, B 5.59 -> 4.16); empty rows need nothing;
//    and write_core.cuh's machinery for the rest:
//  * short and bad requests: one warp each; row r goes to block r mod G, its warp (r / G) mod
//    kvc::kWtWarps (KVC_WT_SPREAD: a decode batch spread over every SM; measured on an H200, A decode in a graph
//    5.7 -> 5.3 us with the per-block stamp counts below, B 8.6 -> 7.4);
//  * long requests: the whole block; row r goes to block r mod G (the walkers are lanes 0 .. contexts-1 of
//    warp 0, one chain per context, in lockstep; the workers are threads 32 .. 32 + kvc::kWtTile - 1).
// With more than one row per thread, a tile is first checked for one token per row without the scan
// (kvc_wt_decode_rows: coalesced row loads and one compare per row; the block's own rows, r mod G == block, one
// per thread, written by its first threads); only when the check fails does the scan above run.
// The grid is fixed by the SM count (never by the batch); the counts are read on the device. A decode batch of
// up to kvc::kWtRowItems * KVC_WT_THREADS rows is one tile: one round of row loads, one barrier, then the stores.
//
// Counters: per context kernel_run_counter += 1 (block 0) and slot_run_counter += the stamped slots (one atomic
// per block, KVC_WT_BLOCK_STAMPS; per stamping warp, with no barrier, when every tile's rows had one token);
// invalid_rows (if given) is SET by block 0, which walks every row. Rows, RT(),
// T(), seeds and bounds as the reference (SPEC §5, §6, §9, §10; see write_core.cuh): a row's tokens are
// [sum of write_len of the rows before it, + write_len); invalid and padding rows write nothing and take no
// tokens.

// 1: splitmix64's multiplies as three instructions instead of four (KVC_MUL3, common.cuh's kvc_mul64, as in the
// verify's 32-bit modules): a shorter dependent chain per hash, which is what a long request's chain walker waits
// on. Long chains 3.4 % faster on an H200 (C 3,338 -> 3,223 us, D 213.0 -> 205.8 in a graph); the decode write the
// same within the spread (H200 and H100, each variant timed twice, interleaved: BENCHMARKS.md).
#define KVC_WT_MUL3 1
#if KVC_WT_MUL3
#define KVC_MUL3 1
#endif
#include "write_core.cuh"

#ifndef KVC_INPUT_ASSERT
#error "KVC_INPUT_ASSERT must be defined (0 or 1)"
#endif
#ifndef KVC_HAS_REAL_KV
#error "KVC_HAS_REAL_KV must be defined (0 or 1)"
#endif
#ifndef KVC_CONTEXTS
#error "KVC_CONTEXTS must be defined (1, 2 or 4)"
#endif
static_assert(KVC_CONTEXTS >= 1 && KVC_CONTEXTS <= kvc::kMaxContexts, "contexts per launch");

// Launch geometry (kvcanary/ops/cuda/grids.py reads these defines).
#define KVC_WT_THREADS 256
#define KVC_WT_BLOCKS_PER_SM 1
#define KVC_WT_ROW_ITEMS 4  // at most this many rows per thread per tile of the row scan
// 1: the stamped-slot counts are summed per block (one atomic per block and context); 0: per warp.
#define KVC_WT_BLOCK_STAMPS 1
// Which warp writes short request r: 1: block r mod G, its warp (r / G) mod W (a decode batch spread over every
// SM); 0: warp r mod (G * W) of the grid in block order (the first blocks' warps first).
#define KVC_WT_SPREAD 1
// 1: programmatic dependent launch (common.cuh, kvc_grid_dependency; kvcanary/ops/cuda/pdl.py launches the kernel
// with the attribute only when this is 1). On an H100, A decode in a graph of its own launches 2.96-3.00 -> 2.45-2.47
// us, B 3.48-3.52 -> 3.00-3.01 (the launch overlaps the end of the kernel before it: in a KVCanary step, the verify).
#define KVC_WT_PDL 1

namespace kvc {
constexpr int kWtWarps = KVC_WT_THREADS / kWarpSize;
// Tokens per tile of the long-request path (its workers are threads 32 .. 32 + kWtTile - 1; with four contexts a
// tile's shared memory is about 26 KB).
constexpr int kWtTile = 96;
constexpr int kWtRowItems = KVC_WT_ROW_ITEMS;
constexpr int kWtRows = kWtRowItems * KVC_WT_THREADS;  // rows per tile
static_assert(kWtWarps * kWarpSize == KVC_WT_THREADS, "whole warps");
static_assert(KVC_WT_THREADS >= kWriteWorkerBase + kWtTile, "a worker per tile token");
}  // namespace kvc

// The fingerprint of a covered slot from a descriptor table of n >= 1 sources. Not inlined: the write reaches it
// from both request paths and every context, and a token's fingerprint is off the chain's critical path.
__device__ __noinline__ kvc_u64 kvc_write_fingerprint(const kvc_i64* desc, kvc_i64 n, kvc_i64 slot) {
    kvc_u64 w0, w1;
    kvc_load16(kvc_source_bytes(desc, slot), w0, w1);
    return kvc_fingerprint_table<kvc::kFoldLoadsInFlight>(desc, n, slot, w0, w1);
}

// The contexts of a plan-free write launch.
struct KvcWriteTableContexts {
    static constexpr bool kRealKv = KVC_HAS_REAL_KV != 0;
    const KvcWriteTableParams& p;
    __device__ __forceinline__ int count() const { return (int)p.num_contexts; }
    __device__ __forceinline__ const KvcContextParams& ctx(int c) const { return p.ctx[c]; }
    __device__ __forceinline__ kvc_u64 fingerprint(int c, kvc_i64 slot) const {
        const KvcContextParams& x = p.ctx[c];
        return x.num_sources > 0 ? kvc_write_fingerprint(x.sources, x.num_sources, slot) : 0;
    }
};

// The first r >= base with r mod m == k (0 <= k < m). base 0 (the first tile, the only one of a decode batch)
// needs no division.
__device__ __forceinline__ kvc_i64 kvc_first_congruent(kvc_i64 base, kvc_i64 m, kvc_i64 k) {
    if (base == 0) return k;
    kvc_i64 q, rem;
    kvc_divmod(base, m, q, rem);
    return base + (k >= rem ? k - rem : k - rem + m);
}

namespace kvc {
// s_seed of a row of the block's that the warp loop skips: an empty one, or a one-token one that the thread which
// scanned it writes (kvc_wt_single). Real seeds are stored as >= -1 (every negative seed is "no seed").
constexpr kvc_i64 kWtRowDone = -2;
}  // namespace kvc

// A one-token request of the block's (a decode row), written by the thread that scanned its row rather than by a
// warp after the scan: its token loads go out with the row loads, at the token index the row would have if every
// row before it had one token (`guess`; reloaded at `start` when not), and its seed records right after the
// table, so both latencies overlap the block scan instead of following it; and one token needs no chain walk
// (its record holds the seed's hash; the token's own mix3 is only for a next token).
template <int NC>
struct KvcWtSingle {
    bool go;  // write it (kvc_wt_single) once the rows are published
    kvc_i64 guess, start, seed;
    KvcSeedRecord rec[NC];
    kvc_u64 running[NC];  // the chain state the seed records give (kvc_wt_single_seed)
    kvc_i64 last_pos[NC];
    kvc_i64 slot, tok, pos, expected_tok, expected_pos;
};

// The chain state of a one-token row from its seed records. kvc_wt_decode_rows computes it before the barrier that
// publishes the rows (after the check's loads are used), so the hash overlaps the wait for the other threads rather
// than following it (H200, with the two changes at the kernel's end, B decode in a graph 3.54 -> 3.40 us); after the
// scan (kvc_wt_rows) the same order made A 2.73 -> 2.89 us, so there it is computed after the barrier.
template <int NC>
__device__ __forceinline__ void kvc_wt_single_seed(int nctx, KvcWtSingle<NC>& one) {
#pragma unroll
    for (int c = 0; c < NC; ++c)
        if (c < nctx) kvc_write_seed_state(one.rec[c], one.seed, one.running[c], one.last_pos[c]);
}

// Token i's slot, id and position (and its expected ones with the input assert) into `one`.
template <int NC, bool INPUT_ASSERT>
__device__ __forceinline__ void kvc_wt_single_tokens(const KvcTokenParams& tk, kvc_i64 i, KvcWtSingle<NC>& one) {
    one.slot = tk.out_cache_loc[i];
    one.tok = tk.input_ids[i];
    one.pos = tk.positions[i];
    if (INPUT_ASSERT) {
        one.expected_tok = tk.expected_input_tokens[i];
        one.expected_pos = tk.expected_input_positions[i];
    }
}

// `one` before its row is known: nothing to write yet, and its tokens loaded at `guess` (the row's token index if
// every row before it has one token; kvc::NO_SLOT: past the token arrays, or no row).
template <int NC, bool INPUT_ASSERT>
__device__ __forceinline__ void kvc_wt_single_begin(const KvcTokenParams& tk, kvc_i64 guess, KvcWtSingle<NC>& one) {
    one.go = false;
    one.guess = guess;
    one.slot = kvc::NO_SLOT;
    one.tok = one.pos = one.expected_tok = one.expected_pos = 0;
    if (guess >= 0) kvc_wt_single_tokens<NC, INPUT_ASSERT>(tk, guess, one);
}

// The seed of a row that has one (kvc_has_seed): T(RT(rp, prefix - 1)), every negative value as kvc::NO_SLOT.
__device__ __forceinline__ kvc_i64 kvc_wt_row_seed(const KvcTableParams& t, kvc_i64 rp, kvc_i64 prefix) {
    return kvc_max64(kvc_lut_translate_any(t, kvc_table_rt(t, rp, prefix - 1)), kvc::NO_SLOT);
}

// Each context's chain position flag (0 for the contexts past the launch's), loaded right after a tile's row loads;
// compared only where used.
template <int NC, class Cx>
__device__ __forceinline__ void kvc_wt_position_flags(const Cx& cx, int nctx, int (&position_flag)[NC]) {
#pragma unroll
    for (int c = 0; c < NC; ++c) position_flag[c] = c < nctx ? kvc_position_flag_load(cx.ctx(c)) : 0;
}

// The seed records of `one`'s row (one.seed set): loaded when the row has one token (`len`) and the seed is inside
// the buffer (only such a seed has a record), so that they are in flight while the rows are published.
template <int NC, class Cx>
__device__ __forceinline__ void kvc_wt_single_seed_load(const Cx& cx, int nctx, kvc_i64 len, KvcWtSingle<NC>& one) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        one.rec[c] = KvcSeedRecord{0, 0, 0};
        if (c < nctx && len == 1 && one.seed < cx.ctx(0).num_slots)
            one.rec[c] = kvc_write_seed_load(cx.ctx(c), one.seed);
    }
}

// What a block learns from one tile of rows.
struct KvcWtTile {
    kvc_i64 total;  // the tile's tokens
    bool any_long;  // some row has more than kvc::kWriteShort tokens (so the long-request loop has work)
    bool ones;      // every row has one token (a decode tile: only the warps of the block's own rows stamp)
};

// Thread tid's rows into shared memory, from `run`, the tile-local token offset of its first row: s_start gets
// each row's offset, s_seed its seed (kvc::kWtRowDone for the rows the warp loop skips); row jm (the thread's
// first row of the block's own) becomes `one` (go: a one-token request this thread writes).
template <int ITEMS, int NC, class Cx>
__device__ __forceinline__ void kvc_wt_publish(const Cx& cx, const KvcTokenParams& tk, kvc_i64 run, kvc_i64 tok_carry,
                                               int items, const kvc_i64 (&len)[ITEMS], const kvc_i64 (&seed)[ITEMS],
                                               int jm, kvc_i64 len_m, kvc_i64 seed_m, kvc_i64* s_start,
                                               kvc_i64* s_seed, KvcWtSingle<NC>& one) {
    const int tid = (int)threadIdx.x;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        if (j >= items) break;
        bool done = false;
        if (j == jm) {
            one.start = tok_carry + run;
            // A good range and a seed inside the buffer (else the warp loop logs the request).
            one.go = len_m == 1 && one.start >= 0 && one.start < tk.num_tokens && seed_m < cx.ctx(0).num_slots;
            done = len_m == 0 || one.go;
        }
        s_start[tid * items + j] = run;
        s_seed[tid * items + j] = done ? kvc::kWtRowDone : seed[j];
        run += len[j];
    }
}

// One tile of rows [tile, tile + items * KVC_WT_THREADS) of the write (SPEC §5, §10): thread tid takes rows
// tile + tid * items + j, j < items <= ITEMS; s_start gets the rows' tile-local exclusive token offsets (and the
// tile total after them), s_seed the seeds of the rows this block writes (else -1; kvc::kWtRowDone for the rows the
// warp loop skips); `invalid` counts the invalid rows this thread saw; `one` is the thread's first row of the
// block's own if it is a one-token request (tok_carry: the tokens before the tile); position_flag gets each
// context's chain position flag (0 when it has none). Ends with the barrier that publishes them. ITEMS is a
// compile-time bound: a batch of up to KVC_WT_THREADS rows runs the one-row code, without the per-item loop and
// its run-time checks (a decode batch).
template <int ITEMS, int NC, bool INPUT_ASSERT, class Cx>
__device__ __forceinline__ KvcWtTile kvc_wt_rows(const Cx& cx, const KvcTableParams& t, const KvcBatchParams& b,
                                                 const KvcTokenParams& tk, kvc_i64 tile, int items, kvc_i64 tok_carry,
                                                 kvc_i64 blocks, kvc_i64 block, kvc_i64* s_start, kvc_i64* s_seed,
                                                 kvc_i64* scratch, kvc_i64& invalid, KvcWtSingle<NC>& one,
                                                 int (&position_flag)[NC]) {
    const int tid = (int)threadIdx.x;
    const int nctx = cx.count();
    const kvc_i64 first = tile + (kvc_i64)tid * items;
    // The row loads first: they start the critical path (rows -> table -> seed record). Then the contexts' position
    // flags, compared only where used (a flag compared here would hold every warp for a load latency before its
    // row loads were issued: Nsight Compute, H200).
    kvc_i64 rp[ITEMS], prefix[ITEMS], extend[ITEMS];
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        rp[j] = prefix[j] = extend[j] = 0;
        if (j < items && first + j < b.bs) {
            rp[j] = b.req_pool_indices[first + j];
            prefix[j] = b.prefix_lens[first + j];
            extend[j] = b.extend_seq_lens[first + j];
        }
    }
    kvc_wt_position_flags<NC>(cx, nctx, position_flag);
    bool mine[ITEMS];
    int jm = -1;  // the thread's first row of the block's own
#if KVC_WT_SPREAD
    // Both paths give row r to block r mod G: one division for the thread's first row (none below G), then a
    // count for the next ones (a decode batch's threads are on the critical path, and each division is a long
    // sequence of instructions).
    kvc_i64 by_block = first, q;
    if (first >= blocks) kvc_divmod(first, blocks, q, by_block);
#endif
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        mine[j] = false;
        if (j < items && first + j < b.bs) {
#if KVC_WT_SPREAD
            mine[j] = by_block == block;
            const bool by_warps = mine[j];
            by_block = by_block + 1 == blocks ? 0 : by_block + 1;
#else
            kvc_i64 q, by_block;
            kvc_divmod(first + j, blocks, q, by_block);
            kvc_i64 by_warp;
            kvc_divmod(first + j, blocks * kvc::kWtWarps, q, by_warp);
            const bool by_warps = by_warp / kvc::kWtWarps == block;  // the warp loop's rows
            mine[j] = by_warps || by_block == block;
#endif
            if (jm < 0 && by_warps) jm = j;
        }
    }
    kvc_wt_single_begin<NC, INPUT_ASSERT>(tk, jm >= 0 && first + jm < tk.num_tokens ? first + jm : kvc::NO_SLOT, one);
    kvc_i64 len[ITEMS], seed[ITEMS], sum = 0;
    bool some_long = false, ones = true;  // ones: every row of the thread's has one token
    kvc_i64 len_m = 0, seed_m = kvc::NO_SLOT;  // row jm's
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        len[j] = 0;
        seed[j] = kvc::NO_SLOT;
        if (j < items && first + j < b.bs) {
            const bool valid = kvc_row_valid(rp[j], prefix[j], t.max_reqs, t.max_seq_len, t.pad_row);
            const bool active = valid && rp[j] != t.pad_row;
            invalid += valid ? 0 : 1;
            len[j] = kvc_write_len(active, extend[j]);
            some_long = some_long || len[j] > kvc::kWriteShort;
            ones = ones && len[j] == 1;
            if (mine[j] && kvc_has_seed(active, prefix[j], len[j]))
                seed[j] = kvc_wt_row_seed(t, rp[j], prefix[j]);
        }
        sum += len[j];
        if (j == jm) {
            len_m = len[j];
            seed_m = seed[j];
        }
    }
    // Row jm's seed records, in flight during the scan.
    one.seed = seed_m;
    kvc_wt_single_seed_load<NC>(cx, nctx, len_m, one);
    // The rows' tile-local token offsets. When every row of the tile has one token (a decode batch) a row's offset
    // is its index: the rows are published at once, and the barrier that publishes them also tells whether that
    // held; only when not does the block scan (three more barriers) run and the rows get published again. (Offsets
    // past the tile's last row are never read.)
    const kvc_i64 n_rows = kvc_min64((kvc_i64)items * KVC_WT_THREADS, b.bs - tile);
    KvcWtTile out;
    out.total = n_rows;
    out.any_long = false;
    out.ones = true;
    kvc_wt_publish<ITEMS>(cx, tk, first - tile, tok_carry, items, len, seed, jm, len_m, seed_m, s_start,
                          s_seed, one);
    if (tid == 0) s_start[(kvc_i64)items * KVC_WT_THREADS] = n_rows;
    if (__syncthreads_and(ones)) return out;
    out.ones = false;
    const kvc_i64 run = kvc_block_exclusive_sum(sum, scratch, out.total);
    kvc_wt_publish<ITEMS>(cx, tk, run, tok_carry, items, len, seed, jm, len_m, seed_m, s_start, s_seed, one);
    if (tid == 0) s_start[(kvc_i64)items * KVC_WT_THREADS] = out.total;
    // The barrier that publishes the rows also tells whether any row may be long (a row of more than kWriteShort
    // tokens whose range turns out bad is not: the long loop checks each row).
    out.any_long = __syncthreads_or(some_long) != 0;
    return out;
}

// A tile that may be a decode batch (every row one token), checked without the row scan: thread tid first loads
// the block's own row of rank tid (the rows r of the tile with r mod G == block, in order; the caller makes sure
// there are at most KVC_WT_THREADS), its tokens at the row's index and its seed records, as kvc_wt_rows does for
// its row jm; then it checks that rows tid, tid + KVC_WT_THREADS, ... of the tile have one token each (coalesced
// loads, no ownership or seed work per row). The barrier that publishes the own rows (their offsets are their
// indices) tells whether every row had one token; when not, nothing published is used and the caller runs
// kvc_wt_rows. Every block reads every row either way; this way a row costs each block three loads and a compare
// instead of the scan's bookkeeping, and a block's writes are done by its first warp(s) rather than one thread in
// each of its warps.
template <int NC, bool INPUT_ASSERT, class Cx>
__device__ __forceinline__ bool kvc_wt_decode_rows(const Cx& cx, const KvcTableParams& t, const KvcBatchParams& b,
                                                   const KvcTokenParams& tk, kvc_i64 tile, kvc_i64 n_rows,
                                                   kvc_i64 tok_carry, kvc_i64 blocks, kvc_i64 block, kvc_i64* s_start,
                                                   kvc_i64* s_seed, KvcWtSingle<NC>& one, int (&position_flag)[NC]) {
    const int tid = (int)threadIdx.x;
    const int nctx = cx.count();
    // The own row (tile-local index i) first: it starts the critical path (row -> table -> seed record).
    const kvc_i64 i = kvc_first_congruent(tile, blocks, block) - tile + (kvc_i64)tid * blocks;
    const bool own = i < n_rows;
    kvc_i64 rp = 0, prefix = 0, extend = 0;
    if (own) {
        rp = b.req_pool_indices[tile + i];
        prefix = b.prefix_lens[tile + i];
        extend = b.extend_seq_lens[tile + i];
    }
    kvc_wt_position_flags<NC>(cx, nctx, position_flag);
    kvc_wt_single_begin<NC, INPUT_ASSERT>(tk, own && tok_carry + i < tk.num_tokens ? tok_carry + i : kvc::NO_SLOT,
                                          one);
    const bool active = own && kvc_row_active(rp, prefix, t.max_reqs, t.max_seq_len, t.pad_row);
    const kvc_i64 len = kvc_write_len(active, extend);
    one.seed = kvc::NO_SLOT;
    if (kvc_has_seed(active, prefix, len)) one.seed = kvc_wt_row_seed(t, rp, prefix);
    kvc_wt_single_seed_load<NC>(cx, nctx, len, one);
    // Every row of the tile: one token each? Each block starts at its own place in the tile (block * 32 rows on,
    // wrapping), so that the grid's blocks do not all ask the same L2 lines at once (H200, B decode in a graph
    // 3.50-3.55 -> 3.46-3.48 us).
    kvc_i64 crp[kvc::kWtRowItems], cprefix[kvc::kWtRowItems], cextend[kvc::kWtRowItems];
    const kvc_i64 rot = (kvc_i64)((unsigned)block * 32u % (unsigned)n_rows);  // n_rows <= kWtRows, block < 2**31
#pragma unroll
    for (int j = 0; j < kvc::kWtRowItems; ++j) {
        kvc_i64 k = tid + (kvc_i64)j * KVC_WT_THREADS;
        crp[j] = cprefix[j] = 0;
        cextend[j] = 1;
        if (k < n_rows) {
            k += rot;
            if (k >= n_rows) k -= n_rows;
            crp[j] = b.req_pool_indices[tile + k];
            cprefix[j] = b.prefix_lens[tile + k];
            cextend[j] = b.extend_seq_lens[tile + k];
        }
    }
    bool ones = true;
#pragma unroll
    for (int j = 0; j < kvc::kWtRowItems; ++j) {
        if (tid + (kvc_i64)j * KVC_WT_THREADS < n_rows)
            ones = ones && cextend[j] == 1 &&
                   kvc_row_active(crp[j], cprefix[j], t.max_reqs, t.max_seq_len, t.pad_row);
    }
    if (own) {
        one.start = tok_carry + i;
        // A good range and a seed inside the buffer (else the warp loop logs the request).
        one.go = len == 1 && one.start < tk.num_tokens && one.seed < cx.ctx(0).num_slots;
        s_start[i] = i;
        // s_start[i + 1] is the next row's offset: with one block the next row is this block's too, and its thread
        // writes it.
        if (blocks > 1 || i + 1 == n_rows) s_start[i + 1] = i + 1;
        s_seed[i] = one.go ? kvc::kWtRowDone : one.seed;
        if (len == 1) kvc_wt_single_seed<NC>(nctx, one);
    }
    return __syncthreads_and(ones) != 0;
}

// A one-token request (`one.go`) by its thread: SPEC §6 for one token, as kvc_write_warp_request does it for a
// request of n = 1 (the range and the seed were checked when `go` was set).
template <int NC, bool INPUT_ASSERT, class Cx>
__device__ __forceinline__ void kvc_wt_single(const Cx& cx, const KvcTokenParams& tk, KvcWtSingle<NC>& one,
                                              const bool (&position_assert)[NC], kvc_i64 (&stamped)[NC]) {
    const int nctx = cx.count();
    const kvc_i64 i = one.start;
    // Reloaded when a row before it had other than one token.
    if (i != one.guess) kvc_wt_single_tokens<NC, INPUT_ASSERT>(tk, i, one);
    const int assert_bits =
        kvc_write_assert_bits_of<INPUT_ASSERT>(one.slot, one.tok, one.pos, one.expected_tok, one.expected_pos);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        if (c < nctx) {
            const int flag = kvc_write_flag(one.slot, cx.ctx(c).slot_limit, assert_bits);
            const kvc_i64 rkv = Cx::kRealKv && (flag & kvc::kFlagStamp) ? (kvc_i64)cx.fingerprint(c, one.slot) : 0;
            const bool check_pos = one.seed >= 0 && position_assert[c];
            stamped[c] += kvc_write_finish(cx.ctx(c), tk, true, flag, one.slot, one.tok, one.pos, rkv,
                                           (kvc_i64)one.running[c], (kvc_i64)((kvc_u64)one.last_pos[c] + 1ULL),
                                           check_pos, i);
        }
    }
}

extern "C" __global__ void __launch_bounds__(KVC_WT_THREADS, KVC_WT_BLOCKS_PER_SM)
kvc_write_from_table(const __grid_constant__ KvcWriteTableParams p) {
    constexpr int NC = KVC_CONTEXTS;  // the launcher never passes more (specs.contexts_spec)
    __shared__ KvcWriteSmem<NC, kvc::kWtTile> sm;
    __shared__ kvc_i64 s_start[kvc::kWtRows + 1];  // tile-local exclusive token offsets of the rows
    __shared__ kvc_i64 s_seed[kvc::kWtRows];       // seeds of the rows this block writes
    __shared__ kvc_i64 scratch[kvc::kScanScratch];

    const KvcWriteTableContexts cx{p};
    const KvcTableParams& t = p.table;
    const KvcBatchParams& b = p.batch;
    const KvcTokenParams& tk = p.tokens;
    const int tid = (int)threadIdx.x, warp = tid >> 5;
    const int nctx = (int)p.num_contexts;
    const kvc_i64 blocks = gridDim.x, block = blockIdx.x;
#if KVC_WT_SPREAD
    const kvc_i64 warps = blocks * kvc::kWtWarps, gwarp = (kvc_i64)warp * blocks + block;
#else
    const kvc_i64 warps = blocks * kvc::kWtWarps, gwarp = block * kvc::kWtWarps + warp;
#endif

    kvc_grid_dependency<KVC_WT_PDL != 0>();
    if (block == 0 && tid == 0) {
#pragma unroll
        for (int c = 0; c < NC; ++c)
            if (c < nctx) kvc_counter_add(p.ctx[c].kernel_run_counter, 1);
    }
    kvc_i64 stamped[NC];  // per thread, summed per warp at the end
#pragma unroll
    for (int c = 0; c < NC; ++c) stamped[c] = 0;

    bool all_decode = true;  // every tile had one token per row (block-uniform)
    kvc_i64 tok_carry = 0;  // tokens of the rows before the tile
    kvc_i64 invalid = 0;    // invalid rows this thread saw
    // Rows per thread: as few as cover the batch in one tile (at most kWtRowItems), so a small decode batch
    // spreads its row loads and seed reads over the most threads (measured on an H200: A decode 7.3 -> 5.7 us in a
    // graph) while a large one still takes one tile.
    const int items = (int)kvc_min64(kvc::kWtRowItems, kvc_max64(1, (b.bs + KVC_WT_THREADS - 1) / KVC_WT_THREADS));
    const kvc_i64 tile_rows = (kvc_i64)items * KVC_WT_THREADS;
    for (kvc_i64 tile = 0; tile < b.bs; tile += tile_rows) {
        KvcWtSingle<NC> one;
        int position_flag[NC];
        const kvc_i64 n_rows = kvc_min64(tile_rows, b.bs - tile);
        KvcWtTile rows{n_rows, false, true};
        // With more than one row per thread, the check for a decode tile first, when the block's own rows fit one
        // per thread (block-uniform). On an H200, B decode in a graph 3.76 -> 3.39 us; at one row per thread the
        // scan already costs a row's loads and a barrier, and the check made A decode slower (2.70 -> 2.93 us).
        // (kvc_wt_decode_rows takes a block's own rows as KVC_WT_SPREAD lays them out.)
        const bool decode = KVC_WT_SPREAD && items > 1 && blocks * KVC_WT_THREADS >= n_rows &&
                            kvc_wt_decode_rows<NC, KVC_INPUT_ASSERT != 0>(cx, t, b, tk, tile, n_rows, tok_carry, blocks,
                                                                          block, s_start, s_seed, one, position_flag);
        if (!decode)
            rows = items == 1
                ? kvc_wt_rows<1, NC, KVC_INPUT_ASSERT != 0>(cx, t, b, tk, tile, 1, tok_carry, blocks, block, s_start,
                                                            s_seed, scratch, invalid, one, position_flag)
                : kvc_wt_rows<kvc::kWtRowItems, NC, KVC_INPUT_ASSERT != 0>(cx, t, b, tk, tile, items, tok_carry,
                                                                           blocks, block, s_start, s_seed, scratch,
                                                                           invalid, one, position_flag);
        all_decode = all_decode && rows.ones;  // kvc_wt_decode_rows checked it (rows keeps its defaults)
        bool position_assert[NC];
#pragma unroll
        for (int c = 0; c < NC; ++c) position_assert[c] = position_flag[c] != 0;
        const kvc_i64 tile_total = rows.total;
        const kvc_i64 tile_end = tile + kvc_min64(tile_rows, b.bs - tile);
        if (one.go) {
            if (!decode) kvc_wt_single_seed<NC>(nctx, one);
            kvc_wt_single<NC, KVC_INPUT_ASSERT != 0>(cx, tk, one, position_assert, stamped);
        }

        // Short, empty and bad requests: one warp each (the loop is warp-uniform).
        for (kvc_i64 r = kvc_first_congruent(tile, warps, gwarp); r < tile_end; r += warps) {
            const kvc_i64 i = r - tile;
            if (s_seed[i] == kvc::kWtRowDone) continue;
            const kvc_i64 start = tok_carry + s_start[i], end = tok_carry + s_start[i + 1];
            if (kvc_write_is_long(start, end, tk.num_tokens)) continue;
            kvc_write_warp_request<NC, KVC_INPUT_ASSERT != 0>(cx, tk, start, end, s_seed[i], position_assert,
                                                               stamped);
        }
        // Long requests: the whole block (the loop and its condition are block-uniform); skipped when the tile has
        // none (a decode batch: the loop's row reads and checks are most of a warp's instructions otherwise).
        for (kvc_i64 r = kvc_first_congruent(tile, blocks, block); rows.any_long && r < tile_end; r += blocks) {
            const kvc_i64 i = r - tile;
            const kvc_i64 start = tok_carry + s_start[i], end = tok_carry + s_start[i + 1];
            if (!kvc_write_is_long(start, end, tk.num_tokens)) continue;
            kvc_write_block_request<NC, kvc::kWtTile, KVC_INPUT_ASSERT != 0>(cx, tk, start, end, s_seed[i],
                                                                             position_assert, stamped, sm);
        }
        tok_carry += tile_total;
        // The tile's shared rows are read until here. Not after the last tile: what follows uses other shared
        // memory (scratch, the stamp sums), behind barriers of its own (H200, B decode in a graph 4.07 -> 4.02 us).
        if (tile + tile_rows < b.bs) __syncthreads();
    }

    if (block == 0 && b.invalid_rows != nullptr) {  // block 0 walked every row; no count asked, no extra scan
        kvc_i64 invalid_total;
        kvc_block_exclusive_sum(invalid, scratch, invalid_total);
        if (tid == 0) *b.invalid_rows = (int)invalid_total;
    }
    // After tiles of one-token rows only the warps that hold the block's own rows have stamped (with a grid of one
    // block per SM: at A two warps per block, at B the first), so one atomic per such warp needs no block barrier.
    if (all_decode)
        kvc_write_count_stamps<NC, 0>(cx, stamped);
    else
        kvc_write_count_stamps<NC, KVC_WT_BLOCK_STAMPS ? kvc::kWtWarps : 0>(cx, stamped);
}
