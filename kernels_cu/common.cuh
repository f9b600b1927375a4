// kvcanary: helpers shared by every kernel. Python twins: kvcanary/ops/reference/{hashing,realkv,log,table,plan}.py.
//
// Two halves:
//  * pure helpers (hashes, the real-KV fold step, bounds decisions, row and table rules, the ring-index rule):
//    `__host__ __device__`, no loads or stores, so the CPU CI compiles them with a host compiler (defining
//    __host__, __device__ and __forceinline__ as empty) and checks them against the Python reference
//    (tests/ops/test_host_helpers.py);
//  * device-only helpers (loads, atomics, warp intrinsics, block scans, table access): inside `#ifdef __CUDACC__`.
// Global names carry a kvc_ / Kvc / KVC_ prefix; constants live in namespace kvc. No standard headers: NVRTC
// has none.
#pragma once

#include "consts.cuh"
#include "params.cuh"

#define KVC_HD __host__ __device__ __forceinline__

namespace kvc {
constexpr int kWarpSize = 32;
// Shared memory of kvc_block_exclusive_sum: one partial per warp (at most 32 warps) plus the block total.
constexpr int kScanScratch = kWarpSize + 1;
// The real-KV fold issues this many 16-byte loads before folding them, so their latencies overlap.
constexpr int kFoldLoadsInFlight = 4;
// 2**32: below it, divisions are done in 32 bits (a 64-bit division is a long software sequence on the GPU).
constexpr unsigned long long kU32Limit = 1ULL << 32;
}  // namespace kvc

// ---------------------------------------------------------------------------------------------------
// Hashes (SPEC §3). All arithmetic is unsigned 64-bit and wraps.

// x * c (mod 2**64). With KVC_MUL3 defined to 1 (the verify's 32-bit modules and the write from the table,
// KVC_WT_MUL3; not the verify's 64-bit modules: KVC_VT_MUL3_ALL was timed and is off), on the device: one
// 32 x 32 -> 64-bit multiply of the low words and two 32-bit multiply-adds into its high word, three instructions
// where nvcc's 64-bit multiply takes four.
KVC_HD kvc_u64 kvc_mul64(kvc_u64 x, kvc_u64 c) {
#if defined(__CUDA_ARCH__) && defined(KVC_MUL3) && KVC_MUL3
    kvc_u64 r;
    asm("{\n\t.reg .u32 xl, xh, cl, ch, rl, rh;\n\t"
        "mov.b64 {xl, xh}, %1;\n\t"
        "mov.b64 {cl, ch}, %2;\n\t"
        "mul.wide.u32 %0, xl, cl;\n\t"
        "mov.b64 {rl, rh}, %0;\n\t"
        "mad.lo.u32 rh, xh, cl, rh;\n\t"
        "mad.lo.u32 rh, xl, ch, rh;\n\t"
        "mov.b64 %0, {rl, rh};\n\t}"
        : "=l"(r)
        : "l"(x), "l"(c));
    return r;
#else
    return x * c;
#endif
}

KVC_HD kvc_u64 kvc_splitmix64(kvc_u64 x) {
    x = kvc_mul64(x ^ (x >> 30), kvc::SPLITMIX64_MUL1);
    x = kvc_mul64(x ^ (x >> 27), kvc::SPLITMIX64_MUL2);
    return x ^ (x >> 31);
}

KVC_HD kvc_u64 kvc_mix3(kvc_u64 a, kvc_u64 b, kvc_u64 c) {
    return kvc_splitmix64(kvc_splitmix64(kvc_splitmix64(a) ^ b) ^ c);
}

// slot_hash(s) for s < 0: the hash every chain starts from.
KVC_HD kvc_u64 kvc_anchor_hash() { return kvc_splitmix64(kvc::CANARY_CHAIN_ANCHOR); }

// slot_hash(s) for a live slot, from its record's fields (read as u64).
KVC_HD kvc_u64 kvc_record_hash(kvc_i64 prev_hash, kvc_i64 token, kvc_i64 position) {
    return kvc_mix3((kvc_u64)prev_hash, (kvc_u64)token, (kvc_u64)position);
}

// One step of the real-KV fold (SPEC §3.1): h = splitmix64(h ^ w), for a word or for a source hash.
KVC_HD kvc_u64 kvc_fold(kvc_u64 h, kvc_u64 w) { return kvc_splitmix64(h ^ w); }

// The fold of one 16-byte load (two little-endian words, low address first).
KVC_HD kvc_u64 kvc_fold16(kvc_u64 h, kvc_u64 w0, kvc_u64 w1) { return kvc_fold(kvc_fold(h, w0), w1); }

// q = a / b and r = a % b for a >= 0, b >= 1, in 32 bits when both fit.
KVC_HD void kvc_divmod(kvc_i64 a, kvc_i64 b, kvc_i64& q, kvc_i64& r) {
    const kvc_u64 ua = (kvc_u64)a, ub = (kvc_u64)b;
    if (ub == 1) {
        q = a;
        r = 0;
    } else if ((ua | ub) < kvc::kU32Limit) {
        const unsigned int a32 = (unsigned int)ua, b32 = (unsigned int)ub;
        const unsigned int q32 = a32 / b32;
        q = (kvc_i64)q32;
        r = (kvc_i64)(a32 - q32 * b32);
    } else {
        q = (kvc_i64)(ua / ub);
        r = (kvc_i64)(ua - (kvc_u64)q * ub);
    }
}

// Byte offset of slot `slot`'s bytes in a real-KV source: row slot / page_size, column
// (slot % page_size) * num_bytes_per_token. Slots are non-negative here.
KVC_HD kvc_u64 kvc_real_kv_offset(kvc_i64 slot, kvc_i64 page_size, kvc_i64 bytes_per_token,
                                  kvc_i64 row_stride_bytes) {
    kvc_i64 row, col;
    kvc_divmod(slot, page_size, row, col);
    return (kvc_u64)row * (kvc_u64)row_stride_bytes + (kvc_u64)col * (kvc_u64)bytes_per_token;
}

// ---------------------------------------------------------------------------------------------------
// Violation ring (SPEC §4): a row with index i (the value atomicAdd returned, plus its rank in a batch
// append) is written only if 0 <= i < ring_capacity. The index itself is an int32 that keeps counting.

KVC_HD bool kvc_ring_index_ok(kvc_i64 i, kvc_i64 ring_capacity) { return i >= 0 && i < ring_capacity; }

// ---------------------------------------------------------------------------------------------------
// Batch rows (SPEC §5, §9, §10). Same decisions as kvcanary/ops/reference/table.py.

// A row is valid unless its pool index is outside [0, max_reqs) and not the padding row, or its prefix is
// longer than the table's rows (a padding row with such a prefix is invalid too: with pad_row = 0 this is
// exactly the rule before paged tables).
KVC_HD bool kvc_row_valid(kvc_i64 rp, kvc_i64 prefix, kvc_i64 max_reqs, kvc_i64 max_seq_len, kvc_i64 pad_row) {
    return (rp == pad_row || (rp >= 0 && rp < max_reqs)) && prefix <= max_seq_len;
}

// Valid and not padding: the rows that have verify entries, write tokens and seeds.
KVC_HD bool kvc_row_active(kvc_i64 rp, kvc_i64 prefix, kvc_i64 max_reqs, kvc_i64 max_seq_len, kvc_i64 pad_row) {
    return kvc_row_valid(rp, prefix, max_reqs, max_seq_len, pad_row) && rp != pad_row;
}

KVC_HD kvc_i64 kvc_max64(kvc_i64 a, kvc_i64 b) { return a > b ? a : b; }
KVC_HD kvc_i64 kvc_min64(kvc_i64 a, kvc_i64 b) { return a < b ? a : b; }

// First verified position of a row (SWA windows start W positions before the prefix end).
KVC_HD kvc_i64 kvc_window_start(kvc_i64 prefix, kvc_i64 swa_window_size) {
    return swa_window_size > 0 ? kvc_max64(prefix - swa_window_size, 0) : 0;
}

// Number of verify entries of a row.
KVC_HD kvc_i64 kvc_verify_len(bool active, kvc_i64 prefix, kvc_i64 swa_window_size) {
    return active ? kvc_max64(prefix - kvc_window_start(prefix, swa_window_size), 0) : 0;
}

// Number of tokens a row writes.
KVC_HD kvc_i64 kvc_write_len(bool active, kvc_i64 extend) { return active ? kvc_max64(extend, 0) : 0; }

// Whether a row's write chain continues from a seed slot (the slot of position prefix - 1).
KVC_HD bool kvc_has_seed(bool active, kvc_i64 prefix, kvc_i64 write_len) {
    return active && prefix > 0 && write_len > 0;
}

// RT(rp, p) of a block table (SPEC §10) from the block id at column p / block_size and rem = p % block_size:
// block * block_size + rem in 64 bits; a negative block id gives -1.
KVC_HD kvc_i64 kvc_rt_paged(kvc_i64 block, kvc_i64 rem, kvc_i64 block_size) {
    return block < 0 ? kvc::NO_SLOT : block * block_size + rem;
}

// T(x) given the LUT value for an in-range x (`lut_value` is ignored otherwise).
KVC_HD kvc_i64 kvc_translate(kvc_i64 x, kvc_i64 lut_len, kvc_i64 lut_value) {
    if (x < 0) return x;
    return x < lut_len ? lut_value : kvc::LUT_OUT_OF_RANGE_SLOT;
}

// Whether position q = p + offset of the expected-token pool may be gathered.
KVC_HD bool kvc_expected_token_ok(kvc_i64 q, kvc_i64 valid_len, kvc_i64 max_context_len) {
    return q >= 0 && q < valid_len && q < max_context_len;
}

// ---------------------------------------------------------------------------------------------------
// Bounds (SPEC §9).

// Verify: an entry whose slot is outside the buffer (or beyond what a folded real-KV source covers:
// slot_limit <= num_slots), or whose prev is outside the buffer, is reported, never read. Slot 0 is skipped
// before this check; a negative prev is a chain head and is fine.
KVC_HD bool kvc_verify_out_of_range(kvc_i64 slot, kvc_i64 prev, kvc_i64 num_slots, kvc_i64 slot_limit) {
    return slot < 0 || slot >= slot_limit || prev >= num_slots;
}

// Write: a request's token range must lie inside the flattened token arrays (when non-empty).
KVC_HD bool kvc_write_range_bad(kvc_i64 start, kvc_i64 end, kvc_i64 num_tokens) {
    return end > start && (start < 0 || end > num_tokens);
}

// Records (SPEC §13): what an entry does with a slot of a buffer of num_slots records.
namespace kvc {
constexpr int kRecordSkip = 0;        // negative slot: skip the entry
constexpr int kRecordOk = 1;
constexpr int kRecordOutOfRange = 2;  // >= num_slots: skip the entry and count it
}  // namespace kvc
KVC_HD int kvc_record_slot_status(kvc_i64 slot, kvc_i64 num_slots) {
    return slot < 0 ? kvc::kRecordSkip : slot < num_slots ? kvc::kRecordOk : kvc::kRecordOutOfRange;
}

// Copy: the status of an entry from the statuses of its source and destination slots: an out-of-range slot on
// either side counts the entry (once, whatever the other slot is); otherwise a negative slot on either side
// skips it.
KVC_HD int kvc_copy_status(int src_status, int dst_status) {
    if (src_status == kvc::kRecordOutOfRange || dst_status == kvc::kRecordOutOfRange) return kvc::kRecordOutOfRange;
    if (src_status == kvc::kRecordSkip || dst_status == kvc::kRecordSkip) return kvc::kRecordSkip;
    return kvc::kRecordOk;
}

// ---------------------------------------------------------------------------------------------------
// Device-only helpers.
#ifdef __CUDACC__

// Programmatic dependent launch (sm_90+; kvcanary/ops/cuda/pdl.py launches with the attribute): let the next kernel
// of the stream be scheduled now (one launched with the attribute waits for this one itself before it touches
// memory), then wait until the kernel before this one has finished and its writes are visible. First thing in a
// kernel, before any global memory access. Nothing when `on` is false or below sm_90, and the two instructions do
// nothing in a launch without the attribute.
template <bool on>
__device__ __forceinline__ void kvc_grid_dependency() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (on) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
#endif
}

namespace kvc {
constexpr unsigned kFullMask = 0xffffffffu;  // every lane of a warp
}  // namespace kvc

// A canary record is 4 int64 at slot * stride; stride is a multiple of 8 and the buffer 8-byte aligned.
__device__ __forceinline__ kvc_i64* kvc_record(unsigned char* canary, kvc_i64 slot, kvc_i64 stride) {
    return reinterpret_cast<kvc_i64*>(canary + (kvc_u64)slot * (kvc_u64)stride);
}
__device__ __forceinline__ const kvc_i64* kvc_record(const unsigned char* canary, kvc_i64 slot, kvc_i64 stride) {
    return reinterpret_cast<const kvc_i64*>(canary + (kvc_u64)slot * (kvc_u64)stride);
}

// Whether every record of a buffer is 16-byte aligned (then a record is two 16-byte halves).
__device__ __forceinline__ bool kvc_records_vec16(const void* canary, kvc_i64 stride) {
    return (((kvc_u64)canary | (kvc_u64)stride) & 15ULL) == 0;
}

// Fields 0..3 of the record at rec through the read-only path (the buffer is not written by this kernel).
__device__ __forceinline__ void kvc_load_record_at(const kvc_i64* rec, bool vec16, kvc_i64& token,
                                                   kvc_i64& position, kvc_i64& prev_hash, kvc_i64& real_kv_hash) {
    if (vec16) {
        const longlong2 a = __ldg(reinterpret_cast<const longlong2*>(rec));
        const longlong2 b = __ldg(reinterpret_cast<const longlong2*>(rec) + 1);
        token = a.x;
        position = a.y;
        prev_hash = b.x;
        real_kv_hash = b.y;
    } else {
        token = __ldg(rec + kvc::FIELD_TOKEN);
        position = __ldg(rec + kvc::FIELD_POSITION);
        prev_hash = __ldg(rec + kvc::FIELD_PREV_HASH);
        real_kv_hash = __ldg(rec + kvc::FIELD_REAL_KV_HASH);
    }
}

// The same, of slot `slot`'s record.
__device__ __forceinline__ void kvc_load_record_ro(const unsigned char* canary, kvc_i64 slot, kvc_i64 stride,
                                                   bool vec16, kvc_i64& token, kvc_i64& position,
                                                   kvc_i64& prev_hash, kvc_i64& real_kv_hash) {
    kvc_load_record_at(kvc_record(canary, slot, stride), vec16, token, position, prev_hash, real_kv_hash);
}

// The 16-byte word pair at p (16-byte aligned: validation checks pointer, row stride and sizes), through
// the read-only path: no kernel writes real KV.
__device__ __forceinline__ void kvc_load16(const unsigned char* p, kvc_u64& w0, kvc_u64& w1) {
    const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(p));
    w0 = v.x;
    w1 = v.y;
}

// Fold of the bytes [from, nbytes) at p (nbytes - from a multiple of 16), continuing from h. LOADS 16-byte loads
// are issued before they are folded, so their latencies overlap.
template <int LOADS>
__device__ __forceinline__ kvc_u64 kvc_fold_bytes(kvc_u64 h, const unsigned char* p, kvc_i64 from, kvc_i64 nbytes) {
    constexpr kvc_i64 batch = (kvc_i64)LOADS * kvc::REAL_KV_LOAD_BYTES;
    kvc_i64 off = from;
    for (; off + batch <= nbytes; off += batch) {
        kvc_u64 w[2 * LOADS];
#pragma unroll
        for (int k = 0; k < LOADS; ++k) kvc_load16(p + off + kvc::REAL_KV_LOAD_BYTES * k, w[2 * k], w[2 * k + 1]);
#pragma unroll
        for (int k = 0; k < 2 * LOADS; ++k) h = kvc_fold(h, w[k]);
    }
    for (; off < nbytes; off += kvc::REAL_KV_LOAD_BYTES) {
        kvc_u64 w0, w1;
        kvc_load16(p + off, w0, w1);
        h = kvc_fold16(h, w0, w1);
    }
    return h;
}

// The real-KV fingerprint of a covered slot from up to four sources passed by value (SGLang-named kernels):
// the fold over sources, in order. 0 with no sources.
__device__ __forceinline__ kvc_u64 kvc_fingerprint4(const KvcRealKv4& kv, kvc_i64 slot) {
    kvc_u64 acc = 0;
#pragma unroll
    for (int s = 0; s < kvc::MAX_REAL_KV_SOURCES; ++s) {
        if (s < kv.count) {
            const unsigned char* p =
                kv.ptr[s] + kvc_real_kv_offset(slot, kv.page_size[s], kv.bytes_per_token[s], kv.row_stride[s]);
            acc = kvc_fold(acc, kvc_fold_bytes<kvc::kFoldLoadsInFlight>(0, p, 0, kv.nbytes[s]));
        }
    }
    return acc;
}

// Address of a covered slot's bytes in source row `d` of a descriptor table.
__device__ __forceinline__ const unsigned char* kvc_source_bytes(const kvc_i64* d, kvc_i64 slot) {
    const unsigned char* base = reinterpret_cast<const unsigned char*>(__ldg(d + kvc::kSrcPtr));
    return base + kvc_real_kv_offset(slot, __ldg(d + kvc::kSrcPageSize), __ldg(d + kvc::kSrcBytesPerToken),
                                     __ldg(d + kvc::kSrcRowStride));
}

// The fingerprint of a covered slot from a device descriptor table of n >= 1 sources (the plan-free kernels,
// any number of sources). The first 16 bytes of source 0 were loaded by the caller (w0, w1), early, so that
// their latency overlaps the canary record's. LOADS: loads in flight per fold batch (fewer registers when small).
template <int LOADS>
__device__ __forceinline__ kvc_u64 kvc_fingerprint_table(const kvc_i64* desc, kvc_i64 n, kvc_i64 slot, kvc_u64 w0,
                                                         kvc_u64 w1) {
    const kvc_i64 nb0 = __ldg(desc + kvc::kSrcFoldBytes);
    kvc_u64 h = kvc_fold16(0, w0, w1);
    if (nb0 > kvc::REAL_KV_LOAD_BYTES)
        h = kvc_fold_bytes<LOADS>(h, kvc_source_bytes(desc, slot), kvc::REAL_KV_LOAD_BYTES, nb0);
    kvc_u64 acc = kvc_fold(0, h);
    for (kvc_i64 s = 1; s < n; ++s) {
        const kvc_i64* d = desc + s * kvc::kSourceDescFields;
        acc = kvc_fold(acc, kvc_fold_bytes<LOADS>(0, kvc_source_bytes(d, slot), 0, __ldg(d + kvc::kSrcFoldBytes)));
    }
    return acc;
}

// The violation log and counters of a launch context (SPEC §4).
struct KvcLog {
    kvc_i64* ring;        // [capacity, VIOLATION_FIELDS]
    int* write_index;     // [1], counts every violation
    kvc_i64 capacity;
    kvc_i64 tag;          // CanaryLaunchTag of the launch
};

__device__ __forceinline__ KvcLog kvc_log_of(const KvcContextParams& c) {
    KvcLog log;
    log.ring = c.ring;
    log.write_index = c.write_index;
    log.capacity = c.ring_capacity;
    log.tag = c.tag;
    return log;
}

__device__ __forceinline__ void kvc_write_row(const KvcLog& log, kvc_i64 i, kvc_i64 slot, kvc_i64 position,
                                              kvc_i64 stored_token, kvc_i64 expected_token,
                                              kvc_i64 stored_chain_hash, kvc_i64 expected_aux,
                                              kvc_i64 fail_bits) {
    if (!kvc_ring_index_ok(i, log.capacity)) return;
    kvc_i64* row = log.ring + i * kvc::VIOLATION_FIELDS;
    row[kvc::VFIELD_KERNEL_KIND] = log.tag;
    row[kvc::VFIELD_SLOT_IDX] = slot;
    row[kvc::VFIELD_POSITION] = position;
    row[kvc::VFIELD_STORED_TOKEN] = stored_token;
    row[kvc::VFIELD_EXPECTED_TOKEN] = expected_token;
    row[kvc::VFIELD_STORED_CHAIN_HASH] = stored_chain_hash;
    row[kvc::VFIELD_EXPECTED_AUX] = expected_aux;
    row[kvc::VFIELD_FAIL_REASON] = fail_bits;
}

// Append one row from a single thread: i = atomicAdd(write_index, 1), written if i < capacity.
__device__ __forceinline__ void kvc_append_row(const KvcLog& log, kvc_i64 slot, kvc_i64 position,
                                               kvc_i64 stored_token, kvc_i64 expected_token,
                                               kvc_i64 stored_chain_hash, kvc_i64 expected_aux,
                                               kvc_i64 fail_bits) {
    const kvc_i64 i = (kvc_i64)atomicAdd(log.write_index, 1);
    kvc_write_row(log, i, slot, position, stored_token, expected_token, stored_chain_hash, expected_aux,
                  fail_bits);
}

// Warp-aggregated append: every lane of the (fully active) warp calls this; lanes with `want` get
// consecutive indices from one atomicAdd. Same result as one atomicAdd per row, in lane order.
__device__ __forceinline__ void kvc_append_row_warp(const KvcLog& log, bool want, kvc_i64 slot,
                                                    kvc_i64 position, kvc_i64 stored_token,
                                                    kvc_i64 expected_token, kvc_i64 stored_chain_hash,
                                                    kvc_i64 expected_aux, kvc_i64 fail_bits) {
    const unsigned int ballot = __ballot_sync(kvc::kFullMask, want);
    if (ballot == 0) return;
    const int lane = (int)(threadIdx.x & 31);
    const int leader = __ffs(ballot) - 1;
    int base = 0;
    if (lane == leader) base = atomicAdd(log.write_index, __popc(ballot));
    base = __shfl_sync(kvc::kFullMask, base, leader);
    if (want) {
        const kvc_i64 i = (kvc_i64)base + __popc(ballot & ((1u << lane) - 1u));
        kvc_write_row(log, i, slot, position, stored_token, expected_token, stored_chain_hash, expected_aux,
                      fail_bits);
    }
}

__device__ __forceinline__ void kvc_counter_add(kvc_i64* counter, kvc_i64 amount) {
    atomicAdd(reinterpret_cast<unsigned long long*>(counter), (unsigned long long)amount);
}

// Warp-level inclusive sum (all lanes active). T: kvc_i64, or int where the sums are known to fit (half the shuffles).
template <typename T>
__device__ __forceinline__ T kvc_warp_inclusive_sum(T v) {
    const int lane = (int)(threadIdx.x & 31);
#pragma unroll
    for (int d = 1; d < kvc::kWarpSize; d <<= 1) {
        const T n = __shfl_up_sync(kvc::kFullMask, v, d);
        if (lane >= d) v += n;
    }
    return v;
}

// Block-wide exclusive sum (every thread of the block calls it; blockDim.x a multiple of 32, at most 1024).
// `scratch` is shared memory of kvc::kScanScratch T. Returns the thread's exclusive prefix; `total` gets the block
// sum. Starts with a barrier (scratch may still be read from a previous call) and ends with one. T as above.
template <typename T>
__device__ __forceinline__ T kvc_block_exclusive_sum(T v, T* scratch, T& total) {
    const int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5), nwarps = (int)(blockDim.x >> 5);
    const T inc = kvc_warp_inclusive_sum(v);
    __syncthreads();
    if (lane == kvc::kWarpSize - 1) scratch[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        const T w = lane < nwarps ? scratch[lane] : 0;
        const T wi = kvc_warp_inclusive_sum(w);
        scratch[lane] = wi - w;  // exclusive prefix of warp `lane`
        if (lane == kvc::kWarpSize - 1) scratch[kvc::kWarpSize] = wi;
    }
    __syncthreads();
    total = scratch[kvc::kWarpSize];
    return scratch[warp] + inc - v;
}

// The row r (< n) owning entry e, i.e. offsets[r] <= e < offsets[r + 1], for 0 <= e < offsets[n] (rows with
// no entries never own one). Searches forward from `from` (a row at or before the answer): gallop, then
// bisect. `offsets` may be in global or shared memory. I: the row index type (int for a shared tile of rows,
// which saves registers; kvc_i64 for a whole batch); O: the offsets' type (int where they are known to fit).
template <typename I, typename O>
__device__ __forceinline__ I kvc_find_row(const O* offsets, I n, O e, I from) {
    if (offsets[from + 1] > e) return from;
    // Invariant: offsets[lo + 1] <= e; find the first r > lo with offsets[r + 1] > e (r < n).
    I lo = from, step = 1, hi;
    for (;;) {
        hi = lo + step;
        if (hi >= n - 1) {
            hi = n - 1;
            break;
        }
        if (offsets[hi + 1] > e) break;
        lo = hi;
        step <<= 1;
    }
    while (hi - lo > 1) {
        const I mid = lo + ((hi - lo) >> 1);
        if (offsets[mid + 1] > e) hi = mid;
        else lo = mid;
    }
    return hi;
}

// The table cell that holds RT(rp, p) (SPEC §10): its address and, for a block table, p % block_size (0 for a
// per-position table). Split from the load so that a kernel can issue several cells' loads back to back before it
// uses any of them (kvc_table_value turns the loaded int into RT).
struct KvcTableCell {
    const int* at;
    kvc_i64 rem;
};

// The cell of RT(rp, p), 0 <= p < max_seq_len, given `origin` and `idx`: a block table's is table element
// origin + p / block_size (origin = rp * cols, the row's first cell); a per-position table's is origin + idx, for
// any split of rp * cols + p (kvc_table_cell: rp * cols and p; the plan-free verify keeps a per-row origin so that
// an entry's cell costs one add, no multiply).
__device__ __forceinline__ KvcTableCell kvc_table_cell_at(const KvcTableParams& t, kvc_i64 origin, kvc_i64 idx,
                                                         kvc_i64 p) {
    KvcTableCell c;
    if (t.paged) {
        kvc_i64 col;
        kvc_divmod(p, t.block_size, col, c.rem);
        c.at = t.table + (origin + col);
    } else {
        c.at = t.table + (origin + idx);
        c.rem = 0;
    }
    return c;
}

// The cell of RT(rp, p) for a valid row rp and 0 <= p < max_seq_len.
__device__ __forceinline__ KvcTableCell kvc_table_cell(const KvcTableParams& t, kvc_i64 rp, kvc_i64 p) {
    return kvc_table_cell_at(t, rp * t.cols, p, p);
}

// The cell of RT(rp, p - 1) from that of RT(rp, p), p >= 1: no second division.
__device__ __forceinline__ KvcTableCell kvc_table_prev_cell(const KvcTableParams& t, KvcTableCell c) {
    if (!t.paged || c.rem == 0) {
        c.at -= 1;
        c.rem = t.paged ? t.block_size - 1 : 0;
    } else {
        c.rem -= 1;
    }
    return c;
}

// RT from a cell and the int loaded from it.
__device__ __forceinline__ kvc_i64 kvc_table_value(const KvcTableParams& t, const KvcTableCell& c, int raw) {
    return t.paged ? kvc_rt_paged((kvc_i64)raw, c.rem, t.block_size) : (kvc_i64)raw;
}

// RT of a per-position table (not paged) as the int loaded from the cell kvc_table_cell_at names (a kernel may
// convert it later, so that several such loads stay in flight together).
__device__ __forceinline__ int kvc_table_raw_flat(const KvcTableParams& t, kvc_i64 origin, kvc_i64 idx) {
    return __ldg(t.table + (origin + idx));
}

// RT(rp, p) (SPEC §10), as int64, load included, of the cell kvc_table_cell_at names. The same rule as
// kvc_table_cell_at and kvc_table_value in one piece: built from those two, the verify without real KV compiled
// to different code and ran slower (it is bound by instructions).
__device__ __forceinline__ kvc_i64 kvc_table_rt_at(const KvcTableParams& t, kvc_i64 origin, kvc_i64 idx,
                                                   kvc_i64 p) {
    if (t.paged) {
        kvc_i64 col, rem;
        kvc_divmod(p, t.block_size, col, rem);
        return kvc_rt_paged((kvc_i64)__ldg(t.table + (origin + col)), rem, t.block_size);
    }
    return (kvc_i64)kvc_table_raw_flat(t, origin, idx);
}

// RT(rp, p) of a valid row rp and 0 <= p < max_seq_len.
__device__ __forceinline__ kvc_i64 kvc_table_rt(const KvcTableParams& t, kvc_i64 rp, kvc_i64 p) {
    return kvc_table_rt_at(t, rp * t.cols, p, p);
}

// Number of verify entries of a batch row with pool index rp and prefix length `prefix` (SPEC §5, §10).
__device__ __forceinline__ kvc_i64 kvc_row_verify_len(const KvcTableParams& t, const KvcBatchParams& b, kvc_i64 rp,
                                                      kvc_i64 prefix) {
    return kvc_verify_len(kvc_row_active(rp, prefix, t.max_reqs, t.max_seq_len, t.pad_row), prefix,
                          b.swa_window_size);
}

// T(x) (SPEC §5): through the LUT when the launch has one (HAS_LUT is a compile-time flag of the kernel).
template <bool HAS_LUT>
__device__ __forceinline__ kvc_i64 kvc_lut_translate(const KvcTableParams& t, kvc_i64 x) {
    if (!HAS_LUT) return x;
    const kvc_i64 v = (x >= 0 && x < t.lut_len) ? __ldg(t.lut + x) : 0;
    return kvc_translate(x, t.lut_len, v);
}

// T(x) with the LUT chosen at run time (a null LUT: T(x) = x), for kernels that translate rarely (seeds).
__device__ __forceinline__ kvc_i64 kvc_lut_translate_any(const KvcTableParams& t, kvc_i64 x) {
    return t.lut != nullptr ? kvc_lut_translate<true>(t, x) : x;
}

#endif  // __CUDACC__
