"""A canary step's plan-free launches (SPEC §11, §12) for one (phase, group), prepared once per set of contexts.

``KVCanary.step`` runs one verify and one write from the table per attention group. The contexts of a (phase,
group) are the same objects step after step, so a backend may prepare their launch arguments once
(:meth:`kvcanary.ops.backends.Backend.table_step`): :class:`kvcanary.ops.cuda.table_step.CudaTableStep` packs the
contexts' words into a reusable argument buffer; :class:`RecordTableStep` (the CPU backend's, and CUDA's for more
contexts than one launch holds) builds the launch records of :mod:`kvcanary.ops.launches` on every call and hands
them to the backend, exactly as the public ops do. Both take the same arguments, validated by the caller.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvcanary.ops.interop import ArrayView, Device
from kvcanary.ops.launches import ContextViews, TableViews, VerifyTableLaunch, WriteTableLaunch
from kvcanary.ops.validation import as_view


class TableStep(Protocol):
    """The verify and write launches of one (phase, group): what ``KVCanary.step`` calls.

    The batch arrays (``req_pool_indices`` ... ``expected_input_positions``, ``expected_tokens_pool``) are what
    :func:`kvcanary.ops.validation.batch_array` accepted: a checked torch tensor or an :class:`ArrayView` (both
    have ``.shape`` and ``.data_ptr()``); ``stream`` is what :meth:`Backend.launch_stream` returned (or any stream
    the backend takes).
    """

    verify_contexts: tuple[ContextViews, ...]
    write_contexts: tuple[ContextViews, ...]

    def verify(self, *, table: TableViews, lut: ArrayView | None, req_pool_indices: Any, prefix_lens: Any,
               swa_window_size: int, expected_tokens_pool: Any, expected_tokens_valid_lens: Any, token_offset: int,
               check_expected_token: bool, invalid_rows_total: ArrayView | None, stream: Any = None) -> None: ...

    def write(self, *, table: TableViews, lut: ArrayView | None, req_pool_indices: Any, prefix_lens: Any,
              extend_seq_lens: Any, input_ids: Any, positions: Any, out_cache_loc: Any, expected_input_tokens: Any,
              expected_input_positions: Any, stream: Any = None) -> None: ...


def _view(name: str, a: Any) -> ArrayView | None:
    return None if a is None else as_view(name, a)


class RecordTableStep:
    """A :class:`TableStep` that builds a launch record per call and runs it on ``backend``."""

    def __init__(self, backend: Any, *, device: Device, verify_contexts: tuple[ContextViews, ...],
                 write_contexts: tuple[ContextViews, ...]):
        self.backend = backend
        self.device = device
        self.verify_contexts, self.write_contexts = verify_contexts, write_contexts

    def verify(self, *, table: TableViews, lut: ArrayView | None, req_pool_indices: Any, prefix_lens: Any,
               swa_window_size: int, expected_tokens_pool: Any, expected_tokens_valid_lens: Any, token_offset: int,
               check_expected_token: bool, invalid_rows_total: ArrayView | None, stream: Any = None) -> None:
        self.backend.verify_from_table(VerifyTableLaunch(
            device=self.device, contexts=self.verify_contexts,
            req_pool_indices=as_view("req_pool_indices", req_pool_indices),
            prefix_lens=as_view("prefix_lens", prefix_lens), table=table, swa_window_size=swa_window_size, lut=lut,
            expected_tokens_pool=_view("expected_tokens", expected_tokens_pool),
            expected_tokens_valid_lens=_view("expected_tokens_valid_lens", expected_tokens_valid_lens),
            token_offset=token_offset, check_expected_token=check_expected_token, invalid_rows=None,
            invalid_rows_total=invalid_rows_total), stream)

    def write(self, *, table: TableViews, lut: ArrayView | None, req_pool_indices: Any, prefix_lens: Any,
              extend_seq_lens: Any, input_ids: Any, positions: Any, out_cache_loc: Any, expected_input_tokens: Any,
              expected_input_positions: Any, stream: Any = None) -> None:
        self.backend.write_from_table(WriteTableLaunch(
            device=self.device, contexts=self.write_contexts,
            req_pool_indices=as_view("req_pool_indices", req_pool_indices),
            prefix_lens=as_view("prefix_lens", prefix_lens), extend_seq_lens=as_view("extend_seq_lens", extend_seq_lens),
            table=table, lut=lut, input_ids=as_view("input_ids", input_ids), positions=as_view("positions", positions),
            out_cache_loc=as_view("out_cache_loc", out_cache_loc),
            expected_input_tokens=_view("expected_input_tokens", expected_input_tokens),
            expected_input_positions=_view("expected_input_positions", expected_input_positions),
            invalid_rows=None), stream)
