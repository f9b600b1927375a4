"""Launch geometry of every CUDA kernel, in one place.

Threads per block and blocks per SM come from the kernel sources' ``#define``s (the kernels are compiled
with the same values); the number of blocks is fixed by the *capacities* and the device's SM count, never
by a batch's contents, so one grid serves every batch of a capacity and a captured CUDA graph stays valid.
The kernels read their active counts on the device and stride over the rest.

The launchers in this package and :class:`kvcanary.CanaryPlanner` (which reports the grids it will get)
both use these functions (cached: a launch looks its grid up). Importing this module does not import CuPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

from kvcanary.ops.cuda import specs
from kvcanary.ops.cuda.specs import int_define
from kvcanary.ops.interop import import_cupy


@dataclass(frozen=True)
class Grid:
    """One launch's geometry: ``blocks`` x ``threads``."""

    blocks: int
    threads: int


def clear_source_caches() -> None:
    """Forget everything read from the kernel sources: their texts and integer defines
    (:func:`kvcanary.ops.cuda.specs.clear_source_caches`) and every grid built from the defines (the SM counts
    stay), for a caller that points ``specs.kernels_dir`` at another copy of ``kernels_cu/``."""
    specs.clear_source_caches()
    for fn in (plan_grids, verify_grid, write_grid, verify_table_grid, write_table_grid, records_grid, scatter_grid):
        fn.cache_clear()


@cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of CUDA device ``device_index`` (queried once per device, then cached)."""
    return int(import_cupy().cuda.Device(device_index).attributes["MultiProcessorCount"])


def _persistent(work_items: int, items_per_block: int, blocks_per_sm: int, sms: int) -> int:
    """Enough blocks to cover ``work_items``, at most ``blocks_per_sm`` resident per SM, at least 1."""
    need = -(-max(0, work_items) // items_per_block)
    return max(1, min(need, blocks_per_sm * sms))


@lru_cache(maxsize=1024)
def plan_grids(verify_capacity: int, sms: int) -> dict[str, Grid]:
    """The plan's three launches: the verify-offset scan and the write metadata run in one block (they loop
    over tiles of rows); the entry kernel is a persistent grid over ``verify_capacity`` entries."""
    scan = Grid(1, int_define("plan.cu", "KVC_SCAN_THREADS"))
    threads = int_define("plan.cu", "KVC_ENTRY_THREADS")
    entries = Grid(_persistent(verify_capacity, threads, int_define("plan.cu", "KVC_ENTRY_BLOCKS_PER_SM"), sms),
                   threads)
    return {"verify_offsets": scan, "verify_entries": entries, "write_meta": scan}


@lru_cache(maxsize=1024)
def verify_grid(verify_capacity: int, has_real_kv: bool, sms: int) -> Grid:
    """Persistent grid over ``verify_capacity`` entries, ``KVC_VERIFY_UNROLL`` entries per thread per step."""
    threads = int_define("verify.cu", "KVC_VERIFY_THREADS")
    per_sm = int_define("verify.cu", "KVC_VERIFY_BLOCKS_PER_SM_REAL_KV" if has_real_kv else "KVC_VERIFY_BLOCKS_PER_SM")
    per_block = threads * int_define("verify.cu", "KVC_VERIFY_UNROLL")
    return Grid(_persistent(verify_capacity, per_block, per_sm, sms), threads)


@lru_cache(maxsize=1024)
def write_grid(write_req_capacity: int, sms: int) -> Grid:
    """One block walks one request's chain at a time; blocks stride over the request capacity."""
    return Grid(_persistent(write_req_capacity, 1, int_define("write.cu", "KVC_WRITE_BLOCKS_PER_SM"), sms),
                int_define("write.cu", "KVC_WRITE_THREADS"))


@cache
def verify_table_grid(has_real_kv: bool, sms: int) -> Grid:
    """Plan-free verify (SPEC §11): this many blocks per SM whatever the batch (every block walks the rows and
    takes its warps' ranges of the entries)."""
    threads = int_define("verify_table.cu", "KVC_VT_THREADS")
    per_sm = int_define("verify_table.cu", "KVC_VT_BLOCKS_PER_SM_REAL_KV" if has_real_kv else "KVC_VT_BLOCKS_PER_SM")
    return Grid(max(1, per_sm * sms), threads)


@cache
def write_table_grid(sms: int) -> Grid:
    """Plan-free write (SPEC §12): this many blocks per SM whatever the batch (short requests go to the grid's
    warps, long ones to its blocks)."""
    return Grid(max(1, int_define("write_table.cu", "KVC_WT_BLOCKS_PER_SM") * sms),
                int_define("write_table.cu", "KVC_WT_THREADS"))


@lru_cache(maxsize=1024)
def records_grid(n: int, sms: int) -> Grid:
    """Records gather / scatter / copy (SPEC §13): one entry per thread, a grid-stride loop over ``n``."""
    threads = int_define("records.cu", "KVC_REC_THREADS")
    return Grid(_persistent(n, threads, int_define("records.cu", "KVC_REC_BLOCKS_PER_SM"), sms), threads)


@lru_cache(maxsize=1024)
def scatter_grid(batch_rows: int, sms: int) -> Grid:
    """One block copies one row at a time; blocks stride over the batch rows (scatter is not captured)."""
    return Grid(_persistent(batch_rows, 1, int_define("scatter.cu", "KVC_SCATTER_BLOCKS_PER_SM"), sms),
                int_define("scatter.cu", "KVC_SCATTER_THREADS"))
