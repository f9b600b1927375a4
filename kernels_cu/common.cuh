// kvcanary: helpers shared by every kernel. Python twins: kvcanary/ops/reference/{hashing,realkv,log,plan}.py.
//
// Two halves:
//  * pure helpers (hashes, the real-KV fold step, bounds decisions, ring-index rule): `__host__ __device__`,
//    no loads or stores, so the CPU CI compiles them with a host compiler (defining __host__, __device__ and
//    __forceinline__ as empty) and checks them against the Python reference;
//  * device-only helpers (loads, atomics, warp intrinsics): inside `#ifdef __CUDACC__`.
// No standard headers: NVRTC has none.
#pragma once

#include "consts.cuh"

typedef long long kvc_i64;
typedef unsigned long long kvc_u64;

#define KVC_HD __host__ __device__ __forceinline__

// ---------------------------------------------------------------------------------------------------
// Hashes (SPEC §3). All arithmetic is unsigned 64-bit and wraps.

KVC_HD kvc_u64 kvc_splitmix64(kvc_u64 x) {
    x = (x ^ (x >> 30)) * SPLITMIX64_MUL1;
    x = (x ^ (x >> 27)) * SPLITMIX64_MUL2;
    return x ^ (x >> 31);
}

KVC_HD kvc_u64 kvc_mix3(kvc_u64 a, kvc_u64 b, kvc_u64 c) {
    return kvc_splitmix64(kvc_splitmix64(kvc_splitmix64(a) ^ b) ^ c);
}

// slot_hash(s) for s < 0: the hash every chain starts from.
KVC_HD kvc_u64 kvc_anchor_hash() { return kvc_splitmix64(CANARY_CHAIN_ANCHOR); }

// slot_hash(s) for a live slot, from its record's fields (read as u64).
KVC_HD kvc_u64 kvc_record_hash(kvc_i64 prev_hash, kvc_i64 token, kvc_i64 position) {
    return kvc_mix3((kvc_u64)prev_hash, (kvc_u64)token, (kvc_u64)position);
}

// One step of the real-KV fold (SPEC §3.1): h = splitmix64(h ^ w), for a word or for a source hash.
KVC_HD kvc_u64 kvc_fold(kvc_u64 h, kvc_u64 w) { return kvc_splitmix64(h ^ w); }

// The fold of one 16-byte load (two little-endian words, low address first).
KVC_HD kvc_u64 kvc_fold16(kvc_u64 h, kvc_u64 w0, kvc_u64 w1) { return kvc_fold(kvc_fold(h, w0), w1); }

// Byte offset of slot `slot`'s bytes in a real-KV source: row slot / page_size, column
// (slot % page_size) * num_bytes_per_token. Slots are non-negative here; 32-bit division when both fit
// (64-bit division is a long software sequence on the GPU).
KVC_HD kvc_u64 kvc_real_kv_offset(kvc_i64 slot, kvc_i64 page_size, kvc_i64 bytes_per_token,
                                  kvc_i64 row_stride_bytes) {
    kvc_u64 s = (kvc_u64)slot, p = (kvc_u64)page_size, row, col;
    if (p == 1) {
        row = s;
        col = 0;
    } else if (((s | p) >> 32) == 0) {
        unsigned int s32 = (unsigned int)s, p32 = (unsigned int)p;
        row = s32 / p32;
        col = s32 - (unsigned int)row * p32;
    } else {
        row = s / p;
        col = s - row * p;
    }
    return row * (kvc_u64)row_stride_bytes + col * (kvc_u64)bytes_per_token;
}

// ---------------------------------------------------------------------------------------------------
// Violation ring (SPEC §4): a row with index i (the value atomicAdd returned, plus its rank in a batch
// append) is written only if 0 <= i < ring_capacity. The index itself is an int32 that keeps counting.

KVC_HD bool kvc_ring_index_ok(kvc_i64 i, kvc_i64 ring_capacity) { return i >= 0 && i < ring_capacity; }

// ---------------------------------------------------------------------------------------------------
// Bounds rule (SPEC §9) and plan arithmetic (SPEC §5). Same decisions as kvcanary/ops/reference/*.py.

// Plan: a row is valid iff its pool index is inside req_to_token and its prefix fits the row.
KVC_HD bool kvc_plan_row_valid(kvc_i64 rp, kvc_i64 prefix, kvc_i64 max_reqs, kvc_i64 max_seq_len) {
    return rp >= 0 && rp < max_reqs && prefix <= max_seq_len;
}

// Plan: valid and not the padding row.
KVC_HD bool kvc_plan_row_active(kvc_i64 rp, kvc_i64 prefix, kvc_i64 max_reqs, kvc_i64 max_seq_len) {
    return kvc_plan_row_valid(rp, prefix, max_reqs, max_seq_len) && rp != REQ_POOL_IDX_PADDING;
}

KVC_HD kvc_i64 kvc_max64(kvc_i64 a, kvc_i64 b) { return a > b ? a : b; }
KVC_HD kvc_i64 kvc_min64(kvc_i64 a, kvc_i64 b) { return a < b ? a : b; }

// Plan: first verified position of a row (SWA windows start W positions before the prefix end).
KVC_HD kvc_i64 kvc_window_start(kvc_i64 prefix, kvc_i64 swa_window_size) {
    return swa_window_size > 0 ? kvc_max64(prefix - swa_window_size, 0) : 0;
}

// Plan: number of verify entries of a row.
KVC_HD kvc_i64 kvc_verify_len(bool active, kvc_i64 prefix, kvc_i64 swa_window_size) {
    return active ? kvc_max64(prefix - kvc_window_start(prefix, swa_window_size), 0) : 0;
}

// Plan: number of tokens a row writes.
KVC_HD kvc_i64 kvc_write_len(bool active, kvc_i64 extend) { return active ? kvc_max64(extend, 0) : 0; }

// Plan: whether a row's write chain continues from a seed slot (the slot of position prefix - 1).
KVC_HD bool kvc_has_seed(bool active, kvc_i64 prefix, kvc_i64 write_len) {
    return active && prefix > 0 && write_len > 0;
}

// Plan: T(x) given the LUT value for an in-range x (`lut_value` is ignored otherwise).
KVC_HD kvc_i64 kvc_translate(kvc_i64 x, kvc_i64 lut_len, kvc_i64 lut_value) {
    if (x < 0) return x;
    return x < lut_len ? lut_value : (kvc_i64)LUT_OUT_OF_RANGE_SLOT;
}

// Plan: whether position q = p + offset of the expected-token pool may be gathered.
KVC_HD bool kvc_expected_token_ok(kvc_i64 q, kvc_i64 valid_len, kvc_i64 max_context_len) {
    return q >= 0 && q < valid_len && q < max_context_len;
}

// Verify: an entry whose slot or prev is outside the buffer is reported, never read. slot 0 is skipped
// before this check; a negative prev is a chain head and is fine.
KVC_HD bool kvc_verify_out_of_range(kvc_i64 slot, kvc_i64 prev, kvc_i64 num_slots) {
    return slot < 0 || slot >= num_slots || prev >= num_slots;
}

// Write: a request's token range must lie inside the flattened token arrays (when non-empty).
KVC_HD bool kvc_write_range_bad(kvc_i64 start, kvc_i64 end, kvc_i64 num_tokens) {
    return end > start && (start < 0 || end > num_tokens);
}

// ---------------------------------------------------------------------------------------------------
// Device-only helpers.
#ifdef __CUDACC__

#define KVC_FULL_MASK 0xffffffffu

// A canary record is 4 int64 at slot * stride; stride is a multiple of 8 and the buffer 8-byte aligned.
__device__ __forceinline__ kvc_i64* kvc_record(unsigned char* canary, kvc_i64 slot, kvc_i64 stride) {
    return reinterpret_cast<kvc_i64*>(canary + (kvc_u64)slot * (kvc_u64)stride);
}

// Up to MAX_REAL_KV_SOURCES real-KV sources, passed by value (kernel arguments, so nothing is allocated
// per launch). `nbytes` is what the fold reads per slot: 16 (PARTIAL) or read_bytes (ALL).
struct KvcRealKv {
    const unsigned char* ptr[MAX_REAL_KV_SOURCES];
    kvc_i64 page_size[MAX_REAL_KV_SOURCES];
    kvc_i64 bytes_per_token[MAX_REAL_KV_SOURCES];
    kvc_i64 row_stride[MAX_REAL_KV_SOURCES];
    kvc_i64 nbytes[MAX_REAL_KV_SOURCES];
    int count;
};

// The 16-byte word pair at p (16-byte aligned: validation checks pointer, row stride and sizes), through
// the read-only path: no kernel writes real KV.
__device__ __forceinline__ void kvc_load16(const unsigned char* p, kvc_u64& w0, kvc_u64& w1) {
    ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(p));
    w0 = v.x;
    w1 = v.y;
}

// Fold of the first `nbytes` bytes of a slot: 16-byte loads issued four at a time ahead of the
// serial fold so their latencies overlap.
__device__ __forceinline__ kvc_u64 kvc_source_hash(const unsigned char* p, kvc_i64 nbytes) {
    kvc_u64 h = 0;
    kvc_i64 off = 0;
    for (; off + 64 <= nbytes; off += 64) {
        kvc_u64 w[8];
#pragma unroll
        for (int k = 0; k < 4; ++k) kvc_load16(p + off + 16 * k, w[2 * k], w[2 * k + 1]);
#pragma unroll
        for (int k = 0; k < 8; ++k) h = kvc_fold(h, w[k]);
    }
    for (; off < nbytes; off += 16) {
        kvc_u64 w0, w1;
        kvc_load16(p + off, w0, w1);
        h = kvc_fold16(h, w0, w1);
    }
    return h;
}

// The real-KV fingerprint of a valid slot: the fold over sources, in order. 0 with no sources.
__device__ __forceinline__ kvc_u64 kvc_fingerprint(const KvcRealKv& kv, kvc_i64 slot) {
    kvc_u64 acc = 0;
#pragma unroll
    for (int s = 0; s < MAX_REAL_KV_SOURCES; ++s) {
        if (s < kv.count) {
            const unsigned char* p =
                kv.ptr[s] + kvc_real_kv_offset(slot, kv.page_size[s], kv.bytes_per_token[s], kv.row_stride[s]);
            acc = kvc_fold(acc, kvc_source_hash(p, kv.nbytes[s]));
        }
    }
    return acc;
}

// The kernel parameter list of the real-KV sources, and the struct built from it.
#define KVC_REAL_KV_PARAMS                                                                               \
    const unsigned char *rkv_ptr0, const unsigned char *rkv_ptr1, const unsigned char *rkv_ptr2,         \
        const unsigned char *rkv_ptr3, kvc_i64 rkv_page0, kvc_i64 rkv_page1, kvc_i64 rkv_page2,          \
        kvc_i64 rkv_page3, kvc_i64 rkv_bpt0, kvc_i64 rkv_bpt1, kvc_i64 rkv_bpt2, kvc_i64 rkv_bpt3,       \
        kvc_i64 rkv_stride0, kvc_i64 rkv_stride1, kvc_i64 rkv_stride2, kvc_i64 rkv_stride3,              \
        kvc_i64 rkv_nbytes0, kvc_i64 rkv_nbytes1, kvc_i64 rkv_nbytes2, kvc_i64 rkv_nbytes3, kvc_i64 rkv_count

__device__ __forceinline__ KvcRealKv kvc_make_real_kv(
    const unsigned char* p0, const unsigned char* p1, const unsigned char* p2, const unsigned char* p3,
    kvc_i64 g0, kvc_i64 g1, kvc_i64 g2, kvc_i64 g3, kvc_i64 b0, kvc_i64 b1, kvc_i64 b2, kvc_i64 b3,
    kvc_i64 s0, kvc_i64 s1, kvc_i64 s2, kvc_i64 s3, kvc_i64 n0, kvc_i64 n1, kvc_i64 n2, kvc_i64 n3,
    kvc_i64 count) {
    KvcRealKv kv;
    kv.ptr[0] = p0; kv.ptr[1] = p1; kv.ptr[2] = p2; kv.ptr[3] = p3;
    kv.page_size[0] = g0; kv.page_size[1] = g1; kv.page_size[2] = g2; kv.page_size[3] = g3;
    kv.bytes_per_token[0] = b0; kv.bytes_per_token[1] = b1; kv.bytes_per_token[2] = b2; kv.bytes_per_token[3] = b3;
    kv.row_stride[0] = s0; kv.row_stride[1] = s1; kv.row_stride[2] = s2; kv.row_stride[3] = s3;
    kv.nbytes[0] = n0; kv.nbytes[1] = n1; kv.nbytes[2] = n2; kv.nbytes[3] = n3;
    kv.count = (int)count;
    return kv;
}

#define KVC_REAL_KV_ARGS                                                                                 \
    rkv_ptr0, rkv_ptr1, rkv_ptr2, rkv_ptr3, rkv_page0, rkv_page1, rkv_page2, rkv_page3, rkv_bpt0,         \
        rkv_bpt1, rkv_bpt2, rkv_bpt3, rkv_stride0, rkv_stride1, rkv_stride2, rkv_stride3, rkv_nbytes0,   \
        rkv_nbytes1, rkv_nbytes2, rkv_nbytes3, rkv_count

// The violation log and counters of a launch context (SPEC §4).
struct KvcLog {
    kvc_i64* ring;        // [capacity, VIOLATION_FIELDS]
    int* write_index;     // [1], counts every violation
    kvc_i64 capacity;
    kvc_i64 tag;          // CanaryLaunchTag of the launch
};

__device__ __forceinline__ void kvc_write_row(const KvcLog& log, kvc_i64 i, kvc_i64 slot, kvc_i64 position,
                                              kvc_i64 stored_token, kvc_i64 expected_token,
                                              kvc_i64 stored_chain_hash, kvc_i64 expected_aux,
                                              kvc_i64 fail_bits) {
    if (!kvc_ring_index_ok(i, log.capacity)) return;
    kvc_i64* row = log.ring + i * VIOLATION_FIELDS;
    row[VFIELD_KERNEL_KIND] = log.tag;
    row[VFIELD_SLOT_IDX] = slot;
    row[VFIELD_POSITION] = position;
    row[VFIELD_STORED_TOKEN] = stored_token;
    row[VFIELD_EXPECTED_TOKEN] = expected_token;
    row[VFIELD_STORED_CHAIN_HASH] = stored_chain_hash;
    row[VFIELD_EXPECTED_AUX] = expected_aux;
    row[VFIELD_FAIL_REASON] = fail_bits;
}

// Append one row from a single thread: i = atomicAdd(write_index, 1), written if i < capacity.
__device__ __forceinline__ void kvc_append_row(const KvcLog& log, kvc_i64 slot, kvc_i64 position,
                                               kvc_i64 stored_token, kvc_i64 expected_token,
                                               kvc_i64 stored_chain_hash, kvc_i64 expected_aux,
                                               kvc_i64 fail_bits) {
    kvc_i64 i = (kvc_i64)atomicAdd(log.write_index, 1);
    kvc_write_row(log, i, slot, position, stored_token, expected_token, stored_chain_hash, expected_aux,
                  fail_bits);
}

// Warp-aggregated append: every lane of the (fully active) warp calls this; lanes with `want` get
// consecutive indices from one atomicAdd. Same result as one atomicAdd per row, in lane order.
__device__ __forceinline__ void kvc_append_row_warp(const KvcLog& log, bool want, kvc_i64 slot,
                                                    kvc_i64 position, kvc_i64 stored_token,
                                                    kvc_i64 expected_token, kvc_i64 stored_chain_hash,
                                                    kvc_i64 expected_aux, kvc_i64 fail_bits) {
    unsigned int ballot = __ballot_sync(KVC_FULL_MASK, want);
    if (ballot == 0) return;
    int lane = (int)(threadIdx.x & 31);
    int leader = __ffs(ballot) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(log.write_index, __popc(ballot));
    base = __shfl_sync(KVC_FULL_MASK, base, leader);
    if (want) {
        kvc_i64 i = (kvc_i64)base + __popc(ballot & ((1u << lane) - 1u));
        kvc_write_row(log, i, slot, position, stored_token, expected_token, stored_chain_hash, expected_aux,
                      fail_bits);
    }
}

// Warp-level inclusive sum of an int64 (all lanes active).
__device__ __forceinline__ kvc_i64 kvc_warp_inclusive_sum(kvc_i64 v) {
    int lane = (int)(threadIdx.x & 31);
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        kvc_i64 n = __shfl_up_sync(KVC_FULL_MASK, v, d);
        if (lane >= d) v += n;
    }
    return v;
}

// Block-wide exclusive sum (all threads call it; blockDim.x a multiple of 32, at most 1024). `scratch`
// is shared memory of 33 int64. Returns the thread's exclusive prefix; `total` gets the block sum.
__device__ __forceinline__ kvc_i64 kvc_block_exclusive_sum(kvc_i64 v, kvc_i64* scratch, kvc_i64& total) {
    int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5), nwarps = (int)(blockDim.x >> 5);
    kvc_i64 inc = kvc_warp_inclusive_sum(v);
    __syncthreads();  // scratch may still be read from a previous call
    if (lane == 31) scratch[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        kvc_i64 w = lane < nwarps ? scratch[lane] : 0;
        kvc_i64 wi = kvc_warp_inclusive_sum(w);
        scratch[lane] = wi - w;  // exclusive prefix of warp `lane`
        if (lane == 31) scratch[32] = wi;
    }
    __syncthreads();
    total = scratch[32];
    return scratch[warp] + inc - v;
}

#endif  // __CUDACC__
