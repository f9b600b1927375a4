"""Fault scenarios: one fault planted into the engine model at a realistic moment, and what the canary made
of it. The demo, the tests and the notebooks use :func:`run_fault_scenario`; which target a fault hits is
decided by the finder registered beside its injector (:data:`kvcanary.faults.FAULTS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvcanary.runtime.report import Violation
from kvcanary.testing import faults
from kvcanary.testing.engine import Batch, ServingSimulation, SimConfig
from kvcanary.testing.faults import FAULT_NAMES, ExpectedViolation, Injection

__all__ = ["FAULT_NAMES", "FaultResult", "run_fault_scenario"]


@dataclass
class FaultResult:
    """One injector run: what was expected, what the canary reported, when.

    ``injected_at_step`` is the engine step the fault was planted in (-1: never); ``sim_step_of`` maps the
    canary's step numbers to engine steps."""

    name: str
    expected: ExpectedViolation | None
    matched: list[Violation]
    violations: list[Violation]
    injected_at_step: int
    clean_before: bool
    note: str = ""
    sim_step_of: dict[int, int] = field(default_factory=dict)

    def steps_after_injection(self, v: Violation) -> int | None:
        """Engine steps between the edit and the launch that appended ``v`` (0 = the same step)."""
        s = self.sim_step_of.get(v.step)
        return None if s is None or self.injected_at_step < 0 else s - self.injected_at_step

    @property
    def detected(self) -> bool:
        return bool(self.matched)

    @property
    def first(self) -> Violation | None:
        return self.matched[0] if self.matched else None


def run_fault_scenario(name: str, config: SimConfig | None = None, *, device: Any = "cpu", warmup_steps: int = 12,
                       observe_steps: int = 2, max_tries: int = 20, kv: str = "k", group: str = "full") -> FaultResult:
    """Run a fresh engine model (``config``, default :class:`SimConfig`) clean for ``warmup_steps`` steps, plant fault ``name`` (one of
    :data:`~kvcanary.faults.FAULT_NAMES`) at the first step whose batch offers a target (trying up to
    ``max_tries`` steps, four times as many for a fault only a sweep sees), run ``observe_steps`` more steps
    (then, for a sweep fault, sweep), and compare what the target canary found with the injector's
    :class:`~kvcanary.faults.ExpectedViolation`. ``clean_before`` says no violation preceded the fault;
    ``note`` says what went unexpectedly (no target; rows of other launches before a sweep fault's sweep)."""
    kind = faults.fault_kind(name)
    sim = ServingSimulation(config or SimConfig(), device=device)
    assert sim.canary is not None
    sim.run(warmup_steps)
    clean = not sim.canary.poll(sync=True)
    injection: Injection | None = None
    injected_at = -1
    for _ in range(max_tries * (4 if kind.detected_by == "sweep" else 1)):
        planted: list[Injection | None] = []

        def plant(s: ServingSimulation, b: Batch, planted: list[Injection | None] = planted) -> None:
            planted.append(s.plant_fault(name, b, kv=kv, group=group))

        sim.step(plant)
        if planted[0] is not None:
            injection, injected_at = planted[0], sim.step_index - 1
            break
    note = "" if injection is not None else "no target found"
    sim.run(observe_steps)
    found = sim.canary.poll(sync=True)
    if kind.detected_by == "sweep" and injection is not None:
        early = [v for v in found if v.phase != "sweep"]
        if early:
            note = f"{len(early)} row(s) of other launches before the sweep"
        sim.sweep()
        found += sim.canary.poll(sync=True)
    expected = injection.expected if injection is not None else None
    matched = expected.found_in(found) if expected is not None else []
    return FaultResult(name, expected, matched, found, injected_at, clean, note,
                       {k: v[0] for k, v in sim.canary_steps.items()})
