"""Fault schedules: random faults in a running engine, each of which must be reported in time.

Public as ``kvcanary.faults.FaultSchedule`` (:mod:`kvcanary.faults`); see :class:`FaultSchedule`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvcanary.errors import invalid
from kvcanary.runtime.report import Violation
from kvcanary.testing import faults

#: ``plant(name, kv, group, rng) -> Injection | None``: the engine's hook that plants fault ``name`` into
#: its current batch / tables / pools (None: no target this step).
PlantFn = Callable[[str, str, str, np.random.Generator], "faults.Injection | None"]

ENV_PROBS = "KVCANARY_FAULT_PROBS"
ENV_WARMUP_STEPS = "KVCANARY_FAULT_WARMUP_STEPS"
ENV_TARGET = "KVCANARY_FAULT_TARGET"
ENV_DETECT_WITHIN = "KVCANARY_FAULT_DETECT_WITHIN"
ENV_SEED = "KVCANARY_FAULT_SEED"
ENV_MAX_IN_FLIGHT = "KVCANARY_FAULT_MAX_IN_FLIGHT"
ENV_VARS = (ENV_PROBS, ENV_WARMUP_STEPS, ENV_TARGET, ENV_DETECT_WITHIN, ENV_SEED, ENV_MAX_IN_FLIGHT)

_GROUPS = ("full", "swa")
_KVS = ("k", "v")


class FaultNotDetectedError(RuntimeError):
    """An injected fault was not reported within the schedule's bound: the detector is not alive (or the
    canary is not wired where the fault hits). ``fault`` is the :class:`ScheduledFault`."""

    def __init__(self, message: str, fault: ScheduledFault):
        super().__init__(message)
        self.fault = fault


@dataclass
class ScheduledFault:
    """One injection of a :class:`FaultSchedule` and its outcome.

    Attributes:
        name, group, kv: the fault and its target.
        step: the engine step it was planted in (before that step's HEAD).
        injection: the engine's :class:`~kvcanary.faults.Injection` (expectation and containment).
        reported_at: the engine step whose :meth:`FaultSchedule.observe` saw the matching row (None: not yet).
        launch_step: the engine step of the launch that appended that row.
        report: the matching :class:`~kvcanary.Violation`.
        contained_at: the step at whose end the damage was contained (reported, or given up on).
        missed: not reported within the bound.
    """

    name: str
    group: str
    kv: str
    step: int
    injection: faults.Injection
    reported_at: int | None = None
    launch_step: int | None = None
    report: Violation | None = None
    contained_at: int | None = None
    missed: bool = False

    @property
    def expected(self) -> faults.ExpectedViolation:
        return self.injection.expected

    @property
    def latency(self) -> int | None:
        """Steps from the injection to the step that saw the report (None if not reported)."""
        return None if self.reported_at is None else self.reported_at - self.step

    def in_flight(self, step: int) -> bool:
        """Whether the fault's damage can explain a report of a launch at ``step``."""
        return self.step <= step and (self.contained_at is None or step <= self.contained_at)


@dataclass
class FaultSchedule:
    """Inject faults of the kinds :mod:`kvcanary.faults` knows at random into a running engine, and check
    that each one is reported within a bounded number of steps ("the detector is alive").

    Each engine step, after ``warmup_steps`` steps, every fault ``name`` of ``probs`` is drawn with its
    probability; a drawn fault is planted (while fewer than ``max_in_flight`` are in flight) at one of the
    configured ``targets`` it supports, through the engine's ``plant`` hook, which returns the
    :class:`~kvcanary.faults.Injection` (its :class:`~kvcanary.faults.ExpectedViolation` and how to contain
    it) or None when the batch offers no target. The schedule then watches what the canaries report: the
    first row matching a fault's expectation, from a launch at or after its injection step, reports it, and
    the fault is contained at the end of that step. A fault not reported within ``detect_within`` steps
    raises :class:`FaultNotDetectedError` naming the fault, the step, what was expected and what was seen
    (``raise_on_miss=False``: it is only recorded in :attr:`missed`). A violation from a launch while no
    fault is in flight (from its injection to the end of the step it was contained in) is a report on a
    *clean step*, kept in :attr:`clean_step_violations`: a false positive, or a real bug.

    Wiring in an engine (the engine model does this when given ``fault_schedule=``)::

        schedule = kvcanary.faults.FaultSchedule.from_env()      # None when KVCANARY_FAULT_PROBS is unset
        ...each step, after the batch is built and before canary.step("head"):
        schedule.inject(step, plant)             # plant(name, kv, group, rng) -> Injection | None
        ...after the step's launches:
        schedule.observe(step, canary.poll(), launch_steps)   # launch_steps: engine step of each row's launch
        schedule.end_step(step)                  # contains reported faults; raises on a missed one

    ``launch_steps`` maps each violation to the engine step of its launch (record ``canary.step_number``
    after each ``step()``; ``Violation.step`` is that number); without it every row counts as launched at
    the step it was read, which is one step late. Rows of other canaries of the engine (e.g. an EAGLE
    draft pool's) go to ``observe(..., match=False)``: they do not report a fault but are checked for
    clean steps.

    Args:
        probs: ``{fault name: probability per step}`` (names from ``kvcanary.faults.FAULTS``).
        warmup_steps: steps (``inject()`` calls) before the first fault.
        targets: ``"group:kv"`` entries (comma separated, or a sequence), group ``full``, ``swa`` or ``*``,
            kv ``k``, ``v`` or ``*``. Each injection picks one the fault supports at random.
        detect_within: a fault must be reported by the step ``injection step + detect_within`` (reports are
            read one step after their launch; a fault only a sweep sees needs the sweep interval + 1).
        seed: seeds the schedule's own random generator (draws and targets; the engine's stay untouched).
        max_in_flight: faults in flight at once (default 1: the containment of one fault, e.g. aborting a
            request, could otherwise take away the target another fault is waiting to be reported on).
        raise_on_miss: raise :class:`FaultNotDetectedError` at the first missed fault.

    Environment (:meth:`from_env`):

    ================================ ===================================================================
    ``KVCANARY_FAULT_PROBS``         ``name=p,name=p`` (e.g. ``remap_req_to_token=0.02,flip_real_kv_byte=0.01``);
                                     unset or empty: no schedule
    ``KVCANARY_FAULT_WARMUP_STEPS``  steps before the first fault (default 0)
    ``KVCANARY_FAULT_TARGET``        ``group:kv`` entries, comma separated (default ``full:k``)
    ``KVCANARY_FAULT_DETECT_WITHIN`` the detection bound in steps (default 16)
    ``KVCANARY_FAULT_SEED``          the schedule's seed (default 0)
    ``KVCANARY_FAULT_MAX_IN_FLIGHT`` faults in flight at once (default 1)
    ================================ ===================================================================
    """

    probs: Mapping[str, float]
    warmup_steps: int = 0
    targets: str | Sequence[tuple[str, str]] = "full:k"
    detect_within: int = 16
    seed: int = 0
    max_in_flight: int = 1
    raise_on_miss: bool = True
    faults: list[ScheduledFault] = field(default_factory=list, init=False)
    clean_step_violations: list[Violation] = field(default_factory=list, init=False)
    no_target: dict[str, int] = field(default_factory=dict, init=False)
    enabled: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        probs = {}
        for name, p in dict(self.probs).items():
            faults.fault_kind(name)
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= 1.0:
                raise invalid(f"probs[{name!r}] must be a probability in [0, 1], got {p!r}")
            probs[name] = float(p)
        self.probs = probs
        self.warmup_steps = _count("warmup_steps", self.warmup_steps, 0)
        self.detect_within = _count("detect_within", self.detect_within, 1)
        self.max_in_flight = _count("max_in_flight", self.max_in_flight, 1)
        self.seed = _count("seed", self.seed, 0)
        self.targets = self._target_list = _parse_targets("targets", self.targets)
        for name in probs:
            if not self._targets_of(name):
                raise invalid(f"fault {name!r} supports groups {faults.fault_kind(name).groups}, none of "
                              f"targets={_format_targets(self.targets)}")
        self.no_target = dict.fromkeys(probs, 0)
        self._rng = np.random.default_rng(self.seed)
        self._steps = 0
        self._seen: list[tuple[int, Violation]] = []   # (launch step, row) of matchable rows, for the reports

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> FaultSchedule | None:
        """The schedule the ``KVCANARY_FAULT_*`` variables describe (see the class docstring), or None when
        ``KVCANARY_FAULT_PROBS`` is unset or empty. ``overrides`` are constructor arguments that win over
        the environment. Bad values raise ``ValueError`` naming the variable, the expected form and the value.
        """
        env = os.environ if environ is None else environ
        text = env.get(ENV_PROBS, "").strip()
        if not text:
            return None
        probs: dict[str, float] = {}
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            name, sep, value = (s.strip() for s in entry.partition("="))
            if not sep or not name:
                raise invalid(f"{ENV_PROBS} entries must be NAME=PROBABILITY, got {entry!r} in {text!r}")
            if name not in faults.FAULTS:
                raise invalid(f"{ENV_PROBS}: unknown fault {name!r}; choose from {tuple(faults.FAULTS)}")
            if name in probs:
                raise invalid(f"{ENV_PROBS}: fault {name!r} is given twice in {text!r}")
            try:
                p = float(value)
            except ValueError:
                p = -1.0
            if not 0.0 <= p <= 1.0:
                raise invalid(f"{ENV_PROBS}: the probability of {name} must be a number in [0, 1], got {value!r}")
            probs[name] = p
        kwargs: dict[str, object] = dict(probs=probs)
        for var, arg, default in ((ENV_WARMUP_STEPS, "warmup_steps", 0), (ENV_DETECT_WITHIN, "detect_within", 16),
                                  (ENV_SEED, "seed", 0), (ENV_MAX_IN_FLIGHT, "max_in_flight", 1)):
            raw = env.get(var, "").strip()
            minimum = 1 if arg in ("detect_within", "max_in_flight") else 0
            if not raw:
                kwargs[arg] = default
            elif raw.lstrip("+").isdigit() and int(raw) >= minimum:
                kwargs[arg] = int(raw)
            else:
                kind = "a positive" if minimum else "a non-negative"
                raise invalid(f"{var} must be {kind} integer, got {raw!r}")
        raw = env.get(ENV_TARGET, "").strip()
        kwargs["targets"] = _parse_targets(ENV_TARGET, raw) if raw else "full:k"
        kwargs.update(overrides)
        return cls(**kwargs)  # type: ignore[arg-type]

    # -- the engine's side -----------------------------------------------------------------------------

    def _targets_of(self, name: str) -> list[tuple[str, str]]:
        groups = faults.fault_kind(name).groups
        return [(g, kv) for g, kv in self._target_list if g in groups]

    @property
    def in_flight(self) -> list[ScheduledFault]:
        """Faults planted and not contained yet."""
        return [f for f in self.faults if f.contained_at is None]

    def inject(self, step: int, plant: PlantFn) -> list[ScheduledFault]:
        """Draw this step's faults and plant them through ``plant(name, kv, group, rng)`` (call it once per
        engine step, after the batch is built and before HEAD). Returns the faults planted."""
        self._steps += 1
        if not self.enabled or self._steps <= self.warmup_steps:
            return []
        out = []
        for name, p in self.probs.items():
            if self._rng.random() >= p or len(self.in_flight) >= self.max_in_flight:
                continue
            targets = self._targets_of(name)
            group, kv = targets[int(self._rng.integers(len(targets)))]
            injection = plant(name, kv, group, self._rng)
            if injection is None:
                self.no_target[name] += 1
                continue
            fault = ScheduledFault(name, group, kv, int(step), injection)
            self.faults.append(fault)
            out.append(fault)
        return out

    def observe(self, step: int, violations: Iterable[Violation], launch_steps: Iterable[int] | None = None, *,
                match: bool = True) -> None:
        """Show the schedule violations read at engine step ``step``. ``launch_steps``: the engine step of
        each one's launch (default ``step``). ``match=False``: rows that cannot report a fault (another
        canary's), checked for clean steps only."""
        vs = list(violations)
        launched = [int(step)] * len(vs) if launch_steps is None else [int(s) for s in launch_steps]
        if len(launched) != len(vs):
            raise invalid(f"launch_steps must give one step per violation: {len(launched)} for {len(vs)}")
        for v, at in zip(vs, launched):
            if not any(f.in_flight(at) for f in self.faults):
                self.clean_step_violations.append(v)
            if not match:
                continue
            self._seen.append((at, v))
            for f in self.faults:
                if f.reported_at is None and f.step <= at and f.expected.matches(v):
                    f.reported_at, f.launch_step, f.report = int(step), at, v

    def end_step(self, step: int) -> None:
        """Close engine step ``step``: contain the faults reported so far, and give up on those past the
        bound (contained too; :class:`FaultNotDetectedError` unless ``raise_on_miss`` is False)."""
        missed = []
        for f in self.in_flight:
            if f.reported_at is None and step - f.step >= self.detect_within:
                f.missed = True
                missed.append(f)
            if f.reported_at is not None or f.missed:
                f.contained_at = int(step)
                if f.injection.contain is not None:
                    f.injection.contain()
        oldest = min((f.step for f in self.in_flight), default=step + 1)
        seen = [(at, v) for at, v in self._seen if at >= oldest]
        if missed and self.raise_on_miss:
            message = self.describe_miss(missed[0], step)
            self._seen = seen
            raise FaultNotDetectedError(message, missed[0])
        self._seen = seen

    def describe_miss(self, f: ScheduledFault, step: int) -> str:
        """The report of a missed fault: what was planted when, what was expected, what was seen instead."""
        seen = [v for at, v in self._seen if at >= f.step]
        text = (f"kv-canary: fault {f.name} injected at step {f.step} ({f.group}:{f.kv}) was not reported within "
                f"{self.detect_within} steps (checked at step {step}): expected {f.expected}; "
                f"{len(seen)} other violation(s) reported since")
        return text + "".join(f"\n  {v}" for v in seen[:3])

    # -- results -------------------------------------------------------------------------------------------

    @property
    def missed(self) -> list[ScheduledFault]:
        return [f for f in self.faults if f.missed]

    @property
    def reported(self) -> list[ScheduledFault]:
        return [f for f in self.faults if f.reported_at is not None]

    def summary(self) -> str:
        """One line per fault kind: injected, reported, missed, worst latency, batches without a target."""
        lines = [f"fault schedule: {len(self.faults)} injected, {len(self.reported)} reported, "
                 f"{len(self.missed)} missed, {len(self.clean_step_violations)} violations on clean steps"]
        for name in self.probs:
            fs = [f for f in self.faults if f.name == name]
            lat = [f.latency for f in fs if f.latency is not None]
            lines.append(f"  {name:<22} injected {len(fs):>3}  reported {len(lat):>3}  "
                         f"latency {'-' if not lat else f'{min(lat)}..{max(lat)}'}  no target {self.no_target[name]}")
        return "\n".join(lines)


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise invalid(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _parse_targets(name: str, value: object) -> list[tuple[str, str]]:
    """``"full:k,swa:*"`` (or a sequence of ``(group, kv)``) -> the expanded ``(group, kv)`` list."""
    entries: list[tuple[str, str]] = []
    items: list[object]
    if isinstance(value, str):
        items = [e.strip() for e in value.split(",") if e.strip()]
        pairs = [tuple(s.strip() for s in str(e).split(":")) for e in items]
    else:
        items = list(value)  # type: ignore[call-overload]
        pairs = [tuple(str(x) for x in e) if isinstance(e, (tuple, list)) else (str(e),) for e in items]
    if not pairs:
        raise invalid(f"{name} must name at least one GROUP:KV target, got {value!r}")
    for text, pair in zip(items, pairs):
        if len(pair) != 2 or pair[0] not in (*_GROUPS, "*") or pair[1] not in (*_KVS, "*"):
            raise invalid(f"{name} entries must be GROUP:KV with GROUP full, swa or * and KV k, v or *, got {text!r}")
        for g in _GROUPS if pair[0] == "*" else (pair[0],):
            for kv in _KVS if pair[1] == "*" else (pair[1],):
                if (g, kv) not in entries:
                    entries.append((g, kv))
    return entries


def _format_targets(targets: object) -> str:
    return ",".join(f"{g}:{kv}" for g, kv in targets)  # type: ignore[attr-defined]
