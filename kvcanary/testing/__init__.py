"""Testing aids, nothing on an engine's hot path.

* :mod:`~kvcanary.testing.faults`: fault injectors, each with the target finder for the engine model
  registered beside it;
* :mod:`~kvcanary.testing.schedule`: fault schedules (random faults, each reported within a bound);
  both are public as :mod:`kvcanary.faults`;
* :mod:`~kvcanary.testing.engine`: the engine model, a serving engine's KV-cache management around a pluggable
  model, guarded by canaries (paged pool, prefix cache, SWA, chunked prefill, padding, sweeps, EAGLE);
* :mod:`~kvcanary.testing.models`: the models it plugs in (deterministic stand-ins for target and draft);
* :mod:`~kvcanary.testing.scenarios`: one fault in a fresh engine model, and what the canary made of it;
* :mod:`~kvcanary.testing.demo`: ``python -m kvcanary demo``.
"""
