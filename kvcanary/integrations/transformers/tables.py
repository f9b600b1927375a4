"""The canary's view of the engine's per-request tables: a block table and an expected-token pool on the device.

transformers keeps each request's block list as a Python list (``allocator.block_table[request_id]``) and its
token history as ``state.initial_tokens + state.generated_tokens``. The canary reads a block table int32
``[max_rows, max_blocks]`` (SPEC §10, ``pad_row = -1``: every row is a request row) and an expected-token pool
int32 ``[max_rows, max_blocks * page_size]`` on the device. :class:`RequestTables` gives each request a stable
row and keeps both in step with the host lists, uploading only what changed since the row was last written:

* a request gets a row the first time it is in a batch and keeps it until the engine frees its blocks (finish,
  cancel, offload, soft reset) or a reset frees every request;
* when every row is taken, the least recently batched row of a request that is not in the current batch is
  reused (its owner gets a fresh row, rewritten from scratch, when it comes back): the canary only needs a row to
  be stable between a step's HEAD and TAIL;
* block lists grow at the end (new pages), and change in place when the engine de-duplicates a block, forks or
  restores; the row is diffed against the list it was last written with and rewritten from the first change;
* the token pool is appended up to each request's prefix (the positions the step verifies).

Everything is assembled on the host and uploaded in one copy per step by the caller (:meth:`RequestTables.prepare`
returns the host updates, :meth:`RequestTables.apply` writes them from their device copy).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from kvcanary.errors import invalid


def history_slice(state, start: int, stop: int) -> list[int]:
    """Token ids of ``state`` (a transformers ``RequestState``) at positions ``[start, stop)``: the prompt, then the
    generated tokens (a soft-reset request carries its earlier generated tokens in its prompt)."""
    prompt, generated = state.initial_tokens, state.generated_tokens
    n = len(prompt)
    if stop <= n:
        return list(prompt[start:stop])
    if start >= n:
        return list(generated[start - n:stop - n])
    return list(prompt[start:]) + list(generated[:stop - n])


@dataclass
class TableUpdates:
    """Host-side updates of one step: ``table`` and ``tokens`` are flat ``[row, col, value, ...]`` triples."""

    table: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cleared_rows: list[int] = field(default_factory=list)


class RequestTables:
    """Stable rows, the device block table and the expected-token pool (see the module docstring).

    Args:
        max_rows: rows of both tables (at least the engine's ``max_requests_per_batch``).
        max_blocks: columns of the block table (a request's longest block list).
        page_size: tokens per block; the token pool has ``max_blocks * page_size`` columns.
        device: where both tables live.
        check_tokens: keep the expected-token pool (the verify token check).
    """

    def __init__(self, *, max_rows: int, max_blocks: int, page_size: int, device: torch.device,
                 check_tokens: bool) -> None:
        self.max_rows, self.max_blocks, self.page_size = max_rows, max_blocks, page_size
        self.block_table = torch.full((max_rows, max_blocks), -1, dtype=torch.int32, device=device)
        self.tokens: torch.Tensor | None = (torch.zeros((max_rows, max_blocks * page_size), dtype=torch.int32,
                                                        device=device) if check_tokens else None)
        self._row_of: OrderedDict[str, int] = OrderedDict()   # least recently batched first
        self._free = list(range(max_rows - 1, -1, -1))
        self._blocks: list[list[int]] = [[] for _ in range(max_rows)]   # what each row holds on the device
        self._filled = [0] * max_rows                                   # token positions written per row

    @property
    def max_seq_len(self) -> int:
        return self.max_blocks * self.page_size

    def release(self, request_id: str) -> None:
        """The engine freed the request's blocks: its row goes back to the free list."""
        row = self._row_of.pop(request_id, None)
        if row is not None:
            self._free.append(row)

    def release_all(self) -> None:
        for rid in list(self._row_of):
            self.release(rid)

    def row_of(self, request_id: str) -> int | None:
        return self._row_of.get(request_id)

    def _take_row(self, request_id: str, in_batch: set[str], updates: TableUpdates) -> int:
        if not self._free:
            victim = next((rid for rid in self._row_of if rid not in in_batch), None)
            if victim is None:
                raise invalid(f"a batch holds more than max_rows={self.max_rows} requests")
            self.release(victim)
        row = self._free.pop()
        self._row_of[request_id] = row
        # A row changes hands: forget what the device holds there (stale entries past the new owner's lists are
        # never read, but a clean row is easier to inspect).
        if self._blocks[row]:
            updates.cleared_rows.append(row)
        self._blocks[row] = []
        self._filled[row] = 0
        return row

    def prepare(self, request_id: str, blocks: list[int], state, prefix: int, in_batch: set[str],
                updates: TableUpdates) -> tuple[int, int]:
        """Bring the request's row up to date (host bookkeeping; device writes collected in ``updates``).

        Returns ``(row, valid_len)``: the request's row and how many leading positions of its token-pool row are
        valid (the positions the step verifies, ``prefix``, when the history is long enough).
        """
        if len(blocks) > self.max_blocks:
            raise invalid(f"request {request_id!r} holds {len(blocks)} blocks ({len(blocks) * self.page_size} "
                          f"positions), more than the canary's max_seq_len={self.max_seq_len}; attach with a larger "
                          "max_seq_len")
        row = self._row_of.get(request_id)
        if row is None:
            row = self._take_row(request_id, in_batch, updates)
        else:
            self._row_of.move_to_end(request_id)
        held = self._blocks[row]
        if blocks != held:
            start = 0
            if len(blocks) >= len(held) and blocks[:len(held)] == held:
                start = len(held)
            else:
                while start < min(len(blocks), len(held)) and blocks[start] == held[start]:
                    start += 1
            t = updates.table
            for col in range(start, len(blocks)):
                t += (row, col, blocks[col])
            for col in range(len(blocks), len(held)):   # the list shrank (never seen, but never leave stale ids)
                t += (row, col, -1)
            self._blocks[row] = list(blocks)
        valid = prefix
        if self.tokens is not None:
            filled = self._filled[row]
            if filled < prefix:
                toks = history_slice(state, filled, prefix)
                tk = updates.tokens
                for i, tok in enumerate(toks):
                    tk += (row, filled + i, tok)
                filled += len(toks)
                self._filled[row] = filled
            valid = min(prefix, filled)
        return row, valid

    def apply(self, table_updates: torch.Tensor, token_updates: torch.Tensor, cleared_rows: list[int]) -> None:
        """Write the collected updates (int64 ``[3 * m]`` triples, already on the tables' device)."""
        if cleared_rows:
            self.block_table[cleared_rows] = -1
        if table_updates.numel():
            u = table_updates.view(-1, 3)
            self.block_table[u[:, 0], u[:, 1]] = u[:, 2].to(torch.int32)
        if token_updates.numel() and self.tokens is not None:
            u = token_updates.view(-1, 3)
            self.tokens[u[:, 0], u[:, 1]] = u[:, 2].to(torch.int32)
