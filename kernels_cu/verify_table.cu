// kvcanary verify straight from the table (SPEC §11). CPU twin: kvcanary/ops/reference/verify_table.py;
// launcher: kvcanary/ops/cuda/verify_table.py.
//
// Specializations: KVC_HAS_LUT (T(x) through full_to_swa_index_mapping), KVC_CHECK_TOKEN (check the expected
// tokens: check_verify_expected_token and a pool given), KVC_HAS_REAL_KV (some context folds real KV, from its
// device descriptor table of any number of sources), KVC_CONTEXTS (1, 2 or 4: the most contexts a launch passes;
// the context loop is unrolled that far, as in write_table.cu, so each context's parameters are read from fixed
// constant-bank offsets, not through a register index; fewer registers with fewer contexts), KVC_FLAT32 (32-bit
// tile indices and, without a LUT, slots: see KVC_VT_FLAT32_MAX_SEQ_LEN below; taken wherever they apply). One
// parameter: KvcVerifyTableParams, with 1 to KVC_CONTEXTS contexts that share the table (K and V of a group: the
// table is walked once for all).
//
// Work distribution (no plan, no scratch, a grid fixed by the SM count). The entries of the batch are numbered
// request by request, position by position, as §5 lays them out. Every block first learns the batch total E (the
// scan of its one tile of rows, or, with more than KVC_VT_THREADS rows, a walk over all rows first) and cuts E
// into steps of kvc::kVtUnroll * 32 consecutive entries: without real KV one contiguous range of steps per warp of
// the grid (kvc_vt_ranges: equal sizes), with it warp g of G takes steps g, g + G, ... (kvc::kVtCarry says why).
// Blocks then walk the rows in tiles of KVC_VT_THREADS rows (one per thread: pool index, prefix; a block-wide
// exclusive sum of the rows' entry counts gives the tile's offsets in shared memory) and each warp takes its
// steps' parts of the tile (a step may straddle two tiles; a block whose range would straddle one starts its tile at
// its first entry's row instead, KVC_VT_REBASE): lane l takes entries
// base + u * 32 + l, finds its row by a galloping search over the tile's offsets from its previous row (usually
// one comparison; without real KV the first row of a warp's entries in a tile is found by the whole warp in two
// votes, kvc_vt_warp_find_row), and its position and table cell by one add each from the row's s_pos0 / s_cell0
// (published with the tile, so no per-entry rp * cols); without real KV, a step that lies inside the row of the
// warp's previous step's last entry takes that row's fields once, with no search (KVC_VT_STEP_IN_ROW). So lanes
// read consecutive table entries (coalesced), the active counts are read on the device, and the ranges are fixed
// before any entry is read.
//
// Bytes per entry (shuffled pool, NONE): 4 B of table (a 128-byte line per 32 lanes) + the slot's 32-byte record;
// the predecessor's record is the neighbouring entry's: lane l computes slot_hash of its own record and passes it
// (and its slot, the next entry's prev) to lane l + 1 with a shuffle; lane 0 takes lane 31's of the previous u,
// or, without real KV, of the warp's previous step (kept in shared memory by lane 0). So only a warp's first entry
// in a tile and a row's first entry load their predecessor themselves (table entry and 24 bytes of record); with
// KVC_VT_LEAD_ENTRY (ranges of up to 4 steps) not the first entry of a warp's range either: its lead, the entry
// before, is one of the first step's entries, hashed and not checked.
// PARTIAL adds one 32-byte sector of real KV per entry per source (its first 16 bytes are loaded together with
// the record, so both latencies overlap). With several contexts the row mapping, table, LUT and pool reads are
// done once; each context adds its record (and KV) reads.
// Numbers (H200, docs/BENCHMARKS.md, 2026-12-05): B NONE shuffled (8.4 M entries) runs within 5 % of a bare kernel
// that reads the same table entries and records and checks nothing (209.7 against 201.4 us; random 32-byte records
// cost a 64-byte DRAM access each); A NONE (1 M entries) is 30.0 us eager, 15.4-15.7 us in a graph with the 32-bit
// modules and the lead once the process has captured other graphs (14.9-15.2 in its first ones; the lead saves
// 0.3-0.5 us: KVC_VT_LEAD_ENTRY; 16.3-17.1 with the 64-bit modules; 6.1 and 7.6 warp
// instructions per entry by Nsight Compute, 14.4 with the earlier distribution, where blocks took 512-entry chunks
// round-robin and lane 0 of every warp looked up its predecessor at every step); B NONE contiguous 95.7 us (103.9
// with the 64-bit modules, 178 before).
// The row walk every block repeats costs ~16 B per row from L2 (B: 1024 rows x 528 blocks = 8.7 MB, about 3 % of
// the bytes).
// Occupancy: 4 blocks of 256 threads per SM within 64 registers; 2 entries per thread per step without real KV,
// 1 with it (2048 and 1024 entries in flight per SM): more in flight made the random reads slower, not faster.
//
// Per step a thread keeps kvc::kVtUnroll entries: all table loads, then per context all record loads, then the
// hashing, so several independent DRAM requests are in flight per thread. Each entry's checks are one
// branch-free pass/fail and one warp vote; the failure bits and the row's fields are built only in a warp where
// some entry fails (rare). Violations are appended per warp
// (one atomicAdd per warp, step and context). Block 0 walks every row once more at the end to count the invalid
// ones and adds the counters (kernel_run_counter += 1, slot_run_counter += E, per context), sets invalid_rows and
// adds the same count to invalid_rows_total (a canary's running count, so it needs no extra op per step).
//
// Rows, windows, RT(), T(), expected tokens and bounds (SPEC §5, §9, §10) as the reference: an invalid or
// padding row has no entries; slot 0 entries are skipped; an entry whose slot is outside [0, num_slots) or not
// covered by a folded source (>= slot_limit), or whose prev is >= num_slots, gets the single row
// (tag, slot, position, -1, expected_token or -1, 0, prev, SLOT_OUT_OF_RANGE).

// The 32-bit modules take splitmix64's multiplies as three multiply-adds (common.cuh, kvc_mul64); with
// KVC_VT_MUL3_ALL 1 the 64-bit ones (block tables: the paged engines' path) do too. For those, statically 1-6 %
// fewer instructions per module, no spills (nvcc 13.0, sm_90; the PARTIAL modules gain most, their fold being
// splitmix64 too). Timed on an H200 (docs/BENCHMARKS.md, 2026-12-05 10:05 UTC): within 0.4 % without real KV,
// 0.3-1.1 % slower with it: off (bench/tune_geometry.py's fifth number).
#define KVC_VT_MUL3_ALL 0
#if (defined(KVC_FLAT32) && KVC_FLAT32) || KVC_VT_MUL3_ALL
#define KVC_MUL3 1
#endif
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
#ifndef KVC_FLAT32
#error "KVC_FLAT32 must be defined (0 or 1)"
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
// 1: with per-warp ranges (no real KV) and a per-position table, a step whose entries all lie inside one row that
// began before the step (the steady state of long rows) takes that row's fields once, warp-uniformly, and needs no
// per-entry row search, shared loads or predecessor test (bench/tune_geometry.py's third number). On an H200
// (docs/BENCHMARKS.md, 2026-12-05) never slower: contiguous pools 2-3 % faster in a graph (A 12.34 -> 11.93 us,
// B 88.0 -> 86.1), A shuffled 15.46 -> 15.40.
#define KVC_VT_STEP_IN_ROW 1
// 1: with per-warp ranges (no real KV), a warp's range in a tile starts one entry early, at its lead: the entry before
// its first (the previous warp's last), loaded and hashed like the others but not checked, so that the first
// entry's predecessor is lane 0's entry, handed on by the shuffle, rather than a table cell and then a record
// looked up after the step's own loads (the warp's first step took about 7,000 cycles against 4,400 for the later
// ones: docs/BENCHMARKS.md, the timeline). Ranges then hold 64k - 1 entries, so a range and its lead fill k steps.
// The value is the most steps a range and its lead may take (0: never a lead). A lead in every range made B 19 %
// slower and B contiguous 43 % on an H200 (32 steps), so only short ranges take one. Such a range's steps no longer
// start at multiples of 64 entries, as they did in B's 8192-entry rows; Nsight Compute counts the same instructions
// and the same L1, L2 and DRAM traffic either way (docs/BENCHMARKS.md, 2026-12-06 16:50 UTC). The cause, measured
// since: a range that straddles a tile boundary (B: 4 tiles), whose block's other warps wait at the next tile's
// barriers for its first part (KVC_VT_REBASE avoids it). With 4 (A's ranges of four steps; B has none), on an H200
// (docs/BENCHMARKS.md, 2026-12-05 16:08 UTC): A shuffled NONE 0.28-0.48 us faster in a graph in each of 10
// interleaved pairs (15.35-15.87 -> 14.92-15.52), A contiguous 0.8-4.4 % faster, B within 0.5 %
// (bench/tune_geometry.py's fourth number). No spills.
#define KVC_VT_LEAD_ENTRY 4
// 1: programmatic dependent launch (common.cuh, kvc_grid_dependency; kvcanary/ops/cuda/pdl.py launches the kernel
// with the attribute only when this is 1): the launch overlaps the end of the kernel before it when that one allows
// it (a KVCanary step's write or verify of another group). On an H100, A shuffled NONE in a graph of its own
// launches 0.1-0.3 us faster; a K + V verify and the write after it 0.9-1.6 us.
#define KVC_VT_PDL 1
// 1: a step inside one row (KVC_VT_STEP_IN_ROW) runs its own copy of the rest of the step (slots, predecessors,
// each context's checks), compiled knowing that every entry is real and takes its neighbour's predecessor, so that
// no per-entry flags are kept or tested there: in the A NONE 32-bit module (nvcc 13.0) such a step without a
// violation runs 245 instructions instead of 284, for 21 % more code (2,304 -> 2,792) and 54 registers instead of
// 48; no module spills. Timed on an H200 (docs/BENCHMARKS.md, 2026-12-05 10:05 UTC): contiguous pools 2-4 % faster
// in a graph, A shuffled 1-2 % slower (with the lead in every range too); again on an H100 at 21:26 UTC, A shuffled
// in turns with shipped: 19.10 and 18.90 us against 19.01 and 18.99: off (bench/tune_geometry.py's sixth number).
#define KVC_VT_IN_ROW_SPLIT 0

// 1: with per-warp ranges (no real KV) and more than one tile of rows, a block whose range starts inside a tile, past
// its first row, and ends past the tile walks its next tile from the row of its first entry (one more scan of rows,
// no entries) rather than the fixed tiles. Otherwise the tile boundary splits the block's warps: those past it wait
// at the next tile's barriers until those before it are done, so the block takes up to two ranges' time and ends
// the launch last. Never taken with one tile (A) or where ranges meet the tiles' boundaries (B's rows of 8192),
// but an engine's batch of more than 256 rows of mixed lengths has such a block at every tile boundary. On an
// H100 (docs/BENCHMARKS.md, 2026-12-06 18:29 UTC, in turns with 0, graph): B with rows of random lengths in
// [4096, 8192] 235.3 -> 206.1 us shuffled and 119.6 -> 88.4 contiguous; B of 8153 each (two tile boundaries at a
// block's fifth warp) 307.2 -> 267.3 and 152.8 -> 112.2, as fast as B's aligned rows; A and aligned B within 1 %.
#define KVC_VT_REBASE 1
// 1: a step's records are hashed before any of its checks, each hash computed whatever the slot (a lane without a
// record of its own hashes zeros and keeps 0), so that the kVtUnroll hashes are one branch-free block the compiler
// interleaves: the step waits on one hash's dependency chain (about 54 dependent instructions) rather than one per
// entry (off, each entry's hash sits in a branch of its own, between the previous entry's checks and vote).
// KVC_VT_HASH_ILP for the 32-bit modules, KVC_VT_HASH_ILP_64 for the 64-bit ones. Statically (nvcc 13.0, sm_90),
// the A NONE 32-bit module: 54 -> 56 registers, 2,408 -> 2,400 instructions, no spill; the 64-bit modules 60 -> 62,
// and four of them (check tokens) would spill 8-24 bytes. On an H100 (docs/BENCHMARKS.md, 2026-12-07 00:42 UTC, in
// turns with 0, graph): the 32-bit modules never slower, A shuffled NONE 18.89 -> 18.72 us, A contiguous 13.04 ->
// 12.88, B contiguous 113.1 -> 112.3, D 3 % faster; the 64-bit ones within 0.2 % (A 19.37 -> 19.32, B the same), so
// they stay off and keep their code. One warp vote per step instead of one per entry on top of it was no faster
// (A shuffled 18.85): removed. bench/tune_geometry.py's ninth number sets both.
#define KVC_VT_HASH_ILP 1
#define KVC_VT_HASH_ILP_64 0
#define KVC_VT_HASHES_FIRST (KVC_FLAT32 ? KVC_VT_HASH_ILP : KVC_VT_HASH_ILP_64)  // the one of this module's width

// The 32-bit modules (KVC_FLAT32 = 1; kvcanary/ops/cuda/verify_table.py chooses them): a per-position table (not
// paged) whose rows hold at most this many positions, contexts of at most KVC_VT_FLAT32_MAX_SLOTS slots and record
// strides, records 16-byte aligned (buffer and stride), and a grid of fewer than 2**24 threads. Then a tile's
// entries (at most kVtTile rows of max_seq_len), its tile-local indices, offsets and positions fit an int with
// 2**24 to spare for a step's overshoot ((2**31 - 2**24) / 256), so the tile's scan and the step loop's index math
// are 32-bit; a row's table origin is kept as the address of its cell for tile-local entry 0 (an entry's cell is
// one 32 x 64-bit multiply-add); a record is two 16-byte loads (no run-time choice between load forms) whose offset
// is one 32 x 32 -> 64-bit multiply-add; splitmix64's multiplies are three instructions (KVC_MUL3); and without a
// LUT slots stay the table's ints (one shuffle, 32-bit compares). Fewer instructions per step where the step is
// bound by instruction issue (A NONE).
#define KVC_VT_FLAT32_MAX_SEQ_LEN 8323072
#define KVC_VT_FLAT32_MAX_SLOTS 2147483647

namespace kvc {
constexpr int kVtMinBlocks = KVC_HAS_REAL_KV ? KVC_VT_BLOCKS_PER_SM_REAL_KV : KVC_VT_BLOCKS_PER_SM;
constexpr int kVtUnroll = KVC_HAS_REAL_KV ? KVC_VT_UNROLL_REAL_KV : KVC_VT_UNROLL;  // entries per thread per step
#if KVC_HAS_REAL_KV
constexpr int kVtFoldLoads = 2;  // loads in flight per real-KV fold batch (ALL mode)
#endif
constexpr int kVtTile = KVC_VT_THREADS;                         // rows per tile: one per thread
constexpr int kVtWarpStep = kVtUnroll * kWarpSize;                 // entries per warp per step
constexpr int kVtWarps = KVC_VT_THREADS / kWarpSize;              // warps per block
// How a warp's steps are laid out. Without real KV (bound by instructions at A): one contiguous range per warp,
// and lane 0 takes its first entry's predecessor from the warp's previous step (through shared memory) rather
// than looking it up, which saves a third of the instructions. With real KV (bound by the random KV and record
// reads): steps grid-strided, warp g of G taking steps g, g + G, ..., so the whole grid sweeps the batch in one
// window, as the bare-read floor does; per-warp ranges made B PARTIAL 22-35 % slower (docs/BENCHMARKS.md).
constexpr bool kVtCarry = !KVC_HAS_REAL_KV;
// Loads issued early, with real KV: a step's table loads back to back before any is used (kvc_table_cell), and a
// looked-up predecessor's record together with the entry's own. Measured on an H200 (docs/BENCHMARKS.md,
// 2026-12-03 19:18): 1-6 % faster with real KV; without it (two entries per thread at 64 registers, bound by
// instructions at A) the same ordering made A contiguous 10 % and B contiguous 5 % slower in a graph, so there
// an entry's looked-up predecessor is loaded and used in place; only the entries' own table ints of a
// per-position table are loaded in the row loop and converted after it (their loads overlap: A 8 %, B contiguous
// 8 % faster in a graph, docs/BENCHMARKS.md, 2026-12-04).
constexpr bool kVtEarlyLoads = KVC_HAS_REAL_KV != 0;
constexpr bool kVtLead = kVtCarry && KVC_VT_LEAD_ENTRY;  // see KVC_VT_LEAD_ENTRY
static_assert(!(kVtLead && kVtEarlyLoads), "the lead's predecessor is skipped only where it is looked up in place");
static_assert(kVtTile * (kvc_i64)KVC_VT_FLAT32_MAX_SEQ_LEN + (1LL << 24) <= (1LL << 31), "flat32 tile bound");
}  // namespace kvc

// Tile-local entry indices, offsets and positions; record strides; slots (see KVC_VT_FLAT32_MAX_SEQ_LEN).
#if KVC_FLAT32
typedef int kvc_vt_idx;
typedef int kvc_vt_stride;
#else
typedef kvc_i64 kvc_vt_idx;
typedef kvc_i64 kvc_vt_stride;
#endif
#if KVC_FLAT32 && !KVC_HAS_LUT
typedef int kvc_vt_slot;
typedef unsigned kvc_vt_uslot;
#else
typedef kvc_i64 kvc_vt_slot;
typedef kvc_u64 kvc_vt_uslot;
#endif

// Whether the table is a block table (never in the flat32 modules, so their code for it compiles away).
__device__ __forceinline__ bool kvc_vt_paged(const KvcTableParams& t) { return !KVC_FLAT32 && t.paged; }

// A row's table cells from its origin cell0 (s_cell0), for tile-local entry idx at position p: the 64-bit modules
// keep the origin as a table index and use common.cuh's rules (kvc_table_cell_at, kvc_table_raw_flat,
// kvc_table_rt_at); the flat32 ones (a per-position table) keep the address of the row's cell for tile-local entry 0.
__device__ __forceinline__ KvcTableCell kvc_vt_cell(const KvcTableParams& t, kvc_i64 cell0, kvc_vt_idx idx,
                                                    kvc_vt_idx p) {
#if KVC_FLAT32
    KvcTableCell c;
    c.at = reinterpret_cast<const int*>(cell0) + idx;
    c.rem = 0;
    return c;
#else
    return kvc_table_cell_at(t, cell0, idx, p);
#endif
}

// The int of a per-position table's cell (loaded, not yet converted: kvc_table_raw_flat).
__device__ __forceinline__ int kvc_vt_raw(const KvcTableParams& t, kvc_i64 cell0, kvc_vt_idx idx) {
#if KVC_FLAT32
    return __ldg(kvc_vt_cell(t, cell0, idx, 0).at);
#else
    return kvc_table_raw_flat(t, cell0, idx);
#endif
}

// RT at tile-local entry idx, position p, load included (kvc_table_rt_at).
__device__ __forceinline__ kvc_i64 kvc_vt_rt(const KvcTableParams& t, kvc_i64 cell0, kvc_vt_idx idx, kvc_vt_idx p) {
#if KVC_FLAT32
    return kvc_vt_raw(t, cell0, idx);
#else
    return kvc_table_rt_at(t, cell0, idx, p);
#endif
}

// The record of slot s in [0, num_slots): in the flat32 modules slot and stride are non-negative ints below 2**31, so
// its offset is one 32 x 32 -> 64-bit multiply-add (the 64-bit form takes six instructions there).
__device__ __forceinline__ const kvc_i64* kvc_vt_record(const unsigned char* canary, kvc_vt_slot s,
                                                        kvc_vt_stride stride) {
#if KVC_FLAT32
    return reinterpret_cast<const kvc_i64*>(canary + (kvc_u64)(unsigned)s * (unsigned)stride);
#else
    return kvc_record(canary, s, stride);
#endif
}

// T(x) of a table value, as a step keeps its slots.
__device__ __forceinline__ kvc_vt_slot kvc_vt_slot_of(const KvcTableParams& t, kvc_i64 x) {
    return (kvc_vt_slot)kvc_lut_translate<KVC_HAS_LUT>(t, x);
}

// The expected token of the entry at position pos of a row (pool index rp, valid length vlen), or kvc::NO_SLOT
// where the pool has none (SPEC §5).
__device__ __forceinline__ kvc_i64 kvc_vt_expected_token(const KvcBatchParams& b, kvc_i64 rp, kvc_i64 vlen,
                                                         kvc_i64 pos) {
    const kvc_i64 q = pos + b.token_offset;
    return kvc_expected_token_ok(q, vlen, b.pool_cols) ? (kvc_i64)b.pool[rp * b.pool_cols + q] : kvc::NO_SLOT;
}

// The shared (context-independent) part of a step's entries.
struct KvcVtEntries {
    kvc_vt_slot slot[kvc::kVtUnroll];
    kvc_vt_slot prev[kvc::kVtUnroll];
    kvc_vt_idx pos[kvc::kVtUnroll];
    kvc_i64 exp_tok[kvc::kVtUnroll];  // -1: unchecked
    bool act[kvc::kVtUnroll];         // a real entry (else a padding lane: slot 0, skipped)
    bool nb[kvc::kVtUnroll];          // the predecessor is lane - 1's entry
};

// The checks of one context for a step's entries (every lane calls it: the appends are warp-collective).
// *hash_carry (lane 0 only, warp-private shared memory): slot_hash of the last entry of the warp's previous step,
// the predecessor of this step's first entry when en.nb[0] holds on lane 0; left holding this step's last.
// lead (lane 0): entry u = 0 is the warp's lead (KVC_VT_LEAD_ENTRY), hashed for lane 1 and not checked. IN_ROW: a
// step inside one row (KVC_VT_IN_ROW_SPLIT), whose every entry's predecessor is lane - 1's (en.nb all true, no lead).
template <bool IN_ROW>
__device__ __forceinline__ void kvc_vt_context(const KvcContextParams& x, const KvcVtEntries& en, bool lead,
                                               volatile kvc_i64* hash_carry_smem) {
    const unsigned char* canary = x.canary;
    const kvc_vt_stride stride = (kvc_vt_stride)x.slot_stride;
    const kvc_vt_slot num_slots = (kvc_vt_slot)x.num_slots, limit = (kvc_vt_slot)x.slot_limit;
    const bool vec16 = KVC_FLAT32 || kvc_records_vec16(canary, stride);  // the flat32 launcher checked it
#if KVC_HAS_REAL_KV
    const kvc_i64 nsrc = x.num_sources;
#endif
    kvc_i64 tok[kvc::kVtUnroll], spos[kvc::kVtUnroll], hash[kvc::kVtUnroll], rkv[kvc::kVtUnroll];
#if KVC_HAS_REAL_KV
    kvc_u64 w0[kvc::kVtUnroll], w1[kvc::kVtUnroll];
#endif
    bool own[kvc::kVtUnroll];
    // A looked-up predecessor's fields (kVtEarlyLoads: loaded here; else where the chain is checked).
    kvc_i64 p_tok[kvc::kVtUnroll], p_pos[kvc::kVtUnroll], p_hash[kvc::kVtUnroll];
    // All loads first: the slot's record (also when the entry itself will be out of range: a covered-or-not
    // slot inside the buffer is the next entry's predecessor), the first real-KV bytes of a covered slot and,
    // with kVtEarlyLoads, the record of a predecessor in [1, num_slots) that is not lane - 1's.
#pragma unroll
    for (int u = 0; u < kvc::kVtUnroll; ++u) {
        const kvc_vt_slot s = en.slot[u];
        own[u] = (kvc_vt_uslot)s - 1 < (kvc_vt_uslot)num_slots - 1;  // s in [1, num_slots) (num_slots >= 1)
        tok[u] = spos[u] = hash[u] = rkv[u] = 0;
        if (own[u]) kvc_load_record_at(kvc_vt_record(canary, s, stride), vec16, tok[u], spos[u], hash[u], rkv[u]);
        p_tok[u] = p_pos[u] = p_hash[u] = 0;
        if (kvc::kVtEarlyLoads && !en.nb[u] && en.prev[u] > kvc::TOKEN_TO_KV_SLOT_PADDING && en.prev[u] < num_slots) {
            const kvc_i64* pr = kvc_vt_record(canary, en.prev[u], stride);
            p_hash[u] = __ldg(pr + kvc::FIELD_PREV_HASH);
            p_tok[u] = __ldg(pr + kvc::FIELD_TOKEN);
            p_pos[u] = __ldg(pr + kvc::FIELD_POSITION);
        }
#if KVC_HAS_REAL_KV
        w0[u] = w1[u] = 0;
        if (nsrc > 0 && own[u] && s < limit) kvc_load16(kvc_source_bytes(x.sources, s), w0[u], w1[u]);
#endif
    }
    const int lane = (int)(threadIdx.x & 31);
#if KVC_VT_HASHES_FIRST
    // slot_hash of each entry's own record, all before the checks (KVC_VT_HASH_ILP): a lane without one hashes the
    // zeroed fields and keeps 0, so no branch separates the hashes.
    kvc_i64 own_hash[kvc::kVtUnroll];
#pragma unroll
    for (int u = 0; u < kvc::kVtUnroll; ++u) {
        const kvc_i64 h = (kvc_i64)kvc_record_hash(hash[u], tok[u], spos[u]);
        own_hash[u] = own[u] ? h : 0;
    }
#endif
    kvc_i64 hash_carry = 0;  // lane 0: slot_hash of entry (u - 1, lane 31), or of the previous step's last
    if (kvc::kVtCarry && lane == 0 && (IN_ROW || en.nb[0])) hash_carry = *hash_carry_smem;
#pragma unroll
    for (int u = 0; u < kvc::kVtUnroll; ++u) {
        const kvc_vt_slot s = en.slot[u], prev = en.prev[u];
        // slot_hash of this lane's record, handed to the next lane (whose prev is this slot).
#if KVC_VT_HASHES_FIRST
        const kvc_i64 h = own_hash[u];
#else
        const kvc_i64 h = own[u] ? (kvc_i64)kvc_record_hash(hash[u], tok[u], spos[u]) : 0;
#endif
        const kvc_i64 rotated = __shfl_sync(kvc::kFullMask, h, (lane + kvc::kWarpSize - 1) & 31);
        kvc_i64 pred = lane > 0 ? rotated : hash_carry;  // slot_hash of prev when en.nb[u] (lane 0: (u - 1, 31)'s)
        hash_carry = rotated;
        const bool live = s != kvc::TOKEN_TO_KV_SLOT_PADDING;  // padding lanes (!en.act) hold slot 0
        // kvc_verify_out_of_range, with slot outside [0, slot_limit) as one unsigned compare.
        const bool oor = live & (((kvc_vt_uslot)s >= (kvc_vt_uslot)limit) | (prev >= num_slots));
        const bool checked = live & !oor;
        // A predecessor in [1, num_slots) that is not lane - 1's entry: its slot_hash from its record.
        if (!IN_ROW && checked && !en.nb[u] && prev > 0) {
            if (kvc::kVtEarlyLoads) {
                pred = (kvc_i64)kvc_record_hash(p_hash[u], p_tok[u], p_pos[u]);
            } else {
                const kvc_i64* pr = kvc_vt_record(canary, prev, stride);
                pred = (kvc_i64)kvc_record_hash(__ldg(pr + kvc::FIELD_PREV_HASH), __ldg(pr + kvc::FIELD_TOKEN),
                                                __ldg(pr + kvc::FIELD_POSITION));
            }
        }
        // prev 0: unknown predecessor, no chain check (expected = stored); prev < 0: chain head (anchor).
        const kvc_i64 expect = prev < 0 ? (kvc_i64)kvc_anchor_hash() : pred;
        kvc_i64 fingerprint = 0;
#if KVC_HAS_REAL_KV
        if (nsrc > 0 && checked) fingerprint = (kvc_i64)kvc_fingerprint_table<kvc::kVtFoldLoads>(x.sources, nsrc, s, w0[u], w1[u]);
#endif
        // Every check at once (no branches); the row's fields are built only in a warp where some entry fails.
        const bool chain_bad = (prev != kvc::TOKEN_TO_KV_SLOT_PADDING) & (hash[u] != expect);
#if KVC_CHECK_TOKEN
        const bool tok_bad = (en.exp_tok[u] != kvc::NO_SLOT) & (tok[u] != en.exp_tok[u]);
#else
        const bool tok_bad = false;
#endif
        bool want = oor | (checked & (chain_bad | tok_bad | (spos[u] != en.pos[u]) | (rkv[u] != fingerprint)));
        if (kvc::kVtLead && !IN_ROW && u == 0 && lead) want = false;  // the lead: hashed for lane 1, not checked
        if (!__all_sync(kvc::kFullMask, !want)) {
            kvc_i64 bits = 0;
            if (chain_bad) bits |= kvc::VERIFY_CHAIN_HASH_MISMATCH;
            if (tok_bad) bits |= kvc::VERIFY_TOKEN_MISMATCH;
            if (spos[u] != en.pos[u]) bits |= kvc::VERIFY_POSITION_MISMATCH;
            if (rkv[u] != fingerprint) bits |= kvc::VERIFY_REAL_KV_HASH_MISMATCH;
            kvc_append_row_warp(kvc_log_of(x), want, s, oor ? en.pos[u] : spos[u], oor ? kvc::NO_SLOT : tok[u],
                                en.exp_tok[u], oor ? 0 : hash[u],
                                oor ? prev : prev == kvc::TOKEN_TO_KV_SLOT_PADDING ? hash[u] : expect,
                                oor ? (kvc_i64)kvc::SLOT_OUT_OF_RANGE : bits);
        }
    }
    if (kvc::kVtCarry && lane == 0) *hash_carry_smem = hash_carry;  // lane 31's last: the next step's predecessor
}

// The rest of a step once its entries' rows are known: slots from the table values, predecessors from the
// neighbours (lane 0's from the warp's previous step, ws[2], when en.nb[0]), then each context's checks (ws: the
// warp's row of s_warp). IN_ROW (KVC_VT_IN_ROW_SPLIT: a copy of its own for a step inside one row): every entry is
// real and takes lane - 1's entry as its predecessor, known at compile time.
template <bool IN_ROW>
__device__ __forceinline__ void kvc_vt_step_rest(const KvcVerifyTableParams& p, const KvcTableParams& t, int nctx,
                                                 int lane, volatile kvc_i64* ws, KvcVtEntries& en,
                                                 int (&raw)[kvc::kVtUnroll], const KvcTableCell (&cell)[kvc::kVtUnroll],
                                                 const KvcTableCell (&prev_cell)[kvc::kVtUnroll],
                                                 const bool (&look)[kvc::kVtUnroll], bool lead) {
    if (!kvc::kVtEarlyLoads && !kvc_vt_paged(t)) {
#pragma unroll
        for (int u = 0; u < kvc::kVtUnroll; ++u)
            if (IN_ROW || en.act[u]) en.slot[u] = kvc_vt_slot_of(t, (kvc_i64)raw[u]);
    }
    if (kvc::kVtEarlyLoads) {  // (never with IN_ROW: a step inside a row needs per-warp ranges)
        int raw_prev[kvc::kVtUnroll];
#pragma unroll
        for (int u = 0; u < kvc::kVtUnroll; ++u) {
            raw[u] = en.act[u] ? __ldg(cell[u].at) : 0;
            raw_prev[u] = look[u] ? __ldg(prev_cell[u].at) : 0;
        }
#pragma unroll
        for (int u = 0; u < kvc::kVtUnroll; ++u) {
            if (en.act[u]) en.slot[u] = kvc_vt_slot_of(t, kvc_table_value(t, cell[u], raw[u]));
            if (look[u]) en.prev[u] = kvc_vt_slot_of(t, kvc_table_value(t, prev_cell[u], raw_prev[u]));
        }
    }
    // Lane 0 starts from the previous step's last slot (in s_warp when en.nb[0]), then takes lane 31's.
    kvc_vt_slot slot_carry = (kvc::kVtCarry && lane == 0 && (IN_ROW || en.nb[0])) ? (kvc_vt_slot)ws[2] : 0;
#pragma unroll
    for (int u = 0; u < kvc::kVtUnroll; ++u) {
        const kvc_vt_slot s = __shfl_sync(kvc::kFullMask, en.slot[u], (lane + kvc::kWarpSize - 1) & 31);
        if (IN_ROW || en.nb[u]) en.prev[u] = lane > 0 ? s : slot_carry;
        slot_carry = s;
    }
    if (kvc::kVtCarry && lane == 0) ws[2] = slot_carry;
#pragma unroll
    for (int c = 0; c < KVC_CONTEXTS; ++c)  // the launcher never passes more (specs.contexts_spec)
        if (c < nctx) kvc_vt_context<IN_ROW>(p.ctx[c], en, lead, &ws[3 + c]);  // block-uniform condition
}

// The batch's `total` entries are cut into one contiguous range per warp of the grid, `per` entries each (a
// multiple of a warp's step, or with leads (ranges of at most KVC_VT_LEAD_ENTRY steps) one less, so that a range
// and its lead fill whole steps; the last ranges may be short or empty): warp w of block b takes
// [(b * warps_per_block + w) * per, + per) clipped to total. Thread 0 writes range[0..3] = per, this block's
// start and end (its warps' ranges together), total (the caller synchronizes); kept in shared memory, not in
// registers, through the loop (the entry loop needs every register it can get). With grid-strided steps (real
// KV) there are no ranges: per is unused and every block's share is [0, total).
__device__ __forceinline__ void kvc_vt_ranges(kvc_i64 total, volatile kvc_i64* range) {
    if (!kvc::kVtCarry) {  // grid-strided steps: every block's share spans the batch
        range[0] = 0;
        range[1] = 0;
        range[2] = range[3] = total;
        return;
    }
    const kvc_i64 warps = (kvc_i64)gridDim.x * kvc::kVtWarps;
    kvc_i64 per, rem;
    kvc_divmod(total + warps - 1, warps, per, rem);
    // With a lead a range takes per / step + 1 steps; an odd per (64k - 1) tells the tiles that ranges have leads.
    per = kvc::kVtLead && per / kvc::kVtWarpStep + 1 <= KVC_VT_LEAD_ENTRY
              ? (per + kvc::kVtWarpStep) / kvc::kVtWarpStep * kvc::kVtWarpStep - 1
              : (per + kvc::kVtWarpStep - 1) / kvc::kVtWarpStep * kvc::kVtWarpStep;
    range[0] = per;
    range[1] = kvc_min64((kvc_i64)blockIdx.x * kvc::kVtWarps * per, total);
    range[2] = kvc_min64(range[1] + kvc::kVtWarps * per, total);
    range[3] = total;
}

// The tile row that owns tile-local entry e (0 <= e < offsets[kVtTile]): the first r with offsets[r + 1] > e, as
// kvc_find_row, found by the whole warp (every lane calls it with the same e) in two votes: lane l first tests the
// end of the l-th group of kVtTile / 32 rows, then lane l < kVtTile / 32 tests row l of the first group that ends
// past e. Rows without entries never own one (their end equals their start).
template <typename O>
__device__ __forceinline__ int kvc_vt_warp_find_row(const O* offsets, O e) {
    constexpr int group = kvc::kVtTile / kvc::kWarpSize;
    static_assert(group * kvc::kWarpSize == kvc::kVtTile && group <= kvc::kWarpSize, "rows per vote group");
    const int lane = (int)(threadIdx.x & 31);
    const unsigned ends = __ballot_sync(kvc::kFullMask, offsets[group * (lane + 1)] > e);  // lane 31: the total
    const int g = __ffs((int)ends) - 1;
    const unsigned rows = __ballot_sync(kvc::kFullMask, lane < group && offsets[group * g + lane + 1] > e);
    return group * g + __ffs((int)rows) - 1;
}

extern "C" __global__ void __launch_bounds__(KVC_VT_THREADS, kvc::kVtMinBlocks)
kvc_verify_from_table(const __grid_constant__ KvcVerifyTableParams p) {
    // The tile's rows, one array so that a row's fields sit at fixed offsets from one address (with four separate
    // arrays the check-token, real-KV, four-context specializations spill 12 bytes under nvcc 13.0): the
    // tile-local exclusive offsets of the rows' entries (kVtTile + 1 of them); s_pos0, the position of tile-local
    // entry 0 in the row's numbering (window start - offset: entry el is at position el + s_pos0); s_cell0, the
    // table index of that entry's cell (rp * cols + s_pos0; a block table: rp * cols, the row's first cell), so
    // an entry needs no 64-bit multiply; and, when tokens are checked, req_pool_indices and the expected-token
    // valid lengths.
    __shared__ kvc_i64 s_rows[3 + 2 * KVC_CHECK_TOKEN][kvc::kVtTile + 1];
    // In the flat32 modules s_off and s_pos0 are ints (the first half of their rows) and s_cell0 holds an address.
    kvc_vt_idx* const s_off = reinterpret_cast<kvc_vt_idx*>(s_rows[0]);
    kvc_vt_idx* const s_pos0 = reinterpret_cast<kvc_vt_idx*>(s_rows[1]);
    kvc_i64* const s_cell0 = s_rows[2];
#if KVC_CHECK_TOKEN
    kvc_i64* const s_rp = s_rows[3];
    kvc_i64* const s_vlen = s_rows[4];
#endif
    __shared__ kvc_i64 scratch[kvc::kScanScratch];
    // Block-uniform walk state (thread 0 writes it): [0..3] as kvc_vt_ranges, [4] the entries of the rows before
    // the tile, [5] the tile's first row; [6, 7] the next [4, 5] when the walk moves to a row (KVC_VT_REBASE).
    volatile __shared__ kvc_i64 s_walk[8];  // volatile: re-read where needed, never held in registers
    // Warp-private: [0, 1] the warp's entries [lo, hi) in the tile (written by lane 0, re-read every step so they
    // need no registers through it); [2] the slot and [3 + c] context c's slot_hash of the warp's previous step's
    // last entry (lane 0 writes and reads them); with kVtLead, [3 + KVC_CONTEXTS] 1 when entry lo is the warp's lead.
    constexpr int kLeadAt = 3 + KVC_CONTEXTS;
    __shared__ kvc_i64 s_warp[kvc::kVtWarps][kLeadAt + (kvc::kVtLead ? 1 : 0)];

    const KvcTableParams& t = p.table;
    const KvcBatchParams& b = p.batch;
    const int nctx = (int)p.num_contexts;
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
    kvc_grid_dependency<KVC_VT_PDL != 0>();
    // With one tile of rows its scan gives the batch total; with more, a first walk over every row does.
    const bool one_tile = b.bs <= kvc::kVtTile;
    if (!one_tile) {
        kvc_i64 len_sum = 0;
        for (kvc_i64 r = tid; r < b.bs; r += KVC_VT_THREADS) {
            len_sum += kvc_row_verify_len(t, b, b.req_pool_indices[r], b.prefix_lens[r]);
        }
        kvc_i64 total;
        kvc_block_exclusive_sum(len_sum, scratch, total);
        if (tid == 0) kvc_vt_ranges(total, s_walk);  // read after the barrier below
    }
    if (tid == 0) {
        s_walk[4] = s_walk[5] = 0;
        if (b.bs == 0) kvc_vt_ranges(0, s_walk);  // no tile sets them
    }

    for (;;) {
        __syncthreads();  // the walk state; and the previous tile's shared rows are read until here
        if (s_walk[5] >= b.bs || (s_walk[5] > 0 && s_walk[4] >= s_walk[2])) break;  // no rows or entries left
        const kvc_i64 r = s_walk[5] + tid;
        kvc_i64 len = 0, ws = 0, row_cell = 0;
        if (r < b.bs) {
            const kvc_i64 rp = b.req_pool_indices[r], prefix = b.prefix_lens[r];
            len = kvc_row_verify_len(t, b, rp, prefix);
            ws = kvc_window_start(prefix, b.swa_window_size);
            // Used only for a row with entries (a valid rp); unsigned, so an invalid rp cannot overflow (UB).
            row_cell = (kvc_i64)((kvc_u64)rp * (kvc_u64)t.cols);
#if KVC_CHECK_TOKEN
            // i == tid, from the volatile walk state: the compiler then computes these shared addresses here
            // rather than keeping one through the entry loop (some specializations spilled it).
            const int i = (int)(r - s_walk[5]);
            s_rp[i] = rp;
            s_vlen[i] = b.valid_lens[r];
#endif
        }
        // Rows past bs have no entries, so their offsets equal the tile total and no search selects them.
        // (In the flat32 modules a tile's sums fit an int: scanned in 32 bits, half the shuffles.)
        kvc_vt_idx tile_sum;
        const kvc_vt_idx off =
            kvc_block_exclusive_sum((kvc_vt_idx)len, reinterpret_cast<kvc_vt_idx*>(scratch), tile_sum);
        const kvc_i64 tile_total = tile_sum;
        s_off[tid] = off;
        if (r < b.bs) {
            const int i = (int)(r - s_walk[5]);  // == tid, as above
            s_pos0[i] = (kvc_vt_idx)(ws - off);
            const kvc_i64 cell0 = row_cell + (kvc_vt_paged(t) ? 0 : ws - off);
            // flat32: the address (unsigned arithmetic: an unused row's may point anywhere).
            s_cell0[i] = KVC_FLAT32 ? (kvc_i64)((kvc_u64)t.table + (kvc_u64)cell0 * sizeof(int)) : cell0;
        }
        if (tid == 0) {
            s_off[kvc::kVtTile] = (kvc_vt_idx)tile_total;
            if (one_tile) kvc_vt_ranges(tile_total, s_walk);
        }
        __syncthreads();
        // This warp's entries in the tile, tile-local (an entry's index minus carry): [lo, hi).
        volatile kvc_i64* const wr = s_warp[warp];
        if (lane == 0) {
            const kvc_i64 carry = s_walk[4];
            if (kvc::kVtCarry) {
                const kvc_i64 per = s_walk[0], wstart = kvc_min64(s_walk[1] + warp * per, s_walk[2]);
                wr[0] = kvc_max64(wstart - carry, 0);
                wr[1] = kvc_min64(kvc_min64(wstart + per, s_walk[2]) - carry, tile_total);
                if (kvc::kVtLead) {  // the lead, entry wstart - 1, when ranges have one (an odd per, kvc_vt_ranges)
                    // and it is in this tile and so is the range
                    const bool lead = (per & 1) != 0 && wstart - carry >= 1 && wr[0] < wr[1];
                    if (lead) wr[0] = wr[0] - 1;
                    wr[kLeadAt] = lead ? 1 : 0;
                }
            } else {
                // The first of this warp's steps g + k * G that ends past `carry`; it may have begun in the previous
                // tile (a negative tile-local start: its entries below 0 are inactive here).
                const kvc_i64 warps = (kvc_i64)gridDim.x * kvc::kVtWarps;
                const kvc_i64 g = (kvc_i64)blockIdx.x * kvc::kVtWarps + warp, first = carry / kvc::kVtWarpStep;
                const kvc_i64 k = first > g ? (first - g + warps - 1) / warps : 0;
                wr[0] = (g + k * warps) * kvc::kVtWarpStep - carry;
                wr[1] = tile_total;
            }
            // The flat32 step loop reads them as ints: a warp whose entries lie wholly before or after this tile
            // (batch-wide offsets can pass 2**31) gets an empty range inside [-step, tile_total], which fits.
            if (KVC_FLAT32) {
                wr[0] = kvc_min64(wr[0], tile_total);
                wr[1] = kvc_max64(wr[1], 0);
            }
        }
        // KVC_VT_REBASE: the block's first entry e (tile-local) lies past this tile's first row and its range ends past
        // the tile: the tile is walked again from e's row, with no entries taken here. The thread of that row (past
        // row 0, so the walk moves forward) leaves the new walk state in s_walk[6, 7]; thread 0 moves it in below.
        bool rebase = false;
        if (kvc::kVtCarry && KVC_VT_REBASE && !one_tile) {
            const kvc_i64 e = s_walk[1] - s_walk[4];  // block-uniform, as every operand here but the row's own
            rebase = e >= (kvc_i64)s_off[1] && e < tile_total && s_walk[2] - s_walk[4] > tile_total;
            if (rebase && r < b.bs && (kvc_i64)off <= e && e < (kvc_i64)off + len) {
                s_walk[6] = s_walk[4] + off;
                s_walk[7] = r;
            }
        }
        __syncthreads();  // every thread has read the walk state (and lane 0 has written wr[0], wr[1])
        if (rebase) {  // block-uniform
            if (tid == 0) {
                s_walk[4] = s_walk[6];
                s_walk[5] = s_walk[7];
            }
            continue;
        }
        if (tid == 0) {
            s_walk[4] = s_walk[4] + tile_total;
            s_walk[5] = s_walk[5] + kvc::kVtTile;
        }
        // This thread's last row in the tile (its entries only move forward). With per-warp ranges, first the row of
        // the warp's first entry in the tile, found by the whole warp at once (two votes) rather than by each lane
        // galloping from row 0 (A NONE 2-4 % faster in a graph). Not with grid-strided steps (real KV): there it
        // made D and A contiguous PARTIAL 1-2.5 % slower (docs/BENCHMARKS.md, 2026-12-04).
        int hint = 0;
        if (kvc::kVtCarry) {
            const kvc_i64 e0 = kvc_max64(wr[0], 0);  // warp-uniform (>= 0 already: a clamp the compiler cannot see)
            if (e0 < wr[1]) hint = kvc_vt_warp_find_row<kvc_vt_idx>(s_off, (kvc_vt_idx)e0);
        }
        // A step: lane l takes entries base + u * 32 + l. An entry's predecessor e - 1 is lane l - 1's, lane 0's
        // is lane 31's of u - 1 or, with per-warp ranges, of the warp's previous step (kept in s_warp), so only
        // the warp's first entry in the tile (with grid-strided steps: in the step) and the rows' first entries
        // look their predecessor up.
        const kvc_vt_idx advance =
            kvc::kVtCarry ? kvc::kVtWarpStep : (kvc_vt_idx)gridDim.x * kvc::kVtWarps * kvc::kVtWarpStep;
        for (kvc_vt_idx base = (kvc_vt_idx)wr[0];; base += advance) {  // warp-uniform
            // The warp's row of s_warp, addressed from threadIdx afresh (cheaper than a register kept through the
            // step, which some specializations spilled).
            volatile kvc_i64* const ws = s_warp[threadIdx.x >> 5];
            const kvc_vt_idx lo = (kvc_vt_idx)ws[0], hi = (kvc_vt_idx)ws[1];
            if (base >= hi) break;
            KvcVtEntries en;
#if KVC_VT_STEP_IN_ROW
            // The step inside one row (warp-uniform): after a step of this tile (base > lo), lane 31's row r0 is the
            // row of entry base - 1, so the row began before this step and every entry's predecessor is lane - 1's
            // (lane 0's the previous step's last); the step is fast when that row and the warp's range both hold it.
            // (A warp's first step taken so too when it starts at its lead was timed slower at A and B and removed:
            // KVC_VT_LEAD_IN_ROW, docs/BENCHMARKS.md, 2026-12-07 05:51.)
            bool in_row = false;
            int r0 = 0;
            if (kvc::kVtCarry && !kvc_vt_paged(t)) {
                const kvc_vt_idx last = base + (kvc::kVtWarpStep - 1);
                r0 = __shfl_sync(kvc::kFullMask, hint, kvc::kWarpSize - 1);
                in_row = base > lo && last < s_off[r0 + 1] && last < hi;
            }
#else
            constexpr bool in_row = false;
            constexpr int r0 = 0;
#endif
            // With kVtEarlyLoads: first every entry's row and table cells (its own and, when it looks its
            // predecessor up, the one before), then all the step's table loads back to back, then their values, so
            // the loads' latencies overlap. Otherwise a looked-up predecessor's table value is loaded and used in
            // place, and so is a block table's entry.
            KvcTableCell cell[kvc::kVtUnroll], prev_cell[kvc::kVtUnroll];
            bool look[kvc::kVtUnroll];  // looks its predecessor up in the table (not lane - 1's, not a chain head)
            // Without kVtEarlyLoads and with a per-position table: each entry's table int, loaded in the row loop
            // and turned into its slot after it, so that the step's table loads are in flight together.
            int raw[kvc::kVtUnroll];
            bool lead = false;  // entry 0 (u = 0) of lane 0 is the warp's lead (kVtLead)
            if (in_row) {
                const kvc_vt_idx pos0 = s_pos0[r0];
                const kvc_i64 cell0 = s_cell0[r0];
#pragma unroll
                for (int u = 0; u < kvc::kVtUnroll; ++u) {
                    const kvc_vt_idx el = base + (kvc_vt_idx)(u * kvc::kWarpSize + lane);
                    en.act[u] = en.nb[u] = true;
                    en.pos[u] = el + pos0;
                    en.prev[u] = 0;
                    en.exp_tok[u] = kvc::NO_SLOT;
                    raw[u] = kvc_vt_raw(t, cell0, el);
#if KVC_CHECK_TOKEN
                    en.exp_tok[u] = kvc_vt_expected_token(b, s_rp[r0], s_vlen[r0], en.pos[u]);
#endif
                }
                hint = r0;
#if KVC_VT_IN_ROW_SPLIT
                kvc_vt_step_rest<true>(p, t, nctx, lane, ws, en, raw, cell, prev_cell, look, lead);
#endif
            } else {
                // Entry lo on lane 0 is the lead in the warp's first step of the tile when the tile holds it.
                if (kvc::kVtLead) lead = base == lo && lane == 0 && ws[kLeadAt] != 0;
#pragma unroll
                for (int u = 0; u < kvc::kVtUnroll; ++u) {
                    const kvc_vt_idx el = base + (kvc_vt_idx)(u * kvc::kWarpSize + lane);
                    en.act[u] = (kvc::kVtCarry || el >= 0) && el < hi;
                    en.nb[u] = false;
                    en.slot[u] = kvc::TOKEN_TO_KV_SLOT_PADDING;
                    en.prev[u] = en.pos[u] = 0;
                    en.exp_tok[u] = kvc::NO_SLOT;
                    if (kvc::kVtEarlyLoads) {
                        look[u] = false;
                        cell[u].at = prev_cell[u].at = t.table;
                        cell[u].rem = prev_cell[u].rem = 0;
                    }
                    if (en.act[u]) {
                        const int row = kvc_find_row<int>(s_off, kvc::kVtTile, el, hint);
                        hint = row;
                        const kvc_vt_idx first = s_off[row], pos = el + s_pos0[row];
                        const kvc_i64 cell0 = s_cell0[row];
                        en.pos[u] = pos;
                        if (!kvc::kVtEarlyLoads) {
                            if (kvc_vt_paged(t)) en.slot[u] = kvc_vt_slot_of(t, kvc_vt_rt(t, cell0, el, pos));
                            else raw[u] = kvc_vt_raw(t, cell0, el);
                        }
                        // Entry el - 1 (this warp's: in [lo, el) with per-warp ranges, in this step otherwise) is this
                        // entry's predecessor unless el starts the row's entries. A window's first entry keeps its real
                        // predecessor (windows do not restart the chain); position 0 is a chain head.
                        en.nb[u] = el > first && (kvc::kVtCarry ? el > lo : u > 0 || lane > 0);
                        if (kvc::kVtEarlyLoads) {
                            cell[u] = kvc_vt_cell(t, cell0, el, pos);
                            look[u] = !en.nb[u] && pos > 0;
                            if (look[u]) prev_cell[u] = kvc_table_prev_cell(t, cell[u]);
                            if (!en.nb[u] && pos == 0) en.prev[u] = kvc::NO_SLOT;
                        } else if (!en.nb[u] && !(kvc::kVtLead && u == 0 && lead)) {  // the lead's: unused, 0
                            en.prev[u] = pos > 0 ? kvc_vt_slot_of(t, kvc_vt_rt(t, cell0, el - 1, pos - 1))
                                                 : (kvc_vt_slot)kvc::NO_SLOT;
                        }
#if KVC_CHECK_TOKEN
                        en.exp_tok[u] = kvc_vt_expected_token(b, s_rp[row], s_vlen[row], pos);
#endif
                    }
                }
#if KVC_VT_IN_ROW_SPLIT
                kvc_vt_step_rest<false>(p, t, nctx, lane, ws, en, raw, cell, prev_cell, look, lead);
#endif
            }
#if !KVC_VT_IN_ROW_SPLIT
            kvc_vt_step_rest<false>(p, t, nctx, lane, ws, en, raw, cell, prev_cell, look, lead);  // both kinds
#endif
        }
    }

    if (blockIdx.x == 0) {  // block 0 counts the invalid rows and adds the counters
        kvc_i64 invalid = 0;
        for (kvc_i64 r = tid; r < b.bs; r += KVC_VT_THREADS)
            invalid += kvc_row_valid(b.req_pool_indices[r], b.prefix_lens[r], t.max_reqs, t.max_seq_len, t.pad_row)
                           ? 0 : 1;
        kvc_i64 invalid_total;
        kvc_block_exclusive_sum(invalid, scratch, invalid_total);
        if (tid == 0) {
#pragma unroll
            for (int c = 0; c < KVC_CONTEXTS; ++c) {
                if (c < nctx) {
                    kvc_counter_add(p.ctx[c].kernel_run_counter, 1);
                    if (s_walk[3] > 0) kvc_counter_add(p.ctx[c].slot_run_counter, s_walk[3]);
                }
            }
            if (b.invalid_rows != nullptr) *b.invalid_rows = (int)invalid_total;
            if (p.invalid_rows_total != nullptr && invalid_total != 0)
                atomicAdd(reinterpret_cast<unsigned long long*>(p.invalid_rows_total),
                          (unsigned long long)invalid_total);
        }
    }
}
