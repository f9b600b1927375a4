"""Health of a :class:`~kvcanary.KVCanary`: per-tag run counters, statistics and the watchdog.

"The canary is not running" is worse than no canary: a CUDA graph captured without the canary kernels, a
code path that skips ``step()``, or a disabled plan all look like "no violations". The counters prove
the kernels ran; the :class:`CanaryWatchdog` turns a stalled counter into an error.

The counters themselves live in the canary's status block (:mod:`kvcanary.runtime.status`): a pair per
launch tag and kernel, read with one copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvcanary.consts import CanaryLaunchTag


class CanaryNotRunningError(RuntimeError):
    """Raised by the watchdog when an expected launch tag's kernel counter stopped increasing."""


@dataclass(frozen=True)
class TagCounters:
    """Counters of one launch tag (device values; verify and write launches counted separately).

    ``verify_launches``/``write_launches``: kernel launches (+1 each, even empty or disabled ones);
    ``verified_slots``: verify entries processed; ``stamped_slots``: canary records written.
    """

    tag: CanaryLaunchTag
    verify_launches: int
    verified_slots: int
    write_launches: int
    stamped_slots: int

    @property
    def kernel_runs(self) -> int:
        """SPEC §4's ``kernel_run_counter`` for this tag (verify + write launches)."""
        return self.verify_launches + self.write_launches

    @property
    def slot_runs(self) -> int:
        """SPEC §4's ``slot_run_counter`` for this tag (verified + stamped slots)."""
        return self.verified_slots + self.stamped_slots


@dataclass(frozen=True)
class CanaryHealth:
    """A snapshot returned by :meth:`kvcanary.KVCanary.health`.

    ``tags`` holds the counters of every tag this canary launches (HEAD/TAIL/SWEEP x K/V x FULL/SWA as
    configured). ``protected_tokens``: tokens stamped by HEAD K FULL writes (every token that entered the
    cache through the canary). ``verified_slots``: verify entries processed by HEAD and TAIL launches.
    ``sweeps``/``swept_slots``: :meth:`~kvcanary.KVCanary.sweep` calls and the slots they checked (K FULL).
    ``steps``: host-side ``step()`` calls per phase. ``violations_total``: violations the device counted;
    ``violations_kept``: rows the ring holds (``min(total, ring_capacity)``); ``ring_overflowed``: total >
    capacity (rows were dropped). ``plan_overflows``: plans whose prefixes exceeded ``verify_capacity`` (that
    step's verify was skipped); ``invalid_rows``: batch rows the plan rejected (SPEC §9).
    """

    tags: Mapping[CanaryLaunchTag, TagCounters]
    steps: Mapping[str, int]
    protected_tokens: int
    verified_slots: int
    sweeps: int
    swept_slots: int
    violations_total: int
    violations_kept: int
    ring_capacity: int
    plan_overflows: int
    invalid_rows: int

    @property
    def ring_overflowed(self) -> bool:
        """Whether more violations were appended than the ring holds (the rows past its capacity are lost)."""
        return self.violations_total > self.ring_capacity

    @property
    def violations_dropped(self) -> int:
        """The violations counted but not kept in the ring (0 unless it overflowed)."""
        return max(0, self.violations_total - self.ring_capacity)

    def kernel_runs(self) -> dict[CanaryLaunchTag, int]:
        """Each tag's ``kernel_run_counter`` (verify + write launches): what :meth:`CanaryWatchdog.observe` takes."""
        return {t: c.kernel_runs for t, c in self.tags.items()}

    def __str__(self) -> str:
        lines = [f"{'tag':<14}{'verify':>8}{'verified':>10}{'write':>8}{'stamped':>10}"]
        for t, c in self.tags.items():
            lines.append(f"{t.name:<14}{c.verify_launches:>8}{c.verified_slots:>10}{c.write_launches:>8}"
                         f"{c.stamped_slots:>10}")
        lines.append(f"steps={dict(self.steps)} protected_tokens={self.protected_tokens} "
                     f"verified_slots={self.verified_slots} sweeps={self.sweeps} swept_slots={self.swept_slots}")
        lines.append(f"violations_total={self.violations_total} kept={self.violations_kept} "
                     f"ring_capacity={self.ring_capacity} ring_overflowed={self.ring_overflowed} "
                     f"plan_overflows={self.plan_overflows} invalid_rows={self.invalid_rows}")
        return "\n".join(lines)


@dataclass
class CanaryWatchdog:
    """Raises :class:`CanaryNotRunningError` when an expected tag's kernel counter stops increasing.

    Feed it kernel-run counters with :meth:`observe` (a :class:`~kvcanary.KVCanary` does so at each
    ``end_step()`` with the one-step-late staged counters). A tag whose counter has not increased over its last
    ``patience`` observations raises. ``patience`` must cover the longest gap the engine legitimately leaves
    between launches of one tag: HEAD and TAIL alternate, so each grows every second observation (use at least
    2); a tag launched less often (the sweep) gets its own value in ``patience_by_tag``.
    """

    tags: tuple[CanaryLaunchTag, ...]
    patience: int = 4
    patience_by_tag: Mapping[CanaryLaunchTag, int] = field(default_factory=dict)
    _history: list[dict[CanaryLaunchTag, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for value in (self.patience, *self.patience_by_tag.values()):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"kv-canary: watchdog patience must be a positive int, got {value!r}")
        self.tags = tuple(CanaryLaunchTag(t) for t in self.tags)
        self._patience = {t: int(self.patience_by_tag.get(t, self.patience)) for t in self.tags}
        self._keep = max(self._patience.values(), default=self.patience)

    def observe(self, kernel_runs: Mapping[CanaryLaunchTag, int]) -> None:
        """Record one observation; raise if some expected tag did not move over its patience."""
        self._history.append({t: int(kernel_runs.get(t, 0)) for t in self.tags})
        del self._history[: max(0, len(self._history) - self._keep - 1)]
        now = self._history[-1]
        stalled = [t for t in self.tags
                   if len(self._history) > self._patience[t] and now[t] <= self._history[-1 - self._patience[t]][t]]
        if stalled:
            names = ", ".join(f"{t.name} (kernel runs stuck at {now[t]})" for t in stalled)
            spans = "/".join(str(p) for p in sorted({self._patience[t] for t in stalled}))
            raise CanaryNotRunningError(
                f"kv-canary: the canary is not running: {names} did not increase over the last {spans} "
                f"observations; check that step() / sweep() / the captured graph still launches the canary kernels"
            )

    def reset(self) -> None:
        """Forget every observation (after a deliberate pause: the next ``patience`` observations cannot raise)."""
        self._history.clear()
