"""kvcanary for HF transformers' continuous batching (paged KV cache), tested with transformers 5.24.0.

One call guards every continuous-batching run of a model (or one manager)::

    from kvcanary.integrations.transformers import attach

    with attach(model, mode="log") as h:
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cb)
    print(h.canary.health(), h.violations)

What it does (details in the module docstrings and docs/INTEGRATION.md):

* :mod:`~kvcanary.integrations.transformers.geometry`: the canary's slots and real-KV sources over the engine's
  one flat cache tensor (slot = block * page_size + offset; one K and one V source per layer);
* :mod:`~kvcanary.integrations.transformers.hooks`: the engine functions wrapped (HEAD and TAIL around each
  forward, the cache operations that move KV) and their restoration;
* :mod:`~kvcanary.integrations.transformers.session`: one canary per engine cache, driven step by step, with a
  sweep of the prefix cache's blocks;
* :mod:`~kvcanary.integrations.transformers.tables`: the device block table and expected-token pool;
* :mod:`~kvcanary.integrations.transformers.records`: records moved with forks, offloads and restores;
* :mod:`~kvcanary.integrations.transformers.refusals`: the settings refused, and why.
"""

from kvcanary.integrations.transformers.handle import TESTED_TRANSFORMERS_VERSION, CanaryHandle, attach
from kvcanary.integrations.transformers.hooks import patched_functions
from kvcanary.integrations.transformers.refusals import UnsupportedSettingError

__all__ = ["TESTED_TRANSFORMERS_VERSION", "CanaryHandle", "UnsupportedSettingError", "attach", "patched_functions"]
