"""The prepared launches of a canary step (``kvcanary.ops.cuda.table_step``) hand the kernels the same struct bytes
as the launch-record path (``kvcanary.ops.cuda.verify_table`` / ``write_table``), for the arguments a real
``KVCanary`` step passes. Runs without a GPU: the CuPy-facing calls (stream, SM count, kernel lookup, launch,
real-KV descriptor tables) are replaced by recorders; only the packing is compared, byte for byte. (The GPU suite
holds the two paths against each other on the device: tests/gpu/test_canary_gpu.py.)"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

import kvcanary as kc
from kvcanary.ops.cuda import launch as L
from kvcanary.ops.cuda import params as P
from kvcanary.ops.cuda import table_step as TS
from kvcanary.ops.cuda import verify_table as VT
from kvcanary.ops.cuda import write_table as WT
from kvcanary.ops.launches import VerifyTableLaunch, WriteTableLaunch
from kvcanary.ops.table_step import RecordTableStep
from kvcanary.ops.validation import as_view


class Captured:
    """Records what the prepared path and the record path hand the launch: (kernel key, grid, struct bytes)."""

    def __init__(self):
        self.calls: list[tuple] = []


@pytest.fixture
def no_cupy(monkeypatch):
    cap = Captured()

    def fake_function(dev, family, name, *flags):
        return ("fn", family, name, flags)

    def fake_source_table(ctx, device_index, stream):
        desc = L.source_descriptors(ctx)
        return (0x7000 + 64 * len(desc), len(desc)) if desc else (0, 0)

    def record_launch(fn, grid, block, words, dev, stream):
        cap.calls.append((fn, grid, block, struct.pack(f"<{len(words)}q", *words)))

    def record_prepared(fn, grid, block, buf, dev, stream):
        cap.calls.append((fn, grid, block, bytes(buf.words)))

    for mod in (TS, VT, WT):
        monkeypatch.setattr(mod, "function", fake_function)
        monkeypatch.setattr(mod, "sm_count", lambda dev: 132)
        monkeypatch.setattr(mod, "resolve_stream", lambda stream, device: L._RawStream(0))
    monkeypatch.setattr(VT, "launch", record_launch)
    monkeypatch.setattr(WT, "launch", record_launch)
    monkeypatch.setattr(TS, "launch_prepared", record_prepared)
    monkeypatch.setattr(L, "source_table", fake_source_table)
    L.clear_caches()
    yield cap
    L.clear_caches()


def t64(xs):
    return torch.tensor(xs, dtype=torch.int64)


def step_arguments(swa: bool, expected: bool):
    """The (phase, group) contexts and the per-call arguments a CPU KVCanary passes to its table steps."""
    k = torch.zeros((40, 16), dtype=torch.int16)
    v = torch.zeros((40, 16), dtype=torch.int16)
    src = [kc.RealKvSource(tensor=x, page_size=1, num_bytes_per_token=32, read_bytes=32) for x in (k, v)]
    swa_cfg = None
    if swa:
        lut = torch.arange(41, dtype=torch.int64)
        swa_cfg = kc.SwaConfig(num_slots=40, window_size=3, full_to_swa_index_mapping=lut)
    c = kc.KVCanary(num_slots=40, max_batch_size=4, max_tokens_per_step=8, k_sources=(src[0],), v_sources=(src[1],),
                    swa=swa_cfg, mode="quiet", real_kv_hash_mode=kc.RealKvHashMode.PARTIAL,
                    expected_tokens_shape=(4, 16) if expected else None)
    seen: list[tuple[str, dict]] = []

    class Capture(RecordTableStep):
        def verify(self, **kw):
            seen.append(("verify", dict(kw, contexts=self.verify_contexts)))

        def write(self, **kw):
            seen.append(("write", dict(kw, contexts=self.write_contexts)))

    class Backend:
        def table_step(self, *, device, verify_contexts, write_contexts, stream=None):
            return Capture(None, device=device, verify_contexts=verify_contexts, write_contexts=write_contexts)

        def launch_stream(self, stream, device):
            return None

        def capturing(self, stream):
            return False

    c._backend = Backend()
    r2t = torch.zeros((4, 16), dtype=torch.int32)
    r2t[1, :6] = t64([1, 2, 3, 4, 5, 6]).to(torch.int32)
    r2t[2, :3] = t64([9, 10, 11]).to(torch.int32)
    batch = dict(req_pool_indices=t64([1, 2, 0]), prefix_lens=t64([5, 2, 0]), extend_seq_lens=t64([1, 1, 0]),
                 req_to_token=r2t, input_ids=t64([7, 8]), positions=t64([5, 2]), out_cache_loc=t64([6, 11]))
    if swa:
        batch["swa_out_cache_loc"] = t64([6, 11])
    if expected:
        batch["expected_tokens"] = torch.arange(64, dtype=torch.int32).reshape(4, 16)
        batch["expected_tokens_valid_lens"] = t64([6, 3, 0])
        batch["expected_input_tokens"] = t64([7, 8])
        batch["expected_input_positions"] = t64([5, 2])
    for phase in ("head", "tail"):
        c.step(phase, **batch)
    return c, seen


@pytest.mark.parametrize("swa, expected", [(False, False), (True, True), (True, False)])
def test_prepared_launches_pack_the_bytes_of_the_record_path(no_cupy, swa, expected):
    c, seen = step_arguments(swa, expected)
    assert len(seen) == 2 * 2 * len(c.groups)  # (head, tail) x (verify, write) x groups
    for kind, kw in seen:
        ctxs = kw.pop("contexts")
        dev = ctxs[0].canary_buf.device
        prepared = TS.CudaTableStep(device=dev, verify_contexts=ctxs, write_contexts=ctxs)
        getattr(prepared, kind)(**kw)
        # The record path takes views; the step passes checked tensors (batch_array's fast path) as they are.
        assert all(type(kw[k]) is torch.Tensor for k in ("req_pool_indices", "prefix_lens"))
        record = {k: as_view(k, v) if isinstance(v, torch.Tensor) else v for k, v in kw.items() if k != "stream"}
        if kind == "verify":
            VT.verify_from_table(VerifyTableLaunch(device=dev, contexts=ctxs, invalid_rows=None, **record))
        else:
            WT.write_from_table(WriteTableLaunch(device=dev, contexts=ctxs, invalid_rows=None, **record))
        fast, slow = no_cupy.calls[-2], no_cupy.calls[-1]
        assert fast[:3] == slow[:3], (kind, fast[:3], slow[:3])  # same kernel specialization and grid
        assert fast[3] == slow[3], kind                           # the same struct, byte for byte
        words = np.frombuffer(fast[3], dtype="<i8")
        assert len(words) == (P.VERIFY_TABLE if kind == "verify" else P.WRITE_TABLE).words
        assert words[0] == kw["table"].array.ptr and words[0] != 0  # not an all-zero struct


def test_a_prepared_step_refuses_more_contexts_than_one_launch_holds(no_cupy):
    _, seen = step_arguments(False, False)
    ctxs = seen[0][1]["contexts"]
    dev = ctxs[0].canary_buf.device
    with pytest.raises(ValueError, match="kv-canary: a prepared step takes 1 to 4 contexts"):
        TS.CudaTableStep(device=dev, verify_contexts=ctxs * 3, write_contexts=ctxs)


def test_arg_buffer_holds_the_packed_words():
    words = list(range(-5, 30))
    buf = L.ArgBuffer(len(words))
    buf.packer.pack_into(buf.words, 0, *words)
    assert bytes(buf.words) == P.kernel_arg(words).tobytes()
    # kernelParams: one pointer, to the words
    import ctypes

    assert ctypes.c_void_p.from_address(buf.params_addr).value == ctypes.addressof(buf.words)
