"""A scalar model of SPEC §3-§13, written straight from SPEC.md's text, one entry at a time, on Python ints.

It is the independent oracle of the CPU tests: it imports nothing from kvcanary, uses no NumPy, and spells
out every rule as a plain loop, so that a reader can check it against SPEC line by line. Where SPEC leaves a
bounds decision to the implementation (SPEC §9), the model follows the decision written in the docstrings of
``kvcanary/ops/reference/{table,plan,write,verify,scatter,realkv,records}.py`` and in the shared decisions of
the design notes (quoted next to each rule below).

State is plain Python: a canary buffer is a list of records ``[token, position, prev_hash, real_kv_hash]``
(int64 values), the violation log is :class:`Log`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# SPEC §2, copied from the table (not from kvcanary.consts).
ANCHOR = 0xC0FFEE1234567890
M64 = (1 << 64) - 1
CHAIN = 1
POSITION = 2
REAL_KV = 4
WRITE_TOKEN = 8
WRITE_POSITION = 16
VERIFY_TOKEN = 32
OOR = 64


def i64(x: int) -> int:
    """u64 bit pattern (or any int) -> the signed int64 stored in buffers."""
    x &= M64
    return x - (1 << 64) if x >> 63 else x


def i32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >> 31 else x


def splitmix64(x: int) -> int:
    x &= M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def mix3(a: int, b: int, c: int) -> int:
    return splitmix64(splitmix64(splitmix64(a) ^ (b & M64)) ^ (c & M64))


def slot_hash(recs: list[list[int]], s: int) -> int:
    """SPEC §3 slot_hash as a u64."""
    if s < 0:
        return splitmix64(ANCHOR)
    token, position, prev_hash = recs[s][0], recs[s][1], recs[s][2]
    return mix3(prev_hash, token, position)


# ---------------------------------------------------------------------------------------------- §3.1 real KV


@dataclass
class Source:
    """A real-KV source described by the raw bytes of the memory it views.

    ``memory`` holds the whole allocation; the source's row ``k`` starts at ``base + k * row_stride``.
    """

    memory: bytes
    base: int
    row_stride: int
    page_size: int
    num_bytes_per_token: int
    read_bytes: int
    rows: int | None = None  # rows of the source (None: enough for any slot asked)

    def slot_bytes(self, slot: int, n: int) -> bytes:
        start = self.base + (slot // self.page_size) * self.row_stride + (slot % self.page_size) * self.num_bytes_per_token
        return self.memory[start:start + n]


def source_hash(src: Source, slot: int, n: int) -> int:
    data = src.slot_bytes(slot, n)
    assert len(data) == n
    h = 0
    for k in range(0, n, 8):
        h = splitmix64(h ^ int.from_bytes(data[k:k + 8], "little"))
    return h


def fingerprint(sources: list[Source], mode: int, slot: int) -> int:
    """SPEC §3.1 fingerprint (u64). mode: 0 NONE, 1 PARTIAL, 2 ALL."""
    if mode == 0 or not sources:
        return 0
    acc = 0
    for src in sources:
        n = 16 if mode == 1 else src.read_bytes
        acc = splitmix64(acc ^ source_hash(src, slot, n))
    return acc


def covers(sources: list[Source], mode: int, slot: int) -> bool:
    """SPEC §9 (real KV): whether a launch may touch ``slot`` as far as the sources go. Only when the mode reads
    the sources (mode != NONE and at least one source) does a slot whose row ``slot // page_size`` is not a row
    of every source count as uncovered."""
    if mode == 0 or not sources:
        return True
    return all(src.rows is None or slot // src.page_size < src.rows for src in sources)


# ---------------------------------------------------------------------------------------------- §4 log


@dataclass
class Log:
    ring: list[list[int]]
    index: int = 0
    slot_runs: int = 0
    kernel_runs: int = 0

    def append(self, row) -> None:
        i = self.index
        if 0 <= i < len(self.ring):
            self.ring[i] = [int(v) for v in row]
        self.index = i32(i + 1)


# ---------------------------------------------------------------------------------------------- §5 plan


@dataclass
class PlanResult:
    entries: list[tuple[int, int, int, int]] | None  # (slot, expected_token, position, prev); None = not written
    num_valid: int
    enable: int
    offsets: list[int]  # R + 1
    seeds: list[int]  # bs (entries past bs are not written)
    num_valid_reqs: int
    invalid_rows: int


class Table:
    """SPEC §10: the per-position table in either form; ``RT(rp, p)``."""

    def __init__(self, r2t=None, block_table=None, block_size=None):
        assert (r2t is None) != (block_table is None)
        self.r2t, self.block_table = r2t, block_table
        self.block_size = 1 if block_table is None else block_size
        rows = r2t if r2t is not None else block_table
        self.max_reqs = len(rows)
        self.max_seq_len = len(rows[0]) * self.block_size

    def RT(self, rp: int, p: int) -> int:
        if self.r2t is not None:
            return self.r2t[rp][p]
        block = self.block_table[rp][p // self.block_size]
        if block < 0:  # "A negative block id gives RT = -1."
            return -1
        return block * self.block_size + p % self.block_size


def plan(*, rpi, prefix, extend, r2t=None, block_table=None, block_size=None, pad_row=0, window, lut, pool,
         valid_lens, offset, capacity, req_capacity) -> PlanResult:
    """SPEC §5 on the table of §10, with the §9 plan bounds (reference/plan.py, reference/table.py docstrings):

    * a row whose req_pool_indices is outside [0, max_reqs) and is not pad_row, or whose prefix exceeds
      max_seq_len, is invalid: no verify entries, no write entries, seed -1, counted in invalid_rows;
    * a row whose req_pool_indices equals pad_row is padding: no entries, not counted.

    ``capacity=None``: unlimited (SPEC §11).
    """
    table = Table(r2t, block_table, block_size)
    max_reqs, max_seq_len = table.max_reqs, table.max_seq_len

    def T(x: int) -> int:
        if x < 0 or lut is None:
            return x
        if x >= len(lut):
            return -2
        return lut[x]

    entries = []
    write_lens = []
    seeds = []
    invalid_rows = 0
    for r in range(len(rpi)):
        rp, pre = rpi[r], prefix[r]
        if (not (0 <= rp < max_reqs) and rp != pad_row) or pre > max_seq_len:
            invalid_rows += 1
            write_lens.append(0)
            seeds.append(-1)
            continue
        if rp == pad_row:  # padding row
            write_lens.append(0)
            seeds.append(-1)
            continue
        start = max(0, pre - window) if window > 0 else 0
        for p in range(start, pre):
            slot = T(table.RT(rp, p))
            prev = T(table.RT(rp, p - 1)) if p > 0 else -1
            q = p + offset
            if pool is not None and 0 <= q < valid_lens[r] and q < len(pool[0]):
                expected = pool[rp][q]
            else:
                expected = -1
            entries.append((slot, expected, p, prev))
        wl = max(extend[r], 0)
        write_lens.append(wl)
        seeds.append(T(table.RT(rp, pre - 1)) if pre > 0 and wl > 0 else -1)
    offsets = [0]
    for wl in write_lens:
        offsets.append(offsets[-1] + wl)
    offsets += [0] * (req_capacity + 1 - len(offsets))
    if capacity is not None and len(entries) > capacity:
        return PlanResult(None, capacity, 0, offsets, seeds, len(rpi), invalid_rows)
    return PlanResult(entries, len(entries), 1, offsets, seeds, len(rpi), invalid_rows)


# ---------------------------------------------------------------------------------------------- §6 write


def write(*, recs, log: Log, tag, offsets, seeds, num_valid_reqs, ids, pos, loc, exp_tok=None, exp_pos=None,
          chain_flag=None, fp=lambda slot: 0, covered=lambda slot: True) -> None:
    """SPEC §6 with the §9 write bounds (reference/write.py docstring):

    * a request whose non-empty token range is not inside [0, num_tokens): row (tag, -1, start, -1, -1, 0, end, OOR),
      request skipped (checked before the seed);
    * seed >= num_slots: row (tag, seed, -1, -1, -1, 0, -1, OOR), request skipped;
    * out_cache_loc >= num_slots, or a slot the real-KV sources do not cover (``covered``, see :func:`covers`):
      row (tag, slot, pos, tok, -1, running, -1, OOR), token skipped like -1.
    """
    num_slots, n_tokens, R = len(recs), len(ids), len(seeds)
    log.kernel_runs = i64(log.kernel_runs + 1)
    stamped = 0
    for r in range(max(0, min(num_valid_reqs, R))):
        start, end = offsets[r], offsets[r + 1]
        if end > start and (start < 0 or end > n_tokens):
            log.append((tag, -1, start, -1, -1, 0, end, OOR))
            continue
        seed = seeds[r]
        if seed >= num_slots:
            log.append((tag, seed, -1, -1, -1, 0, -1, OOR))
            continue
        running = slot_hash(recs, seed)
        check_pos = seed >= 0 and chain_flag is not None and chain_flag != 0
        last_pos = recs[seed][1] if check_pos else None
        for i in range(start, end):
            slot = loc[i]
            if slot < 0:
                continue
            tok, p = ids[i], pos[i]
            if slot >= num_slots or not covered(slot):
                log.append((tag, slot, p, tok, -1, i64(running), -1, OOR))
                continue
            if exp_tok is not None:
                bits = 0
                if tok != exp_tok[i]:
                    bits |= WRITE_TOKEN
                if p != exp_pos[i]:
                    bits |= WRITE_POSITION
                if bits:
                    log.append((tag, slot, p, tok, exp_tok[i], i64(running), exp_pos[i], bits))
            if check_pos:
                if p != i64(last_pos + 1):
                    log.append((tag, slot, p, tok, tok, i64(running), i64(last_pos + 1), WRITE_POSITION))
                last_pos = p
            recs[slot][0:4] = [tok, p, i64(running), i64(fp(slot))]
            running = mix3(running, tok, p)
            stamped += 1
    log.slot_runs = i64(log.slot_runs + stamped)


# ---------------------------------------------------------------------------------------------- §7 verify


def verify(*, recs, log: Log, tag, slots, exp_tok, exp_pos, prev, num_valid, enable, check_token,
           fp=lambda slot: 0, covered=lambda slot: True) -> None:
    """SPEC §7 with the §9 verify bounds (reference/verify.py docstring): slot outside [0, num_slots), a slot the
    real-KV sources do not cover (``covered``, see :func:`covers`), or prev >= num_slots gives
    (tag, slot, expected_position, -1, expected_token_or_-1, 0, prev, OOR)."""
    num_slots, capacity = len(recs), len(slots)
    log.kernel_runs = i64(log.kernel_runs + 1)
    if enable == 0:
        return
    n = max(0, min(num_valid, capacity))
    log.slot_runs = i64(log.slot_runs + n)
    for e in range(n):
        s, pv = slots[e], prev[e]
        if s == 0:
            continue
        reported = exp_tok[e] if check_token else -1
        if s < 0 or s >= num_slots or pv >= num_slots or not covered(s):
            log.append((tag, s, exp_pos[e], -1, reported, 0, pv, OOR))
            continue
        tok, p, h, rkv = recs[s][0], recs[s][1], recs[s][2], recs[s][3]
        expected_chain = i64(slot_hash(recs, pv)) if pv != 0 else h
        bits = 0
        if pv != 0 and h != expected_chain:
            bits |= CHAIN
        if check_token and exp_tok[e] != -1 and tok != exp_tok[e]:
            bits |= VERIFY_TOKEN
        if p != exp_pos[e]:
            bits |= POSITION
        if rkv != i64(fp(s)):
            bits |= REAL_KV
        if bits:
            log.append((tag, s, p, tok, reported, h, expected_chain, bits))


# ---------------------------------------------------------------------------------------------- §8 scatter


def scatter(*, flat, offsets, rpi, pool) -> None:
    """SPEC §8 with the bounds of reference/scatter.py: rows outside [0, max_reqs) or starting outside
    [0, N] are skipped; copies are clipped to the row and to flat_in; values narrowed to int32."""
    max_reqs, cols, n_flat = len(pool), len(pool[0]), len(flat)
    for r in range(len(rpi)):
        row, start = rpi[r], offsets[r]
        if not (0 <= row < max_reqs) or not (0 <= start <= n_flat):
            continue
        n = min(offsets[r + 1] - start, cols, n_flat - start)
        for k in range(max(n, 0)):
            pool[row][k] = i32(flat[start + k])


# ---------------------------------------------------------------------------------------------- §11, §12 from the table


@dataclass
class Ctx:
    """One context of a plan-free launch: its records, its log and its fold parameters."""

    recs: list[list[int]]
    log: Log
    tag: int
    chain_flag: int | None = None
    fp: object = lambda slot: 0
    covered: object = lambda slot: True


def verify_from_table(*, contexts: list[Ctx], rpi, prefix, r2t=None, block_table=None, block_size=None, pad_row=0,
                      window=0, lut=None, pool=None, valid_lens=None, offset=0, check_token=False) -> int:
    """SPEC §11: "exactly what §5 followed by §7 produce with an unlimited verify_capacity", for each context in
    turn. Returns invalid_rows."""
    res = plan(rpi=rpi, prefix=prefix, extend=[0] * len(rpi), r2t=r2t, block_table=block_table,
               block_size=block_size, pad_row=pad_row, window=window, lut=lut, pool=pool, valid_lens=valid_lens,
               offset=offset, capacity=None, req_capacity=len(rpi))
    e = res.entries
    for c in contexts:
        verify(recs=c.recs, log=c.log, tag=c.tag, slots=[x[0] for x in e], exp_tok=[x[1] for x in e],
               exp_pos=[x[2] for x in e], prev=[x[3] for x in e], num_valid=len(e), enable=1,
               check_token=check_token, fp=c.fp, covered=c.covered)
    return res.invalid_rows


def write_from_table(*, contexts: list[Ctx], rpi, prefix, extend, r2t=None, block_table=None, block_size=None,
                     pad_row=0, window=0, lut=None, ids, pos, loc, exp_tok=None, exp_pos=None) -> int:
    """SPEC §12: "exactly what §5's write metadata followed by §6 produce", for each context in turn (each
    context has its own records, so its own chains). Returns invalid_rows."""
    res = plan(rpi=rpi, prefix=prefix, extend=extend, r2t=r2t, block_table=block_table, block_size=block_size,
               pad_row=pad_row, window=window, lut=lut, pool=None, valid_lens=None, offset=0, capacity=None,
               req_capacity=len(rpi))
    for c in contexts:
        write(recs=c.recs, log=c.log, tag=c.tag, offsets=res.offsets, seeds=res.seeds,
              num_valid_reqs=res.num_valid_reqs, ids=ids, pos=pos, loc=loc, exp_tok=exp_tok, exp_pos=exp_pos,
              chain_flag=c.chain_flag, fp=c.fp, covered=c.covered)
    return res.invalid_rows


# ---------------------------------------------------------------------------------------------- §13 records
# A record is the 4 int64 fields of a slot. Decisions (reference/records.py docstring): a negative slot skips
# the entry (gather: zero record); a slot >= num_slots of its buffer is skipped the same way and the entry is
# counted once; entries are applied in order.


def gather_records(recs, slots) -> tuple[list[list[int]], int]:
    out, oor = [], 0
    for s in slots:
        if 0 <= s < len(recs):
            out.append(list(recs[s]))
        else:
            out.append([0, 0, 0, 0])
            oor += s >= len(recs)
    return out, oor


def scatter_records(recs, slots, records) -> int:
    oor = 0
    for s, rec in zip(slots, records):
        if 0 <= s < len(recs):
            recs[s] = list(rec)
        oor += s >= len(recs)
    return oor


def copy_records(src_recs, dst_recs, src_slots, dst_slots) -> int:
    """``dst_recs`` may be ``src_recs`` itself (one buffer)."""
    oor = 0
    for s, d in zip(src_slots, dst_slots):
        if s >= len(src_recs) or d >= len(dst_recs):
            oor += 1
            continue
        if s < 0 or d < 0:
            continue
        dst_recs[d] = list(src_recs[s])
    return oor


@dataclass
class Chain:
    """Helper for hand-built cases: the prev_hash values a chain of (token, position) pairs gets."""

    seed_hash: int = field(default_factory=lambda: splitmix64(ANCHOR))

    def hashes(self, pairs) -> list[int]:
        out, h = [], self.seed_hash
        for tok, p in pairs:
            out.append(i64(h))
            h = mix3(h, tok, p)
        self.seed_hash = h
        return out
