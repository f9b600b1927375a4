// kvcanary write kernel (SPEC §6). CPU twin: kvcanary/reference/write.py; launcher: kvcanary/cuda/write.py.
//
// Specializations: KVC_INPUT_ASSERT (check tokens/positions against the expected arrays),
// KVC_HAS_REAL_KV (fingerprint real KV; 0 = NONE mode or no sources, the fingerprint is 0).
//
// Design. A request's chain is serial: each stamped slot's prev_hash is mix3 of the one before, so one
// thread must walk it. Everything else does not depend on the chain: the token / position / slot loads,
// the bounds and input-assert decisions and the real-KV fingerprints. So each block owns one request at
// a time (requests in parallel across blocks, a fixed grid striding over them) and splits into
//  * the chain thread (lane 0 of warp 0): walks a tile of KVC_WRITE_TILE tokens already in shared
//    memory, stores each record and advances `running` (three splitmix64 rounds per token, the floor);
//  * KVC_WRITE_WORKERS worker threads (warps 1..): meanwhile load the *next* tile (one token each) into
//    the other shared buffer and compute its fingerprints and flags.
// One __syncthreads per tile swaps the buffers. The chain thread also loads the next token's fields from
// shared memory one iteration ahead, so the only latency on its path is the chain's own arithmetic.
// Violation rows are appended by the chain thread in token order (they carry `running`), so a single
// request yields its rows exactly in the reference's order.
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
#define KVC_WRITE_TILE KVC_WRITE_WORKERS
static_assert(KVC_WRITE_THREADS == 32 + KVC_WRITE_WORKERS, "one chain warp plus the workers");
// Grid: this many blocks per SM (each block walks one chain at a time), capped by the request capacity.
#define KVC_WRITE_BLOCKS_PER_SM 4

// Per-token flags computed by the workers (0 = stamp). WRITE_TOKEN_MISMATCH / WRITE_POSITION_MISMATCH
// (8, 16) carry the input-assert bits themselves.
#define KVC_FLAG_SKIP 1
#define KVC_FLAG_OUT_OF_RANGE 2

extern "C" __global__ void __launch_bounds__(KVC_WRITE_THREADS, KVC_WRITE_BLOCKS_PER_SM)
kvc_write(unsigned char* __restrict__ canary, kvc_i64 num_slots, kvc_i64 slot_stride, kvc_i64* ring,
          int* write_index, kvc_i64 ring_capacity, kvc_i64 tag, kvc_i64* slot_run_counter,
          kvc_i64* kernel_run_counter, const int* __restrict__ chain_position_flag,
          const kvc_i64* __restrict__ write_offsets, const kvc_i64* __restrict__ seed_slot_indices,
          const int* __restrict__ num_valid_reqs, kvc_i64 write_req_capacity,
          const kvc_i64* __restrict__ input_ids, const kvc_i64* __restrict__ positions,
          const kvc_i64* __restrict__ out_cache_loc, const kvc_i64* __restrict__ expected_input_tokens,
          const kvc_i64* __restrict__ expected_input_positions, kvc_i64 num_tokens, KVC_REAL_KV_PARAMS) {
    // +1: the chain thread reads one entry ahead without a bounds check.
    __shared__ kvc_i64 s_slot[2][KVC_WRITE_TILE + 1];
    __shared__ kvc_i64 s_tok[2][KVC_WRITE_TILE + 1];
    __shared__ kvc_i64 s_pos[2][KVC_WRITE_TILE + 1];
    __shared__ kvc_i64 s_rkv[2][KVC_WRITE_TILE + 1];
    __shared__ int s_flag[2][KVC_WRITE_TILE + 1];

    const KvcLog log = {ring, write_index, ring_capacity, tag};
#if KVC_HAS_REAL_KV
    const KvcRealKv kv = kvc_make_real_kv(KVC_REAL_KV_ARGS);
#endif
    const int tid = (int)threadIdx.x;
    const bool is_chain = tid == 0;
    const int w = tid - 32;  // worker index (valid when >= 0)

    if (blockIdx.x == 0 && tid == 0) atomicAdd(reinterpret_cast<unsigned long long*>(kernel_run_counter), 1ULL);
    const kvc_i64 n_req = kvc_max64(0, kvc_min64((kvc_i64)*num_valid_reqs, write_req_capacity));
    const bool position_assert = chain_position_flag != nullptr && *chain_position_flag != 0;

    kvc_i64 stamped = 0;  // chain thread only
    for (kvc_i64 r = blockIdx.x; r < n_req; r += gridDim.x) {
        const kvc_i64 start = write_offsets[r], end = write_offsets[r + 1];
        if (kvc_write_range_bad(start, end, num_tokens)) {
            if (is_chain) kvc_append_row(log, NO_SLOT, start, NO_SLOT, NO_SLOT, 0, end, SLOT_OUT_OF_RANGE);
            continue;
        }
        const kvc_i64 seed = seed_slot_indices[r];
        if (seed >= num_slots) {
            if (is_chain) kvc_append_row(log, seed, NO_SLOT, NO_SLOT, NO_SLOT, 0, NO_SLOT, SLOT_OUT_OF_RANGE);
            continue;
        }
        if (end <= start) continue;
        const kvc_i64 ntiles = (end - start + KVC_WRITE_TILE - 1) / KVC_WRITE_TILE;

        // Chain state (meaningful in the chain thread only).
        kvc_u64 running = 0;
        kvc_i64 last_pos = 0;
        bool check_pos = false;
        if (is_chain) {
            if (seed < 0) {
                running = kvc_anchor_hash();
            } else {
                const kvc_i64* rec = kvc_record(canary, seed, slot_stride);
                const kvc_i64 s_token = rec[FIELD_TOKEN], s_position = rec[FIELD_POSITION];
                running = kvc_record_hash(rec[FIELD_PREV_HASH], s_token, s_position);
                check_pos = position_assert;
                last_pos = s_position;
            }
        }

        for (kvc_i64 k = -1; k < ntiles; ++k) {
            const int buf = (int)(k & 1);
            if (is_chain && k >= 0) {
                const kvc_i64 tile_start = start + k * KVC_WRITE_TILE;
                const int count = (int)kvc_min64(KVC_WRITE_TILE, end - tile_start);
                kvc_i64 n_slot = s_slot[buf][0], n_tok = s_tok[buf][0], n_pos = s_pos[buf][0], n_rkv = s_rkv[buf][0];
                int n_flag = s_flag[buf][0];
                for (int j = 0; j < count; ++j) {
                    const kvc_i64 slot = n_slot, tok = n_tok, pos = n_pos, rkv = n_rkv;
                    const int flag = n_flag;
                    // Next token's fields, issued before this token's chain arithmetic.
                    n_slot = s_slot[buf][j + 1];
                    n_tok = s_tok[buf][j + 1];
                    n_pos = s_pos[buf][j + 1];
                    n_rkv = s_rkv[buf][j + 1];
                    n_flag = s_flag[buf][j + 1];
                    if (flag != 0) {
                        if (flag & KVC_FLAG_SKIP) continue;
                        if (flag & KVC_FLAG_OUT_OF_RANGE) {
                            kvc_append_row(log, slot, pos, tok, NO_SLOT, (kvc_i64)running, NO_SLOT, SLOT_OUT_OF_RANGE);
                            continue;
                        }
#if KVC_INPUT_ASSERT
                        const kvc_i64 i = tile_start + j;
                        kvc_append_row(log, slot, pos, tok, expected_input_tokens[i], (kvc_i64)running,
                                       expected_input_positions[i], flag);
#endif
                    }
                    if (check_pos) {
                        const kvc_i64 want = (kvc_i64)((kvc_u64)last_pos + 1ULL);
                        if (pos != want)
                            kvc_append_row(log, slot, pos, tok, tok, (kvc_i64)running, want, WRITE_POSITION_MISMATCH);
                        last_pos = pos;
                    }
                    kvc_i64* rec = kvc_record(canary, slot, slot_stride);
                    rec[FIELD_TOKEN] = tok;
                    rec[FIELD_POSITION] = pos;
                    rec[FIELD_PREV_HASH] = (kvc_i64)running;
                    rec[FIELD_REAL_KV_HASH] = rkv;
                    running = kvc_mix3(running, (kvc_u64)tok, (kvc_u64)pos);
                    ++stamped;
                }
            } else if (w >= 0 && k + 1 < ntiles) {
                // Prepare tile k + 1 in the other buffer.
                const int nb = buf ^ 1;
                const kvc_i64 i = start + (k + 1) * KVC_WRITE_TILE + w;
                if (i < end) {
                    const kvc_i64 slot = out_cache_loc[i];
                    const kvc_i64 tok = input_ids[i], pos = positions[i];
                    int flag = 0;
                    kvc_i64 rkv = 0;
                    if (slot < 0) {
                        flag = KVC_FLAG_SKIP;
                    } else if (slot >= num_slots) {
                        flag = KVC_FLAG_OUT_OF_RANGE;
                    } else {
#if KVC_INPUT_ASSERT
                        if (tok != expected_input_tokens[i]) flag |= WRITE_TOKEN_MISMATCH;
                        if (pos != expected_input_positions[i]) flag |= WRITE_POSITION_MISMATCH;
#endif
#if KVC_HAS_REAL_KV
                        rkv = (kvc_i64)kvc_fingerprint(kv, slot);
#endif
                    }
                    s_slot[nb][w] = slot;
                    s_tok[nb][w] = tok;
                    s_pos[nb][w] = pos;
                    s_rkv[nb][w] = rkv;
                    s_flag[nb][w] = flag;
                }
            }
            __syncthreads();
        }
    }
    if (is_chain && stamped != 0)
        atomicAdd(reinterpret_cast<unsigned long long*>(slot_run_counter), (unsigned long long)stamped);
}
