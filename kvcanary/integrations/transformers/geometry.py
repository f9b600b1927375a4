"""Where a transformers ``PagedAttentionCache`` keeps each token's K and V, in the canary's terms.

transformers 5.24.0 keeps the whole paged cache in one flat ``uint8`` tensor (``cache.cache_tensor``); each
layer group's allocator carves its blocks out of it. For the full-attention allocator a block holds, for every
layer ``i`` of the group in turn, ``page_size`` K rows then ``page_size`` V rows, each row one token of one
layer (``num_key_value_heads * head_dim`` elements of the model dtype). So the allocator's dtype tensor,
viewed as ``[blocks_total, layers, 2, page_size, heads, head_dim]``, is indexed ``[block, i, 0 (K) | 1 (V),
offset]``, and the canary's slot of a request position ``p`` is the engine's own page arithmetic::

    slot(p) = block_table[p // page_size] * page_size + p % page_size

The engine writes through its own row index ``w = block * block_physical_stride + offset`` (the same for every
layer of the group), which maps to the same slot as ``(w // stride) * page_size + w % stride``.

The two leading sectors of the cache are trash sectors that are never allocated, so block 0 (slot 0, the
canary's dummy slot) never holds a request's token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvcanary import consts
from kvcanary.errors import invalid
from kvcanary.ops.structs import RealKvSource

FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class CacheGeometry:
    """The full-attention group of one ``PagedAttentionCache``, as the canary sees it.

    Attributes:
        page_size: tokens per block (the canary's ``block_size``).
        blocks_total: blocks of the group's views over the whole cache tensor, trash blocks included.
        num_slots: ``blocks_total * page_size``: the canary's slot space (slot 0 lies in the trash sector).
        first_real_block: the lowest block id the allocator can hand out (blocks below are trash).
        stride: ``block_physical_stride``: rows of one token-layer-half per block (``2 * layers * page_size``).
        layers: the model's layer indices of the group, in group order.
        token_bytes: bytes of one token of K (or V) of one layer.
        kv: the allocator's dtype tensor viewed ``[blocks_total, layers, 2, page_size, heads, head_dim]`` (a live
            view of the cache tensor).
        device: the cache's device.
    """

    page_size: int
    blocks_total: int
    num_slots: int
    first_real_block: int
    stride: int
    layers: tuple[int, ...]
    token_bytes: int
    kv: torch.Tensor
    device: torch.device

    @classmethod
    def of(cls, cache) -> CacheGeometry:
        """The geometry of ``cache`` (a ``PagedAttentionCache`` whose only layer group is full attention)."""
        groups = list(cache.cache_allocators)
        if groups != [FULL_ATTENTION]:
            raise invalid(f"the cache must hold full-attention layers only, got layer groups {groups}")
        alloc = cache.cache_allocators[FULL_ATTENTION]
        ps = int(alloc.tokens_per_page)
        layers = tuple(int(i) for i in alloc.layer_indices)
        heads, head_dim = int(alloc.num_key_value_heads), int(alloc.head_dim)
        token_bytes = heads * head_dim * alloc.cache_dtype.itemsize
        blocks_total = cache.cache_tensor.numel() // alloc.bytes_per_block
        kv = alloc.cache_tensor.view(blocks_total, len(layers), 2, ps, heads, head_dim)
        return cls(page_size=ps, blocks_total=blocks_total, num_slots=blocks_total * ps,
                   first_real_block=2 * int(alloc.blocks_per_sector), stride=int(alloc.block_physical_stride),
                   layers=layers, token_bytes=token_bytes, kv=kv, device=cache.cache_tensor.device)

    def sources(self, half: int, *, read_bytes: int | None = None) -> list[RealKvSource]:
        """One :class:`~kvcanary.RealKvSource` per layer of the group over its K (``half=0``) or V (``half=1``)
        rows, in group order (SPEC §13: every layer is fingerprinted). Each is a live ``[blocks_total,
        page_size, heads, head_dim]`` view whose row stride is a whole block; ``read_bytes`` (default all of a
        token's bytes) is what ALL mode folds."""
        step = consts.REAL_KV_LOAD_BYTES
        if self.token_bytes % step:
            raise invalid(f"real-KV fingerprints need a token of one layer's K to take a multiple of {step} bytes, "
                          f"got {self.token_bytes} (num_key_value_heads * head_dim * itemsize); attach with "
                          "real_kv_hash_mode=RealKvHashMode.NONE")
        n = self.token_bytes if read_bytes is None else read_bytes
        return [RealKvSource(tensor=self.kv[:, i, half], page_size=self.page_size,
                             num_bytes_per_token=self.token_bytes, read_bytes=n) for i in range(len(self.layers))]

    def slots_of_write_index(self, write_index: torch.Tensor) -> torch.Tensor:
        """The canary slot of each engine write row (int64 ``[n]``, on the index's device, no host sync)."""
        return (write_index // self.stride) * self.page_size + write_index % self.stride


def upload(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 ``[len(values)]`` on ``device``. On CUDA the copy is issued from pinned memory without waiting, on
    torch's current stream (a fresh pinned buffer each call: the caching host allocator reuses it only once the
    copy is done)."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
