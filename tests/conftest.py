"""Shared set-up of the CPU test suite.

Tests are grouped by layer: ``tests/ops`` (kernel-level ops and the CPU reference), ``tests/runtime``
(planner, canary object, reports), ``tests/testing`` (fault injectors, the demo, the notebooks) and ``tests/gpu``
(the CUDA backend, with its own conftest that skips without a GPU). Their helpers are the package
``tests/support`` (importable as ``support``).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Property tests: enough examples to exercise every branch of the model, few enough for a 2-core CI box.
settings.register_profile(
    "kvcanary-ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "kvcanary-long",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("KVCANARY_HYPOTHESIS_PROFILE", "kvcanary-ci"))


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded torch generator, so random pools are reproducible per test."""
    g = torch.Generator()
    g.manual_seed(1234)
    return g


@pytest.fixture(params=[False, True], ids=["vt64", "flat32"])
def vt_flat32(request, monkeypatch) -> bool:
    """The CUDA verify from the table with its 64-bit modules only, and with its 32-bit ones taken where they apply
    (a per-position table: ``kvcanary.ops.cuda.specs.FLAT32``). Used by the emulated and the GPU tests."""
    from kvcanary.ops.cuda import specs

    monkeypatch.setattr(specs, "FLAT32", request.param)
    return request.param
