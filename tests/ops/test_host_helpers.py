"""The pure ``__host__ __device__`` helpers of ``kernels_cu/common.cuh``, compiled for the CPU and checked.

A small C++ harness (generated into a temporary folder) includes ``common.cuh`` with ``__host__``,
``__device__`` and ``__forceinline__`` defined empty (``__CUDACC__`` is not defined, so the device-only half
is left out), is compiled with the host compiler under ``-Wall -Wextra -Werror``, and answers one query per
input line. Its answers are compared with the Python reference on SPEC's known answers and on random
inputs:

* hashes: ``kvc_splitmix64``, ``kvc_mix3``, ``kvc_anchor_hash``, ``kvc_record_hash`` against
  ``kvcanary.consts`` and ``kvcanary.ops.reference.hashing.slot_hash``;
* real-KV: ``kvc_real_kv_offset``, ``kvc_fold16`` and ``kvc_fold``, composed as the kernels compose them (one
  16-byte load at a time, then the fold over sources), against ``kvcanary.ops.reference.realkv.fingerprint`` on
  random pools with random page sizes, token widths, read sizes, row strides and 1..4 sources;
* plan arithmetic and bounds decisions (``kvc_plan_row_valid/active``, ``kvc_window_start``,
  ``kvc_verify_len``, ``kvc_write_len``, ``kvc_has_seed``, ``kvc_translate``, ``kvc_expected_token_ok``)
  against what ``kvcanary.ops.reference.plan`` writes for random batches;
* ``kvc_verify_out_of_range`` (with and without a real-KV coverage limit) and ``kvc_write_range_bad`` against
  the ``SLOT_OUT_OF_RANGE`` rows of the reference verify and write; ``kvc_ring_index_ok``, ``kvc_max64``,
  ``kvc_min64`` against SPEC §4 / Python;
* the row rules with ``pad_row`` (``kvc_row_valid/active``) and the paged ``RT()`` (``kvc_divmod``,
  ``kvc_rt_paged``) against ``kvcanary.ops.reference.table``; the records' per-entry decisions
  (``kvc_record_slot_status``, ``kvc_copy_status``) against the reference gather and copy.

``kvc_source_hash`` and ``kvc_fingerprint`` themselves are device-only (they load through ``__ldg``); their
composition is covered by the GPU differential tests. Skipped only when no C++ compiler is found (a failure
under CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import kvcanary
from kvcanary import consts
from kvcanary.consts import FailReason, RealKvHashMode
from kvcanary.ops.reference import hashing, realkv
from kvcanary.ops.reference.plan import translate as ref_translate
from kvcanary.ops.structs import RealKvSource, VerifyPlan, ViolationLog, WritePlan, allocate_canary_buffer
from kvcanary.ops.validation import context_views

KERNELS = Path(__file__).resolve().parents[2] / "kernels_cu"
U64 = (1 << 64) - 1
OOR = int(FailReason.SLOT_OUT_OF_RANGE)

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "common.cuh"

typedef unsigned long long u64;
typedef long long i64;

static std::vector<std::vector<unsigned char>> blobs;

static u64 rd_u() {
    u64 v;
    if (std::scanf("%llu", &v) != 1) { std::fprintf(stderr, "harness: bad input\n"); std::exit(2); }
    return v;
}
static i64 rd_i() { return (i64)rd_u(); }  // inputs are u64 bit patterns

static u64 load_u64_le(const unsigned char* p) {
    u64 v = 0;
    for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
    return v;
}

int main(int argc, char** argv) {
    for (int a = 1; a < argc; ++a) {
        FILE* f = std::fopen(argv[a], "rb");
        if (!f) { std::perror(argv[a]); return 2; }
        std::vector<unsigned char> b;
        unsigned char buf[65536];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) b.insert(b.end(), buf, buf + n);
        std::fclose(f);
        blobs.push_back(b);
    }
    char op[32];
    while (std::scanf("%31s", op) == 1) {
        std::string o(op);
        if (o == "sm") { std::printf("%llu\n", kvc_splitmix64(rd_u())); }
        else if (o == "m3") { u64 a = rd_u(), b = rd_u(), c = rd_u(); std::printf("%llu\n", kvc_mix3(a, b, c)); }
        else if (o == "anchor") { std::printf("%llu\n", kvc_anchor_hash()); }
        else if (o == "rh") { i64 a = rd_i(), b = rd_i(), c = rd_i(); std::printf("%llu\n", kvc_record_hash(a, b, c)); }
        else if (o == "fold") { u64 h = rd_u(), w = rd_u(); std::printf("%llu\n", kvc_fold(h, w)); }
        else if (o == "fold16") { u64 h = rd_u(), a = rd_u(), b = rd_u(); std::printf("%llu\n", kvc_fold16(h, a, b)); }
        else if (o == "off") {
            i64 s = rd_i(), p = rd_i(), b = rd_i(), st = rd_i();
            std::printf("%llu\n", kvc_real_kv_offset(s, p, b, st));
        }
        else if (o == "fp") {  // fp slot nsrc {blob page bpt stride nbytes}*
            i64 slot = rd_i(); i64 nsrc = rd_i();
            u64 acc = 0;
            for (i64 s = 0; s < nsrc; ++s) {
                i64 blob = rd_i(), page = rd_i(), bpt = rd_i(), stride = rd_i(), nbytes = rd_i();
                u64 off = kvc_real_kv_offset(slot, page, bpt, stride);
                const std::vector<unsigned char>& b = blobs[(size_t)blob];
                if (off + (u64)nbytes > b.size()) { std::fprintf(stderr, "harness: read past blob\n"); return 3; }
                u64 h = 0;
                for (i64 k = 0; k < nbytes; k += 16)
                    h = kvc_fold16(h, load_u64_le(&b[off + k]), load_u64_le(&b[off + k + 8]));
                acc = kvc_fold(acc, h);
            }
            std::printf("%llu\n", acc);
        }
        else if (o == "ring") { i64 i = rd_i(), c = rd_i(); std::printf("%d\n", (int)kvc_ring_index_ok(i, c)); }
        else if (o == "max") { i64 a = rd_i(), b = rd_i(); std::printf("%lld\n", kvc_max64(a, b)); }
        else if (o == "min") { i64 a = rd_i(), b = rd_i(); std::printf("%lld\n", kvc_min64(a, b)); }
        else if (o == "row") {  // row rp prefix extend max_reqs max_seq_len window pad_row
            i64 rp = rd_i(), pre = rd_i(), ext = rd_i(), mr = rd_i(), ms = rd_i(), w = rd_i(), pad = rd_i();
            bool valid = kvc_row_valid(rp, pre, mr, ms, pad);
            bool active = kvc_row_active(rp, pre, mr, ms, pad);
            i64 vl = kvc_verify_len(active, pre, w);
            i64 wl = kvc_write_len(active, ext);
            std::printf("%d %d %lld %lld %lld %d\n", (int)valid, (int)active, kvc_window_start(pre, w), vl, wl,
                        (int)kvc_has_seed(active, pre, wl));
        }
        else if (o == "tr") { i64 x = rd_i(), n = rd_i(), v = rd_i(); std::printf("%lld\n", kvc_translate(x, n, v)); }
        else if (o == "eok") { i64 q = rd_i(), v = rd_i(), m = rd_i(); std::printf("%d\n", (int)kvc_expected_token_ok(q, v, m)); }
        else if (o == "voor") {
            i64 s = rd_i(), p = rd_i(), n = rd_i(), lim = rd_i();
            std::printf("%d\n", (int)kvc_verify_out_of_range(s, p, n, lim));
        }
        else if (o == "dm") { i64 a = rd_i(), b = rd_i(), q, r; kvc_divmod(a, b, q, r); std::printf("%lld %lld\n", q, r); }
        else if (o == "rtp") { i64 blk = rd_i(), rem = rd_i(), bsz = rd_i(); std::printf("%lld\n", kvc_rt_paged(blk, rem, bsz)); }
        else if (o == "rst") { i64 s = rd_i(), n = rd_i(); std::printf("%d\n", kvc_record_slot_status(s, n)); }
        else if (o == "cst") { i64 a = rd_i(), b = rd_i(); std::printf("%d\n", kvc_copy_status((int)a, (int)b)); }
        else if (o == "wbad") { i64 s = rd_i(), e = rd_i(), n = rd_i(); std::printf("%d\n", (int)kvc_write_range_bad(s, e, n)); }
        else { std::fprintf(stderr, "harness: unknown op %s\n", op); return 2; }
    }
    return 0;
}
"""


def _find_cxx() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Harness:
    def __init__(self, exe: Path, tmp: Path):
        self.exe, self.tmp = exe, tmp

    def run(self, lines: list[str], blobs: list[bytes] = ()) -> list[str]:
        paths = []
        for i, b in enumerate(blobs):
            p = self.tmp / f"blob{i}.bin"
            p.write_bytes(b)
            paths.append(str(p))
        proc = subprocess.run([str(self.exe), *paths], input="\n".join(lines) + "\n", capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"harness failed ({proc.returncode}): {proc.stderr}"
        out = proc.stdout.splitlines()
        assert len(out) == len(lines), f"harness answered {len(out)} of {len(lines)} queries: {proc.stderr}"
        return out

    def ints(self, lines: list[str], blobs: list[bytes] = ()) -> list[int]:
        return [int(x) for x in self.run(lines, blobs)]


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Harness:
    cxx = _find_cxx()
    if cxx is None:
        if os.environ.get("CI"):
            pytest.fail("no C++ compiler (g++, c++ or clang++) found; CI must compile the host helpers")
        pytest.skip("no C++ compiler (g++, c++ or clang++) found")
    tmp = tmp_path_factory.mktemp("host_helpers")
    src = tmp / "harness.cpp"
    src.write_text(HARNESS)
    exe = tmp / "harness"
    cmd = [cxx, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror",
           "-D__host__=", "-D__device__=", "-D__forceinline__=",
           "-I", str(KERNELS), "-include", str(KERNELS / "consts.cuh"), str(src), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"host compile of common.cuh failed:\n{' '.join(cmd)}\n{proc.stderr}"
    assert not proc.stderr.strip(), f"host compile of common.cuh printed diagnostics:\n{proc.stderr}"
    return Harness(exe, tmp)


def u(x: int) -> int:
    return int(x) & U64


def rand_u64(rng: np.random.Generator, n: int) -> list[int]:
    edge = [0, 1, 2, (1 << 63) - 1, 1 << 63, U64, U64 - 1, consts.CANARY_CHAIN_ANCHOR]
    return edge + [int(v) for v in rng.integers(0, 1 << 64, size=n, dtype=np.uint64)]


def rand_i64(rng: np.random.Generator, n: int) -> list[int]:
    edge = [0, 1, -1, -2, (1 << 63) - 1, -(1 << 63), 4096, -4096]
    small = [int(v) for v in rng.integers(-50, 50, size=n // 2)]
    big = [int(v) for v in rng.integers(-(1 << 63), (1 << 63) - 1, size=n - n // 2, dtype=np.int64)]
    return edge + small + big


# ---------------------------------------------------------------------------------------------------------
# SPEC §3 known answers
# ---------------------------------------------------------------------------------------------------------


def test_known_answers(harness):
    anchor = consts.CANARY_CHAIN_ANCHOR
    out = harness.ints([
        "sm 1", f"sm {anchor}", "anchor", "m3 1 2 3", "sm 0",
    ])
    assert out == [0x5692161D100B05E5, 0xDE7FAE23A9A1B716, 0xDE7FAE23A9A1B716, 0xA55BDF37C08724B5, 0]

    # The chain from the anchor over tokens 11, 12, 13 at positions 0, 1, 2: stored prev_hash of each slot,
    # then the next link; each link is kvc_record_hash of the record just stamped.
    links = [harness.ints(["anchor"])[0]]
    for tok, pos in ((11, 0), (12, 1), (13, 2)):
        links += harness.ints([f"rh {links[-1]} {tok} {pos}"])
    assert links == [0xDE7FAE23A9A1B716, 0x89CD2ABFBEBC0649, 0x13F5BAAFE6EF85D6, 0x86BD2A2B9B320591]
    assert harness.ints([f"m3 {0xDE7FAE23A9A1B716} {u(-1)} 0"]) == [0xE5A9A05404A720CF]

    # Real-KV: the 16 bytes of SPEC §3.1 as two little-endian words.
    data = bytes([0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x81, 0x82, 0x84, 0x88, 0x90, 0xA0, 0xC0, 0xFF])
    w0, w1 = int.from_bytes(data[:8], "little"), int.from_bytes(data[8:], "little")
    (src_hash,) = harness.ints([f"fold16 0 {w0} {w1}"])
    assert src_hash == 0xF036E30B6961C78D
    assert harness.ints([f"fold 0 {src_hash}"]) == [0x6041580849E6407D]
    # ... and through the offset + fold path of the harness (one source, page 1, 16 bytes per token)
    assert harness.ints(["fp 0 1 0 1 16 16 16"], [data]) == [0x6041580849E6407D]


# ---------------------------------------------------------------------------------------------------------
# Hashes on random inputs
# ---------------------------------------------------------------------------------------------------------


def test_hashes_random(harness):
    rng = np.random.default_rng(11)
    xs = rand_u64(rng, 3000)
    assert harness.ints([f"sm {x}" for x in xs]) == [consts.splitmix64(x) for x in xs]
    np.testing.assert_array_equal(
        np.array(harness.ints([f"sm {x}" for x in xs]), dtype=np.uint64),
        hashing.splitmix64(np.array(xs, dtype=np.uint64)),
    )

    a, b, c = rand_u64(rng, 2000), rand_u64(rng, 2000), rand_u64(rng, 2000)
    c = c[::-1]
    got = harness.ints([f"m3 {x} {y} {z}" for x, y, z in zip(a, b, c)])
    assert got == [consts.splitmix64_mix3(x, y, z) for x, y, z in zip(a, b, c)]

    got = harness.ints([f"fold {x} {y}" for x, y in zip(a, b)])
    assert got == [consts.splitmix64(x ^ y) for x, y in zip(a, b)]
    got = harness.ints([f"fold16 {x} {y} {z}" for x, y, z in zip(a, b, c)])
    assert got == [consts.splitmix64(consts.splitmix64(x ^ y) ^ z) for x, y, z in zip(a, b, c)]


def test_record_hash_matches_reference_slot_hash(harness):
    rng = np.random.default_rng(12)
    n = 2000
    recs = np.zeros((n, 4), dtype=np.int64)
    recs[:, consts.FIELD_TOKEN] = rand_i64(rng, n - 8)
    recs[:, consts.FIELD_POSITION] = rng.permutation(rand_i64(rng, n - 8))
    recs[:, consts.FIELD_PREV_HASH] = rng.permutation(rand_i64(rng, n - 8))
    want = hashing.slot_hash(recs, np.arange(n))
    got = harness.ints([
        f"rh {u(int(r[consts.FIELD_PREV_HASH]))} {u(int(r[consts.FIELD_TOKEN]))} {u(int(r[consts.FIELD_POSITION]))}"
        for r in recs
    ])
    np.testing.assert_array_equal(np.array(got, dtype=np.uint64), want)
    # slot_hash(s < 0) is the anchor hash
    assert harness.ints(["anchor"]) == [int(hashing.slot_hash(recs, np.array([-1]))[0])]


# ---------------------------------------------------------------------------------------------------------
# Real-KV fingerprint: offset + fold16 + fold against the reference on random pools
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [RealKvHashMode.PARTIAL, RealKvHashMode.ALL], ids=lambda m: m.name)
@pytest.mark.parametrize("seed", range(6))
def test_fingerprint_matches_reference(harness, mode, seed):
    rng = np.random.default_rng(100 + seed)
    g = torch.Generator().manual_seed(seed)
    num_slots = int(rng.integers(1, 300))
    sources, blobs, specs = [], [], []
    for i in range(int(rng.integers(1, consts.MAX_REAL_KV_SOURCES + 1))):
        page = int(rng.choice([1, 2, 3, 16, 64]))
        bpt = 16 * int(rng.integers(1, 6))
        read = 16 * int(rng.integers(1, bpt // 16 + 1))
        rows = -(-num_slots // page) + int(rng.integers(0, 3))
        row_bytes = page * bpt + 16 * int(rng.integers(0, 3))  # trailing bytes the fold must ignore
        stride = row_bytes + 16 * int(rng.integers(0, 3))     # rows of a wider pool: a strided view
        base = torch.randint(0, 256, (rows, stride), dtype=torch.uint8, generator=g)
        sources.append(RealKvSource(tensor=base[:, :row_bytes], page_size=page, num_bytes_per_token=bpt,
                                    read_bytes=read))
        blobs.append(base.numpy().tobytes())
        nbytes = 16 if mode == RealKvHashMode.PARTIAL else read
        specs.append(f"{i} {page} {bpt} {stride} {nbytes}")
    log = ViolationLog.allocate(ring_capacity=1)
    ctx = log.context(canary_buf=allocate_canary_buffer(num_slots), kernel_kind=0,
                      real_kv_sources=tuple(sources), real_kv_hash_mode=mode)
    views = context_views(ctx).real_kv_sources
    slots = np.arange(num_slots)
    want = realkv.fingerprint(views, int(mode), slots)
    got = harness.ints([f"fp {s} {len(specs)} " + " ".join(specs) for s in slots], blobs)
    np.testing.assert_array_equal(np.array(got, dtype=np.uint64), want)


def test_real_kv_offset_wide_values(harness):
    """Offsets past 2**32 (64-bit division path) and the page-size-1 shortcut agree with plain arithmetic."""
    rng = np.random.default_rng(13)
    cases = []
    for _ in range(3000):
        page = int(rng.choice([1, 2, 7, 16, 256, 1 << 20, (1 << 33) + 5]))
        slot = int(rng.choice([int(rng.integers(0, 1 << 20)), int(rng.integers(1 << 31, 1 << 40))]))
        bpt = 16 * int(rng.integers(1, 64))
        stride = page * bpt + 16 * int(rng.integers(0, 4))
        cases.append((slot, page, bpt, stride))
    cases += [((1 << 32) - 1, 3, 16, 48), (1 << 32, 3, 16, 48), ((1 << 32) + 1, 1 << 32, 16, 16 << 32)]
    got = harness.ints([f"off {s} {p} {b} {st}" for s, p, b, st in cases])
    assert got == [u((s // p) * st + (s % p) * b) for s, p, b, st in cases]


# ---------------------------------------------------------------------------------------------------------
# Plan arithmetic against the reference plan
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [0, 1, 5, 64])
@pytest.mark.parametrize("with_pool", [False, True])
def test_plan_row_helpers_match_reference_plan(harness, window, with_pool):
    rng = np.random.default_rng(200 + window + 1000 * with_pool)
    max_reqs, max_seq_len, bs = 9, 40, 64
    rpi = rng.integers(-2, max_reqs + 3, size=bs).astype(np.int64)
    rpi[:4] = [0, max_reqs - 1, max_reqs, -1]
    prefix = rng.integers(-3, max_seq_len + 4, size=bs).astype(np.int64)
    prefix[4:8] = [0, max_seq_len, max_seq_len + 1, 1]
    extend = rng.integers(-3, 6, size=bs).astype(np.int64)
    r2t = torch.from_numpy(rng.integers(1, 1000, size=(max_reqs, max_seq_len)).astype(np.int32))
    lut = None
    if window:
        lut = torch.from_numpy(rng.integers(-1, 500, size=700).astype(np.int64))
    pool = lens = None
    offset = int(rng.integers(0, 2))
    if with_pool:
        pool = torch.from_numpy(rng.integers(0, 30000, size=(max_reqs, 30)).astype(np.int32))
        lens = torch.from_numpy(rng.integers(0, 45, size=bs).astype(np.int64))
    vplan = VerifyPlan.allocate(verify_capacity=bs * max_seq_len)
    wplan = WritePlan.allocate(write_req_capacity=bs + 3)
    invalid_rows = torch.zeros(1, dtype=torch.int32)
    kvcanary.launch_canary_plan_kernels(
        verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=torch.from_numpy(rpi),
        prefix_lens=torch.from_numpy(prefix), extend_seq_lens=torch.from_numpy(extend), req_to_token=r2t,
        swa_window_size=window, full_to_swa_index_mapping=lut, verify_capacity=bs * max_seq_len,
        req_to_verify_expected_tokens=pool, req_to_verify_expected_tokens_valid_lens=lens,
        kv_token_id_vs_position_offset=offset, invalid_rows_out=invalid_rows)

    out = harness.run([f"row {u(int(r))} {u(int(p))} {u(int(e))} {max_reqs} {max_seq_len} {window} 0"
                       for r, p, e in zip(rpi, prefix, extend)])
    rows = np.array([[int(x) for x in line.split()] for line in out], dtype=np.int64)
    valid, _active, wstart, vlen, wlen, has_seed = rows.T

    assert int(invalid_rows[0]) == int((valid == 0).sum())
    assert int(vplan.verify_num_valid[0]) == int(vlen.sum()) and int(vplan.enable[0]) == 1
    offs = wplan.write_offsets.numpy()
    np.testing.assert_array_equal(offs[: bs + 1], np.concatenate([[0], np.cumsum(wlen)]))
    seeds = wplan.write_seed_slot_indices.numpy()[:bs]
    if lut is None:  # req_to_token holds slots >= 1, so "no seed" is exactly -1
        np.testing.assert_array_equal(seeds != -1, has_seed.astype(bool))
    else:
        np.testing.assert_array_equal(seeds[has_seed == 0], -1)

    # Each row's entries start at its window start and run for vlen positions.
    starts = np.concatenate([[0], np.cumsum(vlen)])[:-1]
    pos = vplan.verify_expected_positions.numpy()
    exp_tok = vplan.verify_expected_tokens.numpy()
    slots = vplan.verify_slot_indices.numpy()
    tr_lines, tr_want, eok_lines, eok_want = [], [], [], []
    for r in range(bs):
        if vlen[r] == 0:
            continue
        np.testing.assert_array_equal(pos[starts[r]: starts[r] + vlen[r]], wstart[r] + np.arange(vlen[r]))
        for k in range(vlen[r]):
            e, p = starts[r] + k, wstart[r] + k
            x = int(r2t[rpi[r], p])
            if lut is not None:
                tr_lines.append(f"tr {x} {len(lut)} {int(lut[x]) if x < len(lut) else 0}")
                tr_want.append(int(slots[e]))
            if with_pool:
                eok_lines.append(f"eok {u(p + offset)} {u(int(lens[r]))} {pool.shape[1]}")
                eok_want.append(int(exp_tok[e] != -1))
    if tr_lines:
        assert harness.ints(tr_lines) == tr_want
    if eok_lines:
        assert harness.ints(eok_lines) == eok_want


def test_translate_matches_reference(harness):
    rng = np.random.default_rng(14)
    lut = rng.integers(-3, 1 << 40, size=97).astype(np.int64)
    xs = np.concatenate([rng.integers(-5, 130, size=2000), [-(1 << 63), (1 << 63) - 1, 96, 97, 0, -1]])
    want = ref_translate(xs.astype(np.int64), lut)
    got = harness.ints([f"tr {u(int(x))} {len(lut)} {u(int(lut[x])) if 0 <= x < len(lut) else 0}" for x in xs])
    np.testing.assert_array_equal(np.array(got, dtype=np.int64), want)
    # without a LUT T(x) = x: the kernels skip kvc_translate; with lut_len 0 every x >= 0 is out of range
    assert harness.ints(["tr 5 0 0", f"tr {u(-1)} 0 0"]) == [consts.LUT_OUT_OF_RANGE_SLOT, -1]


# ---------------------------------------------------------------------------------------------------------
# Bounds decisions against the reference verify / write rows
# ---------------------------------------------------------------------------------------------------------


def test_verify_out_of_range_matches_reference(harness):
    rng = np.random.default_rng(15)
    num_slots, n = 50, 600
    slots = rng.integers(-3, num_slots + 4, size=n).astype(np.int64)
    prev = rng.integers(-3, num_slots + 4, size=n).astype(np.int64)
    slots[:6] = [num_slots - 1, num_slots, -1, 1, 1, 0]
    prev[:6] = [num_slots - 1, 0, 0, num_slots, -(1 << 63), num_slots + 5]
    canary = allocate_canary_buffer(num_slots)
    log = ViolationLog.allocate(ring_capacity=2 * n)
    ctx = log.context(canary_buf=canary, kernel_kind=0)
    plan = VerifyPlan.allocate(verify_capacity=n)
    plan.verify_slot_indices.copy_(torch.from_numpy(slots))
    plan.verify_prev_slot_indices.copy_(torch.from_numpy(prev))
    plan.verify_expected_positions.copy_(torch.arange(n))  # row field 2 = the entry index
    plan.verify_num_valid[0] = n
    kvcanary.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
    count = int(log.violation_write_index[0])
    ring = log.violation_ring.numpy()[:count]
    oor_entries = set(ring[ring[:, 7] == OOR][:, 2].tolist())
    got = harness.ints([f"voor {u(int(s))} {u(int(p))} {num_slots} {num_slots}" for s, p in zip(slots, prev)])
    # slot 0 entries are skipped before the bounds check, as in the kernels
    want = {e for e in range(n) if slots[e] != 0 and got[e]}
    assert oor_entries == want
    assert any(got) and not all(got)


def test_write_range_bad_matches_reference(harness):
    rng = np.random.default_rng(16)
    n_tokens, reqs = 20, 300
    bounds = np.sort(rng.integers(-4, n_tokens + 5, size=(reqs, 2)), axis=1)
    bounds[::7] = bounds[::7, ::-1]  # some empty or reversed ranges
    bounds[:4] = [[0, n_tokens], [-1, 0], [n_tokens, n_tokens + 1], [3, 3]]
    got = harness.ints([f"wbad {u(int(s))} {u(int(e))} {n_tokens}" for s, e in bounds])
    for r, (s, e) in enumerate(bounds):
        # the reference write: one request at a time, its range given by write_offsets[0:2]
        canary = allocate_canary_buffer(8)
        log = ViolationLog.allocate(ring_capacity=4)
        ctx = log.context(canary_buf=canary, kernel_kind=0)
        wplan = WritePlan.allocate(write_req_capacity=1)
        wplan.write_offsets[0], wplan.write_offsets[1] = int(s), int(e)
        wplan.write_num_valid_reqs[0] = 1
        zeros = torch.zeros(n_tokens, dtype=torch.int64)
        kvcanary.launch_canary_write_kernel(context=ctx, plan=wplan, input_ids=zeros, positions=zeros,
                                            out_cache_loc=torch.full((n_tokens,), -1, dtype=torch.int64),
                                            enable_write_input_assert=False, expected_input_tokens=None,
                                            expected_input_positions=None)
        rows = log.violation_ring.numpy()[: int(log.violation_write_index[0])]
        ref_bad = any(row[7] == OOR and row[1] == -1 for row in rows)
        assert bool(got[r]) == ref_bad, (s, e, rows)
    assert any(got) and not all(got)


def test_ring_index_and_min_max(harness):
    rng = np.random.default_rng(17)
    cases = [(int(i), int(c)) for i, c in zip(rng.integers(-5, 40, 500), rng.integers(-2, 40, 500))]
    cases += [(0, 0), (0, 1), (-1, 5), ((1 << 31) - 1, 1 << 31), (1 << 31, 1 << 31)]
    assert harness.ints([f"ring {u(i)} {u(c)}" for i, c in cases]) == [int(0 <= i < c) for i, c in cases]
    a, b = rand_i64(rng, 500), rand_i64(rng, 500)[::-1]
    assert harness.ints([f"max {u(x)} {u(y)}" for x, y in zip(a, b)]) == [max(x, y) for x, y in zip(a, b)]
    assert harness.ints([f"min {u(x)} {u(y)}" for x, y in zip(a, b)]) == [min(x, y) for x, y in zip(a, b)]


# ---------------------------------------------------------------------------------------------------------
# Paged tables, padding rows, real-KV coverage and records against the reference
# ---------------------------------------------------------------------------------------------------------


def _table(rng: np.random.Generator, max_reqs: int, cols: int, *, paged: bool, block_size: int, pad_row: int):
    from kvcanary.ops.validation import table_views

    a = rng.integers(0, 1 << 20, (max_reqs, cols))
    a[rng.random(a.shape) < 0.2] = -rng.integers(1, 6)
    arr = torch.from_numpy(a.astype(np.int32))
    kw = dict(block_table=arr, block_size=block_size) if paged else dict(req_to_token=arr, block_size=None)
    return table_views("test", req_to_token=kw.get("req_to_token"), block_table=kw.get("block_table"),
                       block_size=kw["block_size"], pad_row=pad_row), arr.numpy()


@pytest.mark.parametrize("pad_row", [0, -1, 3])
def test_row_rules_match_reference_table(harness, pad_row):
    from kvcanary.ops.reference.table import Table, classify_rows

    rng = np.random.default_rng(300 + pad_row)
    max_reqs, block_size = 7, 4
    views, _ = _table(rng, max_reqs, 5, paged=True, block_size=block_size, pad_row=pad_row)
    max_seq_len = views.max_seq_len
    n = 600
    rpi = rng.integers(-3, max_reqs + 3, n).astype(np.int64)
    rpi[:4] = [pad_row, pad_row, -1, max_reqs]
    prefix = rng.integers(-3, max_seq_len + 4, n).astype(np.int64)
    prefix[:2] = [max_seq_len + 1, 1]  # a padding row with a prefix past the table is invalid
    rows = classify_rows(Table(views), rpi, prefix)
    out = harness.run([f"row {u(int(r))} {u(int(p))} 0 {max_reqs} {max_seq_len} 0 {u(pad_row)}"
                       for r, p in zip(rpi, prefix)])
    got = np.array([[int(x) for x in line.split()] for line in out], dtype=np.int64)
    np.testing.assert_array_equal(got[:, 0].astype(bool), ~rows.invalid)
    np.testing.assert_array_equal(got[:, 1].astype(bool), rows.active)
    assert rows.invalid.any() and rows.active.any() and (~rows.active & ~rows.invalid).any()


@pytest.mark.parametrize("block_size", [1, 3, 16, 64, (1 << 32)])
def test_paged_rt_matches_reference_table(harness, block_size):
    from kvcanary.ops.reference.table import Table

    rng = np.random.default_rng(400 + block_size % 1000)
    max_reqs, cols = 6, 9
    views, arr = _table(rng, max_reqs, cols, paged=True, block_size=block_size, pad_row=0)
    n = 1500
    rps = rng.integers(0, max_reqs, n)
    ps = rng.integers(0, min(views.max_seq_len, 1 << 62), n, dtype=np.int64)
    ps[:3] = [0, views.max_seq_len - 1, block_size - 1]
    want = Table(views).rt(rps, ps)
    dm = [[int(x) for x in line.split()] for line in harness.run([f"dm {int(p)} {block_size}" for p in ps])]
    got = harness.ints([f"rtp {u(int(arr[r, q]))} {rem} {block_size}" for r, (q, rem) in zip(rps, dm)])
    np.testing.assert_array_equal(np.array(got, dtype=np.int64), want)
    assert (want == -1).any() and (want > 0).any()


def test_divmod(harness):
    rng = np.random.default_rng(17)
    cases = [(int(a), int(b)) for a, b in zip(rng.integers(0, 1 << 40, 800), rng.integers(1, 1 << 20, 800))]
    cases += [(int(a), int(b)) for a, b in zip(rng.integers(0, (1 << 63) - 1, 400, dtype=np.int64),
                                                   rng.integers(1, (1 << 63) - 1, 400, dtype=np.int64))]
    cases += [(0, 1), (5, 1), ((1 << 32) - 1, (1 << 32) - 1), (1 << 32, 1 << 32), ((1 << 32) + 7, 3), (7, 1 << 32)]
    got = [tuple(int(x) for x in line.split()) for line in harness.run([f"dm {a} {b}" for a, b in cases])]
    assert got == [divmod(a, b) for a, b in cases]


@pytest.mark.parametrize("mode", [RealKvHashMode.NONE, RealKvHashMode.PARTIAL])
def test_verify_out_of_range_with_source_coverage_matches_reference(harness, mode):
    """An entry whose slot a folded source does not cover is reported like an out-of-range slot (SPEC §9)."""
    from kvcanary.ops.reference.realkv import covered_slots

    rng = np.random.default_rng(18 + int(mode))
    num_slots, n = 64, 500
    src = RealKvSource(tensor=torch.zeros((20, 2 * 16), dtype=torch.uint8), page_size=2, num_bytes_per_token=16,
                       read_bytes=16)  # covers 40 slots
    slots = rng.integers(-3, num_slots + 4, size=n).astype(np.int64)
    prev = rng.integers(-3, num_slots + 4, size=n).astype(np.int64)
    canary = allocate_canary_buffer(num_slots)
    log = ViolationLog.allocate(ring_capacity=2 * n)
    ctx = log.context(canary_buf=canary, kernel_kind=0, real_kv_sources=(src,), real_kv_hash_mode=mode)
    limit = covered_slots(context_views(ctx))
    assert limit == (40 if mode else num_slots)
    plan = VerifyPlan.allocate(verify_capacity=n)
    plan.verify_slot_indices.copy_(torch.from_numpy(slots))
    plan.verify_prev_slot_indices.copy_(torch.from_numpy(prev))
    plan.verify_expected_positions.copy_(torch.arange(n))
    plan.verify_num_valid[0] = n
    kvcanary.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
    ring = log.violation_ring.numpy()[: int(log.violation_write_index[0])]
    oor_entries = set(ring[ring[:, 7] == OOR][:, 2].tolist())
    got = harness.ints([f"voor {u(int(s))} {u(int(p))} {num_slots} {limit}" for s, p in zip(slots, prev)])
    assert oor_entries == {e for e in range(n) if slots[e] != 0 and got[e]}


def test_record_and_copy_status_match_reference(harness):
    """Gather's and copy's per-entry decisions (copied / skipped / counted) against the reference ops."""
    rng = np.random.default_rng(19)
    n_src, n_dst, n = 30, 20, 400
    src_slots = rng.integers(-3, n_src + 3, n).astype(np.int64)
    dst_slots = rng.permutation(np.concatenate([np.arange(n_dst), rng.integers(-3, 0, 100),
                                                rng.integers(n_dst, n_dst + 3, n - n_dst - 100)])).astype(np.int64)
    src_buf = torch.from_numpy(rng.integers(1, 255, (n_src, 32)).astype(np.uint8))
    # gather
    out = torch.full((n, 4), 7, dtype=torch.int64)
    oor = torch.zeros(1, dtype=torch.int32)
    kvcanary.gather_canary_records(canary_buf=src_buf, slots=torch.from_numpy(src_slots), records_out=out,
                                   out_of_range_out=oor)
    st = harness.ints([f"rst {u(int(s))} {n_src}" for s in src_slots])
    copied = (out.numpy() != 0).any(axis=1)  # source records have no zero byte
    np.testing.assert_array_equal(copied, np.array(st) == 1)
    assert int(oor[0]) == sum(x == 2 for x in st)
    # copy into a zeroed buffer: which destination records arrive, and the count
    dst_buf = torch.zeros((n_dst, 32), dtype=torch.uint8)
    kvcanary.copy_canary_records(src_canary_buf=src_buf, src_slots=torch.from_numpy(src_slots),
                                 dst_slots=torch.from_numpy(dst_slots), dst_canary_buf=dst_buf, out_of_range_out=oor)
    dst_st = harness.ints([f"rst {u(int(d))} {n_dst}" for d in dst_slots])
    cst = harness.ints([f"cst {a} {b}" for a, b in zip(st, dst_st)])
    assert int(oor[0]) == sum(x == 2 for x in cst)
    arrived = {int(d) for d, c in zip(dst_slots, cst) if c == 1}
    np.testing.assert_array_equal((dst_buf.numpy() != 0).any(axis=1), [s in arrived for s in range(n_dst)])
    assert {0, 1, 2} <= set(cst)
