"""Health of a :class:`~kvcanary.KVCanary`: per-tag run counters, statistics and the watchdog.

"The canary is not running" is worse than no canary: a CUDA graph captured without the canary kernels, a
code path that skips ``step()``, or a disabled plan all look like "no violations". The counters prove
the kernels ran; the :class:`CanaryWatchdog` turns a stalled counter into an error.

Per-tag counters. SPEC §4 gives one ``kernel_run_counter``/``slot_run_counter`` pair per launch context.
A :class:`~kvcanary.KVCanary` gives every launch tag *and* kernel (verify, write) its own pair, all rows
of one int64 tensor ``[12, 2, 2]`` (tag, kernel, {kernel runs, slot runs}), while every launch shares one
violation ring and write index. So the counters say which launch ran how often, and the health read is a
single copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kvcanary.consts import CanaryLaunchTag

VERIFY, WRITE = 0, 1  # kernel index of the counter tensor
KERNEL_RUNS, SLOT_RUNS = 0, 1  # counter index


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
        return self.violations_total > self.ring_capacity

    @property
    def violations_dropped(self) -> int:
        return max(0, self.violations_total - self.ring_capacity)

    def kernel_runs(self) -> dict[CanaryLaunchTag, int]:
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
    ``end_step()`` with the one-step-late staged counters, when constructed with ``watchdog_patience``).
    A tag whose counter has not increased over the last ``patience`` observations raises. ``patience``
    must cover the longest gap the engine legitimately leaves between launches of one tag (HEAD and TAIL
    alternate, so each grows every second observation: use at least 2).
    """

    tags: tuple[CanaryLaunchTag, ...]
    patience: int = 4
    _history: list[dict[CanaryLaunchTag, int]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise ValueError(f"kv-canary: watchdog patience must be a positive int, got {self.patience!r}")
        self.tags = tuple(CanaryLaunchTag(t) for t in self.tags)

    def observe(self, kernel_runs: Mapping[CanaryLaunchTag, int]) -> None:
        """Record one observation; raise if some expected tag did not move over ``patience`` observations."""
        self._history.append({t: int(kernel_runs.get(t, 0)) for t in self.tags})
        if len(self._history) <= self.patience:
            return
        old = self._history[-1 - self.patience]
        now = self._history[-1]
        del self._history[: len(self._history) - self.patience - 1]
        stalled = [t for t in self.tags if now[t] <= old[t]]
        if stalled:
            names = ", ".join(f"{t.name} (kernel runs stuck at {now[t]})" for t in stalled)
            raise CanaryNotRunningError(
                f"kv-canary: the canary is not running: {names} did not increase over the last "
                f"{self.patience} observations; check that step() / the captured graph still launches "
                f"the canary kernels"
            )

    def reset(self) -> None:
        self._history.clear()


def expected_tags(phases: Iterable[str], kvs: Iterable[str], groups: Iterable[str]) -> tuple[CanaryLaunchTag, ...]:
    """The tags ``{PHASE}_{KV}_{GROUP}`` for the given lower-case names, in tag order."""
    names = {f"{p}_{k}_{g}".upper() for p in phases for k in kvs for g in groups}
    return tuple(t for t in CanaryLaunchTag if t.name in names)
