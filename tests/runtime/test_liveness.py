"""Liveness without a host sync: the stats line and the Prometheus metrics against counters read with a sync,
and the watchdog (on by default) firing when a tag stops running - sweep tags included - and not otherwise."""

from __future__ import annotations

import gc
import logging
import re
import weakref

import pytest
import torch

import kvcanary as kc
from kvcanary import CanaryLaunchTag as T
from kvcanary.runtime.stats import format_stats_line
from kvcanary.testing.engine import ServingSimulation, SimConfig

STATS_RE = re.compile(r"\[canary\] step=(\d+) protected_tokens=(\d+) sweep_passes=(\d+) violations=(\d+) "
                      r"launch_tags_active=(\d+)")


def test_stats_line_fields_match_counters_read_with_a_sync(caplog):
    sim = ServingSimulation(SimConfig(seed=3, sweep_every=5), canary_kwargs=dict(stats_interval=7))
    truth: dict[int, tuple[int, int]] = {}   # canary step -> (protected tokens, violations), read with a sync
    sweeps_at: dict[int, int] = {}
    with caplog.at_level(logging.INFO, logger="kvcanary"):
        for _ in range(60):
            sim.step()
            h = sim.canary.health()
            truth[sim.canary.step_number] = (h.protected_tokens, h.violations_total)
            sweeps_at[sim.canary.step_number] = h.sweeps
    lines = [m for r in caplog.records if (m := STATS_RE.search(r.getMessage()))]
    assert len(lines) >= 10
    for m in lines:
        step, protected, passes, violations, active = (int(x) for x in m.groups())
        if step not in truth:  # staged by a sweep's end_step: the counters equal the step before it
            continue
        assert (protected, violations) == truth[step]
        assert passes <= sweeps_at[max(truth)] and active > 0
    # Exactly SGLang's field names and order.
    assert format_stats_line(step=1, protected_tokens=2, sweep_passes=3, violations=4, launch_tags_active=5) == (
        "[canary] step=1 protected_tokens=2 sweep_passes=3 violations=4 launch_tags_active=5")


def test_stats_interval_is_checked():
    with pytest.raises(ValueError, match="kv-canary: stats_interval must be positive, got 0"):
        kc.KVCanary(num_slots=8, max_batch_size=2, stats_interval=0)


def test_metrics_match_counters_read_with_a_sync():
    prom = pytest.importorskip("prometheus_client")
    registry = prom.CollectorRegistry()
    sim = ServingSimulation(SimConfig(seed=4), canary_kwargs=dict(metrics=registry, name="sim-metrics"))
    sim.run(25)
    # A planted fault gives violations by reason.
    kc.faults.flip_real_kv_byte(sim.k_source, slot=sim.running[0].slots[0], byte=0, mask=0x01)
    sim.run(2)
    found = sim.canary.poll(sync=True)
    assert found
    h = sim.canary.health()
    m = sim.canary.metrics
    assert m is not None
    for tag, c in h.tags.items():
        assert m.value("kvcanary_kernel_launches_total", tag=tag.name, kernel="verify") == c.verify_launches
        assert m.value("kvcanary_kernel_launches_total", tag=tag.name, kernel="write") == c.write_launches
        assert m.value("kvcanary_slots_total", tag=tag.name, kernel="verify") == c.verified_slots
        assert m.value("kvcanary_slots_total", tag=tag.name, kernel="write") == c.stamped_slots
    history = sim.canary.violations
    for flag, label in kc.runtime.report.REASON_LABELS.items():
        expected = sum(1 for v in history if int(v.reasons) & int(flag))
        assert m.value("kvcanary_violations_total", reason=label) == expected
    assert m.value("kvcanary_violations_total", reason="real_kv_hash") > 0
    assert m.value("kvcanary_ring_overflow_violations_total") == h.violations_dropped == 0


def test_metrics_count_ring_overflow():
    prom = pytest.importorskip("prometheus_client")
    registry = prom.CollectorRegistry()
    sim = ServingSimulation(SimConfig(seed=4), canary_kwargs=dict(metrics=registry, ring_capacity=4, mode="quiet"))
    sim.run(10)
    for s in sim.running[0].slots:
        kc.faults.flip_real_kv_byte(sim.k_source, slot=s, byte=0, mask=0x01)
    sim.run(3)
    sim.canary.poll(sync=True)
    h = sim.canary.health()
    assert h.violations_dropped > 0
    assert sim.canary.metrics.value("kvcanary_ring_overflow_violations_total") == h.violations_dropped


def test_metric_families_are_kept_per_registry_object_not_per_address():
    """A registry's metric families live as long as the registry: once it is collected they are gone, so a new
    registry (which may be allocated at the dead one's address) gets families registered in itself, and a canary's
    counters advance where they are read."""
    prom = pytest.importorskip("prometheus_client")
    from kvcanary.runtime import stats

    gc.collect()
    n0 = len(stats._FAMILIES)
    old = prom.CollectorRegistry()
    stats._families(old)
    alive = weakref.ref(old)
    assert len(stats._FAMILIES) == n0 + 1
    del old
    gc.collect()
    assert alive() is None and len(stats._FAMILIES) == n0  # no entry outlives its registry
    for _ in range(20):  # new registries, some possibly at a freed address: each sees its own counters
        reg = prom.CollectorRegistry()
        m = stats.CanaryMetrics(name="c", tags=(T.HEAD_K_FULL,), ring_capacity=1, registry=reg)
        m._fam["dropped"].labels("c").inc(3)
        assert m.value("kvcanary_ring_overflow_violations_total") == 3.0
        del m, reg
        gc.collect()


# ------------------------------------------------------------------------------------------------ watchdog


def test_watchdog_is_on_by_default_and_can_be_turned_off():
    assert kc.KVCanary(num_slots=8, max_batch_size=2).watchdog is not None
    assert kc.KVCanary(num_slots=8, max_batch_size=2, watchdog_patience=None).watchdog is None


def test_watchdog_quiet_over_a_thousand_clean_steps_then_fires_when_sweeps_stop():
    sim = ServingSimulation(SimConfig(seed=7, sweep_every=4, kv_bytes_per_token=16, max_running=4),
                            canary_kwargs=dict(sweep_interval=4, watchdog_patience=6))
    wd = sim.canary.watchdog
    # HEAD/TAIL of both groups, and the SWEEP tags of the FULL group the engine sweeps.
    assert wd is not None and set(wd.tags) == set(sim.canary.tags(("head", "tail"))) | {T.SWEEP_K_FULL, T.SWEEP_V_FULL}
    sim.run(1000)                                        # never fires while every tag runs
    assert sim.canary.poll(sync=True) == []
    sim.cfg = SimConfig(**{**sim.cfg.__dict__, "sweep_every": 0})   # the engine stops sweeping
    steps = 0
    with pytest.raises(kc.CanaryNotRunningError, match=r"SWEEP_K_FULL \(kernel runs stuck at \d+\)") as e:
        for n in range(1, 41):
            steps = n
            sim.step()
    # The SWEEP patience is 2 * 4 + 6 HEAD/TAIL observations: 7 engine steps, up to the 4 steps the last sweep
    # may have been ahead, and one step of staging lag.
    assert 7 <= steps <= 7 + 4 + 1
    assert "HEAD_" not in str(e.value) and "TAIL_" not in str(e.value)


def test_watchdog_fires_when_replays_stop_launching_the_canary():
    sim = ServingSimulation(SimConfig(seed=8, sweep_every=0), canary_kwargs=dict(watchdog_patience=5))
    sim.run(30)
    # A graph replayed without the canary kernels: the engine still calls end_step() after each replay.
    with pytest.raises(kc.CanaryNotRunningError, match=r"HEAD_K_FULL \(kernel runs stuck at \d+\)"):
        for _ in range(20):
            sim.canary.end_step()


def test_watchdog_ignores_sweeps_and_polls_of_an_idle_engine():
    sim = ServingSimulation(SimConfig(seed=9, sweep_every=0), canary_kwargs=dict(watchdog_patience=3))
    sim.run(12)
    slots = torch.tensor(sim.running[0].slots, dtype=torch.int64)
    positions = torch.arange(len(slots), dtype=torch.int64)
    prev = torch.cat([torch.tensor([-1]), slots[:-1]])
    for _ in range(30):   # idle: no forwards, only sweeps and polls
        sim.canary.sweep(slots, positions, prev)
        sim.canary.poll(sync=True)
    assert sim.canary.health().tags[T.SWEEP_K_FULL].verify_launches == 30
