"""kvcanary on HF transformers' continuous batching on CUDA: SDPA, bfloat16, the canary's CUDA kernels on the
engine's compute stream.

* Clean runs (prefix sharing with de-duplication and chunked prefill; forks; offload to the pinned CPU swap pool
  and restore, whose records travel through host memory): nothing reported, and greedy outputs are those of the
  engine without the canary.
* A subset of the bugs planted in the CPU tests (tests/integrations/test_transformers.py), reported as there.
  CUDA threads append the rows of one launch in any order, so the expected row is looked for among the rows of
  the first reporting launch.

Skipped without a GPU or CuPy (tests/gpu/conftest.py) or without transformers 5.24.0 (see
bench/bench_transformers.py for installing it next to an image's own transformers).
"""

from __future__ import annotations

import pytest
import torch

from support.transformers_gate import require_tested_transformers

require_tested_transformers()  # skips this module unless the tested version is installed
pytest.importorskip("cupy")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU", allow_module_level=True)

from kvcanary import CanaryLaunchTag as T  # noqa: E402
from kvcanary.testing.transformers_engine import (  # noqa: E402
    BUGS,
    fork_workload,
    generate,
    prefix_workload,
    pressure_workload,
    run_planted,
    tiny_llama,
    tokens,
)

# 2 layers x K and V x 2 heads x 16 dims x 2 bytes x 4 tokens per block in bfloat16.
BLOCK_BYTES = 1024


@pytest.fixture(scope="module")
def model():
    return tiny_llama(device="cuda", dtype=torch.bfloat16)


@pytest.mark.parametrize("workload", ["prefix_dedup_chunked", "offload_restore", "forks"])
def test_clean_run_on_cuda(model, workload):
    if workload == "prefix_dedup_chunked":
        prompts, gen, config = prefix_workload(new_tokens=40)
    elif workload == "offload_restore":
        prompts, gen, config = pressure_workload(cpu_pool=True, block_bytes=BLOCK_BYTES)
    else:
        prompts, gen, config = fork_workload(new_tokens=24)
    ref = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    out, h = generate(model, prompts, gen, config)
    assert h.canary.device.type == "cuda" and h.session.stream is not None
    assert h.violations == []
    s, health = h.stats(), h.health()
    for tag in (T.HEAD_K_FULL, T.HEAD_V_FULL, T.TAIL_K_FULL, T.TAIL_V_FULL):
        assert health.tags[tag].verify_launches == health.tags[tag].write_launches == s["engine_steps"]
    assert health.verified_slots > 0 and health.sweeps > 0 and health.invalid_rows == 0
    if workload == "prefix_dedup_chunked":
        assert s["dedup_swaps"] > 0
    elif workload == "offload_restore":
        assert s["offloaded_blocks"] > 0 and s["restored_blocks"] > 0
    else:
        assert s["fork_blocks"] > 0
    if not gen.do_sample:
        assert tokens(out) == tokens(ref)
    else:
        assert {k: len(v) for k, v in tokens(out).items()} == {k: len(v) for k, v in tokens(ref).items()}


@pytest.mark.parametrize("name", ["table_entry_to_another_request", "kv_byte_flipped_in_cached_block",
                                  "position_id_slip", "fork_shares_block_to_copy"])
def test_planted_bug_on_cuda(model, monkeypatch, name):
    h, _plant, verdict = run_planted(model, BUGS[name], monkeypatch)
    assert verdict is None, verdict
    assert h.canary.device.type == "cuda"
