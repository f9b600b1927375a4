"""The example notebooks run top to bottom, and the toy engine of notebook 2 behaves as documented.

Notebooks run in a fresh Jupyter kernel started with *this* interpreter (``sys.executable``), whatever
kernel specs the machine has installed, with the repository root on ``PYTHONPATH`` (so an uninstalled
checkout works) and ``examples/`` as the working directory (so ``import toy_engine`` works, as it does
when a reader opens the notebook in Jupyter). Any cell error fails the test; the notebooks assert their
own key claims too. They are also checked to be committed with their outputs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NOTEBOOKS = ["01_quickstart.ipynb", "02_paged_engine.ipynb", "03_detection_matrix.ipynb",
             "04_dlpack_interop.ipynb", "05_transformers.ipynb"]
# Notebooks that need an optional extra to run (skipped when it is not installed).
REQUIRES = {"05_transformers.ipynb": "transformers"}

if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))


# ------------------------------------------------------------------------------------------------------
# Notebooks


def _kernel_manager(tmp_path: Path):
    """A KernelManager whose kernel is ``sys.executable -m ipykernel_launcher`` (this venv's python)."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    spec_dir = tmp_path / "kernels" / "kvcanary-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (kvcanary tests)",
        "language": "python",
    }))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name="kvcanary-test", kernel_spec_manager=ksm)


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_without_error(name, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat", reason="the test extra (nbformat) is not installed")
    nbclient = pytest.importorskip("nbclient", reason="the test extra (nbclient) is not installed")
    if name in REQUIRES:
        pytest.importorskip(REQUIRES[name], reason=f"the {REQUIRES[name]} extra is not installed")
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    # The kernel inherits this environment: find the checkout's kvcanary, and draw figures off-screen.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    client = nbclient.NotebookClient(nb, km=_kernel_manager(tmp_path), timeout=600,
                                     resources={"metadata": {"path": str(EXAMPLES)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert text.strip(), f"{name} printed nothing"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_with_outputs(name):
    """Readers see results without running anything: every code cell was executed, in order, without error."""
    nb = json.loads((EXAMPLES / name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code
    counts = [c["execution_count"] for c in code]
    assert all(isinstance(n, int) for n in counts), f"{name}: unexecuted cells"
    assert counts == sorted(counts), f"{name}: cells were not executed top to bottom"
    assert sum(bool(c["outputs"]) for c in code) >= len(code) - 2, f"{name}: cells without their outputs"
    assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"], f"{name}: stored error"


def test_detection_matrix_notebook_has_its_plot():
    nb = json.loads((EXAMPLES / "03_detection_matrix.ipynb").read_text())
    images = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]
              if "image/png" in o.get("data", {})]
    assert len(images) == 1


# ------------------------------------------------------------------------------------------------------
# The toy engine


def _run(bugs=None, *, seed: int, canary: bool = True, num_requests: int = 24):
    from toy_engine import Bugs, ToyEngine, make_workload

    engine = ToyEngine(bugs=bugs or Bugs(), canary=canary)
    for arrival, prompt, max_new in make_workload(seed=seed, num_requests=num_requests):
        engine.submit(prompt, max_new, arrival)
    engine.run()
    assert engine.idle and len(engine.finished) == num_requests
    return engine


@pytest.fixture(scope="module")
def reference_outputs():
    """Generated tokens per request without a canary, for workload seeds 0 and 1."""
    return {seed: {r.rid: r.generated for r in _run(seed=seed, canary=False).finished} for seed in (0, 1)}


@pytest.mark.parametrize("seed", [0, 1])
def test_toy_engine_clean_run_is_clean_and_exercises_the_cache(seed, reference_outputs):
    from kvcanary import CanaryLaunchTag

    engine = _run(seed=seed)
    assert engine.violations == []
    assert engine.canary.poll(sync=True) == []
    # The workload exercised what the canary guards: shared prefixes, eviction, SWA recycling, chunking.
    for key in ("prefix_hit_tokens", "evictions", "swa_frees", "continuation_chunks", "sweeps"):
        assert engine.stats[key] > 0, key
    # The canary only reads the pools: the model's outputs are those of the canary-less engine.
    assert {r.rid: r.generated for r in engine.finished} == reference_outputs[seed]
    h = engine.canary.health()
    steps = sum(1 for s in engine.history if s.batch_rows)
    for tag in engine.canary.tags(("head", "tail")):
        assert h.tags[tag].verify_launches == steps and h.tags[tag].write_launches == steps, tag.name
    tokens = sum(s.prefill_tokens + s.decode_tokens for s in engine.history)
    assert h.protected_tokens == tokens
    assert h.tags[CanaryLaunchTag.SWEEP_K_FULL].verify_launches == engine.stats["sweeps"]
    assert h.violations_total == 0


@pytest.mark.parametrize("seed", [0, 1])
def test_toy_engine_page_freed_while_cached_is_caught(seed):
    from toy_engine import Bugs

    engine = _run(Bugs(page_freed_while_cached=True), seed=seed)
    events = [e for e in engine.bug_events if e[1] == "page_freed_while_cached"]
    assert events and engine.violations
    first = engine.violations[0]
    step, _phase = engine.engine_step_of(first)
    assert step >= events[0][0]
    # The first report names a slot of a page that was freed while the prefix cache held it.
    freed = {s for e in events if e[0] <= step for s in e[2]}
    assert first.slot in freed
    # The sweep of the prefix cache sees the overwritten records: wrong position, chain or token.
    swept = [v for v in engine.violations if v.tag_name == "SWEEP_K_FULL"]
    assert swept and set(swept[0].reason_labels) & {"position", "chain_hash", "verify_token"}


@pytest.mark.parametrize("seed", [0, 1])
def test_toy_engine_swa_table_off_by_one_is_caught_in_the_swa_group_only(seed, reference_outputs):
    from toy_engine import Bugs

    engine = _run(Bugs(swa_table_off_by_one=True), seed=seed)
    assert engine.bug_events and engine.violations
    first = engine.violations[0]
    assert first.tag_name == "HEAD_K_SWA" and "position" in first.reason_labels
    assert engine.engine_step_of(first)[0] > engine.bug_events[0][0]
    # The full-attention group is untouched by the bug, and reports nothing.
    assert {v.group for v in engine.violations} == {"swa"}
    assert {r.rid: r.generated for r in engine.finished} != reference_outputs[seed]  # silently wrong output


@pytest.mark.parametrize("seed", [0, 1])
def test_toy_engine_chunk_position_slip_is_caught_by_the_head_write(seed):
    from toy_engine import Bugs

    engine = _run(Bugs(chunk_position_slip=True), seed=seed)
    events = [e for e in engine.bug_events if e[1] == "chunk_position_slip"]
    assert events and engine.violations
    first = engine.violations[0]
    assert first.tag_name == "HEAD_K_FULL" and first.reason_labels == ["write_position"]
    assert engine.engine_step_of(first) == (events[0][0], "head")   # the launch that stamped the slip
    assert first.slot == events[0][2][0]                              # at the chunk's first token
    # The write row carries the expected position: the slip equals the request's prefix-cache hit.
    hits = {r.cached_len for r in engine.finished if r.cached_len}
    assert first.expected_aux - first.position in hits
