// kvcanary: the write machinery (SPEC §6) shared by kvc_write (write.cu, one context, requests from a plan) and
// kvc_write_from_table (write_table.cu, up to kvc::kMaxContexts contexts, requests from the table).
//
// A request's chain is serial: each stamped slot's prev_hash is mix3 of the one before, so one thread must
// walk it, and three dependent splitmix64 rounds per token are the floor of a long chain. Everything else is
// parallel: the token / position / slot loads, the bounds and input-assert decisions, the real-KV
// fingerprints, the record stores and the violation rows (a row only needs the `running` value its token saw,
// and the position check only needs the previous stamped position). So the chain walkers compute nothing but
// those two serial values per token and leave the rest to other threads. Several contexts (K and V) share the
// tokens but each has its own canary buffer, hence its own seed record and chain: the walks run side by side.
//
//  * kvc_write_warp_request: a short request (at most kvc::kWriteShort tokens, e.g. decode), an empty one or
//    one with a bad token range, by one warp. Lane j loads token j and its fingerprints; the warp walks every
//    context's chain redundantly (values broadcast by shuffles, the contexts' mix3 independent of each other)
//    and lane j keeps the running hash and expected position its token sees in each context, then stores its
//    records and rows.
//  * kvc_write_block_request: a longer request, by the whole block, pipelined over tiles of TILE tokens. Per
//    iteration k, separated by one barrier:
//      - the chain walkers (lanes 0 .. contexts-1 of warp 0, one context each, in lockstep) walk tile k from
//        shared memory: for each token they write the current `running` and `last_pos + 1` to shared memory,
//        then advance both if the token is stamped in their context (mix3 computed unconditionally and
//        selected, so the loop has no branch; a tile with no unstamped token, known from the previous
//        barrier, takes a loop without the select);
//      - the TILE workers (threads 32 .. 32 + TILE - 1) store tile k-1's records and rows (they need the
//        chain values of tile k-1) and load / fingerprint tile k+1, one token each.
//    Threads past 32 + TILE (if the block has them) only take part in the barriers.
// Rows of one request may come from several threads, so their order in the ring is unspecified (SPEC §4
// allows it); the multiset of rows is the reference's. A slot stamped twice by one request keeps the later
// token's record, as in the reference: tiles are stored in order (one per barrier) and within a warp's request
// or a tile only the last token naming the slot stores it (every one still counts and gets rows).
//
// Bounds (SPEC §9), as the reference, per context:
//  * a request whose non-empty token range is not inside [0, num_tokens) gets
//    (tag, -1, start, -1, -1, 0, end, SLOT_OUT_OF_RANGE) and is skipped (checked before the seed);
//  * a request whose seed is >= num_slots gets (tag, seed, -1, -1, -1, 0, -1, SLOT_OUT_OF_RANGE), no stamps;
//  * a token whose out_cache_loc >= num_slots, or, when the context folds real KV, is not covered by every
//    source (>= slot_limit), gets (tag, slot, pos, tok, -1, running, -1, SLOT_OUT_OF_RANGE) and is skipped
//    like a -1 slot (no chain step, no count, no position check).
//
// The contexts are reached through an accessor `Cx` (see write.cu and write_table.cu): count(), ctx(c) for a
// compile-time c (every loop over contexts is unrolled, so kernel parameters are never indexed dynamically),
// fingerprint(c, slot) for a covered slot.
#pragma once

#include "common.cuh"

namespace kvc {
// Requests with at most this many tokens are written by one warp (one token per lane).
constexpr int kWriteShort = 32;
// The chain walker's loop is unrolled this much; tiles are padded to a multiple with unstamped entries.
constexpr int kWriteUnroll = 8;
// Per-token flags (0 = skip: slot -1, or padding past the request's end). WRITE_TOKEN_MISMATCH /
// WRITE_POSITION_MISMATCH (8, 16) carry the input-assert bits themselves.
constexpr int kFlagStamp = 1;
constexpr int kFlagOutOfRange = 2;
constexpr int kAssertBits = WRITE_TOKEN_MISMATCH | WRITE_POSITION_MISMATCH;
static_assert(((kFlagStamp | kFlagOutOfRange) & kAssertBits) == 0, "flag bits are distinct");
// Threads before the workers: warp 0 holds the chain walkers.
constexpr int kWriteWorkerBase = kWarpSize;
}  // namespace kvc

// A request the block pass writes: a valid token range of more than kvc::kWriteShort tokens (end - start is
// only formed once the range is known to be valid, so it cannot overflow).
__device__ __forceinline__ bool kvc_write_is_long(kvc_i64 start, kvc_i64 end, kvc_i64 num_tokens) {
    return !kvc_write_range_bad(start, end, num_tokens) && end > start && end - start > kvc::kWriteShort;
}

// The input-assert bits of a token (slot >= 0) against its expected token and position.
template <bool INPUT_ASSERT>
__device__ __forceinline__ int kvc_write_assert_bits_of(kvc_i64 slot, kvc_i64 tok, kvc_i64 pos, kvc_i64 expected_tok,
                                                        kvc_i64 expected_pos) {
    if (!INPUT_ASSERT || slot < 0) return 0;
    return (tok != expected_tok ? kvc::WRITE_TOKEN_MISMATCH : 0) |
           (pos != expected_pos ? kvc::WRITE_POSITION_MISMATCH : 0);
}

// The input-assert bits of token i (slot >= 0): compared with the expected arrays.
template <bool INPUT_ASSERT>
__device__ __forceinline__ int kvc_write_assert_bits(const KvcTokenParams& tk, kvc_i64 slot, kvc_i64 tok, kvc_i64 pos,
                                                     kvc_i64 i) {
    if (!INPUT_ASSERT || slot < 0) return 0;
    return kvc_write_assert_bits_of<INPUT_ASSERT>(slot, tok, pos, tk.expected_input_tokens[i],
                                                  tk.expected_input_positions[i]);
}

// A token's flag in one context.
__device__ __forceinline__ int kvc_write_flag(kvc_i64 slot, kvc_i64 slot_limit, int assert_bits) {
    if (slot < 0) return 0;
    if (slot >= slot_limit) return kvc::kFlagOutOfRange;
    return kvc::kFlagStamp | assert_bits;
}

// Everything of token i in one context once its chain values are known: its rows (in the reference's order
// within the token) and its record. `hash` is the running value the token saw, `want` the position the chain
// expects (meaningful when check_pos). `store` is false when a later token of the same request stamps the
// same slot in the same batch of stores (the reference's last write wins). Returns 1 if the slot was stamped.
__device__ __forceinline__ int kvc_write_finish(const KvcContextParams& c, const KvcTokenParams& tk, bool store,
                                                int flag, kvc_i64 slot, kvc_i64 tok, kvc_i64 pos, kvc_i64 rkv,
                                                kvc_i64 hash, kvc_i64 want, bool check_pos, kvc_i64 i) {
    const KvcLog log = kvc_log_of(c);
    if (flag & kvc::kFlagOutOfRange) {
        kvc_append_row(log, slot, pos, tok, kvc::NO_SLOT, hash, kvc::NO_SLOT, kvc::SLOT_OUT_OF_RANGE);
        return 0;
    }
    if (!(flag & kvc::kFlagStamp)) return 0;
    const int bits = flag & kvc::kAssertBits;
    if (bits)
        kvc_append_row(log, slot, pos, tok, tk.expected_input_tokens[i], hash, tk.expected_input_positions[i], bits);
    if (check_pos && pos != want) kvc_append_row(log, slot, pos, tok, tok, hash, want, kvc::WRITE_POSITION_MISMATCH);
    if (!store) return 1;
    kvc_i64* rec = kvc_record(c.canary, slot, c.slot_stride);
    if (kvc_records_vec16(c.canary, c.slot_stride)) {
        longlong2 a, b;
        a.x = tok;
        a.y = pos;
        b.x = hash;
        b.y = rkv;
        reinterpret_cast<longlong2*>(rec)[0] = a;
        reinterpret_cast<longlong2*>(rec)[1] = b;
    } else {
        rec[kvc::FIELD_TOKEN] = tok;
        rec[kvc::FIELD_POSITION] = pos;
        rec[kvc::FIELD_PREV_HASH] = hash;
        rec[kvc::FIELD_REAL_KV_HASH] = rkv;
    }
    return 1;
}

// The fields of a seed record that a chain starts from (all 0 for seed < 0, which has no record).
struct KvcSeedRecord {
    kvc_i64 token, position, prev_hash;
};

// Loads the seed's record in one context, to be turned into chain state later by kvc_write_seed_state: split so
// that a caller issues these loads before others it needs first (a decode write's token loads), and their latencies
// overlap. seed < num_slots (checked by the caller).
__device__ __forceinline__ KvcSeedRecord kvc_write_seed_load(const KvcContextParams& c, kvc_i64 seed) {
    KvcSeedRecord r{0, 0, 0};
    if (seed >= 0) {
        const kvc_i64* rec = kvc_record(static_cast<const unsigned char*>(c.canary), seed, c.slot_stride);
        r.token = rec[kvc::FIELD_TOKEN];
        r.position = rec[kvc::FIELD_POSITION];
        r.prev_hash = rec[kvc::FIELD_PREV_HASH];
    }
    return r;
}

// The chain state a request starts from (SPEC §6): running = slot_hash(seed), the seed's position (anchor and 0
// for seed < 0).
__device__ __forceinline__ void kvc_write_seed_state(const KvcSeedRecord& r, kvc_i64 seed, kvc_u64& running,
                                                     kvc_i64& last_pos) {
    if (seed < 0) {
        running = kvc_anchor_hash();
        last_pos = 0;
    } else {
        running = kvc_record_hash(r.prev_hash, r.token, r.position);
        last_pos = r.position;
    }
}

// Both at once, in one context.
__device__ __forceinline__ void kvc_write_seed(const KvcContextParams& c, kvc_i64 seed, kvc_u64& running,
                                               kvc_i64& last_pos) {
    kvc_write_seed_state(kvc_write_seed_load(c, seed), seed, running, last_pos);
}

// A context's chain position flag (0 when it has none): the assert is on when it is not 0.
__device__ __forceinline__ int kvc_position_flag_load(const KvcContextParams& c) {
    return c.chain_position_flag != nullptr ? *c.chain_position_flag : 0;
}

// Whether the chain position assert is on for a context (its device flag; read once per launch).
__device__ __forceinline__ bool kvc_position_assert(const KvcContextParams& c) {
    return kvc_position_flag_load(c) != 0;
}

// The rows of a request that writes nothing in any context: a bad token range, or a seed outside the buffer.
// Returns true if the request is done (one thread appends the rows).
template <int NC, class Cx>
__device__ __forceinline__ bool kvc_write_reject(const Cx& cx, const KvcTokenParams& tk, kvc_i64 start, kvc_i64 end,
                                                 kvc_i64 seed, bool appender) {
    const int nctx = cx.count();
    if (kvc_write_range_bad(start, end, tk.num_tokens)) {
        if (appender) {
#pragma unroll
            for (int c = 0; c < NC; ++c)
                if (c < nctx)
                    kvc_append_row(kvc_log_of(cx.ctx(c)), kvc::NO_SLOT, start, kvc::NO_SLOT, kvc::NO_SLOT, 0, end,
                                   kvc::SLOT_OUT_OF_RANGE);
        }
        return true;
    }
    if (seed >= cx.ctx(0).num_slots) {  // every context of a launch has the same num_slots
        if (appender) {
#pragma unroll
            for (int c = 0; c < NC; ++c)
                if (c < nctx)
                    kvc_append_row(kvc_log_of(cx.ctx(c)), seed, kvc::NO_SLOT, kvc::NO_SLOT, kvc::NO_SLOT, 0,
                                   kvc::NO_SLOT, kvc::SLOT_OUT_OF_RANGE);
        }
        return true;
    }
    return false;
}

// One short (or empty, or bad) request by one warp; every lane calls it with the same arguments.
template <int NC, bool INPUT_ASSERT, class Cx>
__device__ __forceinline__ void kvc_write_warp_request(const Cx& cx, const KvcTokenParams& tk, kvc_i64 start,
                                                       kvc_i64 end, kvc_i64 seed, const bool (&position_assert)[NC],
                                                       kvc_i64 (&stamped)[NC]) {
    const int lane = (int)(threadIdx.x & 31);
    const int nctx = cx.count();
    if (kvc_write_reject<NC>(cx, tk, start, end, seed, lane == 0)) return;
    if (end <= start) return;
    const kvc_i64 num_slots = cx.ctx(0).num_slots;
    const int n = (int)(end - start);  // 1 .. kvc::kWriteShort
    const kvc_i64 i = start + lane;
    // The seed records first, then the tokens: both sets of loads are in flight together. (With the seed loaded
    // where its chain state is needed, the compiler issued it only after the token's slot had arrived for the
    // flags: two load latencies one after the other, on the critical path of a decode write; Nsight Compute,
    // H200, 2026-12-03.)
    KvcSeedRecord seed_rec[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        seed_rec[c] = KvcSeedRecord{0, 0, 0};
        if (c < nctx) seed_rec[c] = kvc_write_seed_load(cx.ctx(c), seed);
    }
    kvc_i64 slot = kvc::NO_SLOT, tok = 0, pos = 0;
    if (lane < n) {
        slot = tk.out_cache_loc[i];
        tok = tk.input_ids[i];
        pos = tk.positions[i];
    }
    const int assert_bits = kvc_write_assert_bits<INPUT_ASSERT>(tk, slot, tok, pos, i);
    int flag[NC];
    kvc_i64 rkv[NC];
    kvc_u64 running[NC];
    kvc_i64 last_pos[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        flag[c] = 0;
        rkv[c] = 0;
        running[c] = 0;
        last_pos[c] = 0;
        if (c < nctx) {
            flag[c] = kvc_write_flag(slot, cx.ctx(c).slot_limit, assert_bits);
            if (Cx::kRealKv && (flag[c] & kvc::kFlagStamp)) rkv[c] = (kvc_i64)cx.fingerprint(c, slot);
            kvc_write_seed_state(seed_rec[c], seed, running[c], last_pos[c]);
        }
    }
    // The chains, walked by every lane alike; lane j keeps the values token j sees.
    kvc_i64 my_hash[NC], my_want[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) my_hash[c] = my_want[c] = 0;
    for (int j = 0; j < n; ++j) {
        const kvc_i64 tj = __shfl_sync(kvc::kFullMask, tok, j);
        const kvc_i64 pj = __shfl_sync(kvc::kFullMask, pos, j);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            if (c < nctx) {
                const int sj = __shfl_sync(kvc::kFullMask, flag[c], j) & kvc::kFlagStamp;
                if (lane == j) {
                    my_hash[c] = (kvc_i64)running[c];
                    my_want[c] = (kvc_i64)((kvc_u64)last_pos[c] + 1ULL);
                }
                const kvc_u64 m = kvc_mix3(running[c], (kvc_u64)tj, (kvc_u64)pj);
                running[c] = sj ? m : running[c];
                last_pos[c] = sj ? pj : last_pos[c];
            }
        }
    }
    // A slot stamped by several lanes: only the highest lane stores (other lanes get unique keys). Whether a
    // slot is covered is a property of the slot, so the lanes naming a slot stamp it in the same contexts.
    const bool in_buffer = slot >= 0 && slot < num_slots;
    const unsigned int same = __match_any_sync(kvc::kFullMask, in_buffer ? (kvc_u64)slot : ~(kvc_u64)lane);
    const bool store = (same >> lane) == 1u;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        if (c < nctx) {
            const bool check_pos = seed >= 0 && position_assert[c];
            stamped[c] += kvc_write_finish(cx.ctx(c), tk, store, flag[c], slot, tok, pos, rkv[c], my_hash[c],
                                           my_want[c], check_pos, i);
        }
    }
}

// Shared memory of the block pass: two buffers of one tile each (the walkers use tile k's while the workers
// finish tile k - 1 and load tile k + 1 in the other; each worker reads its own entry before overwriting it).
// Per-context values are interleaved ([token][context]) so the walkers' lanes read neighbouring words.
template <int NC, int TILE>
struct KvcWriteSmem {
    kvc_i64 slot[2][TILE];
    kvc_i64 tok[2][TILE];
    kvc_i64 pos[2][TILE];
    kvc_i64 rkv[2][TILE][NC];
    kvc_i64 hash[2][TILE][NC];  // running seen by the token (written by the walker)
    kvc_i64 want[2][TILE][NC];  // last stamped position + 1 (written by the walker)
    int flag[2][TILE][NC];
    bool store[2][TILE];        // no later token of the tile stamps the same slot
    // Each walker's running / last_pos between tiles.
    kvc_u64 running[NC];
    kvc_i64 last_pos[NC];
};

// One long request (a valid range of more than kvc::kWriteShort tokens) by the whole block: every thread calls
// it with the same arguments (it has barriers). blockDim.x >= 32 + TILE.
template <int NC, int TILE, bool INPUT_ASSERT, class Cx>
__device__ __forceinline__ void kvc_write_block_request(const Cx& cx, const KvcTokenParams& tk, kvc_i64 start,
                                                        kvc_i64 end, kvc_i64 seed,
                                                        const bool (&position_assert)[NC], kvc_i64 (&stamped)[NC],
                                                        KvcWriteSmem<NC, TILE>& sm) {
    static_assert(TILE % kvc::kWriteUnroll == 0, "tile padding stays inside the tile");
    const int tid = (int)threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int nctx = cx.count();
    if (kvc_write_reject<NC>(cx, tk, start, end, seed, tid == 0)) return;
    const kvc_i64 num_slots = cx.ctx(0).num_slots;
    const bool walker = warp == 0 && lane < nctx;
    const int w = tid - kvc::kWriteWorkerBase;  // worker index (a worker when 0 <= w < TILE)
    const bool worker = w >= 0 && w < TILE;
    const kvc_i64 ntiles = (end - start + TILE - 1) / TILE;

    int skips = 0;  // whether tile k has an entry inside the request unstamped in some context (last barrier)
    for (kvc_i64 k = -1; k <= ntiles; ++k) {
        int pred = 0;
        if (walker) {
            if (k < 0) {
                // The seed's chain state, read while the workers load tile 0 (each walker its own context).
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    if (lane == c) {
                        kvc_u64 running;
                        kvc_i64 last_pos;
                        kvc_write_seed(cx.ctx(c), seed, running, last_pos);
                        sm.running[c] = running;
                        sm.last_pos[c] = last_pos;
                    }
                }
            } else if (k < ntiles) {
                const int c = lane;
                kvc_u64 running = sm.running[c];
                kvc_i64 last_pos = sm.last_pos[c];
                const int b = (int)(k & 1);
                const int count = (int)kvc_min64(TILE, end - (start + k * TILE));
                const int padded = (count + kvc::kWriteUnroll - 1) & ~(kvc::kWriteUnroll - 1);
                const kvc_i64* tk_s = sm.tok[b];
                const kvc_i64* ps = sm.pos[b];
                if (!skips) {
                    // Every token stamps (padding past the end only disturbs values nobody reads).
                    for (int j = 0; j < padded; j += kvc::kWriteUnroll) {
#pragma unroll
                        for (int u = 0; u < kvc::kWriteUnroll; ++u) {
                            const kvc_i64 t = tk_s[j + u], q = ps[j + u];
                            sm.hash[b][j + u][c] = (kvc_i64)running;
                            sm.want[b][j + u][c] = (kvc_i64)((kvc_u64)last_pos + 1ULL);
                            running = kvc_mix3(running, (kvc_u64)t, (kvc_u64)q);
                            last_pos = q;
                        }
                    }
                } else {
                    for (int j = 0; j < padded; j += kvc::kWriteUnroll) {
#pragma unroll
                        for (int u = 0; u < kvc::kWriteUnroll; ++u) {
                            const kvc_i64 t = tk_s[j + u], q = ps[j + u];
                            const bool st = (sm.flag[b][j + u][c] & kvc::kFlagStamp) != 0;
                            sm.hash[b][j + u][c] = (kvc_i64)running;
                            sm.want[b][j + u][c] = (kvc_i64)((kvc_u64)last_pos + 1ULL);
                            const kvc_u64 m = kvc_mix3(running, (kvc_u64)t, (kvc_u64)q);
                            running = st ? m : running;
                            last_pos = st ? q : last_pos;
                        }
                    }
                }
                sm.running[c] = running;
                sm.last_pos[c] = last_pos;
            }
        } else if (worker) {
            // k - 1 and k + 1 share buffer nb; this worker's entry of tile k - 1 is read first.
            const int nb = (int)((k + 1) & 1);
            if (k >= 1) {
                const kvc_i64 i = start + (k - 1) * TILE + w;
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    if (c < nctx) {
                        const bool check_pos = seed >= 0 && position_assert[c];
                        stamped[c] += kvc_write_finish(cx.ctx(c), tk, sm.store[nb][w], sm.flag[nb][w][c],
                                                       sm.slot[nb][w], sm.tok[nb][w], sm.pos[nb][w], sm.rkv[nb][w][c],
                                                       sm.hash[nb][w][c], sm.want[nb][w][c], check_pos, i);
                    }
                }
            }
            if (k + 1 < ntiles) {
                const kvc_i64 i = start + (k + 1) * TILE + w;
                kvc_i64 slot = kvc::NO_SLOT, tok = 0, pos = 0;
                if (i < end) {
                    slot = tk.out_cache_loc[i];
                    tok = tk.input_ids[i];
                    pos = tk.positions[i];
                }
                const int assert_bits = kvc_write_assert_bits<INPUT_ASSERT>(tk, slot, tok, pos, i);
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    int flag = 0;
                    kvc_i64 rkv = 0;
                    if (c < nctx) {
                        flag = kvc_write_flag(slot, cx.ctx(c).slot_limit, assert_bits);
                        if (Cx::kRealKv && (flag & kvc::kFlagStamp)) rkv = (kvc_i64)cx.fingerprint(c, slot);
                        pred |= (i < end && !(flag & kvc::kFlagStamp)) ? 1 : 0;
                    }
                    sm.flag[nb][w][c] = flag;
                    sm.rkv[nb][w][c] = rkv;
                }
                sm.slot[nb][w] = slot;
                sm.tok[nb][w] = tok;
                sm.pos[nb][w] = pos;
            }
            if (k >= 0 && k < ntiles) {
                // Tile k (walked now, stored next iteration): does a later token of the tile stamp this worker's
                // slot? Tiles are stored in order, one per barrier, so repeats across tiles already end with the
                // last write. Padding and skipped entries hold slot -1, out-of-buffer ones a slot >= num_slots:
                // neither matches.
                const int b = (int)(k & 1);
                const int count = (int)kvc_min64(TILE, end - (start + k * TILE));
                const kvc_i64 mine = sm.slot[b][w];
                bool later = false;
                if (mine >= 0 && mine < num_slots) {
                    for (int j = w + 1; j < count; ++j) later |= sm.slot[b][j] == mine;
                }
                sm.store[b][w] = !later;
            }
        }
        skips = __syncthreads_or(pred);
    }
}

// slot_run_counter += the stamped slots of each context. Every lane of every warp calls it (at the end of the
// kernel, after warp-uniform loops). BLOCK_WARPS == 0: one atomic per warp and context. Otherwise the block's
// BLOCK_WARPS warps first sum in shared memory (it holds a __syncthreads: every thread of the block calls it)
// and one thread per context adds: a decode batch stamps one slot per request and warp, so this turns bs
// same-address atomics per context into at most one per block.
template <int NC, int BLOCK_WARPS = 0, class Cx>
__device__ __forceinline__ void kvc_write_count_stamps(const Cx& cx, const kvc_i64 (&stamped)[NC]) {
    const int lane = (int)(threadIdx.x & 31);
    const int nctx = cx.count();
    __syncwarp();
    // The warp's sum in one instruction (sm_80's redux) rather than a 64-bit shuffle scan: every warp of a decode
    // write runs this, most with nothing stamped. 32 bits hold it: a warp stamps each of the launch's tokens at
    // most once per context, and a launch has fewer than 2**32 tokens.
    kvc_i64 total[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) total[c] = (kvc_i64)__reduce_add_sync(kvc::kFullMask, (unsigned)stamped[c]);
    if (BLOCK_WARPS == 0) {
#pragma unroll
        for (int c = 0; c < NC; ++c)
            if (c < nctx && lane == 0 && total[c] != 0) kvc_counter_add(cx.ctx(c).slot_run_counter, total[c]);
        return;
    }
    __shared__ kvc_i64 s_stamped[BLOCK_WARPS > 0 ? BLOCK_WARPS : 1][NC];
    const int tid = (int)threadIdx.x;
    if (lane == 0) {
#pragma unroll
        for (int c = 0; c < NC; ++c) s_stamped[tid >> 5][c] = total[c];
    }
    __syncthreads();
    if (tid < nctx) {
        kvc_i64 sum = 0;
#pragma unroll
        for (int w = 0; w < BLOCK_WARPS; ++w) sum += s_stamped[w][tid];
#pragma unroll
        for (int c = 0; c < NC; ++c)  // context c's parameters from a fixed offset, not a register index
            if (c == tid && sum != 0) kvc_counter_add(cx.ctx(c).slot_run_counter, sum);
    }
}
