// kvcanary: the kernel parameter structs. Every kernel takes one of the *Params structs below by value.
//
// Python twin: kvcanary/ops/cuda/params.py, one field list per struct, in the same order. Every field is
// 8 bytes (a pointer or a kvc_i64), so a struct is a plain sequence of 8-byte words with no padding and the
// Python side packs it as an int64 array; tests/ops/test_param_layout.py compiles this header with the host
// compiler and checks sizeof/offsetof of every field against the NumPy dtypes built from the field lists,
// so the argument order cannot drift. Host-visible (no device code), no standard headers (NVRTC has none).
#pragma once

typedef long long kvc_i64;
typedef unsigned long long kvc_u64;

namespace kvc {
// Contexts one table launch serves (e.g. K and V of one attention group); the launcher splits longer
// tuples into several launches.
constexpr int kMaxContexts = 4;
// Columns of a real-KV source descriptor row (the device table the plan-free kernels read, SPEC §13).
constexpr int kSourceDescFields = 6;
constexpr int kSrcPtr = 0;           // data pointer (bytes)
constexpr int kSrcPageSize = 1;      // slots per row
constexpr int kSrcBytesPerToken = 2; // bytes a slot owns in its row
constexpr int kSrcRowStride = 3;     // bytes between rows
constexpr int kSrcFoldBytes = 4;     // bytes the fold reads per slot: 16 (PARTIAL) or read_bytes (ALL)
constexpr int kSrcNumRows = 5;       // rows of the source (informational: the launcher folds it into slot_limit)
}  // namespace kvc

// Up to four real-KV sources by value (the SGLang-named kernels; SPEC §2 MAX_REAL_KV_SOURCES).
struct KvcRealKv4 {
    const unsigned char* ptr[4];
    kvc_i64 page_size[4];
    kvc_i64 bytes_per_token[4];
    kvc_i64 row_stride[4];
    kvc_i64 nbytes[4];  // bytes folded per slot: 16 (PARTIAL) or read_bytes (ALL)
    kvc_i64 count;      // sources folded (0: NONE mode or no source)
};

// One launch context (SPEC §4): canary buffer, log, counters, real-KV sources.
struct KvcContextParams {
    unsigned char* canary;              // uint8 [num_slots, slot_stride]
    kvc_i64* ring;                      // int64 [ring_capacity, 8]
    int* write_index;                   // int32 [1]
    kvc_i64* slot_run_counter;          // int64 [1]
    kvc_i64* kernel_run_counter;        // int64 [1]
    const int* chain_position_flag;     // int32 [1] or null (write only)
    const kvc_i64* sources;             // device descriptor table [num_sources, kSourceDescFields] (table kernels)
    kvc_i64 num_sources;                // sources folded through `sources` (0: none)
    kvc_i64 num_slots;
    kvc_i64 slot_limit;                 // min(num_slots, slots every folded source covers) (SPEC §9)
    kvc_i64 slot_stride;                // bytes per record, a multiple of 8, >= 32
    kvc_i64 ring_capacity;
    kvc_i64 tag;                        // CanaryLaunchTag
};

// The per-position table (SPEC §10) and the SWA LUT.
struct KvcTableParams {
    const int* table;      // req_to_token [max_reqs, cols] or block_table [max_reqs, cols]
    const kvc_i64* lut;    // full_to_swa_index_mapping [lut_len] or null (T(x) = x)
    kvc_i64 lut_len;
    kvc_i64 max_reqs;
    kvc_i64 cols;          // columns of the table array
    kvc_i64 block_size;    // 1 for req_to_token
    kvc_i64 paged;         // 1: block table (a negative block id gives RT = -1)
    kvc_i64 max_seq_len;   // cols * block_size
    kvc_i64 pad_row;       // batch rows with this req_pool_indices are padding
};

// The batch rows (SPEC §5).
struct KvcBatchParams {
    const kvc_i64* req_pool_indices;  // [bs]
    const kvc_i64* prefix_lens;       // [bs]
    const kvc_i64* extend_seq_lens;   // [bs] or null (verify)
    const int* pool;                  // req_to_verify_expected_tokens [rows, pool_cols] or null
    const kvc_i64* valid_lens;        // [bs] or null
    int* invalid_rows;                // int32 [1] or null: SET to the number of invalid rows
    kvc_i64 bs;
    kvc_i64 swa_window_size;
    kvc_i64 pool_cols;
    kvc_i64 token_offset;             // kv_token_id_vs_position_offset
};

// The flattened tokens of a write (SPEC §6).
struct KvcTokenParams {
    const kvc_i64* input_ids;
    const kvc_i64* positions;
    const kvc_i64* out_cache_loc;
    const kvc_i64* expected_input_tokens;     // null unless the input assert is on
    const kvc_i64* expected_input_positions;  // null unless the input assert is on
    kvc_i64 num_tokens;
};

// launch_canary_plan_kernels (SPEC §5, §10): three kernels take the same struct.
struct KvcPlanParams {
    KvcTableParams table;
    KvcBatchParams batch;
    kvc_i64* verify_slot_indices;
    kvc_i64* verify_expected_tokens;
    kvc_i64* verify_expected_positions;
    kvc_i64* verify_prev_slot_indices;
    int* verify_num_valid;
    int* verify_enable;
    kvc_i64* write_offsets;           // [R + 1]; also the verify offsets between the first two kernels
    kvc_i64* write_seed_slot_indices; // [R]
    int* write_num_valid_reqs;
    kvc_i64 verify_capacity;
    kvc_i64 write_req_capacity;
};

// launch_canary_verify_kernel (SPEC §7).
struct KvcVerifyParams {
    KvcContextParams ctx;
    KvcRealKv4 rkv;
    const kvc_i64* slot_indices;
    const kvc_i64* expected_tokens;
    const kvc_i64* expected_positions;
    const kvc_i64* prev_slot_indices;
    const int* num_valid;
    const int* enable;
    kvc_i64 capacity;
};

// launch_canary_write_kernel (SPEC §6).
struct KvcWriteParams {
    KvcContextParams ctx;
    KvcRealKv4 rkv;
    KvcTokenParams tokens;
    const kvc_i64* write_offsets;
    const kvc_i64* seed_slot_indices;
    const int* num_valid_reqs;
    kvc_i64 write_req_capacity;
};

// launch_scatter_req_token_ids_kernel (SPEC §8).
struct KvcScatterParams {
    const kvc_i64* flat_in;
    const kvc_i64* offsets;
    const kvc_i64* req_pool_indices;
    int* pool_out;
    kvc_i64 n_flat;
    kvc_i64 bs;
    kvc_i64 max_reqs;
    kvc_i64 cols;
};

// launch_canary_verify_from_table (SPEC §11).
struct KvcVerifyTableParams {
    KvcTableParams table;
    KvcBatchParams batch;
    kvc_i64 num_contexts;   // 1 .. kMaxContexts
    kvc_i64* invalid_rows_total;  // int64 [1] or null: += the number of invalid rows (a canary's running count)
    KvcContextParams ctx[kvc::kMaxContexts];
};

// launch_canary_write_from_table (SPEC §12).
struct KvcWriteTableParams {
    KvcTableParams table;
    KvcBatchParams batch;
    KvcTokenParams tokens;
    kvc_i64 num_contexts;   // 1 .. kMaxContexts
    KvcContextParams ctx[kvc::kMaxContexts];
};

// gather / scatter / copy of canary records (SPEC §13).
struct KvcRecordsParams {
    const unsigned char* src;   // canary buffer read (gather, copy) or null
    unsigned char* dst;         // canary buffer written (scatter, copy) or null
    const kvc_i64* src_slots;   // [n] (gather, copy)
    const kvc_i64* dst_slots;   // [n] (scatter, copy)
    const kvc_i64* records_in;  // int64 [n, 4] (scatter)
    kvc_i64* records_out;       // int64 [n, 4] (gather)
    int* out_of_range;          // int32 [1] or null; zeroed by the launcher before the kernel
    kvc_i64 n;
    kvc_i64 src_num_slots;
    kvc_i64 src_stride;
    kvc_i64 dst_num_slots;
    kvc_i64 dst_stride;
};
