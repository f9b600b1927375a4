"""The engine model: EAGLE-style speculative decoding under two canaries (clean, accounted, rejected draft
slots overwritten by the next step, the draft pool's +1 token offset), submitted workloads, quarantine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvcanary import CanaryLaunchTag as T
from kvcanary import FailReason as F
from kvcanary.testing.engine import Batch, KvPools, Row, ServingSimulation, SimConfig
from kvcanary.testing.models import StandInDraft, next_token


def test_speculative_decoding_clean_run_is_clean_and_accounted():
    cfg = SimConfig(seed=3, spec_tokens=3)
    sim = ServingSimulation(cfg)
    prefix = {"target": 0, "tokens": 0}
    rejected_reused = 0
    pending: dict[int, dict[int, int]] = {}      # request id -> {position: slot} of its rejected draft tokens
    for _ in range(150):
        batch = sim.step()
        for row in batch.rows:
            req = row.req
            prefix["target"] += row.prefix
            loc = batch.out_cache_loc[row.start:row.start + row.n].tolist()
            # The next step of a request writes its rejected positions again, into the same slots.
            for p, slot in pending.pop(req.rid, {}).items():
                if row.prefix <= p < row.prefix + row.n:
                    assert loc[p - row.prefix] == slot
                    rejected_reused += 1
            if row.kind == "verify":
                accepted = req.computed - row.prefix - 1
                assert 0 <= accepted <= row.n - 1
                pending[req.rid] = {row.prefix + i: loc[i] for i in range(accepted + 1, row.n)}
    assert sim.canary.poll(sync=True) == [] and sim.draft_canary.poll(sync=True) == []
    s = sim.stats
    assert s["drafted"] > s["accepted"] > 100 and rejected_reused > 50
    assert s["cache_hits"] > 5 and s["partial_chunks"] > 20 and s["padding_rows"] > 0 and s["swa_frees"] > 100
    h, d = sim.canary.health(), sim.draft_canary.health()
    assert h.violations_total == d.violations_total == 0 and h.plan_overflows == d.plan_overflows == 0
    # The target canary stamps every token the target forward wrote (rejected drafts included) and verifies
    # every prefix; the draft canary stamps every draft-decode and draft-extend token.
    assert h.protected_tokens == s["tokens"] and h.tags[T.HEAD_K_FULL].verified_slots == prefix["target"]
    assert d.protected_tokens == s["draft_tokens"]
    assert d.tags[T.HEAD_K_FULL].verify_launches == s["draft_forwards"] == d.tags[T.TAIL_V_FULL].write_launches
    assert set(d.tags) == {T.HEAD_K_FULL, T.HEAD_V_FULL, T.TAIL_K_FULL, T.TAIL_V_FULL, T.SWEEP_K_FULL, T.SWEEP_V_FULL}


def test_the_draft_canary_checks_tokens_one_position_later():
    # Built like the target's canary (offset 0), the draft canary reads the wrong expected token at every
    # position: only the +1 offset makes a clean speculative run clean.
    sim = ServingSimulation(SimConfig(seed=4, spec_tokens=2), draft_canary_kwargs=dict(kv_token_id_vs_position_offset=0))
    sim.run(30)
    assert sim.canary.poll(sync=True) == []
    rows = sim.draft_canary.poll(sync=True)
    assert rows and all(v.reasons == F.VERIFY_TOKEN_MISMATCH and v.phase in ("head", "tail") for v in rows)


def test_stand_in_draft_agrees_with_the_target_as_configured():
    # Fed token[p + 1] at position p, the draft guesses token[p + 2], which the target predicts from
    # token[p + 1] at position p + 1.
    n = 20000
    ids = torch.arange(1, n + 1, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64) % 97
    batch = Batch("draft_extend", [Row(None, 0, n, 0, "draft_extend")], ids, ids, ids, ids, pos,  # type: ignore[arg-type]
                  torch.full((n,), -1, dtype=torch.int64), None, ids)
    pool = torch.zeros((1, 1, 16), dtype=torch.int16)
    args = dict(out_cache_loc=batch.out_cache_loc, input_ids=ids, positions=pos)
    guess = np.array(StandInDraft(vocab=1000, accept_prob=0.7).forward(None, batch, args, KvPools(pool, pool))[0])
    right = next_token(ids.numpy(), pos.numpy() + 1, 1000)
    assert 0.68 < np.mean(guess == right) < 0.72
    assert np.all((guess >= 1) & (guess < 1000)) and not pool.any()   # nothing written for out_cache_loc -1


def test_submitted_workload_runs_to_completion():
    sim = ServingSimulation(SimConfig(seed=5, arrival_prob=0.0, pad_to=1, spec_tokens=2))
    rng = np.random.default_rng(0)
    shared = rng.integers(1, 1000, 12).tolist()
    for i in range(10):
        sim.submit(shared + rng.integers(1, 1000, 5 + i).tolist(), 6 + i % 4, arrival_step=2 * i)
    sim.run()
    assert sim.idle and len(sim.finished) == 10 and sim.stats["cache_hits"] >= 5
    assert all(len(r.generated) == r.max_new for r in sim.finished)
    assert sim.violations == [] and sim.draft_canary.poll(sync=True) == []
    with pytest.raises(ValueError, match=r"kv-canary: a request needs a prompt and max_new_tokens >= 1 within "
                                         r"max_seq_len=96, got 90 \+ 10"):
        sim.submit([1] * 90, 10)
    with pytest.raises(ValueError, match=r"kv-canary: run\(\) without steps needs a finite workload \(config.arrival_prob=0\), "
                                         r"got arrival_prob=0.7"):
        ServingSimulation(SimConfig()).run()


def test_quarantine_aborts_the_readers_and_drops_the_cached_pages():
    sim = ServingSimulation(SimConfig(seed=6))
    sim.run(25)
    page = next(p for p in sim.cache.values() if any(p in r.pages for r in sim.running))
    readers = [r for r in sim.running if page in r.pages]
    sim.quarantine(slots=[page * sim.cfg.page_size + 1])
    assert page not in sim.page_key and all(r.aborted and r not in sim.running for r in readers)
    assert sim.page_ref[page] == 0 and page in sim.free_pages
    sim.run(30)
    assert sim.canary.poll(sync=True) == []
