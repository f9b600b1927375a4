"""One canary session: a :class:`~kvcanary.KVCanary` over one ``PagedAttentionCache``, driven step by step.

A session lives as long as the engine's batch processor and its cache (one ``generate_batch`` call, or a
persistent manager across calls). It owns

* the canary, sized from the cache (:class:`~kvcanary.integrations.transformers.geometry.CacheGeometry`): one
  slot per token of every block of the cache tensor, a K and a V real-KV source per layer, ``block_size`` = the
  page size and ``pad_row = -1`` (every table row is a request row);
* the device tables (:class:`~kvcanary.integrations.transformers.tables.RequestTables`);
* the record mover (:class:`~kvcanary.integrations.transformers.records.RecordMover`) and the content of every
  block the prefix cache has hashed (for the sweep);

and turns each engine step into canary calls: :meth:`CanarySession.head` right before the forward (after the
scheduler, the offload/restore copies and ``prepare_batch_tensors``), :meth:`CanarySession.tail` right after
it (before ``update_batch`` de-duplicates blocks and forks requests), and a sweep of the hashed blocks every
``sweep_interval`` steps. On CUDA everything is issued on the engine's compute stream, the stream its forward and
block copies run on.

Per step (``bs`` requests, ``N`` tokens; all int64 on the cache's device unless said otherwise):

* ``req_pool_indices [bs]``: each request's row; ``prefix_lens [bs]``: ``position_offset - query_length`` (the
  engine advanced ``position_offset`` while building the batch); ``extend_seq_lens [bs]``: ``query_length``;
* ``input_ids [N]``, ``positions [N]``: the engine's own int32 ``input_ids`` / ``position_ids``, widened;
* ``out_cache_loc [N]``: the slots the forward writes, from the engine's write index (what it really writes);
* ``block_table``: the device copy of the engine's block lists (what the engine reads through);
* ``expected_tokens``/``expected_tokens_valid_lens``: each request's token history up to its prefix.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from kvcanary.consts import RealKvHashMode
from kvcanary.errors import invalid
from kvcanary.integrations.transformers.geometry import FULL_ATTENTION, CacheGeometry, upload
from kvcanary.integrations.transformers.records import RecordMover
from kvcanary.integrations.transformers.refusals import UnsupportedSettingError
from kvcanary.integrations.transformers.tables import RequestTables, TableUpdates
from kvcanary.ops.structs import RealKvSource
from kvcanary.runtime.canary import KVCanary


@dataclass(frozen=True)
class BlockContent:
    """What a hashed block holds: its hash, its logical index in the sequences that use it, its tokens, and the
    block (and that block's hash) it continued when it was hashed (-1 for the first block)."""

    hash: int
    index: int
    tokens: tuple[int, ...]
    parent: int
    parent_hash: int | None


@dataclass(frozen=True)
class SessionOptions:
    """What :func:`~kvcanary.integrations.transformers.attach` was asked for (see its docstring)."""

    mode: str
    sweep_interval: int | None
    real_kv_hash_mode: RealKvHashMode
    real_kv_read_bytes: int | None
    check_tokens: bool
    max_seq_len: int | None
    max_rows: int | None
    name: str
    canary_kwargs: dict[str, Any]


class CanarySession:
    """The canary of one batch processor's cache (see the module docstring).

    Args:
        processor: the transformers ``ContinuousBatchProcessor`` (its cache, IOs and compute stream).
        model: the model it runs (for ``max_position_embeddings``).
        options: the attach options.
    """

    def __init__(self, processor: Any, model: Any, options: SessionOptions) -> None:
        self.processor = processor
        self.cache = processor.cache
        self.alloc = self.cache.cache_allocators[FULL_ATTENTION]
        self.geometry = g = CacheGeometry.of(self.cache)
        self.device = g.device
        self.stream = processor.inputs_and_outputs.compute_stream if self.device.type == "cuda" else None
        self.options = options
        max_batch = int(processor.inputs_and_outputs.max_requests_per_batch)

        max_seq = options.max_seq_len
        if max_seq is None:
            cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
            max_seq = getattr(cfg, "max_position_embeddings", None) or int(self.cache.max_tokens_read)
        max_seq = min(int(max_seq), int(self.alloc.num_blocks) * g.page_size)
        max_blocks = max(1, -(-max_seq // g.page_size))
        max_rows = options.max_rows if options.max_rows is not None else 2 * max_batch
        if max_rows < max_batch:
            raise invalid(f"max_rows must be at least the engine's max_requests_per_batch={max_batch}, got {max_rows}")

        mode = RealKvHashMode(options.real_kv_hash_mode)
        k_src: tuple[RealKvSource, ...] = ()
        v_src: tuple[RealKvSource, ...] = ()
        if mode != RealKvHashMode.NONE:
            k_src = tuple(g.sources(0, read_bytes=options.real_kv_read_bytes))
            v_src = tuple(g.sources(1, read_bytes=options.real_kv_read_bytes))
        self.k_sources, self.v_sources = k_src, v_src   # one per layer, in layer order (TAIL and SWEEP fold them)
        # Built outside inference mode: the engine's thread may run under it, and inference tensors could not be
        # updated in place later from the caller's thread (reset_log, the tables).
        with torch.inference_mode(False), torch.no_grad():
            self.canary = KVCanary(
                num_slots=g.num_slots, max_batch_size=max_batch, max_tokens_per_step=int(self.cache.max_batch_tokens),
                device=self.device, with_v=True, k_sources=k_src, v_sources=v_src, real_kv_hash_mode=mode,
                mode=options.mode, block_size=g.page_size, pad_row=-1, sweep_interval=options.sweep_interval,
                expected_tokens_shape=(max_rows, max_blocks * g.page_size) if options.check_tokens else None,
                name=options.name, **options.canary_kwargs)
            self.tables = RequestTables(max_rows=max_rows, max_blocks=max_blocks, page_size=g.page_size,
                                        device=self.device, check_tokens=options.check_tokens)
        self.mover = RecordMover(buffers=list(self.canary.buffers.values()), page_size=g.page_size,
                                 device=self.device, stream=self.stream)
        self.hashed: dict[int, BlockContent] = {}
        # Cache operations seen that move no record: de-duplicated blocks and soft-reset requests.
        self.events = {"dedup_swaps": 0, "soft_resets": 0}
        self.engine_steps = 0
        # (engine step, phase) of each canary step, by canary step number - 1 (Violation.step is 1-based).
        self.step_log: list[tuple[int, str]] = []
        self._batch: dict[str, Any] | None = None

    # -- streams -------------------------------------------------------------------------------------------

    def on_stream(self) -> contextlib.AbstractContextManager[Any]:
        """Make the engine's compute stream torch's current stream (CUDA), so the canary's torch ops, kernels and
        end-of-step staging are ordered with the forward and the engine's block copies."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)

    def _log(self, phase: str) -> None:
        while len(self.step_log) < self.canary.step_number:
            self.step_log.append((self.engine_steps, phase))

    # -- HEAD / TAIL ---------------------------------------------------------------------------------------

    def head(self) -> None:
        """Before the forward: build this step's metadata, sweep when due, then ``canary.step("head")``."""
        io = self.processor.inputs_and_outputs
        if io.use_block_table:
            raise UnsupportedSettingError("kv-canary: a batch took the flash decode fast path (block-table writes); "
                                          "set ContinuousBatchingConfig.max_blocks_per_request=0")
        self.engine_steps += 1
        reqs = io.requests_in_batch
        in_batch = {fs.state.request_id for fs in reqs}
        updates = TableUpdates()
        rows, prefix, extend, valid = [], [], [], []
        blocks_of = self.alloc.block_table
        for fs in reqs:
            st = fs.state
            q = int(fs.query_length)
            pre = int(st.position_offset) - q
            row, v = self.tables.prepare(st.request_id, blocks_of.get(st.request_id, []), st, pre, in_batch, updates)
            rows.append(row)
            prefix.append(pre)
            extend.append(q)
            valid.append(v)
        n = len(rows)
        total = sum(extend)
        written = int(io.true_write_sizes[0])
        if total != written:
            raise invalid(f"the batch's query lengths add up to {total} tokens but the engine writes {written}")
        if self.stream is not None:
            # prepare_batch_tensors filled the IO tensors on the caller's stream.
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with self.on_stream():
            dev = upload(rows + prefix + extend + valid + updates.table + updates.tokens, self.device)
            meta = dev[: 4 * n].view(4, n)
            nt = len(updates.table)
            self.tables.apply(dev[4 * n: 4 * n + nt], dev[4 * n + nt:], updates.cleared_rows)
            batch: dict[str, Any] = dict(
                req_pool_indices=meta[0], prefix_lens=meta[1], extend_seq_lens=meta[2],
                input_ids=io.input_ids[:total].to(torch.int64),
                positions=io.position_ids[:total].to(torch.int64),
                out_cache_loc=self.geometry.slots_of_write_index(io.write_index_storage[0, :total]),
                block_table=self.tables.block_table)
            if self.tables.tokens is not None:
                batch.update(expected_tokens=self.tables.tokens, expected_tokens_valid_lens=meta[3])
            self._batch = batch
            if self.canary.sweep_due():
                self.sweep()
            self.canary.step("head", stream=self.stream, **batch)
        self._log("head")

    def tail(self) -> None:
        """After the forward: ``canary.step("tail")`` with the metadata HEAD built (real-KV fingerprints now)."""
        batch = self._batch
        if batch is None:
            raise invalid("tail() without head()")
        self._batch = None
        with self.on_stream():
            self.canary.step("tail", stream=self.stream, **batch)
        self._log("tail")

    def abort(self) -> None:
        """The forward raised after HEAD: close the canary's open forward."""
        if self._batch is not None:
            self._batch = None
            self.canary.abort_forward()

    # -- sweep ---------------------------------------------------------------------------------------------

    def sweep(self) -> None:
        """Verify every block the prefix cache has hashed (cached for reuse, or still shared) against its TAIL
        records: chain, position, token (when ``check_tokens``) and real KV. A block's first slot is chained to
        the block it continued while that block still holds the same content (else it is not chain-checked)."""
        ledger = self.alloc.ledger
        hashes = ledger.block_to_hash
        live = {b: c for b, c in self.hashed.items() if hashes.get(b) == c.hash}
        self.hashed = live
        ps = self.geometry.page_size
        blocks: list[int] = []
        index: list[int] = []
        first_prev: list[int] = []
        tokens: list[int] = []
        for b, c in live.items():
            blocks.append(b)
            index.append(c.index)
            if c.index == 0:
                first_prev.append(-1)                       # the chain's head: checked against the anchor
            elif c.parent >= 0 and hashes.get(c.parent) == c.parent_hash:
                first_prev.append(c.parent * ps + ps - 1)
            else:
                first_prev.append(0)                        # predecessor gone: no chain check
            tokens.extend(c.tokens)
        nb = len(blocks)
        with self.on_stream():
            dev = upload(blocks + index + first_prev + tokens, self.device)
            ar = torch.arange(ps, dtype=torch.int64, device=self.device)
            slots = (dev[:nb, None] * ps + ar).reshape(-1)
            positions = (dev[nb: 2 * nb, None] * ps + ar).reshape(-1)
            prev = (slots - 1).view(nb, ps)
            prev[:, 0] = dev[2 * nb: 3 * nb]
            expected = dev[3 * nb:] if self.options.check_tokens else None
            self.canary.sweep(slots, positions, prev.reshape(-1), expected_tokens=expected, stream=self.stream)
        self._log("sweep")

    # -- what the engine's cache management did -------------------------------------------------------------

    def on_blocks_hashed(self, request_id: str, token_ids: list[int], before: list[int]) -> None:
        """After ``mark_complete_blocks``: remember the content of every block of the request the ledger now
        hashes (``before``: the request's block list before the call; a de-duplicated block needs no record
        move, it is only counted)."""
        table = self.alloc.block_table.get(request_id)
        if not table:
            return
        self.events["dedup_swaps"] += sum(1 for a, b in zip(before, table) if a != b)
        hashes = self.alloc.ledger.block_to_hash
        ps = self.geometry.page_size
        parent, parent_hash = -1, None
        for i, b in enumerate(table):
            h = hashes.get(b)
            if h is None:
                break
            c = self.hashed.get(b)
            if c is None or c.hash != h:
                self.hashed[b] = BlockContent(hash=h, index=i, tokens=tuple(token_ids[i * ps:(i + 1) * ps]),
                                              parent=parent, parent_hash=parent_hash)
            parent, parent_hash = b, h

    def on_request_freed(self, request_id: str) -> None:
        self.tables.release(request_id)

    def on_all_freed(self, clear_ledgers: bool) -> None:
        self.tables.release_all()
        if clear_ledgers:
            self.hashed.clear()

    def on_fork_copy(self, copy_src_and_dst: dict[str, tuple[list[int], list[int]]]) -> None:
        src, dst = copy_src_and_dst.get(FULL_ATTENTION, ([], []))
        with self.on_stream():
            self.mover.copy_blocks(list(src), list(dst))

    def on_offloaded(self, offloading_manager: Any, victim_block_tables: dict[str, dict[str, list[int]]],
                     offloaded: set[str]) -> None:
        """After ``_offload_to_cpu``: stash the records of the requests copied to the CPU pool (the other victims
        are soft reset: re-prefilled later into fresh blocks, nothing to move)."""
        cpu_tables = offloading_manager._request_id_to_cpu_blocks
        self.events["soft_resets"] += len(set(victim_block_tables) - offloaded)
        with self.on_stream():
            for rid in offloaded:
                gpu = victim_block_tables.get(rid, {}).get(FULL_ATTENTION, [])
                cpu = cpu_tables.get(rid, {}).get(FULL_ATTENTION, [])
                self.mover.offload(rid, list(gpu), list(cpu))
        self.mover.forget(set(cpu_tables))

    def restore_pairs(self, offloading_manager: Any, requests_in_batch: list[Any]) -> list[tuple[str, list[int],
                                                                                                 list[int]]]:
        """Before ``restore_scheduled_requests`` (which forgets them): ``(request, cpu blocks, gpu blocks)`` of
        every CPU-offloaded request of the batch, paired positionally as the engine copies them."""
        pairs = []
        cpu_tables = offloading_manager._request_id_to_cpu_blocks
        for fs in requests_in_batch:
            st = fs.state
            if not st.is_cpu_offloaded or st.request_id not in cpu_tables:
                continue
            cpu = cpu_tables[st.request_id].get(FULL_ATTENTION, [])
            gpu = self.alloc.block_table.get(st.request_id, [])
            k = min(len(cpu), len(gpu))
            pairs.append((st.request_id, list(cpu[:k]), list(gpu[:k])))
        return pairs

    def on_restored(self, offloading_manager: Any, pairs: list[tuple[str, list[int], list[int]]]) -> None:
        with self.on_stream():
            for rid, cpu, gpu in pairs:
                self.mover.restore(rid, cpu, gpu)
        self.mover.forget(set(offloading_manager._request_id_to_cpu_blocks))

    # -- reporting ---------------------------------------------------------------------------------------------

    def engine_step_of(self, step: int) -> tuple[int, str] | None:
        """``(engine step, phase)`` of canary step ``step`` (a :attr:`~kvcanary.Violation.step`), phase one of
        ``"head"``, ``"tail"``, ``"sweep"``; None when unknown."""
        if 1 <= step <= len(self.step_log):
            return self.step_log[step - 1]
        return None
