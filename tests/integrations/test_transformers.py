"""kvcanary attached to HF transformers' real continuous-batching engine (CPU, a tiny random Llama, no downloads).

* Clean runs over the engine's cache management (prefix sharing and de-duplication, chunked prefill, forks,
  soft resets, offload to a CPU swap pool and restore): no violation, and the generated tokens are those of the
  engine without the canary.
* Two negative controls: with the fork copy or the restore of records switched off, the same runs report, so the
  clean runs above are clean because records move with the KV.
* Bugs planted in the engine's own code paths (installed before ``attach()``, removed after ``detach()``): the
  first report's launch tag, reasons, slot and engine step are checked against what each bug must produce.
* ``detach()`` restores the engine's functions, a second ``attach()`` works, and the refused settings give their
  ``kv-canary:`` messages.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.transformers_gate import require_tested_transformers

transformers = require_tested_transformers()  # skips this module unless the tested version is installed

from kvcanary import CanaryLaunchTag as T  # noqa: E402
from kvcanary import CanaryViolationError  # noqa: E402
from kvcanary import FailReason as R  # noqa: E402
from kvcanary.integrations.transformers import (  # noqa: E402
    UnsupportedSettingError,
    attach,
    patched_functions,
)
from kvcanary.integrations.transformers import records as tf_records  # noqa: E402
from kvcanary.testing.transformers_engine import (  # noqa: E402
    BUGS,
    Plant,
    cb,
    distinct_prompts,
    fork_workload,
    generate,
    greedy,
    prefix_workload,
    pressure_workload,
    run_planted,
    sampled,
    swap_pool_on_cpu,
    tiny_llama,
    tokens,
)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


# --------------------------------------------------------------------------------------------------------
# Clean runs

# Engine steps each clean run takes at least (together more than 500 forwards under the canary).
MIN_STEPS = {"prefix_dedup_chunked": 200, "soft_reset": 100, "offload_restore": 100, "forks": 200}


@pytest.mark.parametrize("workload", ["prefix_dedup_chunked", "soft_reset", "offload_restore"])
def test_clean_run_reports_nothing_and_changes_no_token(model, workload):
    if workload == "prefix_dedup_chunked":
        prompts, gen, config = prefix_workload()
    else:
        prompts, gen, config = pressure_workload(cpu_pool=workload == "offload_restore")
    with swap_pool_on_cpu():
        ref = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
        out, h = generate(model, prompts, gen, config)
    assert h.violations == []
    assert tokens(out) == tokens(ref) and len(out) == len(prompts)
    s = h.stats()
    health = h.health()
    # The canary ran on every engine step, HEAD and TAIL, K and V, and swept the prefix cache.
    for tag in (T.HEAD_K_FULL, T.HEAD_V_FULL, T.TAIL_K_FULL, T.TAIL_V_FULL):
        assert health.tags[tag].verify_launches == health.tags[tag].write_launches == s["engine_steps"]
    assert health.sweeps > 0 and health.swept_slots > 0 and health.invalid_rows == 0
    # The workload exercised the cache operation it is about.
    if workload == "prefix_dedup_chunked":
        assert s["dedup_swaps"] > 0
    elif workload == "soft_reset":
        assert s["soft_resets"] > 0 and s["offloaded_blocks"] == 0
    else:
        assert s["offloaded_blocks"] > 0 and s["restored_blocks"] > 0
    assert s["engine_steps"] >= MIN_STEPS[workload]


def test_clean_forks_report_nothing(model):
    prompts, gen, config = fork_workload()
    ref = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    out, h = generate(model, prompts, gen, config)
    assert h.violations == []
    assert len(out) == 3 * len(prompts) and h.stats()["fork_blocks"] > 0
    # Sampling with the engine's seed is reproducible, so the canary must not change these tokens either.
    assert tokens(out) == tokens(ref)
    assert h.stats()["engine_steps"] >= MIN_STEPS["forks"]



@pytest.mark.parametrize("move", ["copy_blocks", "restore"])
def test_records_must_move_with_the_kv(model, monkeypatch, move):
    """Negative control: with the fork copy (or the restore scatter) of records switched off, the same clean
    workload reports, at the first HEAD that reads the moved blocks: the clean runs are clean because records move."""
    monkeypatch.setattr(tf_records.RecordMover, move, lambda self, *a, **k: None)
    if move == "copy_blocks":
        prompts, gen, config = distinct_prompts(3, 14), sampled(6, children=2), cb(seed=7)
    else:
        prompts, gen, config = pressure_workload(cpu_pool=True)
    with swap_pool_on_cpu():
        _out, h = generate(model, prompts, gen, config)
    assert h.violations
    first = h.violations[0]
    assert first.tag == T.HEAD_K_FULL and first.reasons & (R.VERIFY_POSITION_MISMATCH | R.VERIFY_CHAIN_HASH_MISMATCH)


# --------------------------------------------------------------------------------------------------------
# Bugs planted in the engine's own code paths (kvcanary.testing.transformers_engine.BUGS: story, workload, report)


@pytest.mark.parametrize("name", list(BUGS))
def test_planted_bug_is_reported_as_expected(model, monkeypatch, name):
    _h, _plant, verdict = run_planted(model, BUGS[name], monkeypatch)
    assert verdict is None, verdict


def test_raise_mode_stops_the_engine_and_reraises(model, monkeypatch):
    """mode="raise": the violation is raised in the engine's thread, which fails its requests with it; leaving the
    ``with`` block raises it in the caller's thread."""
    plant = Plant()
    BUGS["position_id_slip"].install(monkeypatch, plant)
    with pytest.raises(CanaryViolationError) as e, attach(model, mode="raise") as h:
        plant.handle = h
        out = model.generate_batch(distinct_prompts(4, 9), generation_config=greedy(10),
                                   continuous_batching_config=cb())
    assert e.value is h.error and e.value.violations[0].reasons == R.WRITE_POSITION_MISMATCH
    assert out and all(o.error is not None and "write_position" in o.error for o in out.values())


# --------------------------------------------------------------------------------------------------------
# attach / detach, managers, refusals


def test_detach_restores_the_engine_and_a_second_attach_works(model):
    prompts, gen, config = distinct_prompts(4, 9), greedy(6), cb()
    engine = patched_functions()
    h1 = attach(model, mode="quiet")
    wrapped = patched_functions()
    assert all(wrapped[k] is not engine[k] for k in engine)
    with pytest.raises(ValueError, match=r"^kv-canary: a canary is already attached to this target; detach\(\) it "
                                         r"first$"):
        attach(model)
    model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    h1.detach()
    assert all(patched_functions()[k] is engine[k] for k in engine)
    first_canary, steps = h1.canary, h1.canary.step_number
    assert steps > 0 and h1.violations == []

    model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    assert h1.canary is first_canary and first_canary.step_number == steps   # detached: not driven any more

    # Two handles at once (two models): the wrappers stay until the last one is detached.
    other = tiny_llama(layers=3)
    with attach(model, mode="quiet") as h2, attach(other, mode="quiet") as h3:
        h2.detach()
        assert all(patched_functions()[k] is not engine[k] for k in engine)
        other.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
        model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    assert h2.canary is None                          # detached before the model ran
    assert h3.canary is not None and h3.stats()["engine_steps"] > 0 and h3.violations == []
    assert all(patched_functions()[k] is engine[k] for k in engine)


def test_persistent_manager_keeps_one_canary_across_runs(model):
    gen = greedy(6)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb())
    try:
        _persistent_runs(manager)
    finally:
        model.destroy_cached_continuous_batching_manager()


def _persistent_runs(manager):
    with attach(manager, mode="quiet") as h:
        manager.warmup()                                  # builds the cache: the canary exists from here
        canary = h.canary
        assert canary is not None and canary.num_slots == h.session.geometry.num_slots
        for run in range(2):
            manager.start()
            ids = manager.add_requests(distinct_prompts(3, 9 + run), max_new_tokens=6)
            results = [manager.get_result(timeout=30) for _ in ids]
            manager.stop(block=True, keep_for_next_session=True)
            assert all(r is not None and r.error is None and len(r.generated_tokens) == 6 for r in results)
        assert h.canary is canary and h.stats()["sessions"] == 1 and h.stats()["engine_steps"] >= 12
    assert h.violations == []


def test_attach_checks_its_arguments(model):
    engine = patched_functions()
    with pytest.raises(ValueError, match=r"^kv-canary: mode must be one of \('log', 'raise', 'quiet'\), got 'loud'$"):
        attach(model, mode="loud")
    with pytest.raises(ValueError, match=r"^kv-canary: sweep_interval must be a positive int or None, got 0$"):
        attach(model, sweep_interval=0)
    with pytest.raises(ValueError, match=r"^kv-canary: real_kv_hash_mode must be a RealKvHashMode \(0, 1 or 2\), "
                                         r"got 7$"):
        attach(model, real_kv_hash_mode=7)
    with pytest.raises(ValueError, match=r"^kv-canary: attach\(\) derives \['num_slots'\] from the cache"):
        attach(model, num_slots=64)
    with pytest.raises(TypeError, match=r"^kv-canary: attach\(\) needs a transformers model"):
        attach(object())
    assert patched_functions() == engine   # nothing installed by a refused attach()


def _refusal(fn) -> str:
    with pytest.raises(UnsupportedSettingError) as e:
        fn()
    return str(e.value)


def test_refusals_name_the_setting():
    engine = patched_functions()
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=512)
    auto = transformers.AutoModelForCausalLM.from_config
    mistral = auto(transformers.MistralConfig(sliding_window=8, **kw), attn_implementation="sdpa")
    assert _refusal(lambda: attach(mistral)) == (
        "kv-canary: sliding-window attention is not supported: the model's layer groups are ['sliding_attention'] "
        "(config.sliding_window=8, config.layer_types=None); the canary guards full-attention layers only, whose "
        "positions map one to one onto cache slots")
    qwen = auto(transformers.Qwen2Config(use_sliding_window=True, sliding_window=8, max_window_layers=1, **kw),
                attn_implementation="sdpa")
    assert _refusal(lambda: attach(qwen)).startswith(
        "kv-canary: sliding-window attention is not supported: the model's layer groups are ['full_attention', "
        "'sliding_attention'] (config.sliding_window=8, config.layer_types=['full_attention', 'sliding_attention'])")

    llama = tiny_llama()
    llama.config._attn_implementation = "flash_attention_2"   # what auto_switch_to_flash sets when flash is installed
    assert _refusal(lambda: attach(llama)) == (
        "kv-canary: flash attention is not supported (attn_implementation='flash_attention_2'): its kernels write "
        "K/V through a block table instead of the write index the canary reads; load the model with "
        "attn_implementation='sdpa' or 'eager' and use ContinuousBatchingConfig(auto_switch_to_flash=False)")
    llama.config._attn_implementation = "sdpa"
    llama._device_mesh = object()
    assert _refusal(lambda: attach(llama)) == (
        "kv-canary: tensor parallel is not supported: the model is sharded over a device mesh (tp_plan / "
        "device_mesh); each rank's cache holds a slice of the KV heads")
    del llama._device_mesh

    # Settings of the continuous-batching config: refused when the engine builds its manager, before any work.
    gen, prompts = greedy(2), distinct_prompts(2, 5)
    with attach(llama, mode="quiet") as h:
        msg = _refusal(lambda: llama.generate_batch(prompts, generation_config=gen,
                                                    continuous_batching_config=cb(default_compile_level=1)))
        assert msg.startswith("kv-canary: torch.compile of the forward is not supported "
                              "(ContinuousBatchingConfig.varlen_compile_config=CompileConfig")
        assert msg.endswith("default_compile_level=1): compiled forwards are padded to fixed sizes; leave them "
                            "unset and default_compile_level=0")
        assert _refusal(lambda: llama.generate_batch(prompts, generation_config=gen,
                                                     continuous_batching_config=cb(use_async_batching=True))) == (
            "kv-canary: async double-buffered batching is not supported (ContinuousBatchingConfig."
            "use_async_batching=True): the next batch is prepared while the forward runs, with placeholder decode "
            "tokens; set use_async_batching=False")
        assert llama.config._attn_implementation == "sdpa" and h.canary is None
    # CUDA graphs and the flash decode fast path resolve to off on a CPU: check the resolved manager a GPU builds.
    for setting, expected in (
        ("use_cuda_graph", "kv-canary: CUDA graphs are not supported (ContinuousBatchingConfig.use_cuda_graph="
                           "(True, True), q_padding_interval_size=64, kv_padding_interval_size=16384): replays are "
                           "padded and skip the canary's host-side steps; set use_cuda_graph=False"),
        ("max_blocks_per_request", "kv-canary: the flash decode fast path is not supported (ContinuousBatchingConfig."
                                   "max_blocks_per_request=32): its kernel writes K/V through a block table; set it "
                                   "to 0"),
    ):
        manager = llama.init_continuous_batching(generation_config=gen, continuous_batching_config=cb())
        resolved = manager.continuous_batching_config
        setattr(resolved, setting, (True, True) if setting == "use_cuda_graph" else 32)
        assert _refusal(lambda m=manager: attach(m)) == expected
    assert patched_functions() == engine   # a refused attach() leaves nothing installed


def test_importing_kvcanary_does_not_import_transformers():
    code = "import sys, kvcanary, kvcanary.integrations; sys.exit('transformers' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_benchmark_script_runs_on_a_small_model(tmp_path):
    """bench/bench_transformers.py is run on a GPU only by hand: keep it working (its --small CPU mode)."""
    from support.bench_scripts import bench_module

    bench = bench_module("bench_transformers")
    out = tmp_path / "bench.md"
    assert bench.main(["--small", "--batch-sizes", "1,2", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| 1 |" in text and "| 2 |" in text and "all clean" in text
