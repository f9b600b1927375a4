"""The engine model's data types (:mod:`kvcanary.testing.engine`): its configuration, requests, batch rows, batches,
KV pools and step summaries, and :class:`EngineView`, what a fault's target finder reads and changes of the engine.

They live apart from the engine so that the faults and the models it plugs in can name them without importing it
(the engine imports those). :mod:`kvcanary.testing.engine` re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kvcanary.ops.structs import RealKvSource


@dataclass(frozen=True)
class SimConfig:
    """Shape of the engine model and of its random workload (the defaults run some 50 to 100 steps per
    second on the CPU reference).

    Pool: ``num_slots`` FULL slots (a multiple of ``page_size``; page 0 is reserved), ``max_running``
    requests at once, ``max_seq_len`` positions per request. Random arrivals (``arrival_prob`` > 0; 0 = only
    :meth:`ServingSimulation.submit`): each step, while fewer than ``max_running`` requests are waiting or
    running, a request arrives with probability ``arrival_prob``: with probability ``share_prob`` it starts
    with one of ``system_prompts`` shared prompts of ``system_prompt_len`` tokens, then ``prompt_len``
    random tokens; it generates ``max_new_tokens`` tokens (inclusive ranges). Scheduling: ``chunk_size``
    prompt tokens per request per step, at most ``prefill_budget`` per step in all (0 = no limit), batches
    padded to a multiple of ``pad_to`` rows. SWA: ``swa_window`` (0 = no SWA group) over an SWA pool of
    ``swa_num_slots``. ``with_v``: the canaries check the V halves too. ``kv_bytes_per_token`` and ``vocab``
    shape the stand-in models. ``sweep_every`` steps the prefix cache is swept (0 = never). Speculative
    decoding: ``spec_tokens`` draft tokens per decode step (0 = off); the stand-in draft agrees with the
    target with probability ``spec_accept_prob``.
    """

    num_slots: int = 384
    page_size: int = 4
    max_running: int = 6
    max_seq_len: int = 96
    arrival_prob: float = 0.7
    prompt_len: tuple[int, int] = (4, 36)
    max_new_tokens: tuple[int, int] = (3, 20)
    system_prompts: int = 2
    system_prompt_len: int = 10
    share_prob: float = 0.6
    chunk_size: int = 12
    prefill_budget: int = 0
    pad_to: int = 4
    swa_window: int = 6
    swa_num_slots: int = 192
    with_v: bool = True
    kv_bytes_per_token: int = 32
    vocab: int = 32000
    sweep_every: int = 8
    spec_tokens: int = 0
    spec_accept_prob: float = 0.7
    seed: int = 0


@dataclass(eq=False)
class Request:
    """One request. ``tokens`` are its known token ids (prompt, then generated); positions ``[0,
    computed)`` have their KV in the pool; ``pages`` hold its positions in order (``slot(p)``)."""

    rid: int
    prompt: list[int]
    max_new: int
    page_size: int
    arrival_step: int = 0
    sys_id: int | None = None
    row: int = 0
    tokens: list[int] = field(default_factory=list)
    computed: int = 0
    cached_len: int = 0            # positions taken from the prefix cache at admission
    pages: list[int] = field(default_factory=list)
    draft: list[int] = field(default_factory=list)  # speculative: tokens proposed for the next verify
    finished: bool = False
    aborted: bool = False

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def remaining(self) -> int:
        return self.max_new - (len(self.tokens) - len(self.prompt))

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)

    def slot(self, p: int) -> int:
        """The FULL slot of position ``p`` (its page must be allocated)."""
        return self.pages[p // self.page_size] * self.page_size + p % self.page_size

    @property
    def slots(self) -> list[int]:
        """FULL slots of the computed positions."""
        return [self.slot(p) for p in range(self.computed)]


@dataclass(frozen=True, eq=False)
class Row:
    """A real batch row: its request, its first flat token index, tokens fed (``extend``), positions
    already cached (``prefix``) and what it does (``prefill``, ``decode``, ``verify``, ``draft_decode``,
    ``draft_extend``)."""

    req: Request
    start: int
    n: int
    prefix: int
    kind: str


@dataclass
class Batch:
    """One forward's batch as host (CPU) torch tensors, as the scheduler built them (``kind`` is
    ``"target"``, ``"draft_decode"`` or ``"draft_extend"``). Rows past ``rows`` are CUDA-graph padding."""

    kind: str
    rows: list[Row]
    req_pool_indices: torch.Tensor
    prefix_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    swa_out_cache_loc: torch.Tensor | None
    valid_lens: torch.Tensor


@dataclass
class KvPools:
    """The KV tensors a forward writes (``swa_*`` None without an SWA group or for the draft model)."""

    k: torch.Tensor
    v: torch.Tensor
    swa_k: torch.Tensor | None = None
    swa_v: torch.Tensor | None = None


@dataclass
class StepInfo:
    """What one engine step did."""

    step: int
    batch_rows: int
    prefill_tokens: int
    decode_tokens: int
    prefix_hit_tokens: int
    finished: int
    swept_slots: int


class EngineView(Protocol):
    """What :mod:`kvcanary.testing.faults` reads and changes of the engine (a
    :class:`~kvcanary.testing.engine.ServingSimulation`): its configuration and SWA window, the running requests,
    the host tables, the real-KV sources, the prefix cache's page keys and pinned pages, and its quarantine."""

    cfg: SimConfig
    window: int
    running: list[Request]
    r2t_host: torch.Tensor
    lut_host: torch.Tensor
    k_source: RealKvSource
    v_source: RealKvSource
    swa_k_source: RealKvSource | None
    swa_v_source: RealKvSource | None
    page_key: dict[int, tuple[int, ...]]
    pinned: set[int]

    def idle_cache_pages(self) -> list[int]:
        ...

    def quarantine(self, *, slots: Iterable[int] = (), requests: Iterable[Request] = ()) -> None:
        ...
