// kvcanary: canary records that move with the KV (SPEC §13). CPU twin: kvcanary/ops/reference/records.py;
// launcher: kvcanary/ops/cuda/records.py.
//
// Three kernels, one parameter each (KvcRecordsParams), a grid-stride loop over the n entries, one entry per
// thread: a record is the first 32 bytes of a slot (token, position, prev_hash, real_kv_hash); bytes past 32
// are never touched. Records move as two 16-byte halves when both sides are 16-byte aligned, else as four
// 8-byte words.
//  * kvc_gather_records: records_out[i] = record(src_slots[i]); a skipped entry gets a zero record;
//  * kvc_scatter_records: record(dst_slots[i]) = records_in[i];
//  * kvc_copy_records: record(dst_slots[i]) in dst = record(src_slots[i]) in src (src may be dst).
// A negative slot skips the entry; a slot >= num_slots skips it too and counts it in out_of_range (the launcher
// zeroes it first; one atomicAdd per warp). For copy, an out-of-range slot on either side counts the entry once
// (whatever the other slot is), else a negative slot on either side skips it (kvc_copy_status). Duplicate destination
// slots, or a copy whose source and destination slots overlap in one buffer, race (unspecified result; the
// reference applies entries in order). Nothing here is ordered between entries, so the reads of a copy use
// plain loads (the buffer may be written by the same launch), the gather the read-only path.

#include "common.cuh"

// Launch geometry (kvcanary/ops/cuda/grids.py reads these defines).
#define KVC_REC_THREADS 256
#define KVC_REC_BLOCKS_PER_SM 8

__device__ __forceinline__ void kvc_record_move(const kvc_i64* from, kvc_i64* to, bool vec16) {
    if (vec16) {
        const longlong2 a = reinterpret_cast<const longlong2*>(from)[0];
        const longlong2 b = reinterpret_cast<const longlong2*>(from)[1];
        reinterpret_cast<longlong2*>(to)[0] = a;
        reinterpret_cast<longlong2*>(to)[1] = b;
    } else {
        const kvc_i64 w0 = from[0], w1 = from[1], w2 = from[2], w3 = from[3];
        to[0] = w0;
        to[1] = w1;
        to[2] = w2;
        to[3] = w3;
    }
}

__device__ __forceinline__ bool kvc_aligned16(const void* a, kvc_i64 stride_a, const void* b, kvc_i64 stride_b) {
    return (((kvc_u64)a | (kvc_u64)stride_a | (kvc_u64)b | (kvc_u64)stride_b) & 15ULL) == 0;
}

// out_of_range += the entries of the warp that want it (every lane calls it).
__device__ __forceinline__ void kvc_count_out_of_range(int* out_of_range, bool oor) {
    const unsigned int ballot = __ballot_sync(kvc::kFullMask, oor);
    if (out_of_range != nullptr && ballot != 0 && (threadIdx.x & 31) == 0) atomicAdd(out_of_range, __popc(ballot));
}

extern "C" __global__ void __launch_bounds__(KVC_REC_THREADS) kvc_gather_records(const __grid_constant__ KvcRecordsParams p) {
    const bool vec16 = kvc_aligned16(p.src, p.src_stride, p.records_out, 0);
    const kvc_i64 stride = (kvc_i64)gridDim.x * blockDim.x;
    // The loop condition is warp-uniform (base is the block's first entry), so every lane reaches the ballot.
    for (kvc_i64 base = (kvc_i64)blockIdx.x * blockDim.x; base < p.n; base += stride) {
        const kvc_i64 i = base + threadIdx.x;
        int status = kvc::kRecordSkip;
        if (i < p.n) {
            const kvc_i64 slot = p.src_slots[i];
            status = kvc_record_slot_status(slot, p.src_num_slots);
            kvc_i64* out = p.records_out + i * kvc::CANARY_FIELDS_PER_SLOT;
            if (status == kvc::kRecordOk) {
                const kvc_i64* rec = kvc_record(p.src, slot, p.src_stride);
                if (vec16) {
                    const longlong2 a = __ldg(reinterpret_cast<const longlong2*>(rec));
                    const longlong2 b = __ldg(reinterpret_cast<const longlong2*>(rec) + 1);
                    reinterpret_cast<longlong2*>(out)[0] = a;
                    reinterpret_cast<longlong2*>(out)[1] = b;
                } else {
#pragma unroll
                    for (int f = 0; f < kvc::CANARY_FIELDS_PER_SLOT; ++f) out[f] = __ldg(rec + f);
                }
            } else {
#pragma unroll
                for (int f = 0; f < kvc::CANARY_FIELDS_PER_SLOT; ++f) out[f] = 0;
            }
        }
        kvc_count_out_of_range(p.out_of_range, status == kvc::kRecordOutOfRange);
    }
}

extern "C" __global__ void __launch_bounds__(KVC_REC_THREADS) kvc_scatter_records(const __grid_constant__ KvcRecordsParams p) {
    const bool vec16 = kvc_aligned16(p.dst, p.dst_stride, p.records_in, 0);
    const kvc_i64 stride = (kvc_i64)gridDim.x * blockDim.x;
    for (kvc_i64 base = (kvc_i64)blockIdx.x * blockDim.x; base < p.n; base += stride) {
        const kvc_i64 i = base + threadIdx.x;
        int status = kvc::kRecordSkip;
        if (i < p.n) {
            const kvc_i64 slot = p.dst_slots[i];
            status = kvc_record_slot_status(slot, p.dst_num_slots);
            if (status == kvc::kRecordOk)
                kvc_record_move(p.records_in + i * kvc::CANARY_FIELDS_PER_SLOT, kvc_record(p.dst, slot, p.dst_stride),
                                vec16);
        }
        kvc_count_out_of_range(p.out_of_range, status == kvc::kRecordOutOfRange);
    }
}

extern "C" __global__ void __launch_bounds__(KVC_REC_THREADS) kvc_copy_records(const __grid_constant__ KvcRecordsParams p) {
    const bool vec16 = kvc_aligned16(p.src, p.src_stride, p.dst, p.dst_stride);
    const kvc_i64 stride = (kvc_i64)gridDim.x * blockDim.x;
    for (kvc_i64 base = (kvc_i64)blockIdx.x * blockDim.x; base < p.n; base += stride) {
        const kvc_i64 i = base + threadIdx.x;
        int status = kvc::kRecordSkip;
        if (i < p.n) {
            const kvc_i64 s = p.src_slots[i], d = p.dst_slots[i];
            status = kvc_copy_status(kvc_record_slot_status(s, p.src_num_slots),
                                     kvc_record_slot_status(d, p.dst_num_slots));
            if (status == kvc::kRecordOk)
                kvc_record_move(kvc_record(p.src, s, p.src_stride), kvc_record(p.dst, d, p.dst_stride), vec16);
        }
        kvc_count_out_of_range(p.out_of_range, status == kvc::kRecordOutOfRange);
    }
}
