"""Fault schedules: random faults over long runs of the engine model are each reported within the bound and
nothing is reported on clean steps (with and without speculative decoding, SWA, chunked prefill and prefix
sharing); a dead detector or a report on a clean step is caught; any engine can drive a schedule; the
configuration from the environment and its errors."""

from __future__ import annotations

import pytest
import torch

import kvcanary as kc
from kvcanary import CanaryLaunchTag as T
from kvcanary import faults
from kvcanary.testing.engine import ServingSimulation, SimConfig
from kvcanary.testing.schedule import FaultNotDetectedError, FaultSchedule

ALL = dict.fromkeys(faults.FAULT_NAMES, 0.02)


def _run(schedule: FaultSchedule, config: SimConfig, steps: int) -> ServingSimulation:
    sim = ServingSimulation(config, fault_schedule=schedule)
    sim.run(steps)
    schedule.enabled = False           # no new faults: the last ones get their chance to be reported
    sim.run(schedule.detect_within)
    sim.finish_fault_schedule()
    return sim


def _check(schedule: FaultSchedule, sim: ServingSimulation, targets: set[tuple[str, str]]) -> None:
    fs = schedule.faults
    assert len(fs) >= 40, schedule.summary()
    assert {f.name for f in fs} == set(faults.FAULT_NAMES), schedule.summary()
    assert {(f.group, f.kv) for f in fs} == targets
    # Every injected fault was reported, by the row its injector documents, within the bound.
    assert not schedule.missed
    for f in fs:
        assert f.reported_at is not None and f.report is not None, schedule.describe_miss(f, sim.step_index)
        assert f.expected.matches(f.report)
        assert 0 <= f.latency <= schedule.detect_within and f.step <= f.launch_step <= f.reported_at
        assert f.contained_at == f.reported_at
    assert min(f.step for f in fs) > schedule.warmup_steps - 1
    # Nothing was reported by a launch while no fault was in flight (the damage of each was contained).
    assert schedule.clean_step_violations == []
    # Faults really were in flight for only part of the run: most steps were clean.
    in_flight = {s for f in fs for s in range(f.step, f.contained_at + 1)}
    assert len(in_flight) < sim.step_index * 0.7
    s = sim.stats
    assert s["cache_hits"] > 10 and s["partial_chunks"] > 50 and s["swa_frees"] > 100 and s["aborted"] > 0


def test_schedule_over_1000_steps_every_fault_reported_in_time_and_clean_steps_clean():
    schedule = FaultSchedule(ALL, warmup_steps=20, targets="*:*", detect_within=12, seed=3)
    sim = _run(schedule, SimConfig(seed=11), 1000)
    _check(schedule, sim, {(g, kv) for g in ("full", "swa") for kv in ("k", "v")})
    latency = {name: max(f.latency for f in schedule.faults if f.name == name) for name in faults.FAULT_NAMES}
    # The documented timing: HEAD/TAIL faults are read the step after their launch at the latest; swapped
    # tokens and recycled slots are seen by the next step's HEAD; an idle slot only by a sweep.
    assert all(latency[n] <= 1 for n in ("remap_req_to_token", "flip_real_kv_byte", "shift_position"))
    assert latency["swap_input_tokens"] <= 2 and latency["recycle_slot"] <= 2
    assert latency["flip_idle_slot_byte"] <= sim.cfg.sweep_every + 1


def test_schedule_over_1000_steps_with_speculation_swa_chunked_prefill_and_sharing():
    cfg = SimConfig(seed=12, spec_tokens=3, with_v=False, max_running=5)
    schedule = FaultSchedule(ALL, warmup_steps=20, targets="full:k,swa:k", detect_within=12, seed=4)
    sim = _run(schedule, cfg, 1000)
    _check(schedule, sim, {("full", "k"), ("swa", "k")})
    s = sim.stats
    assert s["drafted"] > s["accepted"] > 100 and s["draft_forwards"] > 1000
    assert sim.draft_canary is not None and sim.draft_canary.health().protected_tokens == s["draft_tokens"]


def test_a_dead_detector_raises_naming_the_fault_the_step_and_what_was_expected():
    # Real-KV fingerprints off: a flipped KV byte goes unnoticed, and the schedule says so.
    schedule = FaultSchedule({"flip_real_kv_byte": 1.0}, warmup_steps=5, detect_within=4, seed=0)
    sim = ServingSimulation(SimConfig(seed=1), fault_schedule=schedule,
                            canary_kwargs=dict(real_kv_hash_mode=kc.RealKvHashMode.NONE))
    with pytest.raises(FaultNotDetectedError) as err:
        sim.run(30)
    f = err.value.fault
    assert (f.name, f.step, f.group, f.kv, f.missed) == ("flip_real_kv_byte", 5, "full", "k", True)
    assert sim.step_index == 5 + 4          # raised at the end of the step the bound ran out
    message = str(err.value)
    assert message.startswith("kv-canary: fault flip_real_kv_byte injected at step 5 (full:k) was not reported "
                              "within 4 steps (checked at step 9): expected flip_real_kv_byte: TAIL_K_FULL "
                              "real_kv_hash at slot(s) ")
    assert "first TAIL verify after the edit" in message and "0 other violation(s) reported since" in message
    assert schedule.missed == [f] and f.contained_at == 9


def test_a_miss_is_recorded_when_not_raising_and_the_report_lists_what_was_seen():
    # The fault is planted but reported under another tag than its expectation names: a miss, with the
    # rows seen since in the report.
    schedule = FaultSchedule({"remap_req_to_token": 1.0}, warmup_steps=3, detect_within=2, raise_on_miss=False)

    def plant(name, kv, group, rng):
        inj = sim.plant_fault(name, batch[0], rng, kv=kv, group=group)
        wrong = faults.ExpectedViolation(inj.expected.fault, T.SWEEP_K_SWA, inj.expected.reasons, inj.expected.slots,
                                         inj.expected.when, inj.expected.description)
        return faults.Injection(wrong, inj.contain)

    sim = ServingSimulation(SimConfig(seed=2))
    batch = []
    for step in range(8):
        sim.step(lambda s, b: (batch.clear(), batch.append(b), schedule.inject(s.step_index, plant)))
        found = sim.canary.poll()
        schedule.observe(step, found, [sim.engine_step_of(v)[0] for v in found])
        schedule.end_step(step)
    assert schedule.missed and schedule.missed[0].step == 3
    text = schedule.describe_miss(schedule.missed[0], 5)
    assert "expected remap_req_to_token: SWEEP_K_SWA" in text
    assert "other violation(s) reported since\n  kv_canary violation: launch_tag=HEAD_K_FULL" in text


def test_a_report_on_a_clean_step_is_recorded():
    # A fault planted behind the schedule's back (no injection in flight) is a report on a clean step.
    schedule = FaultSchedule({"remap_req_to_token": 0.0})
    sim = ServingSimulation(SimConfig(seed=3), fault_schedule=schedule)
    sim.run(12)
    assert schedule.faults == [] and schedule.clean_step_violations == []
    planted = []
    sim.step(lambda s, b: planted.append(s.plant_fault("remap_req_to_token", b)))
    sim.run(2)
    sim.finish_fault_schedule()
    assert planted[0] is not None
    assert planted[0].expected.found_in(schedule.clean_step_violations)


class Decoder:
    """An engine that is not the engine model: three requests (rows 1-3) decoding one token per step, a slot
    pool with no reuse, and its own fault hook and containment (restore the table entry)."""

    def __init__(self, schedule: FaultSchedule):
        self.schedule = schedule
        self.k_pool = torch.zeros((512, 16), dtype=torch.int16)
        src = kc.RealKvSource(tensor=self.k_pool, page_size=1, num_bytes_per_token=32, read_bytes=32)
        self.canary = kc.KVCanary(num_slots=512, max_batch_size=3, k_sources=(src,), mode="quiet")
        self.r2t = torch.zeros((4, 160), dtype=torch.int32)
        self.lens = {1: 0, 2: 0, 3: 0}
        self.next_slot = 1
        self.step_of: dict[int, int] = {}

    def plant(self, name, kv, group, rng):
        row = int(rng.integers(1, 4))
        p = self.lens[row] - 2
        other = 1 + row % 3
        new = int(self.r2t[other, int(rng.integers(self.lens[other]))])
        old = int(self.r2t[row, p])
        exp = faults.remap_req_to_token(self.r2t, req_pool_index=row, position=p, new_slot=new)
        return faults.Injection(exp, lambda: self.r2t.__setitem__((row, p), old))

    def step(self, i: int) -> None:
        rows = [1, 2, 3]
        n = 4 if i == 0 else 1          # a 4-token prompt, then decode
        ids, pos, loc = [], [], []
        for r in rows:
            slots = list(range(self.next_slot, self.next_slot + n))
            self.next_slot += n
            self.r2t[r, self.lens[r]:self.lens[r] + n] = torch.tensor(slots, dtype=torch.int32)
            ids += [100 * r + self.lens[r] + j for j in range(n)]
            pos += list(range(self.lens[r], self.lens[r] + n))
            loc += slots
        if i > 0:
            self.schedule.inject(i, self.plant)
        t = lambda x: torch.tensor(x, dtype=torch.int64)
        args = dict(req_pool_indices=t(rows), prefix_lens=t([self.lens[r] for r in rows]),
                    extend_seq_lens=t([n] * 3), req_to_token=self.r2t, input_ids=t(ids), positions=t(pos),
                    out_cache_loc=t(loc))
        for phase in ("head", "tail"):
            if phase == "tail":
                self.k_pool[t(loc)] = (t(ids)[:, None] * 7 + torch.arange(16)).to(torch.int16)
            self.canary.step(phase, **args)
            self.step_of[self.canary.step_number] = i
        for r in rows:
            self.lens[r] += n
        found = self.canary.poll()
        self.schedule.observe(i, found, [self.step_of.get(v.step, i) for v in found])
        self.schedule.end_step(i)


def test_any_engine_can_run_a_schedule_with_its_own_hook():
    schedule = FaultSchedule({"remap_req_to_token": 0.3}, warmup_steps=2, detect_within=3, seed=5)
    engine = Decoder(schedule)
    for i in range(120):
        engine.step(i)
    assert len(schedule.faults) > 10 and not schedule.missed
    assert all(f.latency == 0 for f in schedule.faults)   # the HEAD verify of the step, read by its TAIL
    assert schedule.clean_step_violations == []            # restoring the entry contained each fault


# ------------------------------------------------------------------------------------------ configuration


def test_from_env_reads_every_variable():
    env = {"KVCANARY_FAULT_PROBS": " remap_req_to_token=0.02, flip_real_kv_byte = 1e-2 ,",
           "KVCANARY_FAULT_WARMUP_STEPS": "100", "KVCANARY_FAULT_TARGET": "swa:v, full:*",
           "KVCANARY_FAULT_DETECT_WITHIN": "20", "KVCANARY_FAULT_SEED": "7", "KVCANARY_FAULT_MAX_IN_FLIGHT": "2"}
    s = FaultSchedule.from_env(env)
    assert s is not None
    assert s.probs == {"remap_req_to_token": 0.02, "flip_real_kv_byte": 0.01}
    assert (s.warmup_steps, s.detect_within, s.seed, s.max_in_flight) == (100, 20, 7, 2)
    assert s.targets == [("swa", "v"), ("full", "k"), ("full", "v")]
    assert s.raise_on_miss


def test_from_env_defaults_and_absence():
    assert FaultSchedule.from_env({}) is None
    assert FaultSchedule.from_env({"KVCANARY_FAULT_PROBS": "  "}) is None
    s = FaultSchedule.from_env({"KVCANARY_FAULT_PROBS": "shift_position=0.5"})
    assert s is not None and s.probs == {"shift_position": 0.5}
    assert (s.warmup_steps, s.detect_within, s.seed, s.max_in_flight, s.targets) == (0, 16, 0, 1, [("full", "k")])
    s = FaultSchedule.from_env({"KVCANARY_FAULT_PROBS": "shift_position=0.5"}, detect_within=3, raise_on_miss=False)
    assert s is not None and s.detect_within == 3 and not s.raise_on_miss
    s = FaultSchedule.from_env({"KVCANARY_FAULT_PROBS": "recycle_slot=1", "KVCANARY_FAULT_TARGET": "*:*"})
    assert s is not None and s._targets_of("recycle_slot") == [("full", "k"), ("full", "v")]


def test_from_env_reads_os_environ(monkeypatch):
    monkeypatch.setenv("KVCANARY_FAULT_PROBS", "swap_input_tokens=0.25")
    monkeypatch.setenv("KVCANARY_FAULT_SEED", "9")
    s = FaultSchedule.from_env()
    assert s is not None and s.probs == {"swap_input_tokens": 0.25} and s.seed == 9


@pytest.mark.parametrize(("env", "message"), [
    ({"KVCANARY_FAULT_PROBS": "remap=0.1"},
     r"KVCANARY_FAULT_PROBS: unknown fault 'remap'; choose from \('remap_req_to_token', "),
    ({"KVCANARY_FAULT_PROBS": "remap_req_to_token"},
     r"KVCANARY_FAULT_PROBS entries must be NAME=PROBABILITY, got 'remap_req_to_token' in 'remap_req_to_token'"),
    ({"KVCANARY_FAULT_PROBS": "=0.1"}, r"KVCANARY_FAULT_PROBS entries must be NAME=PROBABILITY, got '=0.1' in '=0.1'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=1.5"},
     r"KVCANARY_FAULT_PROBS: the probability of shift_position must be a number in \[0, 1\], got '1.5'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=often"},
     r"KVCANARY_FAULT_PROBS: the probability of shift_position must be a number in \[0, 1\], got 'often'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=nan"},
     r"KVCANARY_FAULT_PROBS: the probability of shift_position must be a number in \[0, 1\], got 'nan'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=0.1,shift_position=0.2"},
     r"KVCANARY_FAULT_PROBS: fault 'shift_position' is given twice"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=0.1", "KVCANARY_FAULT_WARMUP_STEPS": "-1"},
     r"KVCANARY_FAULT_WARMUP_STEPS must be a non-negative integer, got '-1'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=0.1", "KVCANARY_FAULT_WARMUP_STEPS": "1.5"},
     r"KVCANARY_FAULT_WARMUP_STEPS must be a non-negative integer, got '1.5'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=0.1", "KVCANARY_FAULT_DETECT_WITHIN": "0"},
     r"KVCANARY_FAULT_DETECT_WITHIN must be a positive integer, got '0'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=0.1", "KVCANARY_FAULT_MAX_IN_FLIGHT": "x"},
     r"KVCANARY_FAULT_MAX_IN_FLIGHT must be a positive integer, got 'x'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=0.1", "KVCANARY_FAULT_SEED": "-3"},
     r"KVCANARY_FAULT_SEED must be a non-negative integer, got '-3'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=0.1", "KVCANARY_FAULT_TARGET": "full:x"},
     r"KVCANARY_FAULT_TARGET entries must be GROUP:KV with GROUP full, swa or \* and KV k, v or \*, got 'full:x'"),
    ({"KVCANARY_FAULT_PROBS": "shift_position=0.1", "KVCANARY_FAULT_TARGET": "full"},
     r"KVCANARY_FAULT_TARGET entries must be GROUP:KV .*, got 'full'"),
    ({"KVCANARY_FAULT_PROBS": "recycle_slot=0.1", "KVCANARY_FAULT_TARGET": "swa:k"},
     r"fault 'recycle_slot' supports groups \('full',\), none of targets=swa:k"),
])
def test_from_env_refuses_bad_values_with_a_clear_error(env, message):
    with pytest.raises(ValueError, match="^kv-canary: " + message):
        FaultSchedule.from_env(env)


def test_constructor_checks_its_arguments():
    with pytest.raises(ValueError, match=r"kv-canary: unknown fault 'x'"):
        FaultSchedule({"x": 0.1})
    with pytest.raises(ValueError, match=r"kv-canary: probs\['shift_position'\] must be a probability in \[0, 1\], got -0.1"):
        FaultSchedule({"shift_position": -0.1})
    with pytest.raises(ValueError, match=r"kv-canary: probs\['shift_position'\] must be a probability in \[0, 1\], got True"):
        FaultSchedule({"shift_position": True})
    with pytest.raises(ValueError, match=r"kv-canary: detect_within must be an integer >= 1, got 0"):
        FaultSchedule({}, detect_within=0)
    with pytest.raises(ValueError, match=r"kv-canary: targets must name at least one GROUP:KV target, got ''"):
        FaultSchedule({}, targets="")
    with pytest.raises(ValueError, match=r"kv-canary: targets entries must be GROUP:KV .*got \('full', 'k', 'v'\)"):
        FaultSchedule({}, targets=[("full", "k", "v")])
    s = FaultSchedule({}, targets=[("swa", "*")])
    assert s.targets == [("swa", "k"), ("swa", "v")]
    with pytest.raises(ValueError, match=r"kv-canary: launch_steps must give one step per violation: 0 for 1"):
        s.observe(0, [kc.Violation.from_row([0] * 8)], [])
