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

import contextlib

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the transformers extra is not installed")

from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig  # noqa: E402
from transformers.generation.continuous_batching import continuous_api as cb_api  # noqa: E402
from transformers.generation.continuous_batching import input_outputs as cb_io  # noqa: E402
from transformers.generation.continuous_batching import offloading_manager as cb_off  # noqa: E402
from transformers.generation.continuous_batching.cache_allocators import cache_allocator as cb_alloc  # noqa: E402
from transformers.generation.continuous_batching.cache_allocators import full_attention as cb_full  # noqa: E402

from kvcanary import CanaryLaunchTag as T  # noqa: E402
from kvcanary import CanaryViolationError  # noqa: E402
from kvcanary import FailReason as R  # noqa: E402
from kvcanary.integrations.transformers import (  # noqa: E402
    UnsupportedSettingError,
    attach,
    patched_functions,
)
from kvcanary.integrations.transformers import records as tf_records  # noqa: E402

PS = 4          # page size of every run: small pages make many blocks, shares, copies
FULL = "full_attention"


def tiny_llama(layers: int = 2, **kw):
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=256, **kw)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def cb(**kw) -> ContinuousBatchingConfig:
    args = dict(page_size=PS, num_blocks=256, max_batch_tokens=64, max_requests_per_batch=16,
                auto_switch_to_flash=False)
    return ContinuousBatchingConfig(**{**args, **kw})


def greedy(n: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=-1)


def distinct_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts with no common prefix (their first tokens differ)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        rest = torch.randint(1, 500, (length - 1,), generator=g).tolist()
        out.append([1 + 37 * i % 499] + rest)
    return out


@contextlib.contextmanager
def swap_pool_on_cpu():
    """CPU-only torch cannot pin memory, and the engine's CPU swap pool is pinned: allocate it unpinned (a test-rig
    workaround, not a canary concern; nothing changes where a GPU exists)."""
    if torch.cuda.is_available():
        yield
        return
    orig = cb_off.OffloadingManager.__init__

    def init(self, *a, **k):
        real = torch.empty

        def empty(*args, **kw):
            kw.pop("pin_memory", None)
            return real(*args, **kw)

        torch.empty = empty
        try:
            orig(self, *a, **k)
        finally:
            torch.empty = real

    cb_off.OffloadingManager.__init__ = init
    try:
        yield
    finally:
        cb_off.OffloadingManager.__init__ = orig


def generate(model, prompts, gen, config, **attach_kw):
    """``(outputs, handle)``: one ``generate_batch`` under a freshly attached canary (quiet), then detached."""
    kw = dict(mode="quiet", sweep_interval=4)
    with attach(model, **{**kw, **attach_kw}) as h:
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    assert not [o.error for o in out.values() if o.error]
    return out, h


def tokens(out) -> dict[str, list[int]]:
    return {k: list(o.generated_tokens) for k, o in out.items()}


# --------------------------------------------------------------------------------------------------------
# Clean runs

SHARED = list(range(100, 124))           # 6 pages shared by a family of prompts


def _prefix_workload():
    """Prefix families, identical prompts (completed in the same forward: de-duplicated), long prompts split over
    several forwards by a small token budget."""
    prompts = [SHARED + [200 + i] * (2 + 3 * i) for i in range(6)]
    prompts += [SHARED[:12] + [300 + j for j in range(9)]] * 3
    prompts += [[400 + j % 90 for j in range(53)], [450 + j % 40 for j in range(41)]]
    return prompts, greedy(100), cb(max_batch_tokens=24, max_requests_per_batch=8)


def _pressure_workload(cpu_pool: bool):
    prompts = [[(13 * i + j) % 400 + 1 for j in range(10)] for i in range(10)]
    space = 10 * 2048 / 1024**3 if cpu_pool else 0.0    # 10 blocks of this model, or none (soft resets)
    return prompts, greedy(40), cb(num_blocks=40, max_batch_tokens=64, cpu_offload_space=space)


# Engine steps each clean run takes at least (together more than 500 forwards under the canary).
MIN_STEPS = {"prefix_dedup_chunked": 200, "soft_reset": 100, "offload_restore": 100, "forks": 200}


@pytest.mark.parametrize("workload", ["prefix_dedup_chunked", "soft_reset", "offload_restore"])
def test_clean_run_reports_nothing_and_changes_no_token(model, workload):
    if workload == "prefix_dedup_chunked":
        prompts, gen, config = _prefix_workload()
    else:
        prompts, gen, config = _pressure_workload(cpu_pool=workload == "offload_restore")
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
    prompts = [SHARED[:9 + i] for i in range(0, 12, 3)] + distinct_prompts(3, 14)
    gen = GenerationConfig(max_new_tokens=100, do_sample=True, eos_token_id=-1, num_return_sequences=3)
    config = cb(seed=7)
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
        prompts = distinct_prompts(3, 14)
        gen = GenerationConfig(max_new_tokens=6, do_sample=True, eos_token_id=-1, num_return_sequences=2)
        config = cb(seed=7)
    else:
        prompts, gen, config = _pressure_workload(cpu_pool=True)
    with swap_pool_on_cpu():
        _out, h = generate(model, prompts, gen, config)
    assert h.violations
    first = h.violations[0]
    assert first.tag == T.HEAD_K_FULL and first.reasons & (R.VERIFY_POSITION_MISMATCH | R.VERIFY_CHAIN_HASH_MISMATCH)


# --------------------------------------------------------------------------------------------------------
# Bugs planted in the engine's own code paths (installed before attach(): the canary wraps the buggy engine)


class Plant:
    """Where and when a planted bug struck: the engine step (as the canary counts them), the slots involved."""

    def __init__(self):
        self.step: int | None = None
        self.slots: set[int] = set()
        self.handle = None

    def now(self) -> int:
        """The engine step the canary has reached (HEAD of step n increments the count to n)."""
        return self.handle.session.engine_steps

    def strike(self, step: int, blocks=(), slots=()) -> None:
        self.step = step
        self.slots = {b * PS + o for b in blocks for o in range(PS)} | set(slots)


def run_planted(model, plant: Plant, prompts, gen, config, **kw):
    """Run under a quiet canary; return the first report and the engine step and phase that found it."""
    with attach(model, mode="quiet", sweep_interval=4, **kw) as h:
        plant.handle = h
        model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    assert plant.step is not None, "the bug was never planted"
    assert h.violations, "the planted bug went unreported"
    first = h.violations[0]
    return first, h.engine_step_of(first)


def _slot_of_write_row(alloc, w: int) -> int:
    stride = alloc.block_physical_stride
    return (w // stride) * PS + w % stride


def test_table_entry_pointing_at_another_requests_block(model, monkeypatch):
    """Request X's first table entry is repointed at request Y's second block (X then attends to Y's KV): the
    HEAD verify of that very step reports the foreign block with a wrong position and a broken chain."""
    plant = Plant()
    orig = cb_io.ContinuousBatchingIOs.prepare_batch_tensors

    def buggy(self, requests_in_batch, *a, **k):
        alloc = self.cache.cache_allocators[FULL]
        if plant.step is None:
            xs = [fs.state.request_id for fs in requests_in_batch if fs.state.position_offset >= 2 * PS]
            for x in xs:
                ys = [y for y, t in alloc.block_table.items() if y != x and len(t) >= 2]
                if ys:
                    foreign = alloc.block_table[ys[0]][1]
                    alloc.ledger.acquire(foreign)
                    old, alloc.block_table[x][0] = alloc.block_table[x][0], foreign
                    if alloc.ledger.release(old):
                        alloc.pool.free_blocks(alloc.index, [old])
                    plant.strike(plant.now() + 1, blocks=[foreign])
                    break
        return orig(self, requests_in_batch, *a, **k)

    monkeypatch.setattr(cb_io.ContinuousBatchingIOs, "prepare_batch_tensors", buggy)
    first, (step, phase) = run_planted(model, plant, distinct_prompts(6, 13), greedy(12), cb())
    assert first.tag == T.HEAD_K_FULL
    assert first.reasons & (R.VERIFY_CHAIN_HASH_MISMATCH | R.VERIFY_POSITION_MISMATCH) == (
        R.VERIFY_CHAIN_HASH_MISMATCH | R.VERIFY_POSITION_MISMATCH)
    assert first.slot in plant.slots and (step, phase) == (plant.step, "head")


def test_block_handed_to_another_request_while_in_use(model, monkeypatch):
    """The allocator gives request Y, growing into a new block, the first block of running request X: Y's forward
    overwrites X's KV, so the TAIL verify of that step reports X's block by its real-KV fingerprint."""
    plant = Plant()
    orig = cb_full.FullAttentionCacheAllocator.allocate_cache_to_request

    def buggy(self, request_id, past_length, query_length):
        had = len(self.block_table.get(request_id, []))
        orig(self, request_id, past_length, query_length)
        table = self.block_table[request_id]
        if plant.step is None and had >= 1 and len(table) > had:
            xs = [x for x, t in self.block_table.items() if x != request_id and len(t) >= 2]
            if xs:
                live = self.block_table[xs[0]][0]
                fresh, table[-1] = table[-1], live
                self.pool.free_blocks(self.index, [fresh])
                # Y writes the first (past_length + query_length - had * PS) offsets of the block.
                plant.strike(plant.now() + 1, slots=[live * PS + o for o in range(past_length + query_length
                                                                                      - had * PS)])

    monkeypatch.setattr(cb_full.FullAttentionCacheAllocator, "allocate_cache_to_request", buggy)
    first, (step, phase) = run_planted(model, plant, distinct_prompts(6, 10), greedy(12), cb())
    assert first.tag == T.TAIL_K_FULL and first.reasons == R.VERIFY_REAL_KV_HASH_MISMATCH
    assert first.slot in plant.slots and (step, phase) == (plant.step, "tail")


def test_kv_byte_flipped_in_a_cached_block(model, monkeypatch):
    """A stray write flips one bit of the last layer's V in a block the prefix cache keeps for reuse (no running
    request reads it): the next sweep reports it by its real-KV fingerprint, in the V half."""
    plant = Plant()
    orig = cb_api.ContinuousBatchProcessor.update_batch

    def buggy(self):
        orig(self)
        alloc = self.cache.cache_allocators[FULL]
        if plant.step is None and alloc.ledger.cached_blocks:
            block = next(iter(alloc.ledger.cached_blocks))
            v_rows = alloc._kv_token_views[alloc.layer_indices[-1]][1]   # the engine's own V view of that layer
            row = v_rows[block * alloc.block_physical_stride + 1].view(torch.uint8).view(-1)
            row[0] ^= 0x01
            plant.strike(plant.now(), slots=[block * PS + 1])

    monkeypatch.setattr(cb_api.ContinuousBatchProcessor, "update_batch", buggy)
    # Few requests per batch: the first ones finish and leave their blocks cached while the others still run.
    first, (step, phase) = run_planted(model, plant, distinct_prompts(10, 10), greedy(12),
                                       cb(max_requests_per_batch=4))
    assert first.tag == T.SWEEP_V_FULL and first.reasons == R.VERIFY_REAL_KV_HASH_MISMATCH
    assert first.slot in plant.slots and phase == "sweep" and plant.step < step <= plant.step + 4


def plant_position_slip(monkeypatch, plant: Plant) -> None:
    """From the third engine step on, the batch builder shifts the position id of the first token that continues
    a cached prefix by one."""
    orig = cb_io.ContinuousBatchingIOs.prepare_batch_tensors

    def buggy(self, requests_in_batch, *a, **k):
        offsets = [fs.state.position_offset for fs in requests_in_batch]
        orig(self, requests_in_batch, *a, **k)
        if plant.step is None and plant.handle.session is not None and plant.now() >= 3:
            start = 0
            for fs, pre in zip(requests_in_batch, offsets):
                if pre > 0:
                    self.position_ids[start] += 1
                    w = int(self.write_index_storage[0, start])
                    plant.strike(plant.now() + 1, slots=[_slot_of_write_row(self.cache.cache_allocators[FULL], w)])
                    break
                start += fs.query_length

    monkeypatch.setattr(cb_io.ContinuousBatchingIOs, "prepare_batch_tensors", buggy)


def test_position_id_slip(model, monkeypatch):
    """The batch builder shifts one decode token's position id by one (the model then rotates it wrongly): the
    HEAD write of that step reports the position that does not continue the request's chain."""
    plant = Plant()
    plant_position_slip(monkeypatch, plant)
    first, (step, phase) = run_planted(model, plant, distinct_prompts(4, 9), greedy(10), cb())
    assert first.tag == T.HEAD_K_FULL and first.reasons == R.WRITE_POSITION_MISMATCH
    assert first.slot in plant.slots and (step, phase) == (plant.step, "head")


def test_raise_mode_stops_the_engine_and_reraises(model, monkeypatch):
    """mode="raise": the violation is raised in the engine's thread, which fails its requests with it; leaving the
    ``with`` block raises it in the caller's thread."""
    plant = Plant()
    plant_position_slip(monkeypatch, plant)
    with pytest.raises(CanaryViolationError) as e, attach(model, mode="raise") as h:
        plant.handle = h
        out = model.generate_batch(distinct_prompts(4, 9), generation_config=greedy(10),
                                   continuous_batching_config=cb())
    assert e.value is h.error and e.value.violations[0].reasons == R.WRITE_POSITION_MISMATCH
    assert out and all(o.error is not None and "write_position" in o.error for o in out.values())


def test_dedup_swapping_in_a_block_of_other_tokens(model, monkeypatch):
    """De-duplication adopts another request's first block, which holds other tokens at the same positions (a
    hash collision): its chain starts at the anchor and its positions match, so only the token check sees it, at
    the request's next HEAD verify."""
    plant = Plant()
    orig = cb_alloc.CacheAllocator.mark_complete_blocks

    def buggy(self, request_id, token_ids, new_new_blocks):
        orig(self, request_id, token_ids, new_new_blocks)
        table = self.block_table.get(request_id)
        if plant.step is None and table and table[0] in self.ledger.block_to_hash:
            others = [t[0] for r, t in self.block_table.items()
                      if r != request_id and t and t[0] != table[0] and t[0] in self.ledger.block_to_hash]
            if others:
                self.ledger.acquire(others[0])
                old, table[0] = table[0], others[0]
                if self.ledger.release(old):
                    self.pool.free_blocks(self.index, [old])
                plant.strike(plant.now() + 1, blocks=[others[0]])

    monkeypatch.setattr(cb_alloc.CacheAllocator, "mark_complete_blocks", buggy)
    first, (step, phase) = run_planted(model, plant, distinct_prompts(5, 11), greedy(12), cb())
    assert first.tag == T.HEAD_K_FULL and first.reasons & R.VERIFY_TOKEN_MISMATCH
    assert not first.reasons & R.VERIFY_POSITION_MISMATCH
    assert first.slot in plant.slots and (step, phase) == (plant.step, "head")


def test_fork_sharing_a_block_it_should_copy(model, monkeypatch):
    """A fork shares the parent's partly written last block instead of copying it: parent and children write
    their different sampled tokens into the same slots, and the losers' next HEAD verify sees another token."""
    plant = Plant()

    def buggy(self, source_request_id, dest_request_id, past_length):
        source = self.block_table[source_request_id]
        for b in source:
            self.ledger.acquire(b)
        self.block_table[dest_request_id] = list(source)
        shared = plant.slots | {source[-1] * PS + o for o in range(PS)}
        plant.strike(plant.now() if plant.step is None else plant.step, slots=shared)
        return [], []

    monkeypatch.setattr(cb_alloc.CacheAllocator, "fork_blocks", buggy)
    # Prompts of 4k + 1 tokens: the parent is forked after 4k of them, its last block (allocated for the whole
    # prompt, still empty) then takes positions 4k to 4k + 3: the last prompt token (the same for all) and three
    # sampled ones.
    prompts = distinct_prompts(2, 13)
    gen = GenerationConfig(max_new_tokens=8, do_sample=True, eos_token_id=-1, num_return_sequences=3)
    first, (step, phase) = run_planted(model, plant, prompts, gen, cb(seed=3))
    assert first.tag == T.HEAD_K_FULL and first.reasons & R.VERIFY_TOKEN_MISMATCH
    assert first.slot in plant.slots and phase == "head" and plant.step < step <= plant.step + 5


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
