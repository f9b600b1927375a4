"""The models the engine model (:mod:`kvcanary.testing.engine`) plugs in as its forward.

A model is whatever computes K/V and next tokens; the engine does everything else (allocation, tables,
scheduling, the canary). The contract, :class:`Model`:

* ``token_shape`` and ``dtype``: the shape and dtype of one token's K (and of its V) in a pool; the engine
  allocates every pool as ``[rows, page_size, *token_shape]`` of that dtype and describes it to the canary
  with a :class:`~kvcanary.RealKvSource`;
* ``forward(sim, batch, args, pools)``: write the K/V of every written token of ``batch`` (``out_cache_loc
  > 0``; 0 is the dummy slot of padding tokens, -1 a token not written) into ``pools``, and return, for each
  real batch row in order, the model's next-token prediction at each of its fed positions (a list of
  ``extend`` ints). ``args`` holds the batch tensors on the engine's device (as passed to the canary);
  ``batch`` the same on the host, plus the rows' requests.

:class:`StandInModel` and :class:`StandInDraft` are cheap deterministic stand-ins: their K/V bytes are
integer functions of (token, position), so they are identical on every device (the CPU and CUDA runs of a
workload compare byte for byte), and their predictions are a fixed function of the fed token and its
position. The draft agrees with the target with a set probability, so EAGLE-style verification accepts
a realistic mix of draft lengths. ``examples/toy_engine.py`` plugs in a tiny real attention model instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from kvcanary.testing.engine_types import Batch, KvPools


class Model(Protocol):
    """What the engine model needs from a model (see the module docstring)."""

    token_shape: tuple[int, ...]
    dtype: torch.dtype

    def forward(self, sim: Any, batch: Batch, args: dict[str, torch.Tensor],
                pools: KvPools) -> list[list[int]]:
        ...


_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(*xs: np.ndarray) -> np.ndarray:
    """A splitmix-style hash of int64 arrays (elementwise, wrapping u64): deterministic everywhere."""
    h = np.zeros(np.broadcast(*xs).shape, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for x in xs:
            h = (h ^ np.asarray(x).astype(np.uint64)) * np.uint64(0x9E3779B97F4A7C15)
            h ^= h >> np.uint64(31)
    return h & _M64


def next_token(tokens: np.ndarray, positions: np.ndarray, vocab: int, salt: int = 0) -> np.ndarray:
    """The stand-in target's prediction after ``tokens`` at ``positions``: ids in ``[1, vocab)``."""
    h = _mix(np.asarray(tokens, dtype=np.int64), np.asarray(positions, dtype=np.int64), np.int64(salt))
    return (h % np.uint64(vocab - 1)).astype(np.int64) + 1


def _write_stand_in_kv(pool_k: torch.Tensor, pool_v: torch.Tensor | None, loc: torch.Tensor, ids: torch.Tensor,
                       pos: torch.Tensor, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Write int16 K/V rows computed from (token, position) at slots ``loc`` (only ``loc > 0``)."""
    dim = pool_k.shape[-1]
    keep = loc > 0
    loc, ids, pos = loc[keep], ids[keep], pos[keep]
    j = torch.arange(dim, device=loc.device, dtype=torch.int64)
    mixed = (ids[:, None] * 2654435761 + pos[:, None] * 40503 + j * 97 + salt) % 65521
    k = (mixed - 32760).to(torch.int16)
    v = ((mixed * 7 + 13) % 65521 - 32760).to(torch.int16)
    pool_k.view(-1, dim)[loc] = k
    if pool_v is not None:
        pool_v.view(-1, dim)[loc] = v
    return k, v


def _per_row(batch: Batch, values: np.ndarray) -> list[list[int]]:
    return [values[row.start:row.start + row.n].tolist() for row in batch.rows]


@dataclass
class StandInModel:
    """The target stand-in: K/V bytes from (token, position), prediction ``next_token(token, position)``.

    Args:
        kv_bytes_per_token: bytes of one token's K (and of its V): a multiple of 16 (int16 elements).
        vocab: token ids are drawn from ``[1, vocab)``.
    """

    kv_bytes_per_token: int = 32
    vocab: int = 32000
    salt: int = 0
    token_shape: tuple[int, ...] = field(init=False)
    dtype: torch.dtype = field(init=False)

    def __post_init__(self) -> None:
        self.token_shape = (self.kv_bytes_per_token // 2,)
        self.dtype = torch.int16

    def forward(self, sim: Any, batch: Batch, args: dict[str, torch.Tensor], pools: KvPools) -> list[list[int]]:
        k, v = _write_stand_in_kv(pools.k, pools.v, args["out_cache_loc"], args["input_ids"], args["positions"],
                                  self.salt)
        if pools.swa_k is not None:
            # The SWA layer's K/V of a token equal its full-attention K/V in the stand-in.
            swa = args["swa_out_cache_loc"][args["out_cache_loc"] > 0]
            live = swa > 0
            dim = pools.swa_k.shape[-1]
            pools.swa_k.view(-1, dim)[swa[live]] = k[live]
            if pools.swa_v is not None:
                pools.swa_v.view(-1, dim)[swa[live]] = v[live]
        preds = next_token(batch.input_ids.numpy(), batch.positions.numpy(), self.vocab)
        return _per_row(batch, preds)


@dataclass
class StandInDraft:
    """The EAGLE draft stand-in.

    At position ``p`` the draft is fed the token *after* it (``token[p + 1]``: its KV pool is shifted by one,
    which is why its canary uses ``kv_token_id_vs_position_offset = +1``) and predicts ``token[p + 2]``. It
    agrees with :class:`StandInModel` with probability ``accept_prob`` (a deterministic function of the
    input, so runs repeat), and otherwise proposes a token the target will reject.
    """

    kv_bytes_per_token: int = 32
    vocab: int = 32000
    accept_prob: float = 0.7
    salt: int = 1
    token_shape: tuple[int, ...] = field(init=False)
    dtype: torch.dtype = field(init=False)

    def __post_init__(self) -> None:
        self.token_shape = (self.kv_bytes_per_token // 2,)
        self.dtype = torch.int16

    def forward(self, sim: Any, batch: Batch, args: dict[str, torch.Tensor], pools: KvPools) -> list[list[int]]:
        _write_stand_in_kv(pools.k, pools.v, args["out_cache_loc"], args["input_ids"], args["positions"], self.salt)
        ids, pos = batch.input_ids.numpy(), batch.positions.numpy() + 1
        right = next_token(ids, pos, self.vocab)
        wrong = right % (self.vocab - 1) + 1  # never equal to `right`
        agree = (_mix(ids, pos, np.int64(self.salt)) % np.uint64(1 << 20)) < np.uint64(int(self.accept_prob * (1 << 20)))
        return _per_row(batch, np.where(agree, right, wrong))
