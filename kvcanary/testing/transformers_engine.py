"""HF transformers' continuous batching as a test rig for :mod:`kvcanary.integrations.transformers`: used by the
integration tests (CPU and GPU) and by ``python -m kvcanary demo --engine transformers``. Imports transformers.

* :func:`tiny_llama`: a tiny random Llama built from a config (no downloads), on any device and dtype;
* workloads that exercise the engine's cache management (prefix sharing and de-duplication, chunked prefill,
  forks, soft resets, offload and restore);
* :data:`BUGS`: realistic bugs planted in the engine's own code paths, each with the report it must produce. A
  bug is installed through an object with ``setattr(target, name, value)`` that restores what it replaced
  (pytest's ``monkeypatch``, or :class:`Patches`) before ``attach()`` (the canary then wraps the buggy engine),
  and removed after ``detach()``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from transformers import ContinuousBatchingConfig, GenerationConfig, LlamaConfig
from transformers.generation.continuous_batching import continuous_api as cb_api
from transformers.generation.continuous_batching import input_outputs as cb_io
from transformers.generation.continuous_batching import offloading_manager as cb_off
from transformers.generation.continuous_batching.cache_allocators import cache_allocator as cb_alloc
from transformers.generation.continuous_batching.cache_allocators import full_attention as cb_full

from kvcanary.consts import CanaryLaunchTag as T
from kvcanary.consts import FailReason as R
from kvcanary.integrations.transformers import attach

PS = 4                     # page size of every run: small pages make many blocks, shares and copies
FULL = "full_attention"
SHARED = list(range(100, 124))           # 6 pages shared by a family of prompts


def tiny_llama(layers: int = 2, *, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A random 2-layer Llama (hidden 64, 2 KV heads of 16: 128 bytes of K per token and layer in float32)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    return model.to(device)


def cb(**kw: Any) -> ContinuousBatchingConfig:
    args = dict(page_size=PS, num_blocks=256, max_batch_tokens=64, max_requests_per_batch=16,
                auto_switch_to_flash=False)
    return ContinuousBatchingConfig(**{**args, **kw})


def greedy(n: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n, do_sample=False, eos_token_id=-1)


def sampled(n: int, *, children: int) -> GenerationConfig:
    """Sampling (the engine needs it to fork) with ``children`` sequences per prompt."""
    return GenerationConfig(max_new_tokens=n, do_sample=True, eos_token_id=-1, num_return_sequences=children)


def distinct_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens with no common prefix (their first tokens differ)."""
    g = torch.Generator().manual_seed(seed)
    return [[1 + 37 * i % 499] + torch.randint(1, 500, (length - 1,), generator=g).tolist() for i in range(n)]


def prefix_workload(new_tokens: int = 100):
    """Prefix families, identical prompts (completed in one forward: de-duplicated), long prompts split over several
    forwards by a small token budget (chunked prefill). ``(prompts, generation config, cb config)``."""
    prompts = [SHARED + [200 + i] * (2 + 3 * i) for i in range(6)]
    prompts += [SHARED[:12] + [300 + j for j in range(9)]] * 3
    prompts += [[400 + j % 90 for j in range(53)], [450 + j % 40 for j in range(41)]]
    return prompts, greedy(new_tokens), cb(max_batch_tokens=24, max_requests_per_batch=8)


def pressure_workload(*, cpu_pool: bool, new_tokens: int = 40, block_bytes: int = 2048):
    """10 requests in a 40-block cache: the engine offloads to a CPU swap pool of 10 blocks (``block_bytes`` each:
    2048 for :func:`tiny_llama` in float32), or soft-resets requests when there is no pool."""
    prompts = [[(13 * i + j) % 400 + 1 for j in range(10)] for i in range(10)]
    space = 10 * block_bytes / 1024**3 if cpu_pool else 0.0
    return prompts, greedy(new_tokens), cb(num_blocks=40, max_batch_tokens=64, cpu_offload_space=space)


def fork_workload(new_tokens: int = 100):
    """Prompts sampled three times each (forks share the complete blocks, copy the partial one)."""
    prompts = [SHARED[:9 + i] for i in range(0, 12, 3)] + distinct_prompts(3, 14)
    return prompts, sampled(new_tokens, children=3), cb(seed=7)


@contextlib.contextmanager
def swap_pool_on_cpu():
    """CPU-only torch cannot pin memory, and the engine's CPU swap pool is pinned: allocate it unpinned (a rig
    workaround, nothing the canary depends on; a no-op where CUDA is available)."""
    if torch.cuda.is_available():
        yield
        return
    orig = cb_off.OffloadingManager.__init__

    def init(self, *a, **k):
        real = torch.empty

        def empty(*args, **kw):
            kw.pop("pin_memory", None)
            return real(*args, **kw)

        with Patches() as patches:
            patches.setattr(torch, "empty", empty)
            orig(self, *a, **k)

    with Patches() as patches:
        patches.setattr(cb_off.OffloadingManager, "__init__", init)
        yield


def generate(model, prompts, gen, config, **attach_kw):
    """``(outputs, handle)``: one ``generate_batch`` under a freshly attached canary (quiet, sweeping every 4
    steps), detached afterwards; no request may fail."""
    kw = dict(mode="quiet", sweep_interval=4)
    with attach(model, **{**kw, **attach_kw}) as h:
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    errors = [o.error for o in out.values() if o.error]
    if errors:
        raise RuntimeError(f"kv-canary: {len(errors)} requests failed, the first with: {errors[0]}")
    return out, h


def tokens(out) -> dict[str, list[int]]:
    return {k: list(o.generated_tokens) for k, o in out.items()}


# --------------------------------------------------------------------------------------------------------
# Planted bugs


class Plant:
    """Where and when a planted bug struck: the engine step (as the canary counts them: HEAD of step ``n`` moves
    the count to ``n``; a bug planted while the engine prepares step ``n`` struck in step ``n``, one planted in
    ``update_batch`` after step ``n``'s forward struck in step ``n`` too) and the slots involved."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.slots: set[int] = set()
        self.handle: Any = None

    def now(self) -> int:
        return self.handle.session.engine_steps

    def strike(self, step: int, *, blocks=(), slots=()) -> None:
        self.step = step
        self.slots = {b * PS + o for b in blocks for o in range(PS)} | set(slots)


class Patches:
    """``setattr(target, name, value)`` that puts every replaced attribute back on exit (``with Patches() as p``),
    last replaced first: pytest's ``monkeypatch`` for code outside pytest."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def setattr(self, target: Any, name: str, value: Any) -> None:
        self._saved.append((target, name, target.__dict__[name]))
        setattr(target, name, value)

    def undo(self) -> None:
        while self._saved:
            target, name, value = self._saved.pop()
            setattr(target, name, value)

    def __enter__(self) -> Patches:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


def _slot_of_write_row(alloc, w: int) -> int:
    stride = alloc.block_physical_stride
    return (w // stride) * PS + w % stride


def _remap_table_entry(patches, plant: Plant) -> None:
    orig = cb_io.ContinuousBatchingIOs.prepare_batch_tensors

    def buggy(self, requests_in_batch, *a, **k):
        alloc = self.cache.cache_allocators[FULL]
        if plant.step is None:
            for x in [fs.state.request_id for fs in requests_in_batch if fs.state.position_offset >= 2 * PS]:
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

    patches.setattr(cb_io.ContinuousBatchingIOs, "prepare_batch_tensors", buggy)


def _hand_out_live_block(patches, plant: Plant) -> None:
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
                written = past_length + query_length - had * PS   # offsets of the new block this step writes
                plant.strike(plant.now() + 1, slots=[live * PS + o for o in range(written)])

    patches.setattr(cb_full.FullAttentionCacheAllocator, "allocate_cache_to_request", buggy)


def _flip_cached_v_byte(patches, plant: Plant) -> None:
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

    patches.setattr(cb_api.ContinuousBatchProcessor, "update_batch", buggy)


def _slip_position_id(patches, plant: Plant) -> None:
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

    patches.setattr(cb_io.ContinuousBatchingIOs, "prepare_batch_tensors", buggy)


def _dedup_other_tokens(patches, plant: Plant) -> None:
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
                plant.strike(plant.now(), blocks=[others[0]])

    patches.setattr(cb_alloc.CacheAllocator, "mark_complete_blocks", buggy)


def _share_fork_block(patches, plant: Plant) -> None:
    def buggy(self, source_request_id, dest_request_id, past_length):
        source = self.block_table[source_request_id]
        for b in source:
            self.ledger.acquire(b)
        self.block_table[dest_request_id] = list(source)
        shared = plant.slots | {source[-1] * PS + o for o in range(PS)}
        plant.strike(plant.now() if plant.step is None else plant.step, slots=shared)
        return [], []

    patches.setattr(cb_alloc.CacheAllocator, "fork_blocks", buggy)


@dataclass(frozen=True)
class PlantedBug:
    """A bug, the workload that triggers it, and the first report it must produce.

    ``tag``/``reasons``: the first violation's launch tag and the bits it must carry (``exact``: no other bit);
    ``absent``: bits it must not carry; ``phase`` and ``within``: it comes from that phase of an engine step in
    ``[strike + lag, strike + within]`` (``lag`` 0: the very step the bug struck, 1: a later one); its slot is
    one the bug touched."""

    name: str
    story: str
    install: Callable[[Any, Plant], None]
    workload: Callable[[], tuple[list[list[int]], GenerationConfig, ContinuousBatchingConfig]]
    tag: T
    reasons: R
    phase: str
    lag: int = 0
    within: int = 0
    exact: bool = False
    absent: int = 0

    def verdict(self, violations: list, step_of: Callable[[Any], tuple[int, str] | None], plant: Plant, *,
                ordered: bool = True) -> str | None:
        """None when the first report is the expected one, else what is wrong. ``ordered``: the first violation
        itself must match (the CPU reference appends rows in entry order); otherwise one of the rows of the first
        reporting launch must (CUDA threads append the rows of one launch in any order)."""
        if plant.step is None:
            return "the bug was never planted"
        if not violations:
            return "the planted bug went unreported"
        first = violations[0]
        found = step_of(first)
        if found is None:
            return "the first report has no engine step"
        step, phase = found
        if phase != self.phase or not plant.step + self.lag <= step <= plant.step + self.within:
            return f"first report in engine step {step} ({phase}), bug planted in step {plant.step}"
        rows = [first] if ordered else [v for v in violations if v.step == first.step and v.tag == int(self.tag)]

        def matches(v) -> bool:
            bits = int(v.reasons)
            return (v.tag == int(self.tag) and (bits == int(self.reasons) if self.exact
                                                else bits & int(self.reasons) == int(self.reasons))
                    and not bits & self.absent and v.slot in plant.slots)

        if not any(matches(v) for v in rows):
            return f"unexpected first report: {first}"
        return None


BUGS = {b.name: b for b in (
    PlantedBug(
        "table_entry_to_another_request", "request X's first table entry points at request Y's second block (X "
        "attends to Y's KV): the HEAD verify of that very step sees a foreign position and a broken chain",
        _remap_table_entry, lambda: (distinct_prompts(6, 13), greedy(12), cb()),
        T.HEAD_K_FULL, R.VERIFY_CHAIN_HASH_MISMATCH | R.VERIFY_POSITION_MISMATCH, "head"),
    PlantedBug(
        "block_handed_out_while_in_use", "the allocator gives request Y, growing into a new block, running request "
        "X's first block: Y's forward overwrites X's KV, and the TAIL verify of that step sees X's fingerprints",
        _hand_out_live_block, lambda: (distinct_prompts(6, 10), greedy(12), cb()),
        T.TAIL_K_FULL, R.VERIFY_REAL_KV_HASH_MISMATCH, "tail", exact=True),
    PlantedBug(
        "kv_byte_flipped_in_cached_block", "a stray write flips a bit of the last layer's V in a block the prefix "
        "cache keeps (no running request reads it): the next sweep sees its fingerprint, in the V half",
        _flip_cached_v_byte,
        # Few requests per batch: the first ones finish, leaving their blocks cached while the others run.
        lambda: (distinct_prompts(10, 10), greedy(12), cb(max_requests_per_batch=4)),
        T.SWEEP_V_FULL, R.VERIFY_REAL_KV_HASH_MISMATCH, "sweep", lag=1, within=4, exact=True),
    PlantedBug(
        "position_id_slip", "the batch builder shifts a decode token's position id by one (the model rotates it "
        "wrongly): the HEAD write of that step sees a position that does not continue the chain",
        _slip_position_id, lambda: (distinct_prompts(4, 9), greedy(10), cb()),
        T.HEAD_K_FULL, R.WRITE_POSITION_MISMATCH, "head", exact=True),
    PlantedBug(
        "dedup_of_other_tokens", "de-duplication adopts another request's first block, holding other tokens at the "
        "same positions (a hash collision): the block's chain and positions agree, its tokens do not (next HEAD)",
        _dedup_other_tokens, lambda: (distinct_prompts(5, 11), greedy(12), cb()),
        T.HEAD_K_FULL, R.VERIFY_TOKEN_MISMATCH, "head", lag=1, within=1, absent=int(R.VERIFY_POSITION_MISMATCH)),
    PlantedBug(
        "fork_shares_block_to_copy", "a fork shares the parent's partly written last block instead of copying it: "
        "parent and children write their own sampled tokens into one slot, and the losers' next HEAD sees another",
        _share_fork_block,
        # Prompts of 4k + 1 tokens: the parent is forked after 4k of them; its last block (allocated for the
        # whole prompt, still empty) then takes the last prompt token (the same for all) and three sampled ones.
        lambda: (distinct_prompts(2, 13), sampled(8, children=3), cb(seed=3)),
        T.HEAD_K_FULL, R.VERIFY_TOKEN_MISMATCH, "head", lag=1, within=5),
)}


def run_planted(model, bug: PlantedBug, patches, **attach_kw):
    """Install ``bug`` through ``patches`` (``monkeypatch`` or :class:`Patches`; the caller undoes it), run its
    workload under a quiet canary sweeping every 4 steps. Returns ``(handle, plant, verdict)``: ``verdict`` is
    None when the first report is the expected one (:meth:`PlantedBug.verdict`)."""
    plant = Plant()
    bug.install(patches, plant)
    prompts, gen, config = bug.workload()
    with attach(model, **{"mode": "quiet", "sweep_interval": 4, **attach_kw}) as h:
        plant.handle = h
        model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config)
    ordered = h.canary is None or h.canary.device.type == "cpu"
    return h, plant, bug.verdict(h.violations, h.engine_step_of, plant, ordered=ordered)
