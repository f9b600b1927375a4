"""KVCanary on CUDA: a full HEAD/TAIL step captured in a CUDA graph and replayed equals the eager steps;
the simulated workload gives the same records and violations on CUDA as on the CPU; every fault is caught.

Skipped without CuPy or a CUDA GPU (also by tests/gpu/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

cp = pytest.importorskip("cupy")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU", allow_module_level=True)

import kvcanary as kc  # noqa: E402 - after the skips above
from kvcanary import CanaryLaunchTag as T  # noqa: E402
from kvcanary import FailReason as F  # noqa: E402
from kvcanary import faults  # noqa: E402
from kvcanary.testing.engine import ServingSimulation, SimConfig  # noqa: E402
from kvcanary.testing.scenarios import FAULT_NAMES, run_fault_scenario  # noqa: E402

DEV = torch.device("cuda", 0)
PAGE, DIM = 4, 16                      # 16 int16 = 32 bytes of K (and of V) per token
NUM_SLOTS, SWA_SLOTS, WINDOW = 512, 512, 4  # every FULL slot the tests use has an SWA slot
MAX_REQS, MAX_SEQ = 6, 64
ROWS = [1, 2, 3, 4]                    # live request rows; the batch adds 2 padding rows
BS = len(ROWS) + 2
STEPS = 40                             # decode steps replayed from one captured graph


class GraphEngine:
    """A fixed-shape decode engine: 4 requests decoding one token per step, padded to 6 rows, so one
    captured graph serves every decode step after the batch tensors are refilled in place."""

    def __init__(self):
        def pool(slots):
            return torch.zeros((slots // PAGE, PAGE, DIM), dtype=torch.int16, device=DEV)

        def src(t):
            return kc.RealKvSource(tensor=t, page_size=PAGE, num_bytes_per_token=2 * DIM, read_bytes=2 * DIM)

        self.k, self.v, self.sk, self.sv = pool(NUM_SLOTS), pool(NUM_SLOTS), pool(SWA_SLOTS), pool(SWA_SLOTS)
        self.k_src = src(self.k)
        # Every FULL slot used here (< SWA_SLOTS) has the SWA slot of the same number.
        self.lut = torch.zeros(NUM_SLOTS + 1, dtype=torch.int64, device=DEV)
        self.lut[1:SWA_SLOTS] = torch.arange(1, SWA_SLOTS, device=DEV)
        self.canary = kc.KVCanary(
            num_slots=NUM_SLOTS, max_batch_size=8, max_tokens_per_step=64, device=DEV,
            k_sources=(self.k_src,), v_sources=(src(self.v),),
            swa=kc.SwaConfig(num_slots=SWA_SLOTS, window_size=WINDOW, full_to_swa_index_mapping=self.lut,
                             k_sources=(src(self.sk),), v_sources=(src(self.sv),)),
            mode="quiet", expected_tokens_shape=(MAX_REQS, MAX_SEQ))
        self.r2t = torch.zeros((MAX_REQS, MAX_SEQ), dtype=torch.int32, device=DEV)
        self.pool = torch.zeros((MAX_REQS, MAX_SEQ), dtype=torch.int32, device=DEV)
        z = lambda: torch.zeros(BS, dtype=torch.int64, device=DEV)
        self.static = dict(req_pool_indices=z(), prefix_lens=z(), extend_seq_lens=z(), req_to_token=self.r2t,
                           input_ids=z(), positions=z(), out_cache_loc=z(), expected_tokens=self.pool,
                           expected_tokens_valid_lens=z())

    def forward(self, args):
        """Write integer K/V for every token (padding tokens go to the dummy slot 0); no host sync."""
        loc, ids, pos = args["out_cache_loc"], args["input_ids"], args["positions"]
        j = torch.arange(DIM, device=DEV, dtype=torch.int64)
        mixed = (ids[:, None] * 2654435761 + pos[:, None] * 40503 + j * 97) % 65521
        k, v = (mixed - 32760).to(torch.int16), ((mixed * 7 + 13) % 65521 - 32760).to(torch.int16)
        self.k.view(-1, DIM).index_copy_(0, loc, k)
        self.v.view(-1, DIM).index_copy_(0, loc, v)
        swa = self.lut.index_select(0, loc)
        self.sk.view(-1, DIM).index_copy_(0, swa, k)
        self.sv.view(-1, DIM).index_copy_(0, swa, v)

    def eager(self, args):
        self.canary.step("head", **args)
        self.forward(args)
        self.canary.step("tail", **args)


def _prefill_args(lengths, rng):
    """Variable-shape prefill of the 4 requests (eager); returns the batch and each request's tokens/slots."""
    tokens, slots, ids, pos, loc = {}, {}, [], [], []
    nxt = 1
    for row, n in zip(ROWS, lengths):
        tokens[row] = rng.integers(1, 30000, n).tolist()
        slots[row] = list(range(nxt, nxt + n))
        nxt += n + STEPS + 4           # room for the decode tokens of this request
        ids += tokens[row]
        pos += list(range(n))
        loc += slots[row]
    t = lambda x: torch.tensor(x, dtype=torch.int64, device=DEV)
    args = dict(req_pool_indices=t(ROWS), prefix_lens=t([0] * 4), extend_seq_lens=t(lengths), input_ids=t(ids),
                positions=t(pos), out_cache_loc=t(loc), expected_tokens_valid_lens=t(lengths))
    return args, tokens, slots


def _fill_decode(engine, tokens, slots, new_tokens):
    """Refill the engine's static batch in place for one decode step (and its tables)."""
    s = engine.static
    rpi, pre, ext, ids, pos, loc, valid = [], [], [], [], [], [], []
    for row, tok in zip(ROWS, new_tokens):
        p = len(tokens[row])
        slot = slots[row][0] + p
        engine.r2t[row, p] = slot
        engine.pool[row, p] = tok
        rpi.append(row), pre.append(p), ext.append(1), ids.append(tok), pos.append(p), loc.append(slot)
        valid.append(p + 1)
    for _ in range(BS - len(ROWS)):  # padding rows: row 0, one dummy token written to slot 0
        rpi.append(0), pre.append(0), ext.append(1), ids.append(0), pos.append(0), loc.append(0), valid.append(0)
    for name, vals in (("req_pool_indices", rpi), ("prefix_lens", pre), ("extend_seq_lens", ext),
                       ("input_ids", ids), ("positions", pos), ("out_cache_loc", loc),
                       ("expected_tokens_valid_lens", valid)):
        s[name].copy_(torch.tensor(vals, dtype=torch.int64))


def _setup(engine, rng_seed):
    rng = np.random.default_rng(rng_seed)
    args, tokens, slots = _prefill_args([5, 7, 3, 6], rng)
    for row in ROWS:
        n = len(tokens[row])
        engine.r2t[row, :n] = torch.tensor(slots[row], dtype=torch.int32)
        engine.pool[row, :n] = torch.tensor(tokens[row], dtype=torch.int32)
        slots[row] = [slots[row][0] + k for k in range(n + STEPS + 4)]
    engine.eager(dict(args, req_to_token=engine.r2t, expected_tokens=engine.pool))
    return rng, tokens, slots


def _sorted_rows(ring: torch.Tensor, n: int) -> list[list[int]]:
    return sorted(ring[:n].cpu().tolist())


# The captured step includes the toy engine's own torch ops, which allocate from torch's graph pool: this
# test needs torch's caching allocator (run_all.sh's memcheck pass turns it off for every other test).
@pytest.mark.torch_graph_pool
def test_captured_head_tail_step_replays_like_eager(vt_flat32):
    eager, graphed = GraphEngine(), GraphEngine()
    states = [_setup(e, 123) for e in (eager, graphed)]

    # Warm-up (compiles every kernel) and capture, with the chain position assert off; then switch on.
    for e in (eager, graphed):
        _fill_decode(e, states[0][1], states[0][2], [0, 0, 0, 0])
        e.static["req_pool_indices"].zero_()        # a padding-only batch: runs every launch, stamps nothing
        with e.canary.warmup():
            e.eager(e.static)
    g = torch.cuda.CUDAGraph()
    with graphed.canary.warmup(), torch.cuda.graph(g):
        graphed.canary.step("head", **graphed.static)
        graphed.forward(graphed.static)
        graphed.canary.step("tail", **graphed.static)
    assert graphed.canary.chain_position_assert
    # The step's verify launches took the modules the switch asks for (the table is a req_to_token).
    for canary in (eager.canary, graphed.canary):
        assert {st._flat32 for _, st in canary._table_steps["head"][1]} == {vt_flat32}

    rng = np.random.default_rng(7)
    tokens = {row: list(states[0][1][row]) for row in ROWS}
    slots = states[0][2]
    expectations = []
    for step in range(STEPS):
        new = rng.integers(1, 30000, 4).tolist()
        for e in (eager, graphed):
            _fill_decode(e, tokens, slots, new)
        if step == 4:   # a stale page-table entry, in both engines
            for e in (eager, graphed):
                exp = faults.remap_req_to_token(e.r2t, req_pool_index=2, position=2, new_slot=slots[1][4])
            expectations.append(exp)
        if step == 7:   # a bit flip in a live slot's K
            for e in (eager, graphed):
                exp = faults.flip_real_kv_byte(e.k_src, slot=slots[3][1], byte=5)
            expectations.append(exp)
        g.replay()
        graphed.canary.end_step()  # after every replay: stage this replay's copy, read the previous one
        eager.eager(eager.static)
        for row, tok in zip(ROWS, new):
            tokens[row].append(tok)
    torch.cuda.synchronize()

    a, b = eager.canary, graphed.canary
    for tag in a.buffers:
        assert torch.equal(a.buffers[tag], b.buffers[tag]), tag.name
    assert torch.equal(a.counters, b.counters)
    assert int(a.violation_write_index[0]) == int(b.violation_write_index[0]) > 0
    n = min(int(a.violation_write_index[0]), a.ring_capacity)
    assert _sorted_rows(a.violation_ring, n) == _sorted_rows(b.violation_ring, n)
    assert a.health().invalid_rows == b.health().invalid_rows
    # The replays did the work: 1 prefill + 1 warm-up + 40 decode launches per HEAD/TAIL tag and kernel.
    h = b.health()
    assert h.tags[T.HEAD_K_FULL].verify_launches == h.tags[T.TAIL_V_SWA].write_launches == 2 + STEPS
    assert h.tags[T.HEAD_K_FULL].stamped_slots == 21 + 4 * STEPS

    va, vb = a.poll(sync=True), b.poll(sync=True)
    assert sorted(v.to_row() for v in va) == sorted(v.to_row() for v in vb)
    for exp in expectations:
        assert exp.found_in(vb), str(exp)
    assert all(v.step > 0 for v in vb)  # attributed to the end_step() after a replay


def test_simulated_workload_matches_the_cpu_reference():
    cfg = SimConfig(seed=9)
    cpu, gpu = ServingSimulation(cfg), ServingSimulation(cfg, device=DEV)
    for sim in (cpu, gpu):
        sim.run(40)
    assert cpu.stats == gpu.stats
    for tag in cpu.canary.buffers:
        assert torch.equal(cpu.canary.buffers[tag], gpu.canary.buffers[tag].cpu()), tag.name
    assert torch.equal(cpu.canary.counters, gpu.canary.counters.cpu())
    assert cpu.canary.poll(sync=True) == [] and gpu.canary.poll(sync=True) == []


@pytest.mark.parametrize("name", FAULT_NAMES)
def test_every_fault_is_caught_on_cuda_as_on_cpu(name):
    on_cpu = run_fault_scenario(name, SimConfig(seed=1), warmup_steps=10)
    on_gpu = run_fault_scenario(name, SimConfig(seed=1), device=DEV, warmup_steps=10)
    assert on_gpu.detected and on_gpu.clean_before
    assert sorted(v.to_row() for v in on_gpu.violations) == sorted(v.to_row() for v in on_cpu.violations)


def test_reporting_stays_one_step_late_on_cuda():
    e = GraphEngine()
    _rng, tokens, slots = _setup(e, 5)
    faults.remap_req_to_token(e.r2t, req_pool_index=1, position=1, new_slot=slots[2][0])
    _fill_decode(e, tokens, slots, [1, 2, 3, 4])
    e.canary.step("head", **e.static)
    assert e.canary.poll() == []        # staged, not read: the step never waits for the device
    e.forward(e.static)
    torch.cuda.synchronize()            # make sure the HEAD step's copy has landed before the next step
    e.canary.step("tail", **e.static)
    found = e.canary.poll()
    # Only the HEAD launches' rows (K and V, FULL and SWA) are visible yet: TAIL's were staged, not read.
    assert found and all(T(v.tag).name.startswith("HEAD_") for v in found)
    k_full = [v for v in found if v.tag == T.HEAD_K_FULL]
    assert k_full and k_full[0].reasons & (F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH)


def test_fast_path_equals_the_checked_ops_on_cuda(vt_flat32):
    from support.checked_path import fast_and_checked

    a, b = fast_and_checked(SimConfig(seed=12), device=DEV, steps=30)
    for tag in a.buffers:
        assert torch.equal(a.buffers[tag], b.buffers[tag]), tag.name
    assert torch.equal(a.state.status, b.state.status)
    n = min(int(a.violation_write_index[0]), a.ring_capacity)
    assert _sorted_rows(a.violation_ring, n) == _sorted_rows(b.violation_ring, n)


def test_steps_after_empty_cache_and_reallocated_engine_tensors():
    """The engine frees its tensors, torch returns the memory to the driver, and the engine allocates new ones
    (other addresses; the table and pools too): the canary follows, clean, and matches the CPU reference."""
    cfg = SimConfig(seed=13)
    cpu, gpu = ServingSimulation(cfg), ServingSimulation(cfg, device=DEV)
    for sim in (cpu, gpu):
        sim.run(15)
    old = (gpu.req_to_token.data_ptr(), gpu.pools.k.data_ptr())
    # Re-allocate the engine's long-lived tensors in place of the old ones (same objects, new storage).
    for t in (gpu.req_to_token, gpu.expected_tokens, gpu.full_to_swa, gpu.pools.k, gpu.pools.v):
        fresh = t.clone()
        t.set_(torch.empty(0, dtype=t.dtype, device=DEV))
        torch.cuda.empty_cache()
        t.set_(fresh)
    torch.cuda.empty_cache()
    assert (gpu.req_to_token.data_ptr(), gpu.pools.k.data_ptr()) != old
    for sim in (cpu, gpu):
        sim.run(15)
    assert cpu.canary.poll(sync=True) == [] and gpu.canary.poll(sync=True) == []
    for tag in cpu.canary.buffers:
        assert torch.equal(cpu.canary.buffers[tag], gpu.canary.buffers[tag].cpu()), tag.name
    assert torch.equal(cpu.canary.counters, gpu.canary.counters.cpu())


def test_every_layer_fingerprinted_sweep_and_tail_on_cuda():
    """64 sources: the TAIL launches and the sweep (plan-based verify through the descriptor table) fold them all."""
    from support.scenarios import every_layer_scenario

    assert every_layer_scenario(DEV) == every_layer_scenario("cpu")
    swept, tailed = every_layer_scenario(DEV)
    assert swept == [(T.SWEEP_V_FULL, 6, F.VERIFY_REAL_KV_HASH_MISMATCH)]
    assert tailed == [(T.TAIL_K_FULL, 2, F.VERIFY_REAL_KV_HASH_MISMATCH)]


def _i64(xs):
    return torch.tensor(xs, dtype=torch.int64, device=DEV)


def _one_request_canary():
    """A canary without real KV and the prefill batch of one request: 4 tokens at slots 1..4 (row 1 of an 8-column
    table whose column 4 holds slot 5, for a decode step after it)."""
    c = kc.KVCanary(num_slots=64, max_batch_size=2, max_tokens_per_step=8, device=DEV, mode="quiet",
                    watchdog_patience=None)
    r2t = torch.zeros((2, 8), dtype=torch.int32, device=DEV)
    r2t[1, :5] = torch.arange(1, 6, dtype=torch.int32, device=DEV)
    batch = dict(req_pool_indices=_i64([1]), prefix_lens=_i64([0]), extend_seq_lens=_i64([4]), req_to_token=r2t,
                 input_ids=_i64([5, 6, 7, 8]), positions=_i64([0, 1, 2, 3]), out_cache_loc=_i64([1, 2, 3, 4]))
    return c, batch


def test_a_step_captured_on_its_own_stream_while_another_stream_is_current():
    """``step(stream=s)`` captured on ``s`` while another stream is current: the step sees that its own launch
    stream is capturing, so it neither closes a step nor stages a status copy inside the capture (either would
    break the capture or count a step that did not run); the replay then does the step's work."""
    c, batch = _one_request_canary()
    c.step("head", **batch)
    c.step("tail", **batch)
    decode = dict(batch, prefix_lens=_i64([4]), extend_seq_lens=_i64([1]), input_ids=_i64([9]), positions=_i64([4]),
                  out_cache_loc=_i64([5]))
    s, g = torch.cuda.Stream(device=DEV), torch.cuda.CUDAGraph()
    with c.warmup():
        torch.cuda.synchronize(DEV)
        with torch.cuda.stream(s):
            g.capture_begin()
        assert torch.cuda.current_stream(DEV) != s and not torch.cuda.is_current_stream_capturing()
        steps = c.step_number
        c.step("head", stream=s, **decode)
        c.step("tail", stream=s, **decode)
        assert c.step_number == steps
        with torch.cuda.stream(s):
            g.capture_end()
    g.replay()
    c.end_step()
    torch.cuda.synchronize(DEV)
    h = c.health()
    assert h.tags[T.HEAD_K_FULL].verify_launches == h.tags[T.TAIL_K_FULL].write_launches == 2
    assert h.tags[T.TAIL_K_FULL].stamped_slots == 5
    assert list(c.poll(sync=True)) == []
    # The replay reads the table as it is then: a stale entry planted after capture is caught.
    exp = faults.remap_req_to_token(batch["req_to_token"], req_pool_index=1, position=3, new_slot=7)
    g.replay()
    c.end_step()
    assert exp.found_in(c.poll(sync=True)), str(exp)


def test_status_copy_of_a_step_on_another_stream_is_ordered_after_its_kernels():
    """``step(stream=s)`` with ``s`` not the current stream: the status copy the step stages is ordered after the
    step's kernels on ``s`` (not after the current stream's work), so the copy shows the step's launches."""
    from kvcanary.runtime.status import Count, Kernel, StatusSnapshot

    c, batch = _one_request_canary()
    s = torch.cuda.Stream(device=DEV)
    torch.cuda.synchronize(DEV)
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)   # tens of ms: the step's kernels queue behind it on s
    assert torch.cuda.current_stream(DEV) != s
    c.step("head", stream=s, **batch)
    torch.cuda.synchronize(DEV)
    copies = [x for x in c.collector._stager.take_landed(include_latest=True) if x.label == c.step_number]
    assert len(copies) == 1
    snap = StatusSnapshot(copies[0].values[0], copies[0].label)
    for kernel in (Kernel.VERIFY, Kernel.WRITE):
        assert snap.count(T.HEAD_K_FULL, kernel, Count.LAUNCHES) == 1, kernel
    assert snap.count(T.HEAD_K_FULL, Kernel.WRITE, Count.SLOTS) == 4
