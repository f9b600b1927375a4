"""Ready-made wiring of kvcanary into serving engines, one subpackage per engine.

* :mod:`kvcanary.integrations.transformers`: HF transformers' continuous batching (``generate_batch`` and the
  continuous-batching manager), installed with ``pip install kvcanary[transformers]``.

Nothing here is imported by ``import kvcanary``: each integration imports its engine only when it is imported.
"""
