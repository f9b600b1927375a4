"""The transformers integration's test modules skip, with both versions named, when the installed transformers is
not the tested one (a GPU image's own, for instance), instead of failing to collect.

A stub ``transformers`` package of another version is put first on the path of a child pytest, which collects
``tests/integrations/test_transformers.py`` (its import of the engine rig would fail on that stub).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvcanary.integrations.transformers import TESTED_TRANSFORMERS_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_another_transformers_version_skips_the_integration_tests(tmp_path):
    stub = tmp_path / "transformers"
    stub.mkdir()
    (stub / "__init__.py").write_text('__version__ = "0.0.1"\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "tests/integrations/test_transformers.py"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 5 or "1 skipped" in out, out  # 5: nothing collected to run (the module skipped)
    assert "error" not in out.lower(), out
    assert f"transformers 0.0.1 found, the integration is tested with {TESTED_TRANSFORMERS_VERSION}" in out, out
