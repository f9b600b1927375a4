// kvcanary write kernel (SPEC §6). CPU twin: kvcanary/ops/reference/write.py; launcher: kvcanary/ops/cuda/write.py.
//
// Specializations: KVC_INPUT_ASSERT (check tokens/positions against the expected arrays),
// KVC_HAS_REAL_KV (fingerprint real KV; 0 = NONE mode or no sources, the fingerprint is 0).
//
// Design. A request's chain is serial: each stamped slot's prev_hash is mix3 of the one before, so one
// thread must walk it, and three dependent splitmix64 rounds per token are the floor of a long chain.
// Everything else is parallel: the token / position / slot loads, the bounds and input-assert decisions,
// the real-KV fingerprints, the record stores and the violation rows (a row only needs the `running`
// value its token saw, and the position check only needs the previous stamped position). So the chain
// thread computes nothing but those two serial values per token and leaves the rest to other threads.
// Two passes over the requests, each request handled by exactly one of them:
//  * short requests (at most KVC_WRITE_SHORT tokens, e.g. decode), empty ones and ones with a bad token
//    range: one warp per request (warps stride over the requests; no block barrier). Lane j loads token
//    j and its fingerprint; the warp walks the chain redundantly (values broadcast by shuffles) and lane j
//    keeps the running hash and expected position of its token, then stores its record and rows;
//  * longer requests: one block per request (blocks stride over them), pipelined over tiles of
//    KVC_WRITE_TILE tokens. Per iteration k, separated by one barrier:
//      - the chain thread (lane 0 of warp 0) walks tile k from shared memory: for each token it writes
//        the current `running` and `last_pos + 1` to shared memory, then advances both if the token is
//        stamped (mix3 computed unconditionally and selected, so the loop has no branch; a tile with no
//        unstamped token, known from the previous barrier, takes a loop without the select);
//      - the KVC_WRITE_WORKERS workers (warps 1..) store tile k-1's records and rows (they need the
//        chain values of tile k-1) and load / fingerprint tile k+1, one token each.
// Rows of one request may come from several threads, so their order in the ring is unspecified (SPEC §4
// allows it); the multiset of rows is the reference's. A slot stamped twice by one request keeps the later
// token's record, as in the reference: tiles are stored in order (one per barrier) and within a warp's
// request or a tile only the last token naming the slot stores it (every one still counts and gets rows).
// The real-KV parameters are gathered into a KvcRealKv at each use, not once per kernel, so their 21
// values are not held in registers through the loops.
//
// Bounds (SPEC §9), as the reference:
//  * a request whose non-empty token range is not inside [0, num_tokens) gets
//    (tag, -1, start, -1, -1, 0, end, SLOT_OUT_OF_RANGE) and is skipped (checked before the seed);
//  * a request whose seed is >= num_slots gets (tag, seed, -1, -1, -1, 0, -1, SLOT_OUT_OF_RANGE), no stamps;
//  * a token whose out_cache_loc >= num_slots gets (tag, slot, pos, tok, -1, running, -1,
//    SLOT_OUT_OF_RANGE) and is skipped like a -1 slot (no chain step, no count, no position check).

#include "common.cuh"

#ifndef KVC_INPUT_ASSERT
#error "KVC_INPUT_ASSERT must be defined (0 or 1)"
#endif
#ifndef KVC_HAS_REAL_KV
#error "KVC_HAS_REAL_KV must be defined (0 or 1)"
#endif

// Launch geometry (the launcher reads these defines): one chain warp + the workers, one token per
// worker per tile.
#define KVC_WRITE_WORKERS 256
#define KVC_WRITE_THREADS 288
#define KVC_WRITE_WARPS 9
#define KVC_WRITE_TILE KVC_WRITE_WORKERS
static_assert(KVC_WRITE_THREADS == 32 + KVC_WRITE_WORKERS, "one chain warp plus the workers");
static_assert(KVC_WRITE_WARPS * 32 == KVC_WRITE_THREADS, "whole warps");
// Grid: this many blocks per SM, capped by the request capacity.
#define KVC_WRITE_BLOCKS_PER_SM 4
// Requests with at most this many tokens are written by one warp (one token per lane).
#define KVC_WRITE_SHORT 32
// The chain thread's loop is unrolled this much; tiles are padded to a multiple with unstamped entries.
#define KVC_WRITE_UNROLL 8
static_assert(KVC_WRITE_TILE % KVC_WRITE_UNROLL == 0, "tile padding stays inside the tile");

// Per-token flags (0 = skip: slot -1, or padding past the request's end). WRITE_TOKEN_MISMATCH /
// WRITE_POSITION_MISMATCH (8, 16) carry the input-assert bits themselves.
#define KVC_FLAG_STAMP 1
#define KVC_FLAG_OUT_OF_RANGE 2
static_assert(((KVC_FLAG_STAMP | KVC_FLAG_OUT_OF_RANGE) & (WRITE_TOKEN_MISMATCH | WRITE_POSITION_MISMATCH)) == 0,
              "flag bits are distinct");

// A request the block pass writes: a valid token range of more than KVC_WRITE_SHORT tokens (end - start
// is only formed once the range is known to be valid, so it cannot overflow).
__device__ __forceinline__ bool kvc_write_is_long(kvc_i64 start, kvc_i64 end, kvc_i64 num_tokens) {
    return !kvc_write_range_bad(start, end, num_tokens) && end > start && end - start > KVC_WRITE_SHORT;
}

// Flags and fingerprint of token i (slot >= 0 known to be a loaded, non-skipped entry or -1).
__device__ __forceinline__ int kvc_write_flag(kvc_i64 slot, kvc_i64 num_slots, kvc_i64 tok, kvc_i64 pos,
                                              kvc_i64 i, const kvc_i64* __restrict__ expected_input_tokens,
                                              const kvc_i64* __restrict__ expected_input_positions) {
    if (slot < 0) return 0;
    if (slot >= num_slots) return KVC_FLAG_OUT_OF_RANGE;
    int flag = KVC_FLAG_STAMP;
#if KVC_INPUT_ASSERT
    if (tok != expected_input_tokens[i]) flag |= WRITE_TOKEN_MISMATCH;
    if (pos != expected_input_positions[i]) flag |= WRITE_POSITION_MISMATCH;
#endif
    return flag;
}

// Everything of token i once its chain values are known: its rows (in the reference's order within the
// token) and its record. `hash` is the running value the token saw, `want` the position the chain
// expects (meaningful when check_pos). `store` is false when a later token of the same request stamps
// the same slot in the same batch of stores (the reference's last write wins). Returns 1 if the slot was
// stamped.
__device__ __forceinline__ int kvc_write_finish(const KvcLog& log, unsigned char* __restrict__ canary,
                                                kvc_i64 slot_stride, bool vec16, bool store, int flag, kvc_i64 slot,
                                                kvc_i64 tok, kvc_i64 pos, kvc_i64 rkv, kvc_i64 hash,
                                                kvc_i64 want, bool check_pos, kvc_i64 i,
                                                const kvc_i64* __restrict__ expected_input_tokens,
                                                const kvc_i64* __restrict__ expected_input_positions) {
    if (flag & KVC_FLAG_OUT_OF_RANGE) {
        kvc_append_row(log, slot, pos, tok, NO_SLOT, hash, NO_SLOT, SLOT_OUT_OF_RANGE);
        return 0;
    }
    if (!(flag & KVC_FLAG_STAMP)) return 0;
#if KVC_INPUT_ASSERT
    const int bits = flag & (WRITE_TOKEN_MISMATCH | WRITE_POSITION_MISMATCH);
    if (bits) kvc_append_row(log, slot, pos, tok, expected_input_tokens[i], hash, expected_input_positions[i], bits);
#endif
    if (check_pos && pos != want) kvc_append_row(log, slot, pos, tok, tok, hash, want, WRITE_POSITION_MISMATCH);
    if (!store) return 1;
    kvc_i64* rec = kvc_record(canary, slot, slot_stride);
    if (vec16) {
        longlong2 a, b;
        a.x = tok;
        a.y = pos;
        b.x = hash;
        b.y = rkv;
        reinterpret_cast<longlong2*>(rec)[0] = a;
        reinterpret_cast<longlong2*>(rec)[1] = b;
    } else {
        rec[FIELD_TOKEN] = tok;
        rec[FIELD_POSITION] = pos;
        rec[FIELD_PREV_HASH] = hash;
        rec[FIELD_REAL_KV_HASH] = rkv;
    }
    return 1;
}

// The chain state a request starts from (SPEC §6): running = slot_hash(seed), the seed's position.
__device__ __forceinline__ void kvc_write_seed(const unsigned char* __restrict__ canary, kvc_i64 slot_stride,
                                               kvc_i64 seed, kvc_u64& running, kvc_i64& last_pos) {
    if (seed < 0) {
        running = kvc_anchor_hash();
        last_pos = 0;
    } else {
        const kvc_i64* rec = reinterpret_cast<const kvc_i64*>(canary + (kvc_u64)seed * (kvc_u64)slot_stride);
        const kvc_i64 s_token = rec[FIELD_TOKEN], s_position = rec[FIELD_POSITION];
        running = kvc_record_hash(rec[FIELD_PREV_HASH], s_token, s_position);
        last_pos = s_position;
    }
}

extern "C" __global__ void __launch_bounds__(KVC_WRITE_THREADS, KVC_WRITE_BLOCKS_PER_SM)
kvc_write(unsigned char* __restrict__ canary, kvc_i64 num_slots, kvc_i64 slot_stride, kvc_i64* ring,
          int* write_index, kvc_i64 ring_capacity, kvc_i64 tag, kvc_i64* slot_run_counter,
          kvc_i64* kernel_run_counter, const int* __restrict__ chain_position_flag,
          const kvc_i64* __restrict__ write_offsets, const kvc_i64* __restrict__ seed_slot_indices,
          const int* __restrict__ num_valid_reqs, kvc_i64 write_req_capacity,
          const kvc_i64* __restrict__ input_ids, const kvc_i64* __restrict__ positions,
          const kvc_i64* __restrict__ out_cache_loc, const kvc_i64* __restrict__ expected_input_tokens,
          const kvc_i64* __restrict__ expected_input_positions, kvc_i64 num_tokens, KVC_REAL_KV_PARAMS) {
    // Block pass, two buffers: the chain walks tile k in buffer k & 1 while the workers finish tile k - 1
    // and load tile k + 1, both in the other buffer (each worker reads its own entry before overwriting it).
    __shared__ kvc_i64 s_slot[2][KVC_WRITE_TILE];
    __shared__ kvc_i64 s_tok[2][KVC_WRITE_TILE];
    __shared__ kvc_i64 s_pos[2][KVC_WRITE_TILE];
    __shared__ kvc_i64 s_rkv[2][KVC_WRITE_TILE];
    __shared__ kvc_i64 s_hash[2][KVC_WRITE_TILE];  // running seen by the token (written by the chain)
    __shared__ kvc_i64 s_want[2][KVC_WRITE_TILE];  // last stamped position + 1 (written by the chain)
    __shared__ int s_flag[2][KVC_WRITE_TILE];
    __shared__ bool s_store[2][KVC_WRITE_TILE];  // no later token of the tile stamps the same slot
    // The chain thread's running / last_pos between tiles (in shared memory rather than registers that
    // every thread of the block would carry through the tile loop).
    __shared__ kvc_u64 s_running;
    __shared__ kvc_i64 s_last_pos;

    const KvcLog log = {ring, write_index, ring_capacity, tag};
    const int tid = (int)threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    // Records are stored as two 16-byte halves when every record is 16-byte aligned.
    const bool vec16 = (((kvc_u64)canary | (kvc_u64)slot_stride) & 15ULL) == 0;

    if (blockIdx.x == 0 && tid == 0) atomicAdd(reinterpret_cast<unsigned long long*>(kernel_run_counter), 1ULL);
    const kvc_i64 n_req = kvc_max64(0, kvc_min64((kvc_i64)*num_valid_reqs, write_req_capacity));
    const bool position_assert = chain_position_flag != nullptr && *chain_position_flag != 0;

    kvc_i64 stamped = 0;  // per thread, summed per warp at the end

    // ---- Pass 1: one warp per short / empty / bad request (warps stride over the requests).
    const kvc_i64 warp_stride = (kvc_i64)gridDim.x * KVC_WRITE_WARPS;
    for (kvc_i64 r = (kvc_i64)blockIdx.x * KVC_WRITE_WARPS + warp; r < n_req; r += warp_stride) {
        // The seed is loaded with the range (r < n_req <= capacity), one latency instead of two.
        const kvc_i64 start = write_offsets[r], end = write_offsets[r + 1], seed = seed_slot_indices[r];
        if (kvc_write_is_long(start, end, num_tokens)) continue;
        if (kvc_write_range_bad(start, end, num_tokens)) {
            if (lane == 0) kvc_append_row(log, NO_SLOT, start, NO_SLOT, NO_SLOT, 0, end, SLOT_OUT_OF_RANGE);
            continue;
        }
        if (seed >= num_slots) {
            if (lane == 0) kvc_append_row(log, seed, NO_SLOT, NO_SLOT, NO_SLOT, 0, NO_SLOT, SLOT_OUT_OF_RANGE);
            continue;
        }
        if (end <= start) continue;
        const int n = (int)(end - start);  // 1 .. KVC_WRITE_SHORT
        const kvc_i64 i = start + lane;
        kvc_i64 slot = NO_SLOT, tok = 0, pos = 0;
        if (lane < n) {
            slot = out_cache_loc[i];
            tok = input_ids[i];
            pos = positions[i];
        }
        const int flag = kvc_write_flag(slot, num_slots, tok, pos, i, expected_input_tokens,
                                        expected_input_positions);
        kvc_i64 rkv = 0;
#if KVC_HAS_REAL_KV
        if (flag & KVC_FLAG_STAMP) rkv = (kvc_i64)kvc_fingerprint(kvc_make_real_kv(KVC_REAL_KV_ARGS), slot);
#endif
        kvc_u64 running;
        kvc_i64 last_pos;
        kvc_write_seed(canary, slot_stride, seed, running, last_pos);
        const bool check_pos = seed >= 0 && position_assert;
        // The chain, walked by every lane alike; lane j keeps the values token j sees.
        kvc_i64 my_hash = 0, my_want = 0;
        for (int j = 0; j < n; ++j) {
            const kvc_i64 tj = __shfl_sync(KVC_FULL_MASK, tok, j);
            const kvc_i64 pj = __shfl_sync(KVC_FULL_MASK, pos, j);
            const int sj = __shfl_sync(KVC_FULL_MASK, flag, j) & KVC_FLAG_STAMP;
            if (lane == j) {
                my_hash = (kvc_i64)running;
                my_want = (kvc_i64)((kvc_u64)last_pos + 1ULL);
            }
            const kvc_u64 m = kvc_mix3(running, (kvc_u64)tj, (kvc_u64)pj);
            running = sj ? m : running;
            last_pos = sj ? pj : last_pos;
        }
        // A slot stamped by several lanes: only the highest lane stores (unstamped lanes get unique keys).
        const unsigned int same = __match_any_sync(
            KVC_FULL_MASK, (flag & KVC_FLAG_STAMP) ? (kvc_u64)slot : ~(kvc_u64)lane);
        const bool store = (same >> lane) == 1u;
        stamped += kvc_write_finish(log, canary, slot_stride, vec16, store, flag, slot, tok, pos, rkv, my_hash,
                                    my_want, check_pos, i, expected_input_tokens, expected_input_positions);
    }

    // ---- Pass 2: one block per long request. Every warp reads the same 32 request ranges and ballots,
    // so the list of long requests (and so every barrier below) is uniform across the block.
    const bool is_chain = tid == 0;
    const int w = tid - 32;  // worker index (a worker when >= 0)
    for (kvc_i64 c0 = blockIdx.x; c0 < n_req; c0 += 32 * (kvc_i64)gridDim.x) {
        const kvc_i64 rl = c0 + (kvc_i64)lane * gridDim.x;
        unsigned int todo = __ballot_sync(
            KVC_FULL_MASK, rl < n_req && kvc_write_is_long(write_offsets[rl], write_offsets[rl + 1], num_tokens));
        while (todo != 0) {
            // Re-read (cache hits) rather than keep every lane's range in registers through the tiles.
            const kvc_i64 r = c0 + (kvc_i64)(__ffs(todo) - 1) * gridDim.x;
            todo &= todo - 1;
            const kvc_i64 start = write_offsets[r], end = write_offsets[r + 1], seed = seed_slot_indices[r];
            if (seed >= num_slots) {
                if (is_chain) kvc_append_row(log, seed, NO_SLOT, NO_SLOT, NO_SLOT, 0, NO_SLOT, SLOT_OUT_OF_RANGE);
                continue;
            }
            const bool check_pos = seed >= 0 && position_assert;
            const kvc_i64 ntiles = (end - start + KVC_WRITE_TILE - 1) / KVC_WRITE_TILE;

            int skips = 0;  // whether tile k has an unstamped entry inside the request (from the last barrier)
            for (kvc_i64 k = -1; k <= ntiles; ++k) {
                int pred = 0;
                if (is_chain) {
                    if (k < 0) {
                        // The seed's chain state, read while the workers load tile 0.
                        kvc_u64 running;
                        kvc_i64 last_pos;
                        kvc_write_seed(canary, slot_stride, seed, running, last_pos);
                        s_running = running;
                        s_last_pos = last_pos;
                    } else if (k < ntiles) {
                        kvc_u64 running = s_running;
                        kvc_i64 last_pos = s_last_pos;
                        const int b = (int)(k & 1);
                        const int count = (int)kvc_min64(KVC_WRITE_TILE, end - (start + k * KVC_WRITE_TILE));
                        const int padded = (count + KVC_WRITE_UNROLL - 1) & ~(KVC_WRITE_UNROLL - 1);
                        const kvc_i64* tk = s_tok[b];
                        const kvc_i64* ps = s_pos[b];
                        kvc_i64* hs = s_hash[b];
                        kvc_i64* ws = s_want[b];
                        if (!skips) {
                            // Every token stamps (padding past the end only disturbs values nobody reads).
                            for (int j = 0; j < padded; j += KVC_WRITE_UNROLL) {
#pragma unroll
                                for (int u = 0; u < KVC_WRITE_UNROLL; ++u) {
                                    const kvc_i64 tok = tk[j + u], pos = ps[j + u];
                                    hs[j + u] = (kvc_i64)running;
                                    ws[j + u] = (kvc_i64)((kvc_u64)last_pos + 1ULL);
                                    running = kvc_mix3(running, (kvc_u64)tok, (kvc_u64)pos);
                                    last_pos = pos;
                                }
                            }
                        } else {
                            const int* fl = s_flag[b];
                            for (int j = 0; j < padded; j += KVC_WRITE_UNROLL) {
#pragma unroll
                                for (int u = 0; u < KVC_WRITE_UNROLL; ++u) {
                                    const kvc_i64 tok = tk[j + u], pos = ps[j + u];
                                    const bool st = (fl[j + u] & KVC_FLAG_STAMP) != 0;
                                    hs[j + u] = (kvc_i64)running;
                                    ws[j + u] = (kvc_i64)((kvc_u64)last_pos + 1ULL);
                                    const kvc_u64 m = kvc_mix3(running, (kvc_u64)tok, (kvc_u64)pos);
                                    running = st ? m : running;
                                    last_pos = st ? pos : last_pos;
                                }
                            }
                        }
                        s_running = running;
                        s_last_pos = last_pos;
                    }
                } else if (w >= 0) {
                    // k - 1 and k + 1 share buffer nb; this worker's entry of tile k - 1 is read first.
                    const int nb = (int)((k + 1) & 1);
                    if (k >= 1) {
                        const kvc_i64 i = start + (k - 1) * KVC_WRITE_TILE + w;
                        stamped += kvc_write_finish(log, canary, slot_stride, vec16, s_store[nb][w], s_flag[nb][w],
                                                    s_slot[nb][w], s_tok[nb][w], s_pos[nb][w], s_rkv[nb][w],
                                                    s_hash[nb][w], s_want[nb][w], check_pos, i,
                                                    expected_input_tokens, expected_input_positions);
                    }
                    if (k + 1 < ntiles) {
                        const kvc_i64 i = start + (k + 1) * KVC_WRITE_TILE + w;
                        kvc_i64 slot = NO_SLOT, tok = 0, pos = 0, rkv = 0;
                        if (i < end) {
                            slot = out_cache_loc[i];
                            tok = input_ids[i];
                            pos = positions[i];
                        }
                        const int flag = kvc_write_flag(slot, num_slots, tok, pos, i, expected_input_tokens,
                                                        expected_input_positions);
#if KVC_HAS_REAL_KV
                        if (flag & KVC_FLAG_STAMP)
                            rkv = (kvc_i64)kvc_fingerprint(kvc_make_real_kv(KVC_REAL_KV_ARGS), slot);
#endif
                        pred = i < end && !(flag & KVC_FLAG_STAMP);
                        s_slot[nb][w] = slot;
                        s_tok[nb][w] = tok;
                        s_pos[nb][w] = pos;
                        s_rkv[nb][w] = rkv;
                        s_flag[nb][w] = flag;
                    }
                    if (k >= 0 && k < ntiles) {
                        // Tile k (walked by the chain now, stored next iteration): does a later token of the
                        // tile stamp this worker's slot? Tiles are stored in order, one per barrier, so
                        // repeats across tiles already end with the last write. Padding and skipped
                        // entries hold slot -1, out-of-range ones a slot >= num_slots: neither matches.
                        const int b = (int)(k & 1);
                        const int count = (int)kvc_min64(KVC_WRITE_TILE, end - (start + k * KVC_WRITE_TILE));
                        const kvc_i64 mine = s_slot[b][w];
                        bool later = false;
                        if (s_flag[b][w] & KVC_FLAG_STAMP) {
                            for (int j = w + 1; j < count; ++j) later |= s_slot[b][j] == mine;
                        }
                        s_store[b][w] = !later;
                    }
                }
                skips = __syncthreads_or(pred);
            }
        }
    }

    // slot_run_counter: one atomic per warp (every lane is here; the loops above are warp-uniform).
    __syncwarp();
    const kvc_i64 warp_stamped = kvc_warp_inclusive_sum(stamped);
    if (lane == 31 && warp_stamped != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(slot_run_counter), (unsigned long long)warp_stamped);
}
