"""Helpers shared by the CPU tests: tensor builders, poisoning, a canary "rig", and differential runners that
run one public op and the scalar model of ``spec_model`` on the same inputs and compare every byte."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

import kvcanary as kc
from support import spec_model as M

# A byte pattern no op writes by accident; int views of it per dtype.
POISON_BYTE = 0xA5
POISON = {
    torch.int64: M.i64(int.from_bytes(bytes([POISON_BYTE]) * 8, "little")),
    torch.int32: M.i32(int.from_bytes(bytes([POISON_BYTE]) * 4, "little")),
    torch.uint8: POISON_BYTE,
}


def t64(xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def t32(xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int32)


def poison(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t is not None:
            t.fill_(POISON.get(t.dtype, 7))


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def snapshot(*tensors: torch.Tensor) -> list[bytes]:
    return [_bytes(t) if t is not None else None for t in tensors]


def assert_unchanged(snap: list[bytes], *tensors: torch.Tensor) -> None:
    now = snapshot(*tensors)
    for i, (a, b) in enumerate(zip(snap, now)):
        assert a == b, f"buffer {i} was modified"


def tensors_in(obj, out=None) -> list[torch.Tensor]:
    """Every tensor reachable from an argument (plans, contexts, sources, tuples)."""
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            tensors_in(getattr(obj, f.name), out)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            tensors_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            tensors_in(x, out)
    return out


def storage_snapshot(tensors) -> dict[int, bytes]:
    snap = {}
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() not in snap:
            snap[s.data_ptr()] = torch.empty(0, dtype=torch.uint8).set_(s).numpy().tobytes()
    return snap


def plan_buffers(vp: kc.VerifyPlan, wp: kc.WritePlan) -> list[torch.Tensor]:
    return [vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
            vp.verify_prev_slot_indices, vp.verify_num_valid, vp.enable, wp.write_offsets,
            wp.write_seed_slot_indices, wp.write_num_valid_reqs]


# --------------------------------------------------------------------------------------------- real-KV pools


@dataclass
class PoolSource:
    """A real KV pool ``big`` (uint8 [rows, big_row_bytes], random) and a kvcanary source over a view of it.

    The view starts ``col_offset`` bytes into each row and is ``page_size * num_bytes_per_token + slack``
    bytes wide (so rows are "holey" when ``big_row_bytes`` is larger), optionally reinterpreted as ``dtype``
    and reshaped to ``[rows, page_size, -1]`` (``paged=True``).
    """

    big: torch.Tensor
    col_offset: int
    page_size: int
    num_bytes_per_token: int
    read_bytes: int
    source: kc.RealKvSource

    @classmethod
    def make(cls, *, rows: int, page_size: int, num_bytes_per_token: int, read_bytes: int | None = None,
             big_row_bytes: int | None = None, col_offset: int = 0, slack: int = 0, dtype=torch.uint8,
             paged: bool = False, generator: torch.Generator | None = None) -> PoolSource:
        width = page_size * num_bytes_per_token + slack
        big_row_bytes = big_row_bytes if big_row_bytes is not None else col_offset + width
        assert big_row_bytes >= col_offset + width
        big = torch.randint(0, 256, (rows, big_row_bytes), dtype=torch.uint8, generator=generator)
        v = big[:, col_offset:col_offset + width]
        if dtype != torch.uint8:
            v = v.view(dtype)
        if paged:
            v = v.reshape(rows, page_size, -1) if slack == 0 else v
        src = kc.RealKvSource(tensor=v, page_size=page_size, num_bytes_per_token=num_bytes_per_token,
                              read_bytes=read_bytes if read_bytes is not None else num_bytes_per_token)
        return cls(big, col_offset, page_size, num_bytes_per_token, src.read_bytes, src)

    def model(self) -> M.Source:
        return M.Source(memory=self.big.numpy().tobytes(), base=self.col_offset, row_stride=self.big.shape[1],
                        page_size=self.page_size, num_bytes_per_token=self.num_bytes_per_token,
                        read_bytes=self.read_bytes, rows=self.big.shape[0])


# --------------------------------------------------------------------------------------------- canary rig


@dataclass
class Rig:
    """A canary buffer + violation log + launch-context parameters, with model mirrors of its state."""

    buf: torch.Tensor
    log: kc.ViolationLog
    tag: int = 0
    flag: torch.Tensor | None = None
    pools: list[PoolSource] = field(default_factory=list)
    mode: int = 0

    @classmethod
    def make(cls, num_slots: int, *, stride: int = 32, ring: int = 16, tag: int = 0, flag: int | None = 1,
             pools=(), mode: int = 0) -> Rig:
        buf = kc.allocate_canary_buffer(num_slots, slot_stride_bytes=stride)
        log = kc.ViolationLog.allocate(ring_capacity=ring)
        f = kc.allocate_chain_position_flag(flag) if flag is not None else None
        return cls(buf, log, tag, f, list(pools), mode)

    @property
    def num_slots(self) -> int:
        return self.buf.shape[0]

    def ctx(self, **overrides) -> kc.VerifyOrWriteContext:
        kw = dict(canary_buf=self.buf, kernel_kind=self.tag, real_kv_sources=tuple(p.source for p in self.pools),
                  real_kv_hash_mode=self.mode, enable_chain_position_assert=self.flag)
        kw.update(overrides)
        return self.log.context(**kw)

    def recs(self) -> list[list[int]]:
        return self.buf.numpy().view(np.int64)[:, :4].tolist()

    def set_recs(self, recs: list[list[int]]) -> None:
        self.buf.numpy().view(np.int64)[:, :4] = np.array(recs, dtype=np.int64).reshape(-1, 4)

    def model_log(self) -> M.Log:
        return M.Log(ring=self.log.violation_ring.tolist(), index=int(self.log.violation_write_index[0]),
                     slot_runs=int(self.log.slot_run_counter[0]), kernel_runs=int(self.log.kernel_run_counter[0]))

    def fp(self):
        sources = [p.model() for p in self.pools]
        mode = self.mode
        return lambda slot: M.fingerprint(sources, mode, slot)

    def covered(self):
        sources = [p.model() for p in self.pools]
        mode = self.mode
        return lambda slot: M.covers(sources, mode, slot)

    def model_ctx(self) -> M.Ctx:
        """The model's view of this rig's context (records and log copied)."""
        return M.Ctx(recs=self.recs(), log=self.model_log(), tag=self.tag,
                     chain_flag=int(self.flag[0]) if self.flag is not None else None, fp=self.fp(),
                     covered=self.covered())

    def assert_matches(self, mctx: M.Ctx) -> None:
        """Every byte of the buffer (bytes past 32 untouched) and of the log equal the model's."""
        assert self.buf.numpy().tobytes() == self.expected_buf_bytes(mctx.recs)
        self.assert_log_equals(mctx.log)

    def rows(self) -> list[tuple[int, ...]]:
        n = min(int(self.log.violation_write_index[0]), self.log.violation_ring.shape[0])
        return [tuple(r) for r in self.log.violation_ring[:max(n, 0)].tolist()]

    @property
    def index(self) -> int:
        return int(self.log.violation_write_index[0])

    @property
    def slot_runs(self) -> int:
        return int(self.log.slot_run_counter[0])

    @property
    def kernel_runs(self) -> int:
        return int(self.log.kernel_run_counter[0])

    def assert_log_equals(self, model_log: M.Log) -> None:
        assert self.log.violation_ring.tolist() == model_log.ring
        assert self.index == model_log.index
        assert self.slot_runs == model_log.slot_runs
        assert self.kernel_runs == model_log.kernel_runs

    def expected_buf_bytes(self, recs: list[list[int]]) -> bytes:
        """The buffer bytes if the first 32 bytes of each record were ``recs`` and the rest untouched."""
        b = self.buf.numpy().copy()
        b.view(np.int64)[:, :4] = np.array(recs, dtype=np.int64).reshape(-1, 4)
        return b.tobytes()

    # --------------------------------------------------------------- ops, each checked against the model

    def write(self, plan: kc.WritePlan, *, ids, pos, loc, exp_tok=None, exp_pos=None, check_model: bool = True,
              **ctx_overrides) -> list[tuple[int, ...]]:
        """Run the write op; with ``check_model`` also the model, and compare every byte. Returns new rows."""
        before = self.index
        ids, pos, loc = (t64(x) if not isinstance(x, torch.Tensor) else x for x in (ids, pos, loc))
        assert_on = exp_tok is not None
        if assert_on:
            exp_tok, exp_pos = (t64(x) if not isinstance(x, torch.Tensor) else x for x in (exp_tok, exp_pos))
        if check_model:
            recs, mlog = self.recs(), self.model_log()
            M.write(recs=recs, log=mlog, tag=self.tag, offsets=plan.write_offsets.tolist(),
                    seeds=plan.write_seed_slot_indices.tolist(), num_valid_reqs=int(plan.write_num_valid_reqs[0]),
                    ids=ids.tolist(), pos=pos.tolist(), loc=loc.tolist(),
                    exp_tok=exp_tok.tolist() if assert_on else None, exp_pos=exp_pos.tolist() if assert_on else None,
                    chain_flag=int(self.flag[0]) if self.flag is not None else None, fp=self.fp(),
                    covered=self.covered())
            want_buf = self.expected_buf_bytes(recs)
        kc.launch_canary_write_kernel(context=self.ctx(**ctx_overrides), plan=plan, input_ids=ids, positions=pos,
                                      out_cache_loc=loc, enable_write_input_assert=assert_on,
                                      expected_input_tokens=exp_tok, expected_input_positions=exp_pos)
        if check_model:
            assert self.buf.numpy().tobytes() == want_buf
            self.assert_log_equals(mlog)
        return self.rows()[before:]

    def verify(self, plan: kc.VerifyPlan, *, check_token: bool = True, check_model: bool = True,
               **ctx_overrides) -> list[tuple[int, ...]]:
        before = self.index
        buf_before = self.buf.numpy().tobytes()
        if check_model:
            mlog = self.model_log()
            M.verify(recs=self.recs(), log=mlog, tag=self.tag, slots=plan.verify_slot_indices.tolist(),
                     exp_tok=plan.verify_expected_tokens.tolist(), exp_pos=plan.verify_expected_positions.tolist(),
                     prev=plan.verify_prev_slot_indices.tolist(), num_valid=int(plan.verify_num_valid[0]),
                     enable=int(plan.enable[0]), check_token=check_token, fp=self.fp(), covered=self.covered())
        kc.launch_canary_verify_kernel(context=self.ctx(**ctx_overrides), plan=plan,
                                       check_verify_expected_token=check_token)
        assert self.buf.numpy().tobytes() == buf_before, "verify wrote the canary buffer"
        if check_model:
            self.assert_log_equals(mlog)
        return self.rows()[before:]


def write_plan(offsets, seeds, num_valid_reqs: int | None = None, req_capacity: int | None = None) -> kc.WritePlan:
    """A WritePlan filled by hand; ``req_capacity`` defaults to ``len(seeds)``; unused tail entries are poison."""
    r = req_capacity if req_capacity is not None else len(seeds)
    wp = kc.WritePlan.allocate(write_req_capacity=r)
    poison(wp.write_offsets, wp.write_seed_slot_indices)
    wp.write_offsets[:len(offsets)] = t64(offsets)
    wp.write_seed_slot_indices[:len(seeds)] = t64(seeds)
    wp.write_num_valid_reqs[0] = len(seeds) if num_valid_reqs is None else num_valid_reqs
    return wp


def verify_plan(slots, exp_tok, exp_pos, prev, *, num_valid: int | None = None, enable: int = 1,
                capacity: int | None = None) -> kc.VerifyPlan:
    """A VerifyPlan filled by hand; entries past the given ones are poison."""
    c = capacity if capacity is not None else max(len(slots), 1)
    vp = kc.VerifyPlan.allocate(verify_capacity=c)
    poison(vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
           vp.verify_prev_slot_indices)
    n = len(slots)
    if n:
        vp.verify_slot_indices[:n] = t64(slots)
        vp.verify_expected_tokens[:n] = t64(exp_tok)
        vp.verify_expected_positions[:n] = t64(exp_pos)
        vp.verify_prev_slot_indices[:n] = t64(prev)
    vp.verify_num_valid[0] = n if num_valid is None else num_valid
    vp.enable[0] = enable
    return vp


def single_chain_plan(slots, positions, tokens=None, *, seed_prev: int = -1, **kw) -> kc.VerifyPlan:
    """Verify entries for one request whose positions ``positions`` live in ``slots`` (prev = previous slot)."""
    prev = [seed_prev, *list(slots[:-1])]
    tokens = tokens if tokens is not None else [-1] * len(slots)
    return verify_plan(slots, tokens, positions, prev, **kw)


# --------------------------------------------------------------------------------------------- plan


@dataclass
class PlanRun:
    vp: kc.VerifyPlan
    wp: kc.WritePlan
    invalid_rows: torch.Tensor
    model: M.PlanResult


def run_plan(*, rpi, prefix, extend, r2t=None, window: int = 0, lut=None, pool=None, valid_lens=None, offset: int = 0,
             capacity: int, req_capacity: int | None = None, check_model: bool = True, block_table=None,
             block_size: int | None = None, pad_row: int = 0) -> PlanRun:
    """Run the plan op on poisoned outputs and compare every output byte with the model. The table is
    ``r2t`` or ``block_table`` + ``block_size`` (SPEC §10); ``pad_row`` is passed only when not 0, so the
    default call is SGLang's."""
    rpi_t, prefix_t, extend_t = t64(rpi), t64(prefix), t64(extend)
    r2t_t = None if r2t is None else (r2t if isinstance(r2t, torch.Tensor) else t32(r2t))
    bt_t = None if block_table is None else (block_table if isinstance(block_table, torch.Tensor) else t32(block_table))
    table_kw = dict(req_to_token=r2t_t) if bt_t is None else dict(block_table=bt_t, block_size=block_size)
    if pad_row != 0:
        table_kw["pad_row"] = pad_row
    lut_t = None if lut is None else (lut if isinstance(lut, torch.Tensor) else t64(lut))
    pool_t = None if pool is None else (pool if isinstance(pool, torch.Tensor) else t32(pool))
    lens_t = None if valid_lens is None else t64(valid_lens)
    R = req_capacity if req_capacity is not None else max(len(rpi), 1)
    vp = kc.VerifyPlan.allocate(verify_capacity=capacity)
    wp = kc.WritePlan.allocate(write_req_capacity=R)
    inv = torch.zeros(1, dtype=torch.int32)
    outs = [*plan_buffers(vp, wp), inv]
    poison(*outs)
    snap = snapshot(*outs)
    kc.launch_canary_plan_kernels(
        verify_plan_out=vp, write_plan_out=wp, req_pool_indices=rpi_t, prefix_lens=prefix_t, extend_seq_lens=extend_t,
        swa_window_size=window, full_to_swa_index_mapping=lut_t, verify_capacity=capacity,
        req_to_verify_expected_tokens=pool_t, req_to_verify_expected_tokens_valid_lens=lens_t,
        kv_token_id_vs_position_offset=offset, invalid_rows_out=inv, **table_kw)
    res = M.plan(rpi=list(rpi), prefix=list(prefix), extend=list(extend),
                 r2t=None if r2t_t is None else r2t_t.tolist(),
                 block_table=None if bt_t is None else bt_t.tolist(), block_size=block_size, pad_row=pad_row,
                 window=window,
                 lut=None if lut_t is None else lut_t.tolist(), pool=None if pool_t is None else pool_t.tolist(),
                 valid_lens=None if lens_t is None else lens_t.tolist(), offset=offset, capacity=capacity,
                 req_capacity=R)
    if check_model:
        assert_plan_matches(vp, wp, inv, res, snap)
    return PlanRun(vp, wp, inv, res)


def assert_plan_matches(vp, wp, inv, res: M.PlanResult, snap) -> None:
    arrays = [vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions,
              vp.verify_prev_slot_indices]
    if res.entries is None:
        assert_unchanged(snap[:4], *arrays)
    else:
        # Entries past num_valid are unspecified (verify never reads them); only [:n] is compared.
        n = len(res.entries)
        for k, a in enumerate(arrays):
            assert a[:n].tolist() == [e[k] for e in res.entries], f"verify array {k}"
    assert int(vp.verify_num_valid[0]) == res.num_valid
    assert int(vp.enable[0]) == res.enable
    assert wp.write_offsets.tolist() == res.offsets
    bs = len(res.seeds)
    # SPEC §5 says nothing about seeds past bs (the write never reads them), so only [:bs] is compared.
    assert wp.write_seed_slot_indices[:bs].tolist() == res.seeds
    assert int(wp.write_num_valid_reqs[0]) == res.num_valid_reqs
    assert int(inv[0]) == res.invalid_rows
