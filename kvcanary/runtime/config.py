"""Configuration from the environment, for engines that turn the canary on with a flag.

:meth:`CanaryConfig.from_env` reads the ``KVCANARY_*`` variables below (an unset variable keeps the default;
a malformed one is a ``kv-canary:`` error naming the variable and the value); :meth:`CanaryConfig.canary_kwargs`
turns the settings into :class:`~kvcanary.KVCanary` keyword arguments, and ``KVCanary.from_env(**geometry)``
does both (keyword arguments given in code win over the environment).

======================================  ============  ==========================================================
variable                                default       meaning
======================================  ============  ==========================================================
``KVCANARY_ENABLE``                     ``0``         ``1`` turns the canary on (read by the engine's wiring)
``KVCANARY_MODE``                       ``log``       ``log``, ``raise`` or ``quiet`` (how violations are reported)
``KVCANARY_REAL_KV_MODE``               (auto)        ``none``, ``partial`` or ``all``; default: ``partial`` when
                                                      real-KV sources are given, else ``none``
``KVCANARY_SWEEP_INTERVAL``             ``0``         sweep cached slots every N engine steps (0: no sweeps); the
                                                      watchdog then expects the SWEEP tags too
``KVCANARY_RING_CAPACITY``              ``1024``      violation rows kept on the device
``KVCANARY_STATS_INTERVAL``             ``0``         log a ``[canary] step=...`` stats line every N steps (0: off)
``KVCANARY_WATCHDOG_PATIENCE``          ``16``        canary steps a launch tag may stall before
                                                      ``CanaryNotRunningError`` (0: watchdog off)
``KVCANARY_FAULT_*``                    (off)         a fault schedule for an engine's CI: not read here (the
                                                      runtime does not load testing aids) but by
                                                      :meth:`kvcanary.faults.FaultSchedule.from_env`
======================================  ============  ==========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvcanary.consts import RealKvHashMode
from kvcanary.errors import invalid

DEFAULT_RING_CAPACITY = 1024
DEFAULT_WATCHDOG_PATIENCE = 16

_REAL_KV_MODES = {"none": RealKvHashMode.NONE, "partial": RealKvHashMode.PARTIAL, "all": RealKvHashMode.ALL}


def _env_int(env: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise invalid(f"{name} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise invalid(f"{name} must be an integer >= {minimum}, got {raw!r}")
    return value


def _env_choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str | None) -> str | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise invalid(f"{name} must be one of {choices}, got {raw!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class CanaryConfig:
    """The environment-configurable settings of a :class:`~kvcanary.KVCanary` (see the module's table)."""

    enabled: bool = False
    mode: str = "log"
    real_kv_hash_mode: RealKvHashMode | None = None
    sweep_interval: int = 0
    ring_capacity: int = DEFAULT_RING_CAPACITY
    stats_interval: int = 0
    watchdog_patience: int = DEFAULT_WATCHDOG_PATIENCE

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CanaryConfig:
        """Read the ``KVCANARY_*`` variables of ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ
        enable = _env_choice(env, "KVCANARY_ENABLE", ("0", "1", "true", "false", "on", "off"), "0")
        rkv = _env_choice(env, "KVCANARY_REAL_KV_MODE", tuple(_REAL_KV_MODES), None)
        return cls(
            enabled=enable in ("1", "true", "on"),
            mode=_env_choice(env, "KVCANARY_MODE", ("log", "raise", "quiet"), "log") or "log",
            real_kv_hash_mode=None if rkv is None else _REAL_KV_MODES[rkv],
            sweep_interval=_env_int(env, "KVCANARY_SWEEP_INTERVAL", 0, minimum=0),
            ring_capacity=_env_int(env, "KVCANARY_RING_CAPACITY", DEFAULT_RING_CAPACITY, minimum=1),
            stats_interval=_env_int(env, "KVCANARY_STATS_INTERVAL", 0, minimum=0),
            watchdog_patience=_env_int(env, "KVCANARY_WATCHDOG_PATIENCE", DEFAULT_WATCHDOG_PATIENCE, minimum=0),
        )

    def canary_kwargs(self) -> dict[str, Any]:
        """The :class:`~kvcanary.KVCanary` keyword arguments these settings stand for."""
        kw: dict[str, Any] = dict(mode=self.mode, ring_capacity=self.ring_capacity,
                                  sweep_interval=self.sweep_interval or None,
                                  stats_interval=self.stats_interval or None,
                                  watchdog_patience=self.watchdog_patience or None)
        if self.real_kv_hash_mode is not None:
            kw["real_kv_hash_mode"] = self.real_kv_hash_mode
        return kw
