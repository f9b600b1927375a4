"""Liveness without a host sync: a periodic one-line stats log and optional Prometheus metrics.

Both read what :class:`~kvcanary.KVCanary` already has each step: the status snapshots staged one step late
(:mod:`kvcanary.runtime.status`) and the violations decoded from them. Neither waits for the device.

The stats line uses SGLang's fields, so dashboards that scrape SGLang's canary log keep working::

    [canary] step=120 protected_tokens=48210 sweep_passes=15 violations=0 launch_tags_active=8

``step``: the canary step the counters belong to; ``protected_tokens``: tokens stamped by HEAD K FULL writes
(every token that entered the cache through the canary); ``sweep_passes``: ``sweep()`` calls; ``violations``: the
device's violation count; ``launch_tags_active``: launch tags whose kernels ran since the previous line.

Prometheus (``pip install kvcanary[metrics]``): counters per canary (label ``canary``) and launch tag: kernel
launches and slots processed per kernel, violations by reason, violations the ring could not keep.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import numpy as np

from kvcanary.consts import CanaryLaunchTag
from kvcanary.errors import invalid
from kvcanary.ops.checks import check_positive
from kvcanary.runtime.report import REASON_LABELS, Violation
from kvcanary.runtime.status import Count, Kernel, StatusSnapshot

logger = logging.getLogger("kvcanary")


def format_stats_line(*, step: int, protected_tokens: int, sweep_passes: int, violations: int,
                      launch_tags_active: int) -> str:
    """The one-line stats record (SGLang's field names and order)."""
    return (f"[canary] step={step} protected_tokens={protected_tokens} sweep_passes={sweep_passes} "
            f"violations={violations} launch_tags_active={launch_tags_active}")


class StatsLine:
    """Logs :func:`format_stats_line` at INFO every ``interval`` canary steps, from the newest staged snapshot.

    Args:
        interval: canary steps (``end_step()`` calls) between lines (> 0).
        name: the canary's name (the logger record carries it as ``extra={"canary": name}``).
    """

    def __init__(self, interval: int, name: str) -> None:
        self.interval = check_positive("stats_interval", interval)
        self.name = name
        self._latest: StatusSnapshot | None = None
        self._last_launches: np.ndarray | None = None
        self.last_line: str | None = None

    def observe(self, snapshot: StatusSnapshot) -> None:
        """Remember the newest landed snapshot."""
        self._latest = snapshot

    def maybe_log(self, step_no: int, sweep_passes: int) -> str | None:
        """At every ``interval``-th step, log and return the line for the newest snapshot (None otherwise, or
        while no snapshot has landed yet)."""
        if step_no % self.interval or self._latest is None:
            return None
        snap = self._latest
        launches = snap.counters[:, :, Count.LAUNCHES].sum(axis=1)
        prev = self._last_launches if self._last_launches is not None else np.zeros_like(launches)
        self._last_launches = launches.copy()
        line = format_stats_line(
            step=snap.step,
            protected_tokens=snap.count(CanaryLaunchTag.HEAD_K_FULL, Kernel.WRITE, Count.SLOTS),
            sweep_passes=sweep_passes,
            violations=snap.write_index,
            launch_tags_active=int((launches > prev).sum()),
        )
        self.last_line = line
        logger.info("%s", line, extra={"canary": self.name})
        return line


def _prometheus() -> Any:
    try:
        import prometheus_client  # optional dependency
    except ImportError as e:
        raise invalid(f"metrics need prometheus_client: install kvcanary[metrics] ({e})") from e
    return prometheus_client


# Keyed by the registry itself, held weakly: an id() key outlives its registry, and a later registry allocated at
# the same address would get the dead one's families (its counters would advance where nobody reads them).
_FAMILIES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _families(registry: Any) -> dict[str, Any]:
    """The metric families of ``registry``, created once per registry and shared by every canary in it."""
    fam = _FAMILIES.get(registry)
    if fam is None:
        prom = _prometheus()
        fam = {
            "launches": prom.Counter("kvcanary_kernel_launches", "Canary kernel launches",
                                     ["canary", "tag", "kernel"], registry=registry),
            "slots": prom.Counter("kvcanary_slots", "Canary slots verified (verify) or stamped (write)",
                                  ["canary", "tag", "kernel"], registry=registry),
            "violations": prom.Counter("kvcanary_violations", "Canary violations decoded, by reason",
                                       ["canary", "reason"], registry=registry),
            "dropped": prom.Counter("kvcanary_ring_overflow_violations",
                                    "Violations counted on the device that the ring could not keep",
                                    ["canary"], registry=registry),
        }
        _FAMILIES[registry] = fam
    return fam


class CanaryMetrics:
    """Prometheus counters of one canary, advanced from staged snapshots and decoded violations.

    Args:
        name: the value of the ``canary`` label.
        tags: the launch tags the canary uses.
        ring_capacity: rows its ring keeps (violations past it are counted as dropped).
        registry: a ``prometheus_client.CollectorRegistry`` (default: the global ``REGISTRY``).
    """

    def __init__(self, *, name: str, tags: tuple[CanaryLaunchTag, ...], ring_capacity: int,
                 registry: Any = None) -> None:
        prom = _prometheus()
        self.registry = prom.REGISTRY if registry is None else registry
        self.name = name
        self.tags = tags
        self.ring_capacity = ring_capacity
        self._fam = _families(self.registry)
        self._seen = np.zeros((len(CanaryLaunchTag), len(Kernel), len(Count)), dtype=np.int64)
        self._dropped = 0

    def observe(self, snapshot: StatusSnapshot) -> None:
        """Advance the launch/slot counters to ``snapshot`` and the dropped-violation counter to its total."""
        counters = snapshot.counters
        delta = counters - self._seen
        self._seen = np.maximum(self._seen, counters)
        for tag in self.tags:
            for kernel in Kernel:
                d_launch, d_slots = (int(delta[int(tag), int(kernel), int(c)]) for c in Count)
                labels = (self.name, tag.name, kernel.name.lower())
                if d_launch > 0:
                    self._fam["launches"].labels(*labels).inc(d_launch)
                if d_slots > 0:
                    self._fam["slots"].labels(*labels).inc(d_slots)
        dropped = max(0, snapshot.write_index - self.ring_capacity)
        if dropped > self._dropped:
            self._fam["dropped"].labels(self.name).inc(dropped - self._dropped)
            self._dropped = dropped

    def count_violations(self, violations: list[Violation]) -> None:
        """Count each decoded violation once per reason bit it carries."""
        for v in violations:
            for flag, label in REASON_LABELS.items():
                if int(v.reasons) & int(flag):
                    self._fam["violations"].labels(self.name, label).inc()

    def value(self, metric: str, **labels: str) -> float:
        """A sample's current value (for tests and dashboards): e.g.
        ``value("kvcanary_kernel_launches_total", tag="HEAD_K_FULL", kernel="verify")``."""
        v = self.registry.get_sample_value(metric, {"canary": self.name, **labels})
        return 0.0 if v is None else float(v)

