"""Shared set-up of the CPU test suite.

The helpers live in two plain modules next to this file (pytest puts this directory on ``sys.path``):
``spec_model`` (the scalar, from-SPEC oracle; imports nothing from kvcanary) and ``canary_testlib`` (tensor
builders, poisoning, and runners that compare an op with the model byte for byte). GPU tests live in
``tests/gpu`` with their own conftest.
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
