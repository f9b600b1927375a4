"""CPU reference benchmark: sizes that should stay well under a second on a 2-core machine.

    python bench/bench_reference.py [--runs N]

Prints one table row per case: median and min wall time of N runs (after one warm-up run) of the public op on
CPU tensors, and the time per entry. Every case's result is checked once (a clean canary reports nothing),
so the numbers are for real work, not a short-circuit.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import kvcanary as kc
from kvcanary import consts
from kvcanary.ops.interop import view
from kvcanary.ops.launches import RealKvSourceView
from kvcanary.ops.reference import hashing
from kvcanary.ops.reference.realkv import fingerprint


def t64(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.int64))


def chained_buffer(num_reqs: int, length: int, seed: int = 0):
    """A canary buffer holding ``num_reqs`` clean chains of ``length`` tokens at random slots.

    Returns (canary_buf, req_to_token int32 [num_reqs + 1, length], tokens int64 [num_reqs, length]); row 0 of
    req_to_token is the padding row. Built vectorized across requests, serially along positions (SPEC §3).
    """
    rng = np.random.default_rng(seed)
    n = num_reqs * length
    slots = (rng.permutation(n) + 1).reshape(num_reqs, length)
    tokens = rng.integers(0, 150_000, size=(num_reqs, length), dtype=np.int64)
    buf = kc.allocate_canary_buffer(n + 1)
    recs = buf.numpy().view(np.int64)
    h = np.full(num_reqs, hashing.ANCHOR_HASH, dtype=np.uint64)
    pos = np.zeros(num_reqs, dtype=np.int64)
    for p in range(length):
        s = slots[:, p]
        pos[:] = p
        recs[s, consts.FIELD_TOKEN] = tokens[:, p]
        recs[s, consts.FIELD_POSITION] = p
        recs[s, consts.FIELD_PREV_HASH] = h.view(np.int64)
        h = hashing.mix3(h, tokens[:, p], pos)
    r2t = np.zeros((num_reqs + 1, length), dtype=np.int32)
    r2t[1:] = slots
    return buf, torch.from_numpy(r2t), tokens


def timed(fn, runs: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def plan_args(r2t: torch.Tensor, num_reqs: int, length: int, vp, wp, pool=None):
    return dict(
        verify_plan_out=vp, write_plan_out=wp, req_pool_indices=t64(np.arange(1, num_reqs + 1)),
        prefix_lens=t64(np.full(num_reqs, length)), extend_seq_lens=t64(np.ones(num_reqs)), req_to_token=r2t,
        swa_window_size=0, full_to_swa_index_mapping=None, verify_capacity=vp.capacity,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=None if pool is None else t64(np.full(num_reqs, length)),
        kv_token_id_vs_position_offset=0,
    )


def bench_plan(runs: int, num_reqs: int = 256, length: int = 4096, with_pool: bool = False):
    r2t = torch.randint(1, 2**30, (num_reqs + 1, length), dtype=torch.int32)
    pool = None
    if with_pool:
        pool = torch.randint(0, 150_000, (num_reqs + 1, length), dtype=torch.int32)
    vp = kc.VerifyPlan.allocate(verify_capacity=num_reqs * length)
    wp = kc.WritePlan.allocate(write_req_capacity=num_reqs)
    args = plan_args(r2t, num_reqs, length, vp, wp, pool)
    times = timed(lambda: kc.launch_canary_plan_kernels(**args), runs)
    assert int(vp.enable[0]) == 1 and int(vp.verify_num_valid[0]) == num_reqs * length
    assert vp.verify_slot_indices[length + 5].item() == r2t[2, 5].item()
    return times, num_reqs * length


def bench_verify(runs: int, num_reqs: int = 250, length: int = 4000, mode: int = 0):
    buf, r2t, tokens = chained_buffer(num_reqs, length)
    sources = ()
    if mode:
        kv = torch.randint(0, 256, (buf.shape[0], 64), dtype=torch.uint8)
        sources = (kc.RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=64, read_bytes=64),)
        # Stamp the fingerprints so the check is clean (the write op would do this).
        src = sources[0]
        sv = RealKvSourceView(tensor=view("kv", kv), page_size=1, num_bytes_per_token=64, read_bytes=64,
                              row_bytes=src.row_bytes, row_stride_bytes=src.row_stride_bytes, num_rows=kv.shape[0])
        buf.numpy().view(np.int64)[:, 3] = fingerprint((sv,), mode, np.arange(buf.shape[0])).view(np.int64)
    n = num_reqs * length
    vp = kc.VerifyPlan.allocate(verify_capacity=n)
    wp = kc.WritePlan.allocate(write_req_capacity=num_reqs)
    pool = torch.zeros((num_reqs + 1, length), dtype=torch.int32)
    pool[1:] = torch.from_numpy(tokens.astype(np.int32))
    kc.launch_canary_plan_kernels(**plan_args(r2t, num_reqs, length, vp, wp, pool))
    log = kc.ViolationLog.allocate(ring_capacity=16)
    ctx = log.context(canary_buf=buf, kernel_kind=kc.CanaryLaunchTag.HEAD_K_FULL, real_kv_sources=sources,
                      real_kv_hash_mode=mode)
    times = timed(lambda: kc.launch_canary_verify_kernel(context=ctx, plan=vp, check_verify_expected_token=True), runs)
    assert int(log.violation_write_index[0]) == 0, "the benchmark chain must verify clean"
    assert int(log.slot_run_counter[0]) == n * (runs + 1)
    return times, n


def bench_write(runs: int, length: int = 32_768, mode: int = 0):
    num_slots = length + 1
    buf = kc.allocate_canary_buffer(num_slots)
    sources = ()
    if mode:
        kv = torch.randint(0, 256, (num_slots, 64), dtype=torch.uint8)
        sources = (kc.RealKvSource(tensor=kv, page_size=1, num_bytes_per_token=64, read_bytes=64),)
    log = kc.ViolationLog.allocate(ring_capacity=16)
    ctx = log.context(canary_buf=buf, kernel_kind=kc.CanaryLaunchTag.TAIL_K_FULL, real_kv_sources=sources,
                      real_kv_hash_mode=mode, enable_chain_position_assert=kc.allocate_chain_position_flag(1))
    wp = kc.WritePlan.allocate(write_req_capacity=1)
    wp.write_offsets.copy_(t64([0, length]))
    wp.write_num_valid_reqs[0] = 1
    rng = np.random.default_rng(2)
    ids = t64(rng.integers(0, 150_000, length))
    pos = t64(np.arange(length))
    loc = t64(rng.permutation(length) + 1)

    def run():
        kc.launch_canary_write_kernel(context=ctx, plan=wp, input_ids=ids, positions=pos, out_cache_loc=loc,
                                      enable_write_input_assert=False, expected_input_tokens=None,
                                      expected_input_positions=None)

    times = timed(run, runs)
    assert int(log.violation_write_index[0]) == 0
    assert buf.numpy().view(np.int64)[int(loc[-1]), 1] == length - 1
    return times, length


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    cases = [
        ("verify 1,000,000 entries (real-KV NONE)", lambda: bench_verify(args.runs)),
        ("verify 1,000,000 entries (real-KV ALL, 64 B)", lambda: bench_verify(args.runs, mode=2)),
        ("plan 256 req x 4096 pos", lambda: bench_plan(args.runs)),
        ("plan 256 req x 4096 pos + token gather", lambda: bench_plan(args.runs, with_pool=True)),
        ("write 32,768-token chain (real-KV NONE)", lambda: bench_write(args.runs)),
        ("write 32,768-token chain (real-KV ALL, 64 B)", lambda: bench_write(args.runs, mode=2)),
    ]
    print(f"kvcanary {kc.__version__} CPU reference; numpy {np.__version__}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; median of {args.runs} runs")
    print(f"| {'case':<46} | {'entries':>9} | {'median ms':>9} | {'min ms':>8} | {'ns/entry':>8} |")
    print(f"|{'-' * 48}|{'-' * 11}|{'-' * 11}|{'-' * 10}|{'-' * 10}|")
    for name, fn in cases:
        times, n = fn()
        med = statistics.median(times)
        print(f"| {name:<46} | {n:>9,} | {med * 1e3:>9.1f} | {min(times) * 1e3:>8.1f} | {med * 1e9 / n:>8.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
