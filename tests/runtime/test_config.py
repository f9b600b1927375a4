"""Configuration from the environment (KVCANARY_*)."""

from __future__ import annotations

import pytest

import kvcanary as kc
from kvcanary.runtime.config import CanaryConfig


def test_defaults_when_nothing_is_set():
    cfg = CanaryConfig.from_env({})
    assert cfg == CanaryConfig()
    assert not cfg.enabled and cfg.mode == "log" and cfg.real_kv_hash_mode is None
    assert cfg.canary_kwargs() == dict(mode="log", ring_capacity=1024, sweep_interval=None, stats_interval=None,
                                       watchdog_patience=16)


def test_every_variable_is_read():
    env = {"KVCANARY_ENABLE": "1", "KVCANARY_MODE": "raise", "KVCANARY_REAL_KV_MODE": "ALL",
           "KVCANARY_SWEEP_INTERVAL": "8", "KVCANARY_RING_CAPACITY": "64", "KVCANARY_STATS_INTERVAL": "100",
           "KVCANARY_WATCHDOG_PATIENCE": "0"}
    cfg = CanaryConfig.from_env(env)
    assert cfg.enabled and cfg.mode == "raise" and cfg.real_kv_hash_mode == kc.RealKvHashMode.ALL
    assert (cfg.sweep_interval, cfg.ring_capacity, cfg.stats_interval, cfg.watchdog_patience) == (8, 64, 100, 0)
    c = kc.KVCanary.from_env(environ=env, num_slots=16, max_batch_size=2)
    assert c.mode == "raise" and c.real_kv_hash_mode == kc.RealKvHashMode.ALL and c.ring_capacity == 64
    assert c.sweep_interval == 8 and c.stats_line is not None and c.stats_line.interval == 100
    assert c.watchdog is None  # patience 0 turns it off


def test_code_wins_over_the_environment():
    c = kc.KVCanary.from_env(environ={"KVCANARY_MODE": "raise"}, num_slots=16, max_batch_size=2, mode="quiet")
    assert c.mode == "quiet"


@pytest.mark.parametrize("name, value, message", [
    ("KVCANARY_MODE", "loud", "kv-canary: KVCANARY_MODE must be one of ('log', 'raise', 'quiet'), got 'loud'"),
    ("KVCANARY_REAL_KV_MODE", "some", "kv-canary: KVCANARY_REAL_KV_MODE must be one of ('none', 'partial', 'all'), "
                                      "got 'some'"),
    ("KVCANARY_RING_CAPACITY", "0", "kv-canary: KVCANARY_RING_CAPACITY must be an integer >= 1, got '0'"),
    ("KVCANARY_SWEEP_INTERVAL", "often", "kv-canary: KVCANARY_SWEEP_INTERVAL must be an integer >= 0, got 'often'"),
    ("KVCANARY_WATCHDOG_PATIENCE", "-1", "kv-canary: KVCANARY_WATCHDOG_PATIENCE must be an integer >= 0, got '-1'"),
    ("KVCANARY_ENABLE", "yes", "kv-canary: KVCANARY_ENABLE must be one of ('0', '1', 'true', 'false', 'on', 'off'), "
                               "got 'yes'"),
])
def test_bad_values_name_the_variable(name, value, message):
    with pytest.raises(ValueError) as e:
        CanaryConfig.from_env({name: value})
    assert str(e.value) == message


def test_fault_schedule_variables_are_left_to_the_schedule():
    # The runtime's config does not read the testing aid's variables; FaultSchedule.from_env does.
    env = {"KVCANARY_FAULT_PROBS": "remap_req_to_token=0.25", "KVCANARY_FAULT_SEED": "3",
           "KVCANARY_FAULT_TARGET": "swa:v", "KVCANARY_MODE": "raise"}
    assert CanaryConfig.from_env(env) == CanaryConfig.from_env({"KVCANARY_MODE": "raise"})
    s = kc.faults.FaultSchedule.from_env(env)
    assert isinstance(s, kc.FaultSchedule)
    assert s.probs == {"remap_req_to_token": 0.25} and s.seed == 3 and s.targets == [("swa", "v")]
