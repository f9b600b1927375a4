// A host emulation of the small part of CUDA kvcanary's kernels use, to run the real kernel sources on the CPU
// (tests/ops/test_kernels_emulated.py). Every CUDA thread of a block is an OS thread; blocks run one after the
// other. __syncthreads / __syncthreads_or / __syncthreads_and are block barriers and every warp-collective
// intrinsic (shuffles, ballot, match) is a barrier of the warp's 32 threads: a barrier or collective that not
// every thread reaches deadlocks here (the test's timeout reports it) instead of passing by luck. __shared__
// variables are function statics (one block at a time, so one copy per block). Only full-mask collectives are
// supported, which is all the kernels use.
#pragma once

#include <atomic>
#include <barrier>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#define __CUDACC__ 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static

struct uint3 {
    unsigned x, y, z;
};
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline uint3 blockDim, gridDim;

struct alignas(16) longlong2 {
    long long x, y;
};
struct alignas(16) ulonglong2 {
    unsigned long long x, y;
};

template <class T>
inline T __ldg(const T* p) {
    return *p;
}
// Relaxed, as on the GPU (and so that ThreadSanitizer sees no synchronization the GPU would not give).
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }

struct EmuWarp {
    std::barrier<>* bar;
    unsigned long long buf[32];
};
struct EmuBlock {
    std::barrier<>* bar;
    std::atomic<int> or_acc{0};
    EmuWarp warps[32];
};
inline EmuBlock* g_emu_block;

inline int emu_lane() { return (int)(threadIdx.x & 31); }
inline EmuWarp& emu_warp() { return g_emu_block->warps[threadIdx.x >> 5]; }

inline void __syncthreads() { g_emu_block->bar->arrive_and_wait(); }
inline int __syncthreads_or(int pred) {
    if (pred) g_emu_block->or_acc.fetch_or(1);
    __syncthreads();
    const int r = g_emu_block->or_acc.load();
    __syncthreads();
    if (threadIdx.x == 0) g_emu_block->or_acc.store(0);
    __syncthreads();
    return r;
}
inline int __syncthreads_and(int pred) { return !__syncthreads_or(!pred); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp().bar->arrive_and_wait(); }

template <class T>
inline unsigned long long emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "64-bit at most");
    unsigned long long u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T>
inline T emu_from_bits(unsigned long long u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}
// Every lane publishes a value, then reads lane `src`'s.
inline unsigned long long emu_exchange(unsigned long long mine, int src) {
    EmuWarp& w = emu_warp();
    w.buf[emu_lane()] = mine;
    w.bar->arrive_and_wait();
    const unsigned long long r = w.buf[src & 31];
    w.bar->arrive_and_wait();
    return r;
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
    return emu_from_bits<T>(emu_exchange(emu_bits(v), src));
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    const int lane = emu_lane();
    const unsigned long long r = emu_exchange(emu_bits(v), lane >= (int)d ? lane - (int)d : lane);
    return emu_from_bits<T>(r);
}
inline unsigned __ballot_sync(unsigned, int pred) {
    EmuWarp& w = emu_warp();
    w.buf[emu_lane()] = pred != 0;
    w.bar->arrive_and_wait();
    unsigned r = 0;
    for (int l = 0; l < 32; ++l) r |= (unsigned)(w.buf[l] != 0) << l;
    w.bar->arrive_and_wait();
    return r;
}

inline unsigned __reduce_add_sync(unsigned, unsigned v) {
    EmuWarp& w = emu_warp();
    w.buf[emu_lane()] = v;
    w.bar->arrive_and_wait();
    unsigned r = 0;
    for (int l = 0; l < 32; ++l) r += (unsigned)w.buf[l];
    w.bar->arrive_and_wait();
    return r;
}

// Every lane of the warp takes part (a full mask), as in the kernels.
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, !pred) == 0; }
inline unsigned __match_any_sync(unsigned, unsigned long long key) {
    EmuWarp& w = emu_warp();
    w.buf[emu_lane()] = key;
    w.bar->arrive_and_wait();
    unsigned r = 0;
    for (int l = 0; l < 32; ++l) r |= (unsigned)(w.buf[l] == key) << l;
    w.bar->arrive_and_wait();
    return r;
}

// Run kernel k over `grid` blocks of `block` threads with the parameter struct at `params`.
template <class P>
inline void emu_run(void (*k)(const P), int grid, int block, const void* params) {
    P p;
    std::memcpy(&p, params, sizeof(P));
    gridDim = {(unsigned)grid, 1, 1};
    blockDim = {(unsigned)block, 1, 1};
    for (int b = 0; b < grid; ++b) {
        std::barrier<> bar(block);
        std::vector<std::barrier<>*> wbars;
        EmuBlock blk;
        blk.bar = &bar;
        for (int w = 0; w < block / 32; ++w) {
            wbars.push_back(new std::barrier<>(32));
            blk.warps[w].bar = wbars.back();
        }
        g_emu_block = &blk;
        std::vector<std::thread> ts;
        ts.reserve(block);
        for (int t = 0; t < block; ++t)
            ts.emplace_back([&, t, b] {
                threadIdx = {(unsigned)t, 0, 0};
                blockIdx = {(unsigned)b, 0, 0};
                k(p);
            });
        for (auto& th : ts) th.join();
        for (auto* wb : wbars) delete wb;
    }
}
