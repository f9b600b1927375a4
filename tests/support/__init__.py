"""Helpers shared by the tests (``pythonpath = ["tests"]`` in pyproject.toml makes this package importable):

* :mod:`support.spec_model`: the scalar, from-SPEC oracle (imports nothing from kvcanary);
* :mod:`support.canary_testlib`: tensor builders, poisoning, and runners that compare an op with the model
  byte for byte;
* :mod:`support.gpu_util`: the same on CUDA, comparing the CUDA path with the CPU reference.
"""
