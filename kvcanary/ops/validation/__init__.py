"""Argument validation for every public op (SPEC §9), producing backend-neutral launch records.

Each ``validate_*`` function checks dtypes, ranks, lengths, contiguity, devices, capacities, sentinel and
presence rules *before anything is written*, and returns a frozen launch record of :class:`ArrayView`
objects and plain ints (:mod:`kvcanary.ops.launches`). Both backends (``kvcanary.ops.reference`` and
``kvcanary.ops.cuda``) take these records, so a backend never sees an argument that was not checked.

Modules, bottom up: :mod:`.arrays` (one array's dtype, rank, contiguity, length, device), :mod:`.cache`
(validated views kept while nothing under them changed), :mod:`.structs` (plans, canary buffers, launch
contexts), :mod:`.arguments` (what several ops share: the table of SPEC §10 with ``pad_row``, the LUT, the
expected-token pool, the input assert), then one module of validators per family of public ops, named as the
ops' own modules: :mod:`.sglang_ops` (SPEC §5-§8), :mod:`.table_ops` (SPEC §11, §12), :mod:`.record_ops`
(SPEC §13).

Order of checks: each scalar's own range, then each array's own dtype/rank/contiguity/length, then the
consistency between arguments, then the device. So a negative ``verify_capacity`` is reported as
negative, not as a mismatch.

Real-KV sources (SPEC §9, §13): a source may cover fewer slots than the canary buffer (the backends report a
touched slot it does not cover); the SGLang-named write and verify take at most ``MAX_REAL_KV_SOURCES`` sources
per context, kvcanary's own ops any number.
"""

from kvcanary.ops.validation.arguments import MAX_BLOCK_SIZE, table_views
from kvcanary.ops.validation.arrays import array, array_on, as_view, batch_array
from kvcanary.ops.validation.cache import ValidatedCache, tensor_signature
from kvcanary.ops.validation.record_ops import (
    validate_copy_records,
    validate_gather_records,
    validate_scatter_records,
)
from kvcanary.ops.validation.sglang_ops import validate_plan, validate_scatter, validate_verify, validate_write
from kvcanary.ops.validation.structs import (
    cached_context_views,
    canary_buffer_view,
    context_views,
    contexts_views,
    verify_plan_views,
    write_plan_views,
)
from kvcanary.ops.validation.table_ops import validate_verify_from_table, validate_write_from_table

__all__ = [
    "MAX_BLOCK_SIZE",
    "ValidatedCache",
    "array",
    "array_on",
    "as_view",
    "batch_array",
    "cached_context_views",
    "canary_buffer_view",
    "context_views",
    "contexts_views",
    "table_views",
    "tensor_signature",
    "validate_copy_records",
    "validate_gather_records",
    "validate_plan",
    "validate_scatter",
    "validate_scatter_records",
    "validate_verify",
    "validate_verify_from_table",
    "validate_write",
    "validate_write_from_table",
    "verify_plan_views",
    "write_plan_views",
]
