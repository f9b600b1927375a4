"""The transformers version the integration tests run against, or a skip.

The integration tests drive transformers' continuous-batching internals through
:mod:`kvcanary.testing.transformers_engine`, which imports modules of the version the integration is tested with
(``TESTED_TRANSFORMERS_VERSION``). Another version (a GPU image's own, say) must skip those test modules with
both numbers in the reason, before that import, not fail their collection with an ImportError.
"""

from __future__ import annotations

from typing import Any

import pytest


def require_tested_transformers() -> Any:
    """The ``transformers`` module, at module level of a test file; skips the module when transformers is not
    installed or is not the tested version."""
    transformers = pytest.importorskip("transformers", reason="the transformers extra is not installed")
    from kvcanary.integrations.transformers import TESTED_TRANSFORMERS_VERSION

    if transformers.__version__ != TESTED_TRANSFORMERS_VERSION:
        pytest.skip(f"transformers {transformers.__version__} found, the integration is tested with "
                    f"{TESTED_TRANSFORMERS_VERSION}", allow_module_level=True)
    return transformers
