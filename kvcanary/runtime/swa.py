"""The sliding-window (SWA) attention group of a :class:`~kvcanary.KVCanary`: its configuration and the
translation of a batch's FULL slots into SWA slots.

An engine with SWA layers keeps a second KV pool and a ``full_to_swa_index_mapping`` table from a FULL slot
to its SWA slot. The canary verifies the SWA group's window straight from the FULL table through that LUT
(SPEC §5, §11), and stamps new tokens at their SWA slots: either the engine passes them
(``swa_out_cache_loc``), or :class:`SwaLocations` translates ``out_cache_loc`` through the LUT into scratch
allocated once (so a captured step allocates nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvcanary.errors import invalid
from kvcanary.ops.checks import check_capacity
from kvcanary.ops.validation import array


@dataclass(frozen=True, kw_only=True)
class SwaConfig:
    """The sliding-window (SWA) attention group of a pool.

    Args:
        num_slots: slots of the SWA KV pool (its canary buffers have this many records; slot 0 is padding).
        window_size: the sliding window (> 0): HEAD/TAIL verify positions ``[prefix - window_size, prefix)``.
        full_to_swa_index_mapping: the engine's live int64 ``[full_pool_size + 1]`` table from a FULL slot to
            its SWA slot (0 = none/freed: the canary then skips the slot and the chain check across it). Read
            in place at every step; the engine updates it as it allocates and frees SWA slots.
        k_sources, v_sources: :class:`~kvcanary.RealKvSource` tuples over the SWA K / V pools (TAIL real-KV
            fingerprint), any number each.
    """

    num_slots: int
    window_size: int
    full_to_swa_index_mapping: Any
    k_sources: tuple = ()
    v_sources: tuple = ()


class SwaLocations:
    """Translates ``out_cache_loc`` (FULL slots) into SWA slots through the LUT, into preallocated scratch.

    -1 stays -1 (skip the token); an index past the table becomes ``swa_num_slots``, which the write reports as
    ``slot_out_of_range``. Every op writes into the scratch (``out=``, in place): nothing is allocated.
    """

    def __init__(self, *, lut: torch.Tensor, swa_num_slots: int, max_tokens: int, device: torch.device) -> None:
        self.lut = lut
        self.swa_num_slots = swa_num_slots
        n = check_capacity("max_tokens_per_step", max_tokens)
        self._loc = torch.full((n,), -1, dtype=torch.int64, device=device)
        self._idx = torch.zeros((n,), dtype=torch.int64, device=device)
        self._mask = torch.zeros((n,), dtype=torch.bool, device=device)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self._loc, self._idx, self._mask))

    def translate(self, out_cache_loc: Any) -> torch.Tensor:
        """The SWA slot of each token of ``out_cache_loc`` (int64 ``[N]``, a torch tensor on the canary's device)."""
        if not isinstance(out_cache_loc, torch.Tensor):
            raise TypeError("kv-canary: translating out_cache_loc for the SWA group needs a torch tensor; "
                            "pass swa_out_cache_loc for other array types")
        array("out_cache_loc", out_cache_loc, "int64")
        n = out_cache_loc.shape[0]
        if n > self._loc.shape[0]:
            raise invalid(f"out_cache_loc has {n} tokens, more than max_tokens_per_step={self._loc.shape[0]}")
        lut = self.lut
        idx, mask, dst = self._idx[:n], self._mask[:n], self._loc[:n]
        # Gather with clamped indices (never out of bounds), then restore the sentinels.
        torch.clamp(out_cache_loc, 0, lut.shape[0] - 1, out=idx)
        torch.index_select(lut, 0, idx, out=dst)
        torch.lt(out_cache_loc, 0, out=mask)
        dst.masked_fill_(mask, -1)
        torch.ge(out_cache_loc, lut.shape[0], out=mask)
        dst.masked_fill_(mask, self.swa_num_slots)
        return dst
