// kvcanary write kernel (SPEC §6). CPU twin: kvcanary/ops/reference/write.py; launcher: kvcanary/ops/cuda/write.py.
//
// Specializations: KVC_INPUT_ASSERT (check tokens/positions against the expected arrays),
// KVC_HAS_REAL_KV (fingerprint real KV; 0 = NONE mode or no sources, the fingerprint is 0). One parameter:
// KvcWriteParams (one context, up to four real-KV sources by value: SGLang's ABI).
//
// The machinery is write_core.cuh's (see its header for the design and the bounds rules), with one context:
//  * pass 1: one warp per short / empty / bad request (warps stride over the requests of the plan);
//  * pass 2: one block per long request (chain walker + kvc::kWriteWorkers workers, tiles of kvc::kWriteTile).
// Every warp reads the same 32 request ranges and ballots, so the list of long requests (and so every
// barrier of pass 2) is uniform across the block. The ranges of the first 32 candidates are read before
// pass 1, so their loads overlap it.

#include "write_core.cuh"

#ifndef KVC_INPUT_ASSERT
#error "KVC_INPUT_ASSERT must be defined (0 or 1)"
#endif
#ifndef KVC_HAS_REAL_KV
#error "KVC_HAS_REAL_KV must be defined (0 or 1)"
#endif

// Launch geometry (the launcher reads these defines): one chain warp + the workers, one token per
// worker per tile.
#define KVC_WRITE_THREADS 288
namespace kvc {
constexpr int kWriteWorkers = 256;  // one token per worker per tile
constexpr int kWriteTile = kWriteWorkers;
constexpr int kWriteWarps = KVC_WRITE_THREADS / kWarpSize;
static_assert(KVC_WRITE_THREADS == kWriteWorkerBase + kWriteWorkers, "one chain warp plus the workers");
static_assert(kWriteWarps * kWarpSize == KVC_WRITE_THREADS, "whole warps");
}  // namespace kvc
// Grid: this many blocks per SM, capped by the request capacity (also the register budget: 3 x 288 threads
// leave 75 registers, which the four specializations need to stay spill-free).
#define KVC_WRITE_BLOCKS_PER_SM 3

// The one context of an SGLang-named write launch.
struct KvcWriteOneContext {
    static constexpr bool kRealKv = KVC_HAS_REAL_KV != 0;
    const KvcWriteParams& p;
    __device__ __forceinline__ int count() const { return 1; }
    __device__ __forceinline__ const KvcContextParams& ctx(int) const { return p.ctx; }
    __device__ __forceinline__ kvc_u64 fingerprint(int, kvc_i64 slot) const { return kvc_fingerprint4(p.rkv, slot); }
};

extern "C" __global__ void __launch_bounds__(KVC_WRITE_THREADS, KVC_WRITE_BLOCKS_PER_SM) kvc_write(const __grid_constant__ KvcWriteParams p) {
    __shared__ KvcWriteSmem<1, kvc::kWriteTile> sm;
    const KvcWriteOneContext cx{p};
    const KvcTokenParams& tk = p.tokens;
    const int tid = (int)threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;

    if (blockIdx.x == 0 && tid == 0) kvc_counter_add(p.ctx.kernel_run_counter, 1);
    const kvc_i64 n_req = kvc_max64(0, kvc_min64((kvc_i64)*p.num_valid_reqs, p.write_req_capacity));
    const bool position_assert[1] = {kvc_position_assert(p.ctx)};
    kvc_i64 stamped[1] = {0};  // per thread, summed per warp at the end

    // Candidates of pass 2's first round: request c0 + lane * gridDim.x for c0 = blockIdx.x.
    const kvc_i64 first_rl = (kvc_i64)blockIdx.x + (kvc_i64)lane * gridDim.x;
    const bool first_long =
        first_rl < n_req && kvc_write_is_long(p.write_offsets[first_rl], p.write_offsets[first_rl + 1], tk.num_tokens);

    // ---- Pass 1: one warp per short / empty / bad request (warps stride over the requests).
    const kvc_i64 warp_stride = (kvc_i64)gridDim.x * kvc::kWriteWarps;
    for (kvc_i64 r = (kvc_i64)blockIdx.x * kvc::kWriteWarps + warp; r < n_req; r += warp_stride) {
        // The seed is loaded with the range (r < n_req <= capacity), one latency instead of two.
        const kvc_i64 start = p.write_offsets[r], end = p.write_offsets[r + 1], seed = p.seed_slot_indices[r];
        if (kvc_write_is_long(start, end, tk.num_tokens)) continue;
        kvc_write_warp_request<1, KVC_INPUT_ASSERT != 0>(cx, tk, start, end, seed, position_assert, stamped);
    }

    // ---- Pass 2: one block per long request.
    for (kvc_i64 c0 = blockIdx.x; c0 < n_req; c0 += 32 * (kvc_i64)gridDim.x) {
        const kvc_i64 rl = c0 + (kvc_i64)lane * gridDim.x;
        unsigned int todo = __ballot_sync(
            kvc::kFullMask, c0 == (kvc_i64)blockIdx.x
                               ? first_long
                               : rl < n_req && kvc_write_is_long(p.write_offsets[rl], p.write_offsets[rl + 1],
                                                                 tk.num_tokens));
        while (todo != 0) {
            // Re-read (cache hits) rather than keep every lane's range in registers through the tiles.
            const kvc_i64 r = c0 + (kvc_i64)(__ffs(todo) - 1) * gridDim.x;
            todo &= todo - 1;
            kvc_write_block_request<1, kvc::kWriteTile, KVC_INPUT_ASSERT != 0>(
                cx, tk, p.write_offsets[r], p.write_offsets[r + 1], p.seed_slot_indices[r], position_assert, stamped,
                sm);
        }
    }

    kvc_write_count_stamps<1>(cx, stamped);
}
