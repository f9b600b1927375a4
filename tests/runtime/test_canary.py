"""KVCanary: long clean runs, one-step-late reporting, log/raise/quiet, the watchdog, ring overflow, sweeps,
the SWA translation, warm-up and argument checks (CPU reference)."""

from __future__ import annotations

import logging

import pytest
import torch

import kvcanary as kc
from kvcanary import CanaryLaunchTag as T
from kvcanary import FailReason as F
from kvcanary import KVCanary, faults
from kvcanary.testing.engine import ServingSimulation, SimConfig


def t64(xs):
    return torch.tensor(xs, dtype=torch.int64)


class Tiny:
    """A hand-driven engine: up to 3 requests (rows 1..3), a 64-slot pool with a real K pool, no SWA
    unless ``swa_window`` is given (then SWA slots = FULL slots + 100 via the table)."""

    def __init__(self, swa_window: int = 0, **kw):
        self.k_pool = torch.zeros((16, 4, 16), dtype=torch.float16)  # 64 slots x 32 bytes
        self.source = kc.RealKvSource(tensor=self.k_pool, page_size=4, num_bytes_per_token=32, read_bytes=32)
        self.lut = torch.zeros(65, dtype=torch.int64)
        swa = None
        if swa_window:
            swa = kc.SwaConfig(num_slots=200, window_size=swa_window, full_to_swa_index_mapping=self.lut)
        kw.setdefault("mode", "quiet")
        self.c = KVCanary(num_slots=64, max_batch_size=4, max_tokens_per_step=16, k_sources=(self.source,),
                          swa=swa, **kw)
        self.r2t = torch.zeros((4, 32), dtype=torch.int32)
        self.tokens: dict[int, list[int]] = {1: [], 2: [], 3: []}
        self.slots: dict[int, list[int]] = {1: [], 2: [], 3: []}
        self.next_slot = {1: 1, 2: 21, 3: 41}

    def batch(self, new: dict[int, list[int]]) -> dict:
        rpi, pre, ext, ids, pos, loc = [], [], [], [], [], []
        for row, toks in new.items():
            p0 = len(self.tokens[row])
            slots = list(range(self.next_slot[row], self.next_slot[row] + len(toks)))
            self.r2t[row, p0:p0 + len(toks)] = torch.tensor(slots, dtype=torch.int32)
            for s in slots:
                self.lut[s] = s + 100
            rpi.append(row), pre.append(p0), ext.append(len(toks))
            ids += toks
            pos += list(range(p0, p0 + len(toks)))
            loc += slots
        return dict(req_pool_indices=t64(rpi), prefix_lens=t64(pre), extend_seq_lens=t64(ext),
                    req_to_token=self.r2t, input_ids=t64(ids), positions=t64(pos), out_cache_loc=t64(loc))

    def commit(self, new: dict[int, list[int]]) -> None:
        for row, toks in new.items():
            n = len(toks)
            self.slots[row] += list(range(self.next_slot[row], self.next_slot[row] + n))
            self.next_slot[row] += n
            self.tokens[row] += toks

    def forward(self, args: dict) -> None:
        for tok, p, s in zip(args["input_ids"].tolist(), args["positions"].tolist(), args["out_cache_loc"].tolist()):
            self.k_pool.view(-1, 16)[s] = torch.full((16,), (tok * 31 + p) % 1000 / 7.0, dtype=torch.float16)

    def step(self, new: dict[int, list[int]], hook=None) -> dict:
        args = self.batch(new)
        if hook:
            hook(args)
        self.c.step("head", **args)
        self.forward(args)
        self.c.step("tail", **args)
        self.commit(new)
        return args


def prefilled(**kw) -> Tiny:
    e = Tiny(**kw)
    e.step({1: [11, 12, 13, 14, 15, 16], 2: [21, 22, 23, 24]})
    e.step({1: [17], 2: [25]})
    return e


# ------------------------------------------------------------------------------------------ long clean runs


def _run_and_account(sim: ServingSimulation, steps: int) -> dict:
    prefix = {"full": 0, "swa": 0}
    W = sim.cfg.swa_window
    for i in range(steps):
        b = sim.step()
        real = b.req_pool_indices != 0
        prefix["full"] += int(b.prefix_lens[real].sum())
        prefix["swa"] += int(b.prefix_lens[real].clamp(max=W).sum()) if W else 0
        if i % 25 == 0:
            assert sim.canary.poll() == []
    assert sim.canary.poll(sync=True) == []
    return prefix


def test_clean_run_with_sharing_eviction_swa_recycling_and_chunked_prefill():
    cfg = SimConfig(seed=1, num_slots=160, system_prompts=4, max_running=5, swa_num_slots=96)
    sim = ServingSimulation(cfg)
    prefix = _run_and_account(sim, 220)
    s = sim.stats
    # The workload really exercised what it claims.
    assert s["cache_hits"] > 5 and s["evictions"] > 0 and s["finished"] > 20
    assert s["swa_frees"] > cfg.swa_num_slots and s["tokens"] > cfg.num_slots  # both pools recycled
    assert s["partial_chunks"] > 5 and s["padding_rows"] > 0 and s["sweeps"] > 10
    h = sim.canary.health()
    assert h.violations_total == 0 and h.plan_overflows == 0 and h.invalid_rows == 0
    for tag in (T.HEAD_K_FULL, T.TAIL_V_FULL, T.HEAD_K_SWA, T.TAIL_V_SWA):
        c = h.tags[tag]
        assert c.verify_launches == c.write_launches == 220
        assert c.stamped_slots == s["tokens"]
    assert h.tags[T.HEAD_K_FULL].verified_slots == prefix["full"]
    assert h.tags[T.TAIL_K_SWA].verified_slots == prefix["swa"]
    assert h.tags[T.SWEEP_K_FULL].verify_launches == s["sweeps"]
    assert h.swept_slots == s["swept_slots"] and h.sweeps == s["sweeps"]
    assert h.protected_tokens == s["tokens"]
    assert h.steps["head"] == h.steps["tail"] == 220


def test_clean_run_full_attention_k_only():
    sim = ServingSimulation(SimConfig(seed=5, swa_window=0, with_v=False, pad_to=1))
    _run_and_account(sim, 120)
    assert sim.canary.groups == ("full",) and sim.canary.kvs == ("k",)
    assert set(sim.canary.health().tags) == {T.HEAD_K_FULL, T.TAIL_K_FULL, T.SWEEP_K_FULL}


# ------------------------------------------------------------------------------------------ reporting


def test_detection_is_one_step_late_and_sync_poll_is_immediate():
    e = prefilled()
    assert e.c.poll(sync=True) == []
    faults.remap_req_to_token(e.r2t, req_pool_index=1, position=2, new_slot=22)
    args = e.batch({1: [18]})
    e.c.step("head", **args)
    head_step = e.c.step_number
    assert e.c.poll() == []                   # the HEAD's rows are staged, not yet read
    e.forward(args)
    e.c.step("tail", **args)                  # reads the HEAD step's copy
    rows = e.c.poll()
    assert rows and {v.tag for v in rows} == {T.HEAD_K_FULL}
    assert all(v.step == head_step for v in rows)
    assert rows[0].slot == 22 and rows[0].reasons == F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH
    assert rows[1].slot == e.slots[1][3] and rows[1].reasons == F.VERIFY_CHAIN_HASH_MISMATCH
    assert [v.ring_index for v in rows] == list(range(len(rows)))
    tail_rows = e.c.poll(sync=True)           # the TAIL rows, without waiting for another step
    assert tail_rows and {v.tag for v in tail_rows} == {T.TAIL_K_FULL}
    assert all(v.step == head_step + 1 for v in tail_rows)
    assert e.c.poll(sync=True) == []
    assert e.c.violations == rows + tail_rows


def test_log_mode_logs_each_violation_as_a_warning(caplog):
    e = prefilled(mode="log")
    with caplog.at_level(logging.WARNING, logger="kvcanary"):
        faults.remap_req_to_token(e.r2t, req_pool_index=2, position=1, new_slot=3)
        e.step({2: [26]})
        e.step({2: [27]})
    found = e.c.poll()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert found and lines == [str(v) for v in found]


def test_raise_mode_raises_one_step_late_with_the_new_rows():
    e = prefilled(mode="raise")
    faults.remap_req_to_token(e.r2t, req_pool_index=2, position=1, new_slot=3)
    args = e.batch({2: [26]})
    e.c.step("head", **args)                  # appends the rows; nothing read yet
    with pytest.raises(kc.CanaryViolationError) as err:
        e.c.step("tail", **args)
    vs = err.value.violations
    assert vs and all(v.tag == T.HEAD_K_FULL for v in vs) and vs[0].slot == 3
    assert str(err.value).splitlines()[1:len(vs) + 1] == [str(v) for v in vs]
    assert e.c.poll() == vs                   # poll still returns them


def test_quiet_mode_logs_nothing(caplog):
    e = prefilled()
    with caplog.at_level(logging.WARNING, logger="kvcanary"):
        faults.remap_req_to_token(e.r2t, req_pool_index=2, position=1, new_slot=3)
        e.step({2: [26]})
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert e.c.poll(sync=True)


def test_mode_is_checked():
    with pytest.raises(ValueError, match=r"kv-canary: mode must be one of \('log', 'raise', 'quiet'\), got 'loud'"):
        KVCanary(num_slots=8, max_batch_size=2, mode="loud")


def test_ring_overflow_is_reported_and_reset_log_keeps_new_rows(caplog):
    e = prefilled(mode="log", ring_capacity=3)
    with caplog.at_level(logging.WARNING, logger="kvcanary"):
        faults.remap_req_to_token(e.r2t, req_pool_index=1, position=1, new_slot=22)
        e.step({1: [18]})
        e.step({1: [19]})
        vs = e.c.poll(sync=True)
    assert len(vs) == 3                       # only the kept rows can be decoded
    h = e.c.health()
    assert h.violations_total > 3 and h.violations_kept == 3 and h.ring_overflowed
    assert h.violations_dropped == h.violations_total - 3
    overflow = [r.getMessage() for r in caplog.records if "overflowed" in r.getMessage()]
    assert overflow and f"{h.violations_total} violations in total, only the first 3 rows kept" in overflow[-1]

    e.c.reset_log()
    assert e.c.health().violations_total == 0
    e.step({1: [20]})
    again = e.c.poll(sync=True)
    assert again and again[0].tag == T.HEAD_K_FULL and again[0].slot == 22


def test_raise_mode_raises_on_overflow_with_totals():
    e = prefilled(mode="raise", ring_capacity=1)
    faults.remap_req_to_token(e.r2t, req_pool_index=1, position=1, new_slot=22)
    with pytest.raises(kc.CanaryViolationError) as err:
        e.step({1: [18]})
    assert err.value.kept == 1 and err.value.total > 1
    assert "violation ring overflowed" in str(err.value)


# ------------------------------------------------------------------------------------------ health and watchdog


def test_watchdog_raises_when_the_canary_stops_running():
    e = prefilled(watchdog_patience=3)
    for k in range(10):
        e.step({1: [30 + k], 2: [40 + k]})    # HEAD and TAIL run: counters grow
    # The engine keeps closing steps (graph replays) but the captured graph lacks the canary kernels.
    # Observations are one step late: the 1st end_step() reads the last TAIL step's copy, so HEAD's
    # counter (last moved by the final HEAD step) has been flat for 3 observations at the 3rd call.
    e.c.end_step()
    e.c.end_step()
    with pytest.raises(kc.CanaryNotRunningError, match=r"HEAD_K_FULL \(kernel runs stuck at 24\)"):
        e.c.end_step()


def test_watchdog_unit():
    wd = kc.CanaryWatchdog((T.HEAD_K_FULL, T.TAIL_K_FULL), patience=2)
    wd.observe({T.HEAD_K_FULL: 1, T.TAIL_K_FULL: 0})
    wd.observe({T.HEAD_K_FULL: 1, T.TAIL_K_FULL: 1})
    wd.observe({T.HEAD_K_FULL: 2, T.TAIL_K_FULL: 1})   # each moved within the last 2 observations
    wd.observe({T.HEAD_K_FULL: 2, T.TAIL_K_FULL: 2})
    with pytest.raises(kc.CanaryNotRunningError, match=r"HEAD_K_FULL \(kernel runs stuck at 2\)"):
        wd.observe({T.HEAD_K_FULL: 2, T.TAIL_K_FULL: 3})
    with pytest.raises(ValueError, match="patience must be a positive int, got 0"):
        kc.CanaryWatchdog((T.HEAD_K_FULL,), patience=0)


def test_health_counts_launches_and_slots():
    e = prefilled()
    h = e.c.health()
    head = h.tags[T.HEAD_K_FULL]
    # Step 1 prefills 6 + 4 tokens (no prefix); step 2 verifies 6 + 4 prefix slots and stamps 2.
    assert (head.verify_launches, head.verified_slots, head.write_launches, head.stamped_slots) == (2, 10, 2, 12)
    assert head.kernel_runs == 4 and head.slot_runs == 22
    assert h.protected_tokens == 12 and h.verified_slots == 20 and h.steps["end_step"] == 4
    assert "HEAD_K_FULL" in str(h)


# ------------------------------------------------------------------------------------------ sweep


def _sweep_args(e: Tiny, row: int):
    slots = e.slots[row]
    return t64(slots), t64(list(range(len(slots)))), t64([-1, *slots[:-1]])


def test_sweep_finds_idle_real_kv_corruption_only_there():
    e = prefilled()
    e.c.sweep(*_sweep_args(e, 1))
    assert e.c.poll(sync=True) == []
    exp = faults.flip_idle_slot_byte(e.source, slot=e.slots[1][4], byte=3, mask=0x40)
    e.step({2: [26]})                         # request 1 is idle: HEAD/TAIL do not read its slots
    assert e.c.poll(sync=True) == []
    e.c.sweep(*_sweep_args(e, 1))
    found = e.c.poll(sync=True)
    assert [(v.tag, v.slot, v.reasons) for v in found] == [(T.SWEEP_K_FULL, e.slots[1][4], F.VERIFY_REAL_KV_HASH_MISMATCH)]
    assert exp.found_in(found) == found
    assert e.c.health().sweeps == 2


def test_sweep_in_chunks_equals_one_launch():
    a, b = prefilled(), prefilled(sweep_capacity=3)
    for e in (a, b):
        e.slots[1][2], e.slots[1][3] = e.slots[1][3], e.slots[1][2]  # a wrong walk: chain and position
        e.c.sweep(*_sweep_args(e, 1), expected_tokens=t64([11, 12, 13, 99, 15, 16, 17]))
    va, vb = a.c.poll(sync=True), b.c.poll(sync=True)
    assert va and [v.to_row() for v in va] == [v.to_row() for v in vb]
    assert any(v.reasons & F.VERIFY_TOKEN_MISMATCH for v in va)
    ha, hb = a.c.health(), b.c.health()
    assert ha.tags[T.SWEEP_K_FULL].verified_slots == hb.tags[T.SWEEP_K_FULL].verified_slots == 7
    assert (ha.tags[T.SWEEP_K_FULL].verify_launches, hb.tags[T.SWEEP_K_FULL].verify_launches) == (1, 3)


def test_sweep_checks_arguments():
    e = prefilled()
    with pytest.raises(kc.KvCanaryDTypeError, match="kv-canary: slots must have dtype int64, got int32"):
        e.c.sweep(torch.zeros(2, dtype=torch.int32), t64([0, 1]), t64([-1, 1]))
    with pytest.raises(ValueError, match="kv-canary: positions length must be 2, got 3"):
        e.c.sweep(t64([1, 2]), t64([0, 1, 2]), t64([-1, 1]))
    with pytest.raises(ValueError, match=r"kv-canary: group must be one of \('full',\), got 'swa'"):
        e.c.sweep(t64([1]), t64([0]), t64([-1]), group="swa")


# ------------------------------------------------------------------------------------------ SWA group


def test_swa_group_uses_the_table_and_reports_out_of_range_slots():
    e = Tiny(swa_window=3)
    e.step({1: [11, 12, 13, 14, 15]})
    e.step({1: [16]})
    assert e.c.poll(sync=True) == []
    swa = e.c.health().tags[T.HEAD_K_SWA]
    assert swa.verified_slots == 3 and swa.stamped_slots == 6   # the window of the 5-token prefix
    # The SWA records sit at table-translated slots (FULL slot + 100).
    rec = e.c.buffer("head", "k", "swa")[e.slots[1][2] + 100].view(torch.int64)
    assert rec[0].item() == 13 and rec[1].item() == 2

    args = e.batch({1: [17]})
    args["out_cache_loc"][0] = 64 + 5                # past the 65-entry table
    e.c.step("head", **args)
    found = [v for v in e.c.poll(sync=True) if v.tag == T.HEAD_K_SWA]
    assert [(v.slot, v.reasons) for v in found] == [(200, F.SLOT_OUT_OF_RANGE)]  # swa.num_slots


def test_explicit_swa_out_cache_loc_equals_translation():
    a, b = Tiny(swa_window=2), Tiny(swa_window=2)
    for new in ({1: [1, 2, 3], 2: [4, 5]}, {1: [6], 2: [7]}, {1: [8], 2: [9]}):
        a.step(new)
        b.step(new, hook=lambda args: args.update(swa_out_cache_loc=args["out_cache_loc"] + 100))
    for tag in (T.HEAD_K_SWA, T.TAIL_K_SWA):
        assert torch.equal(a.c.buffers[tag], b.c.buffers[tag])
    assert torch.count_nonzero(a.c.buffers[T.TAIL_K_SWA]) > 0


def test_swa_without_scratch_needs_explicit_locations():
    lut = torch.zeros(9, dtype=torch.int64)
    c = KVCanary(num_slots=8, max_batch_size=2, swa=kc.SwaConfig(num_slots=8, window_size=2,
                                                                  full_to_swa_index_mapping=lut))
    r2t = torch.zeros((2, 4), dtype=torch.int32)
    with pytest.raises(ValueError, match="needs swa_out_cache_loc"):
        c.step("head", req_pool_indices=t64([1]), prefix_lens=t64([0]), extend_seq_lens=t64([1]), req_to_token=r2t,
               input_ids=t64([5]), positions=t64([0]), out_cache_loc=t64([1]))


# ------------------------------------------------------------------------------------------ assorted contracts


def test_warmup_turns_the_chain_position_assert_off():
    e = prefilled()
    with e.c.warmup():
        assert not e.c.chain_position_assert
        e.step({1: [18]}, hook=lambda a: faults.shift_position(a["positions"], index=0, delta=3))
    assert e.c.chain_position_assert
    wrote = [v for v in e.c.poll(sync=True) if v.kernel == "write"]
    assert wrote == []
    exp = [None]
    e.step({2: [26]}, hook=lambda a: exp.__setitem__(0, faults.shift_position(a["positions"], index=0,
                                                                               out_cache_loc=a["out_cache_loc"])))
    assert exp[0].found_in(e.c.poll(sync=True))


def test_write_input_assert_catches_swapped_tokens_in_the_same_step():
    e = prefilled()
    exp = [None]

    def hook(args):
        args["expected_input_tokens"] = args["input_ids"].clone()
        args["expected_input_positions"] = args["positions"].clone()
        exp[0] = faults.swap_input_tokens(args["input_ids"], i=0, j=1, out_cache_loc=args["out_cache_loc"],
                                          check="write")

    args = e.batch({1: [18], 2: [26]})
    hook(args)
    e.c.step("head", **args)
    found = e.c.poll(sync=True)
    hits = exp[0].found_in(found)
    assert len(hits) == 2 and {v.slot for v in hits} == set(exp[0].slots)
    assert all(v.step == e.c.step_number for v in hits)


@pytest.mark.parametrize("change, exc, message", [
    (dict(phase="middle"), ValueError, "kv-canary: phase must be 'head' or 'tail', got 'middle'"),
    (dict(expected_input_tokens=t64([1])), ValueError,
     "kv-canary: expected_input_tokens and expected_input_positions must be given together"),
    (dict(input_ids=t64(list(range(17))), positions=t64([0] * 17), out_cache_loc=t64([0] * 17)), ValueError,
     "kv-canary: input_ids has 17 tokens, more than max_tokens_per_step=16"),
    (dict(req_to_token=torch.zeros((4, 32), dtype=torch.int64)), kc.KvCanaryDTypeError,
     "kv-canary: req_to_token must have dtype int32, got int64"),
    # The batch arrays (checked on every call, fast path or not).
    (dict(input_ids=torch.tensor([18], dtype=torch.int32)), kc.KvCanaryDTypeError,
     "kv-canary: input_ids must have dtype int64, got int32"),
    (dict(req_pool_indices=t64([1, 0, 2, 0])[::2], prefix_lens=t64([6, 4]), extend_seq_lens=t64([1, 0])), ValueError,
     "kv-canary: req_pool_indices must be contiguous"),
    (dict(prefix_lens=t64([6, 0])), ValueError, "kv-canary: prefix_lens length must be 1, got 2"),
    (dict(out_cache_loc=t64([[7]])), ValueError, "kv-canary: out_cache_loc must be 1-D, got shape (1, 1)"),
    (dict(positions=t64([6, 7])), ValueError, "kv-canary: positions length must be 1, got 2"),
    (dict(req_pool_indices=t64([1] * 5), prefix_lens=t64([6] * 5), extend_seq_lens=t64([1] + [0] * 4)), ValueError,
     "kv-canary: batch size 5 exceeds max_batch_size=4"),
    (dict(extend_seq_lens=torch.ones(1, dtype=torch.int64, device="meta")), ValueError,
     "kv-canary: extend_seq_lens is on device meta, which kvcanary does not support (cpu or cuda only)"),
])
def test_step_argument_errors_write_nothing(change, exc, message):
    e = prefilled()
    before = [b.clone() for b in e.c.buffers.values()]
    args = e.batch({1: [18]})
    phase = change.pop("phase", "head")
    args.update(change)
    with pytest.raises(exc) as err:
        e.c.step(phase, **args)
    assert str(err.value) == message
    assert all(torch.equal(a, b) for a, b in zip(before, e.c.buffers.values()))


def test_constructor_errors():
    with pytest.raises(ValueError, match="kv-canary: num_slots must be positive, got 0"):
        KVCanary(num_slots=0, max_batch_size=2)
    with pytest.raises(ValueError, match="kv-canary: verify_capacity must be non-negative, got -3"):
        KVCanary(num_slots=8, max_batch_size=2, verify_capacity=-3)
    pool = torch.zeros((1, 4, 16), dtype=torch.float16)   # covers 4 slots, the canary has 8
    src = kc.RealKvSource(tensor=pool, page_size=4, num_bytes_per_token=32, read_bytes=32)
    # SPEC §9: accepted (SGLang allows it); a touched slot the source does not cover is reported instead.
    KVCanary(num_slots=8, max_batch_size=2, k_sources=(src,))
    with pytest.raises(ValueError, match="kv-canary: v_sources were given but with_v is False"):
        KVCanary(num_slots=4, max_batch_size=2, v_sources=(src,), with_v=False)


def test_constructor_type_and_mode_errors():
    with pytest.raises(TypeError, match="kv-canary: swa must be a SwaConfig, got dict"):
        KVCanary(num_slots=8, max_batch_size=2, swa={"num_slots": 4})
    with pytest.raises(ValueError, match=r"kv-canary: real_kv_hash_mode must be a RealKvHashMode \(0, 1 or 2\), got 5"):
        KVCanary(num_slots=8, max_batch_size=2, real_kv_hash_mode=5)


def test_host_stager_returns_earlier_copies_in_order_and_counts_drops():
    from kvcanary.runtime.staging import HostStager

    src = torch.zeros(2, dtype=torch.int64)
    st = HostStager([src], torch.device("cpu"), depth=3)
    for k in range(1, 5):
        src.fill_(k)
        st.stage(k)
    # depth 3: the copy of stage 1 was dropped when stage 4 reused its slot; the latest is held back.
    assert st.dropped == 1
    got = st.take_landed()
    assert [(c.label, c.values[0].tolist()) for c in got] == [(2, [2, 2]), (3, [3, 3])]
    assert st.take_landed() == []
    assert [(c.label, c.values[0].tolist()) for c in st.take_landed(include_latest=True)] == [(4, [4, 4])]


def test_from_pool_geometry_and_buffers():
    c = KVCanary.from_pool_geometry(pool_slots=100, max_running_requests=4, max_prefill_tokens=64, with_v=True)
    assert c.verify_capacity == 300
    assert c.max_batch_size == 5 and c.max_tokens_per_step == 68
    assert set(c.buffers) == {T.HEAD_K_FULL, T.HEAD_V_FULL, T.TAIL_K_FULL, T.TAIL_V_FULL}
    assert c.buffer("sweep", "v") is c.buffers[T.TAIL_V_FULL]
    assert all(tuple(b.shape) == (100, 32) and b.dtype == torch.uint8 for b in c.buffers.values())
    assert c.tags(("sweep",)) == (T.SWEEP_K_FULL, T.SWEEP_V_FULL)


def test_sweep_accepts_numpy_arrays_zero_copy_and_refuses_other_devices():
    import numpy as np

    a, b = prefilled(), prefilled()
    slots, positions, prev = _sweep_args(a, 1)
    a.c.sweep(slots, positions, prev)
    b.c.sweep(slots.numpy(), positions.numpy(), prev.numpy())      # any __dlpack__ array on the canary's device
    assert a.c.health().tags == b.c.health().tags and b.c.poll(sync=True) == []
    with pytest.raises(kc.KvCanaryDTypeError, match="kv-canary: slots must have dtype int64, got int32"):
        b.c.sweep(np.zeros(2, np.int32), positions.numpy()[:2], prev.numpy()[:2])
    meta = torch.zeros(2, dtype=torch.int64, device="meta")
    with pytest.raises(ValueError, match="kv-canary: slots is on device meta"):
        b.c.sweep(meta, meta, meta)


@pytest.mark.parametrize("swa_window", [0, 3])
def test_invalid_rows_are_summed_over_steps_once_per_verify_of_the_full_group(swa_window):
    """A batch row outside the table (req_pool_indices >= the table's rows) is rejected by the bounds rule; the
    canary's running count grows by the invalid rows of every HEAD and TAIL verify of the FULL group (the SWA
    group verifies the same rows and must not count them twice)."""
    e = prefilled(swa_window=swa_window)
    assert e.c.poll(sync=True) == [] and e.c.health().invalid_rows == 0
    steps, bad_rows = 3, 2
    for i in range(steps):
        args = e.batch({1: [30 + i]})
        n_rows = 1 + bad_rows
        args["req_pool_indices"] = t64([1] + [4 + j for j in range(bad_rows)])  # the table has rows 0..3
        args["prefix_lens"] = t64([len(e.tokens[1])] + [0] * bad_rows)
        args["extend_seq_lens"] = t64([1] + [0] * bad_rows)
        assert args["req_pool_indices"].shape[0] == n_rows
        e.c.step("head", **args)
        e.forward(args)
        e.c.step("tail", **args)
        e.commit({1: [30 + i]})
    assert e.c.poll(sync=True) == []
    assert e.c.health().invalid_rows == 2 * steps * bad_rows


def test_a_table_changed_in_place_between_steps_is_checked_again():
    """The step reuses the last table's checks only while it is the same tensor at the same address with the same
    dtype, shape and strides; the same object re-pointed (set_) or resized is checked again (and refused when it
    became invalid), never launched stale."""
    e = prefilled()
    e.step({1: [17]})
    args = e.batch({1: [18]})
    table = args["req_to_token"]
    old_views = e.c._table(table, None)
    assert e.c._table(table, None) is old_views   # unchanged: the same views
    # Same object, new storage (a copy at another address): accepted, new views.
    table.set_(table.clone())
    e.c.step("head", **args)
    e.forward(args)
    e.c.step("tail", **args)
    e.commit({1: [18]})
    new_views = e.c._table(table, None)
    assert new_views is not old_views and new_views.req_to_token.ptr == table.data_ptr()
    assert e.c.poll(sync=True) == []
    # Same object, another dtype under it (.data =): checked again and refused.
    with pytest.raises(kc.KvCanaryDTypeError, match="kv-canary: req_to_token must have dtype int32, got int64"):
        saved = table.data
        table.data = saved.to(torch.int64)
        try:
            e.c._table(table, None)
        finally:
            table.data = saved
    # Same object, now a non-contiguous view of its storage: refused, nothing written.
    before = [b.clone() for b in e.c.buffers.values()]
    args = e.batch({1: [19]})
    table.set_(table.untyped_storage(), 0, (4, 16), (32, 2))
    with pytest.raises(ValueError, match="kv-canary: req_to_token must be contiguous"):
        e.c.step("head", **args)
    assert all(torch.equal(a, b) for a, b in zip(before, e.c.buffers.values()))
