"""Every fault injector is detected with its documented tag, reasons, slot and timing, for every target
its registered finder supports; injectors edit in place and check their arguments; the registry."""

from __future__ import annotations

import pytest
import torch

import kvcanary as kc
from kvcanary import CanaryLaunchTag as T
from kvcanary import FailReason as F
from kvcanary import faults
from kvcanary.testing.engine import SimConfig
from kvcanary.testing.scenarios import FAULT_NAMES, run_fault_scenario

# name -> (documented tag, documented bits, simulation steps from the edit to the reporting launch)
DOCUMENTED = {
    "remap_req_to_token": (T.HEAD_K_FULL, F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH, 0),
    "flip_real_kv_byte": (T.TAIL_K_FULL, F.VERIFY_REAL_KV_HASH_MISMATCH, 0),
    "flip_idle_slot_byte": (T.SWEEP_K_FULL, F.VERIFY_REAL_KV_HASH_MISMATCH, None),
    "swap_input_tokens": (T.HEAD_K_FULL, F.VERIFY_TOKEN_MISMATCH, 1),
    "shift_position": (T.HEAD_K_FULL, F.WRITE_POSITION_MISMATCH, 0),
    "recycle_slot": (T.HEAD_K_FULL, F.VERIFY_CHAIN_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH, 1),
}


def test_every_injector_is_covered():
    assert set(FAULT_NAMES) == set(DOCUMENTED) == set(faults.INJECTORS)


def test_every_injector_has_a_registered_scenario():
    assert list(faults.FAULTS) == list(faults.INJECTORS) == list(FAULT_NAMES)
    for name, kind in faults.FAULTS.items():
        assert kind.name == name and kind.injector is faults.INJECTORS[name] and callable(kind.find_target)
        assert set(kind.groups) <= {"full", "swa"} and "full" in kind.groups
        assert kind.detected_by == T(DOCUMENTED[name][0]).name.split("_")[0].lower()
        assert faults.fault_kind(name) is kind


def test_kvcanary_faults_is_a_module_with_the_injectors_and_the_schedule():
    import importlib

    from kvcanary.testing import faults as injectors
    from kvcanary.testing import schedule

    mod = importlib.import_module("kvcanary.faults")
    assert mod is faults is kc.faults
    expected = set(injectors.__all__) | {"FaultSchedule", "FaultNotDetectedError", "ScheduledFault"}
    assert set(mod.__all__) == expected
    for name in injectors.__all__:
        assert getattr(mod, name) is getattr(injectors, name)
    assert mod.FaultSchedule is schedule.FaultSchedule is kc.FaultSchedule
    assert mod.FaultNotDetectedError is schedule.FaultNotDetectedError is kc.FaultNotDetectedError


def test_unknown_fault_is_a_clear_error():
    with pytest.raises(ValueError, match=r"kv-canary: unknown fault 'remap'; choose from \('remap_req_to_token', "):
        faults.fault_kind("remap")
    with pytest.raises(ValueError, match="kv-canary: unknown fault 'nope'"):
        run_fault_scenario("nope")
    with pytest.raises(ValueError, match="kv-canary: fault 'recycle_slot' targets groups \\('full',\\), got group='swa'"):
        run_fault_scenario("recycle_slot", group="swa")
    with pytest.raises(ValueError, match="kv-canary: '<lambda>' is not a registered injector"):
        faults.target_finder(lambda: None)

    def remap_req_to_token():  # the name of an injector, but not the registered function
        raise AssertionError

    with pytest.raises(ValueError, match="kv-canary: 'remap_req_to_token' is not a registered injector"):
        faults.target_finder(remap_req_to_token)
    assert faults.FAULTS["remap_req_to_token"].injector is faults.remap_req_to_token


@pytest.mark.parametrize("seed", [0, 4])
@pytest.mark.parametrize("name", FAULT_NAMES)
def test_fault_detected_as_documented(name, seed):
    r = run_fault_scenario(name, SimConfig(seed=seed), warmup_steps=10)
    tag, bits, delay = DOCUMENTED[name]
    assert r.clean_before and r.note == ""
    assert r.expected.tag == tag and r.expected.reasons == bits
    assert r.detected, f"{name}: expected {r.expected}, got {[str(v) for v in r.violations]}"
    first = r.first
    assert first.tag == tag and (int(first.reasons) & int(bits)) == int(bits)
    assert first.slot in r.expected.slots
    if delay is not None:
        assert r.steps_after_injection(first) == delay
    # Nothing is reported before the edit's effects: every row comes from the injection step or later.
    assert all(r.steps_after_injection(v) is None or r.steps_after_injection(v) >= 0 for v in r.violations)


def test_real_kv_flip_is_invisible_to_head_launches():
    r = run_fault_scenario("flip_real_kv_byte", SimConfig(seed=2), warmup_steps=10)
    assert r.detected
    assert all(v.phase == "tail" and v.reasons == F.VERIFY_REAL_KV_HASH_MISMATCH for v in r.violations)
    assert {v.slot for v in r.violations if v.group == "full"} == set(r.expected.slots)


def test_idle_flip_is_seen_only_by_the_sweep():
    r = run_fault_scenario("flip_idle_slot_byte", SimConfig(seed=3), warmup_steps=10, observe_steps=3)
    assert r.detected and r.note == ""           # note would report rows before the sweep
    assert {(v.tag, v.slot) for v in r.violations} == {(T.SWEEP_K_FULL, s) for s in r.expected.slots}


TARGETS = [(name, group, kv) for name, kind in faults.FAULTS.items() for group in kind.groups for kv in ("k", "v")]


@pytest.mark.parametrize(("name", "group", "kv"), TARGETS)
def test_fault_detected_at_every_target_its_finder_supports(name, group, kv):
    # Half of them with speculative decoding on (the finders pick rows of a verify batch then).
    spec = 3 if kv == "v" else 0
    r = run_fault_scenario(name, SimConfig(seed=7, spec_tokens=spec), warmup_steps=10, kv=kv, group=group)
    tag, bits, delay = DOCUMENTED[name]
    want = T[f"{tag.name.split('_')[0]}_{kv}_{group}".upper()]
    assert r.clean_before and r.note == ""
    assert r.expected.tag == want and r.expected.reasons == bits and r.expected.slots
    assert r.detected, f"{name}: expected {r.expected}, got {[str(v) for v in r.violations[:5]]}"
    assert r.first.tag == want and r.first.slot in r.expected.slots
    if delay is not None:
        assert r.steps_after_injection(r.first) == delay


# ------------------------------------------------------------------------------------------ injector contracts


def test_remap_edits_in_place_and_checks():
    r2t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    ptr = r2t.data_ptr()
    exp = faults.remap_req_to_token(r2t, req_pool_index=1, position=2, new_slot=99)
    assert r2t.data_ptr() == ptr and int(r2t[1, 2]) == 99
    assert exp.slots == frozenset({99}) and exp.tag == T.HEAD_K_FULL
    assert "req_to_token[1, 2]: 6 -> 99" in str(exp)
    with pytest.raises(ValueError, match=r"kv-canary: position must be in \[0, 4\), got 4"):
        faults.remap_req_to_token(r2t, req_pool_index=1, position=4, new_slot=1)
    with pytest.raises(ValueError, match="new_slot must differ from the current slot 99"):
        faults.remap_req_to_token(r2t, req_pool_index=1, position=2, new_slot=99)
    with pytest.raises(TypeError, match="kv-canary: req_to_token must have dtype int32, got int64"):
        faults.remap_req_to_token(r2t.long(), req_pool_index=1, position=2, new_slot=5)
    exp = faults.remap_req_to_token(r2t, req_pool_index=0, position=0, new_slot=7, kv="v", group="swa")
    assert exp.tag == T.HEAD_V_SWA and exp.slots is None     # the SWA slot is unknown without the table
    lut = torch.zeros(16, dtype=torch.int64)
    lut[9] = 42
    exp = faults.remap_req_to_token(r2t, req_pool_index=0, position=1, new_slot=9, group="swa",
                                    full_to_swa_index_mapping=lut)
    assert exp.slots == frozenset({42}) and int(r2t[0, 1]) == 9


def test_batch_injectors_check_their_arguments():
    ids = torch.tensor([5, 5, 6], dtype=torch.int64)
    with pytest.raises(ValueError, match="needs two different tokens, got 5 at both i=0 and j=1"):
        faults.swap_input_tokens(ids, i=0, j=1)
    with pytest.raises(ValueError, match="check must be 'verify' or 'write', got 'both'"):
        faults.swap_input_tokens(ids, i=0, j=2, check="both")
    with pytest.raises(ValueError, match=r"kv-canary: j must be in \[0, 2\), got 2"):
        faults.swap_input_tokens(ids, i=0, j=2, out_cache_loc=torch.tensor([1, 2], dtype=torch.int64))
    assert ids.tolist() == [5, 5, 6]             # nothing edited on bad arguments
    exp = faults.swap_input_tokens(ids, i=0, j=2, check="write", kv="v")
    assert ids.tolist() == [6, 5, 5] and exp.tag == T.HEAD_V_FULL and exp.reasons == F.WRITE_TOKEN_MISMATCH
    pos = torch.tensor([3, 4], dtype=torch.int64)
    with pytest.raises(ValueError, match="delta must be a non-zero int, got 0"):
        faults.shift_position(pos, index=0, delta=0)
    exp = faults.shift_position(pos, index=1, delta=-2)
    assert pos.tolist() == [3, 2] and exp.reasons == F.WRITE_POSITION_MISMATCH and exp.slots is None
    loc = torch.tensor([7, 8], dtype=torch.int64)
    r2t = torch.zeros((2, 4), dtype=torch.int32)
    exp = faults.recycle_slot(loc, r2t, token_index=1, req_pool_index=1, position=3, live_slot=2)
    assert loc.tolist() == [7, 2] and int(r2t[1, 3]) == 2 and exp.slots == frozenset({2})
    with pytest.raises(ValueError, match="kv must be 'k' or 'v' and group 'full' or 'swa'"):
        faults.shift_position(pos, index=0, kv="q")
    assert pos.tolist() == [3, 2]


def test_flip_touches_exactly_one_byte_of_the_slot():
    big = torch.zeros((4, 3, 8), dtype=torch.float16)     # 4 pages x 3 slots x 16 bytes
    src = kc.RealKvSource(tensor=big, page_size=3, num_bytes_per_token=16, read_bytes=16)
    before = big.clone()
    exp = faults.flip_real_kv_byte(src, slot=7, byte=5, mask=0x81)
    raw = big.view(torch.uint8).reshape(4, -1)
    diff = (raw != before.view(torch.uint8).reshape(4, -1)).nonzero().tolist()
    assert diff == [[7 // 3, (7 % 3) * 16 + 5]]
    assert int(raw[2, 21]) == 0x81
    assert exp.tag == T.TAIL_K_FULL and exp.slots == frozenset({7})
    with pytest.raises(ValueError, match=r"kv-canary: slot must be in \[0, 12\), got 12"):
        faults.flip_real_kv_byte(src, slot=12)
    with pytest.raises(ValueError, match=r"kv-canary: mask must be in \[1, 255\], got 0"):
        faults.flip_idle_slot_byte(src, slot=1, mask=0)
    assert faults.flip_idle_slot_byte(src, slot=1).tag == T.SWEEP_K_FULL


def test_expected_violation_matching():
    exp = faults.ExpectedViolation("x", T.TAIL_K_FULL, F.VERIFY_REAL_KV_HASH_MISMATCH, frozenset({5}), "w", "d")
    row = [int(T.TAIL_K_FULL), 5, 0, 1, 1, 0, 0, int(F.VERIFY_REAL_KV_HASH_MISMATCH | F.VERIFY_POSITION_MISMATCH)]
    assert exp.matches(kc.Violation.from_row(row))
    assert not exp.matches(kc.Violation.from_row([int(T.HEAD_K_FULL), *row[1:]]))
    assert not exp.matches(kc.Violation.from_row([*row[:1], 6, *row[2:]]))
    assert not exp.matches(kc.Violation.from_row([*row[:7], int(F.VERIFY_POSITION_MISMATCH)]))
