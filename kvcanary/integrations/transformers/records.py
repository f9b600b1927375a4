"""Canary records that move with the KV when transformers' cache management moves it (SPEC §13).

Each canary buffer (HEAD and TAIL, K and V) holds one 32-byte record per slot; nothing in a record names its own
slot, so a record moved together with its KV verifies at the new slot. The engine moves KV in three ways, and
:class:`RecordMover` mirrors each with the public record ops, on the stream the engine's copies run on:

* **fork** (``num_return_sequences > 1``): ``PagedAttentionCache.perform_cache_copy`` copies whole blocks
  ``src[k] -> dst[k]`` (the parent's partly written last block; complete blocks are shared, not copied):
  :meth:`RecordMover.copy_blocks` copies the records of every slot of those blocks
  (:func:`~kvcanary.copy_canary_records`);
* **offload to host**: ``OffloadingManager._offload_to_cpu`` copies a victim's blocks positionally into the CPU
  swap pool: :meth:`RecordMover.offload` gathers their records (:func:`~kvcanary.gather_canary_records`) into a
  host stash, keyed by the request (the engine frees the victim's blocks before copying them, so the records are
  gathered from slots nobody has written since);
* **restore**: ``OffloadingManager.restore_scheduled_requests`` copies the CPU blocks back into the blocks the
  scheduler just gave the request: :meth:`RecordMover.restore` scatters the stash into them
  (:func:`~kvcanary.scatter_canary_records`).

Nothing moves for the other operations: a prefix-cache hit shares blocks whose records are already valid, a
de-duplication swaps in a block holding the same tokens at the same positions (the chain hashes content only, so
the surviving block's own records verify for the request that adopts it), and a soft reset re-prefills the
request from scratch into fresh blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcanary import consts
from kvcanary.integrations.transformers.geometry import upload
from kvcanary.ops.record_ops import copy_canary_records, gather_canary_records, scatter_canary_records


@dataclass
class Stash:
    """The records of one offloaded request: ``records`` int64 ``[buffers, blocks * page_size, 4]`` on the host,
    block by block in the order of ``cpu_blocks`` (the engine pairs its CPU and GPU blocks positionally)."""

    cpu_blocks: list[int]
    records: torch.Tensor


class RecordMover:
    """Moves the records of every canary buffer with the engine's block copies (see the module docstring).

    Args:
        buffers: the canary buffers (uint8 ``[num_slots, stride]`` each, on ``device``).
        page_size: slots per block.
        device: the buffers' device.
        stream: the engine's compute stream (CUDA), or None.
    """

    def __init__(self, *, buffers: list[torch.Tensor], page_size: int, device: torch.device, stream) -> None:
        self.buffers = buffers
        self.page_size = page_size
        self.device = device
        self.stream = stream
        self.stash: dict[str, Stash] = {}
        self.moved = {"fork_blocks": 0, "offloaded_blocks": 0, "restored_blocks": 0}   # blocks whose records moved

    def _slots(self, blocks: list[int]) -> torch.Tensor:
        b = upload(blocks, self.device)
        return (b[:, None] * self.page_size + torch.arange(self.page_size, device=self.device)).reshape(-1)

    def copy_blocks(self, src_blocks: list[int], dst_blocks: list[int]) -> None:
        """Fork: copy the records of every slot of ``src_blocks[k]`` to ``dst_blocks[k]``, in every buffer."""
        if not src_blocks:
            return
        src, dst = self._slots(src_blocks), self._slots(dst_blocks)
        for buf in self.buffers:
            copy_canary_records(src_canary_buf=buf, src_slots=src, dst_slots=dst, stream=self.stream)
        self.moved["fork_blocks"] += len(src_blocks)

    def offload(self, request_id: str, gpu_blocks: list[int], cpu_blocks: list[int]) -> None:
        """Offload: stash the records of ``gpu_blocks`` (paired positionally with ``cpu_blocks``) on the host."""
        if not gpu_blocks:
            return
        slots = self._slots(gpu_blocks)
        recs = torch.empty((len(self.buffers), slots.shape[0], consts.CANARY_FIELDS_PER_SLOT), dtype=torch.int64,
                           device=self.device)
        for i, buf in enumerate(self.buffers):
            gather_canary_records(canary_buf=buf, slots=slots, records_out=recs[i], stream=self.stream)
        if self.device.type == "cuda":
            host = torch.empty(recs.shape, dtype=recs.dtype, pin_memory=True)
            host.copy_(recs, non_blocking=True)   # ordered before the restore's upload on the same stream
        else:
            host = recs
        self.stash[request_id] = Stash(cpu_blocks=list(cpu_blocks), records=host)
        self.moved["offloaded_blocks"] += len(gpu_blocks)

    def restore(self, request_id: str, cpu_blocks: list[int], gpu_blocks: list[int]) -> None:
        """Restore: scatter the stashed records of the first ``len(gpu_blocks)`` CPU blocks into ``gpu_blocks``.

        ``cpu_blocks`` is what the engine copies from (checked against the stash: the same blocks, in order)."""
        st = self.stash.pop(request_id, None)
        n = len(gpu_blocks)
        if st is None or n == 0 or st.cpu_blocks[:n] != list(cpu_blocks[:n]):
            return
        recs = st.records[:, : n * self.page_size].to(self.device, non_blocking=True)
        slots = self._slots(gpu_blocks)
        for i, buf in enumerate(self.buffers):
            scatter_canary_records(canary_buf=buf, slots=slots, records=recs[i], stream=self.stream)
        self.moved["restored_blocks"] += n

    def forget(self, keep: set[str]) -> None:
        """Drop the stash of every request not in ``keep`` (the engine freed its CPU copy: cancelled, reset)."""
        for rid in [r for r in self.stash if r not in keep]:
            del self.stash[rid]
