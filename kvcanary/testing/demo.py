"""``python -m kvcanary demo``: the engine model under the canary, then every fault injector.

1. Runs :class:`~kvcanary.testing.engine.ServingSimulation` (paged pool, arrivals and completions, shared
   system prompts in a prefix cache, an SWA group, chunked prefill and decode, CUDA-graph padding rows,
   periodic sweeps) and checks that the canary reports nothing on these clean steps; then the same with
   EAGLE-style speculative decoding (a draft pool with its own canary), which must stay clean too.
2. Runs each :mod:`kvcanary.testing.faults` injector in a fresh simulation and prints a table: fault, detected?,
   the launch tag and reasons of the documented row, how many steps after the edit it was reported.
3. Runs a :class:`~kvcanary.faults.FaultSchedule` (random faults of every kind, each of which must be reported
   within a bound) over a speculative workload.

``--engine transformers`` tells the same story on a real engine instead: HF transformers' continuous batching
with a tiny random Llama under :func:`kvcanary.integrations.transformers.attach`, a clean run, then every bug of
:data:`kvcanary.testing.transformers_engine.BUGS` planted in the engine's own code paths.

Uses the CUDA backend when a GPU, CuPy and kvcanary's CUDA backend are all available, the CPU reference
otherwise, and says which. Exit status 0 when the clean runs are clean and every fault is detected (in the
table and by the schedule, with no report on a clean step), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvcanary.testing.engine import ServingSimulation, SimConfig
from kvcanary.testing.scenarios import FAULT_NAMES, FaultResult, run_fault_scenario
from kvcanary.testing.schedule import FaultSchedule


def pick_device(requested: str | None = None) -> tuple[str, str]:
    """``(device, description)``: CUDA when usable (GPU + CuPy + kvcanary's CUDA backend), else CPU."""
    if requested == "cpu":
        return "cpu", "CPU reference backend (requested)"
    reason = ""
    if not torch.cuda.is_available():
        reason = "no CUDA GPU"
    else:
        try:
            import cupy  # noqa: F401 - importable is what is checked

            from kvcanary.ops.cuda import backend  # noqa: F401
        except Exception as e:  # any import failure means "not usable"
            reason = f"CUDA backend unavailable: {type(e).__name__}: {e}"
    if not reason:
        return "cuda", f"CUDA backend on {torch.cuda.get_device_name()}"
    if requested == "cuda":
        raise SystemExit(f"kv-canary: --device cuda requested but {reason}")
    return "cpu", f"CPU reference backend ({reason})"


@dataclass
class DemoResult:
    device: str
    clean_steps: int
    clean_violations: int
    faults: list[FaultResult]
    spec_violations: int = 0
    schedule: FaultSchedule | None = None

    @property
    def ok(self) -> bool:
        schedule_ok = self.schedule is None or (
            self.schedule.faults and not self.schedule.missed and not self.schedule.clean_step_violations
            and all(f.reported_at is not None for f in self.schedule.faults))
        return bool(self.clean_violations == 0 and self.spec_violations == 0 and schedule_ok
                    and all(f.detected and f.clean_before for f in self.faults))


def _when(sim_steps: int | None) -> str:
    return "-" if sim_steps is None else f"+{sim_steps} step{'s' if sim_steps != 1 else ''}"


def run_demo(*, device: str | None = None, steps: int = 60, seed: int = 0,
             out: Callable[[str], None] = print) -> DemoResult:
    """Run the demo (see the module docstring), printing through ``out``: ``steps`` clean steps, two thirds
    as many with speculative decoding, each fault scenario, and a fault schedule over ``3 * steps`` steps."""
    dev, description = pick_device(device)
    out(f"kvcanary demo - device: {dev} ({description})")
    cfg = SimConfig(seed=seed)
    t0 = time.perf_counter()
    sim = ServingSimulation(cfg, device=dev)
    sim.run(steps)
    assert sim.canary is not None
    clean = sim.canary.poll(sync=True)
    h = sim.canary.health()
    s = sim.stats
    out(f"\nClean workload: {steps} steps in {time.perf_counter() - t0:.1f} s: {s['admitted']} requests admitted, "
        f"{s['finished']} finished, {s['cache_hits']} prefix-cache hits, {s['tokens']} tokens written, "
        f"{s['sweeps']} sweeps ({s['swept_slots']} slots)")
    out(f"  groups {', '.join(sim.canary.groups)} x halves {', '.join(sim.canary.kvs)}: "
        f"{sum(c.kernel_runs for c in h.tags.values())} kernel launches, {h.protected_tokens} tokens protected, "
        f"{h.verified_slots} prefix slots verified, {h.swept_slots} slots swept")
    out(f"  violations on clean steps: {len(clean)} (device total {h.violations_total})"
        + ("" if not clean else "  <-- UNEXPECTED"))
    for v in clean[:5]:
        out(f"    {v}")

    spec_steps = max(1, steps * 2 // 3)
    t0 = time.perf_counter()
    spec = ServingSimulation(SimConfig(seed=seed, spec_tokens=3), device=dev)
    spec.run(spec_steps)
    assert spec.canary is not None and spec.draft_canary is not None
    spec_clean = spec.canary.poll(sync=True) + spec.draft_canary.poll(sync=True)
    s = spec.stats
    dh = spec.draft_canary.health()
    out(f"\nSpeculative decoding (EAGLE, up to 3 draft tokens): {spec_steps} steps in {time.perf_counter() - t0:.1f} s: "
        f"{s['drafted']} draft tokens verified, {s['accepted']} accepted, {s['draft_forwards']} draft forwards")
    out(f"  draft pool canary (token check at position + 1): {dh.protected_tokens} tokens protected, "
        f"{dh.verified_slots} prefix slots verified")
    out(f"  violations on clean steps: {len(spec_clean)}" + ("" if not spec_clean else "  <-- UNEXPECTED"))
    for v in spec_clean[:5]:
        out(f"    {v}")

    out("\nFault injection (each in a fresh simulation, after 12 clean steps):")
    header = f"  {'fault':<22}{'detected':<10}{'reported':<11}{'documented row (tag: reasons)':<48}first row seen"
    out(header)
    out("  " + "-" * (len(header) + 24))
    results = []
    for name in FAULT_NAMES:
        r = run_fault_scenario(name, cfg, device=dev)
        results.append(r)
        first = r.violations[0] if r.violations else None
        sim_step = r.steps_after_injection(r.first) if r.first is not None else None
        doc = (f"{r.first.tag_name}: {'+'.join(r.first.reason_labels)}" if r.first is not None
               else (f"missing {r.expected.tag.name}" if r.expected else r.note))
        seen = f"{first.tag_name}: {'+'.join(first.reason_labels)}" if first is not None else "-"
        detected = "yes" if r.detected and r.clean_before else "NO"
        out(f"  {name:<22}{detected:<10}{_when(sim_step):<11}{doc:<48}{seen}")
    schedule = run_schedule(dev, seed, steps * 3, out)
    result = DemoResult(dev, steps, len(clean), results, len(spec_clean), schedule)
    out("\n" + ("OK: clean steps stayed clean and every fault was detected as documented."
                if result.ok else "FAILED: see above."))
    out("\nOne report, as the canary logs it and explained:")
    sample = next((r.first for r in results if r.first is not None), None)
    if sample is not None:
        out(str(sample))
        out(sample.explain())
    return result


def run_schedule(dev: str, seed: int, steps: int, out: Callable[[str], None]) -> FaultSchedule:
    """A fault schedule over a speculative workload: every fault kind with probability 0.04 per step after
    10 clean steps, FULL or SWA, K or V, each to be reported within 12 steps."""
    schedule = FaultSchedule(dict.fromkeys(FAULT_NAMES, 0.04), warmup_steps=10, targets="*:*", detect_within=12,
                             seed=seed, raise_on_miss=False)
    t0 = time.perf_counter()
    sim = ServingSimulation(SimConfig(seed=seed + 1, spec_tokens=2), device=dev, fault_schedule=schedule)
    sim.run(steps)
    schedule.enabled = False           # let the last faults be reported
    sim.run(schedule.detect_within)
    sim.finish_fault_schedule()
    lat = [f.latency for f in schedule.faults if f.latency is not None]
    out(f"\nFault schedule ({steps} steps of a speculative workload, each fault kind drawn with p=0.04 per step, "
        f"in {time.perf_counter() - t0:.1f} s):")
    out(f"  {len(schedule.faults)} faults injected, {len(lat)} reported within {max(lat, default=0)} steps "
        f"(bound {schedule.detect_within}), {len(schedule.missed)} missed, "
        f"{len(schedule.clean_step_violations)} violations on clean steps")
    for f in schedule.missed[:3]:
        out(f"    {schedule.describe_miss(f, sim.step_index)}")
    return schedule


def run_transformers_demo(*, device: str | None = None, out: Callable[[str], None] = print) -> bool:
    """The same story on a real engine: HF transformers' continuous batching (a tiny random Llama, no download)
    under :func:`kvcanary.integrations.transformers.attach`: a clean run, then each bug of
    :data:`kvcanary.testing.transformers_engine.BUGS` planted in the engine's own code. True when the clean run
    stayed clean (and changed no token) and every bug was reported as documented."""
    try:
        from kvcanary.testing import transformers_engine as hf
    except ImportError as e:
        out(f"kv-canary: the transformers engine needs the transformers extra (pip install 'kvcanary[transformers]'): "
            f"{e}")
        return False
    import transformers

    dev, description = pick_device(device)
    out(f"kvcanary demo on HF transformers {transformers.__version__} continuous batching - device: {dev} "
        f"({description})")
    transformers.logging.set_verbosity_error()
    model = hf.tiny_llama(device=dev, dtype=torch.float32 if dev == "cpu" else torch.bfloat16)
    prompts, gen, config = hf.prefix_workload(new_tokens=40)
    t0 = time.perf_counter()
    ref = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    generated, h = hf.generate(model, prompts, gen, config)
    s = h.stats()
    same = hf.tokens(generated) == hf.tokens(ref)
    out(f"\nClean run: {len(prompts)} requests, {s['engine_steps']} engine steps in {time.perf_counter() - t0:.1f} s "
        f"(with the reference run); {s['dedup_swaps']} de-duplicated blocks; {h.health().verified_slots} prefix "
        f"slots verified, {h.health().swept_slots} swept")
    out(f"  violations: {len(h.violations)}; tokens identical to the engine without the canary: {same}")
    ok = same and not h.violations

    out("\nBugs planted in the engine (each in a fresh run):")
    header = f"  {'bug':<34}{'detected':<10}{'engine step':<13}first report"
    out(header)
    out("  " + "-" * (len(header) + 30))
    first_seen = None
    for name, bug in hf.BUGS.items():
        with hf.Patches() as patches:
            h, plant, verdict = hf.run_planted(model, bug, patches)
        first = h.violations[0] if h.violations else None
        found = h.engine_step_of(first) if first is not None else None
        when = "-" if found is None or plant.step is None else f"+{found[0] - plant.step} {found[1]}"
        seen = f"{first.tag_name}: {'+'.join(first.reason_labels)}" if first is not None else "-"
        out(f"  {name:<34}{'yes' if verdict is None else 'NO':<10}{when:<13}{seen}")
        if verdict is not None:
            out(f"      {verdict}")
        ok = ok and verdict is None
        first_seen = first_seen or first
    out("\n" + ("OK: the clean run stayed clean and every planted bug was reported as documented."
                if ok else "FAILED: see above."))
    if first_seen is not None:
        out("\nOne report, explained:")
        out(first_seen.explain())
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvcanary demo", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="force a backend (default: CUDA when available, else CPU)")
    parser.add_argument("--steps", type=int, default=60,
                        help="clean workload steps (default 60; the speculative run takes 2/3 as many, the fault "
                             "schedule 3 times as many)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", choices=("sim", "transformers"), default="sim",
                        help="sim: the simulated engine (default); transformers: HF transformers' continuous "
                             "batching (needs the transformers extra)")
    args = parser.parse_args(argv)
    if args.engine == "transformers":
        return 0 if run_transformers_demo(device=args.device) else 1
    result = run_demo(device=args.device, steps=args.steps, seed=args.seed)
    return 0 if result.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
