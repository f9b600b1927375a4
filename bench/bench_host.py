#!/usr/bin/env python3
"""Host (CPU) time of the canary's hot path: one ``KVCanary.step`` call, and one SGLang-named op call.

Usage (from the repository root)::

    PYTHONPATH=. python3 bench/bench_host.py                 # CUDA when available, else the CPU backend
    PYTHONPATH=. python3 bench/bench_host.py --device cpu    # the CPU reference backend only
    PYTHONPATH=. python3 bench/bench_host.py --null-backend  # Python cost only: every launch is a no-op
    PYTHONPATH=. python3 bench/bench_host.py --breakdown     # also: the cost of each primitive a step is made of
    PYTHONPATH=. python3 bench/bench_host.py --chunk 4       # a device sync every 4 steps (GPU never behind)
    PYTHONPATH=. python3 bench/bench_host.py --attribute     # real steps, the time inside each CUDA call
    PYTHONPATH=. python3 bench/bench_host.py --layers 32     # a K and a V real-KV source per layer, 32 layers

Cases (eager, no CUDA graph; shape A: decode, 256 requests x 4096 cached positions, one new token each):

* ``step K+V FULL``: ``canary.step("head", ...)`` then ``canary.step("tail", ...)`` of a canary with a K and a V
  real-KV source over the FULL pool; the host time of each call (``time.perf_counter`` around the call, no
  sync inside), median over the steps;
* ``step K+V FULL+SWA``: the same with a sliding-window group (window 512) whose slots the engine passes
  (``swa_out_cache_loc``);
* ``verify op``: one ``launch_canary_verify_kernel`` call with a context and a plan reused every call (the
  SGLang-named ops validate every argument on every call).

Per case: host µs per call (median, mean, p90; the medians of the HEAD and of the TAIL calls apart: only a TAIL
step checks and folds the real-KV sources, so it grows with ``--layers``), and on CUDA the GPU µs per step (CUDA
events around 50 steps, host work included in the span, so it is the larger of the two) and the host share. The
state is stamped clean first (a prefill through the canary), so no violation is decoded during timing. The table
is printed last and written to ``$OUT/bench_host.md`` when ``$OUT`` is set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import contextmanager

import torch

import kvcanary as kc
from kvcanary.ops import backends

BS, PREFIX = 256, 4096


class NullBackend:
    """Accepts every launch record and does nothing: isolates the Python cost of the hot path."""

    name = "null"

    class _Step:
        def __init__(self, verify_contexts, write_contexts):
            self.verify_contexts, self.write_contexts = verify_contexts, write_contexts

        def verify(self, **kw):
            return None

        def write(self, **kw):
            return None

    def table_step(self, *, device, verify_contexts, write_contexts, stream=None):
        return self._Step(verify_contexts, write_contexts)

    def __getattr__(self, name):
        return lambda launch, stream=None: None


def use_backend(canary) -> None:
    """Point ``canary`` at the current backend of its device (its prepared step launches rebuilt)."""
    canary._backend = backends.backend_for(canary._dev)
    canary._table_steps.clear()


@contextmanager
def null_backend(device_kind: str):
    saved = backends._backends.get(device_kind)
    backends._backends[device_kind] = NullBackend()
    try:
        yield
    finally:
        if saved is None:
            backends._backends.pop(device_kind, None)
        else:
            backends._backends[device_kind] = saved


class Engine:
    """Shape A on ``device``: every request's 4096 positions in consecutive slots, stamped by one prefill."""

    def __init__(self, device: torch.device, *, swa: bool, bs: int, prefix: int, layers: int = 1):
        self.device = device
        n_slots = bs * (prefix + 1) + 1
        d = device

        def pool():
            return torch.zeros((n_slots, 16), dtype=torch.int16, device=d)  # 32 bytes per slot

        def src(t):
            return kc.RealKvSource(tensor=t, page_size=1, num_bytes_per_token=32, read_bytes=32)

        # One K and one V pool per layer, each a real-KV source of the FULL group (a TAIL step folds them all).
        self.k_pools = [pool() for _ in range(layers)]
        self.v_pools = [pool() for _ in range(layers)]
        swa_cfg = None
        if swa:
            self.lut = torch.arange(n_slots + 1, dtype=torch.int64, device=d)
            self.swa_k, self.swa_v = pool(), pool()
            swa_cfg = kc.SwaConfig(num_slots=n_slots, window_size=512, full_to_swa_index_mapping=self.lut,
                                   k_sources=(src(self.swa_k),), v_sources=(src(self.swa_v),))
        self.canary = kc.KVCanary(num_slots=n_slots, max_batch_size=bs, max_tokens_per_step=bs * prefix, device=d,
                                  k_sources=tuple(map(src, self.k_pools)), v_sources=tuple(map(src, self.v_pools)),
                                  swa=swa_cfg, mode="quiet",
                                  ring_capacity=1024, watchdog_patience=None)
        rows = torch.arange(1, bs + 1, device=d)
        self.r2t = torch.zeros((bs + 1, prefix + 1), dtype=torch.int32, device=d)
        base = (rows - 1) * (prefix + 1) + 1
        self.r2t[1:] = (base[:, None] + torch.arange(prefix + 1, device=d)[None, :]).to(torch.int32)
        self.rows = rows.to(torch.int64)
        # Prefill: every request writes its `prefix` tokens (no prefix yet).
        tok = torch.randint(1, 32000, (bs, prefix + 1), device=d, dtype=torch.int64)
        self.tokens = tok
        pre = dict(req_pool_indices=self.rows, prefix_lens=torch.zeros(bs, dtype=torch.int64, device=d),
                   extend_seq_lens=torch.full((bs,), prefix, dtype=torch.int64, device=d), req_to_token=self.r2t,
                   input_ids=tok[:, :prefix].reshape(-1).contiguous(),
                   positions=torch.arange(prefix, device=d).repeat(bs),
                   out_cache_loc=self.r2t[1:, :prefix].reshape(-1).to(torch.int64))
        if swa:
            pre["swa_out_cache_loc"] = pre["out_cache_loc"]
        self._forward(pre)
        self.canary.step("head", **pre)
        self._forward(pre)
        self.canary.step("tail", **pre)
        # The decode batch: position `prefix` of every request (rewritten each step: its seed is position prefix-1).
        self.batch = dict(req_pool_indices=self.rows, prefix_lens=torch.full((bs,), prefix, dtype=torch.int64, device=d),
                          extend_seq_lens=torch.ones(bs, dtype=torch.int64, device=d), req_to_token=self.r2t,
                          input_ids=tok[:, prefix].contiguous(), positions=torch.full((bs,), prefix, dtype=torch.int64,
                                                                                       device=d),
                          out_cache_loc=self.r2t[1:, prefix].to(torch.int64))
        if swa:
            self.batch["swa_out_cache_loc"] = self.batch["out_cache_loc"]
        self._forward(self.batch)

    def _forward(self, b):
        """Stand-in KV write: a value derived from token and position at each new slot (K and V pools)."""
        loc = b["out_cache_loc"]
        val = (b["input_ids"] * 31 + b["positions"]).to(torch.int16)[:, None].expand(-1, 16)
        for k, v in zip(self.k_pools, self.v_pools):
            k[loc] = val
            v[loc] = val + 1
        if hasattr(self, "swa_k"):
            self.swa_k[loc] = val
            self.swa_v[loc] = val + 1

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def time_steps(e: Engine, steps: int, chunk: int = 50) -> tuple[list[float], float | None]:
    """Host µs of each step() call (HEAD and TAIL alike), and the GPU µs per step on CUDA.

    Steps run in chunks of ``chunk`` with a device sync (not timed) after each, so the host is never more than a
    chunk ahead of the GPU: a small chunk keeps a GPU that is slower than the host from holding launches back."""
    c, b = e.canary, e.batch
    host: list[float] = []
    e.sync()
    gpu_us = None
    done = 0
    spans = []
    while done < steps:
        n = min(chunk, steps - done)
        if e.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        for i in range(n):
            phase = "head" if (done + i) % 2 == 0 else "tail"
            t0 = time.perf_counter()
            c.step(phase, **b)
            host.append((time.perf_counter() - t0) * 1e6)
        if e.device.type == "cuda":
            end.record()
            end.synchronize()
            spans.append(start.elapsed_time(end) * 1e3 / n)
        else:
            e.sync()
        done += n
    if spans:
        gpu_us = statistics.median(spans)
    return host, gpu_us


def time_sglang_verify(device: torch.device, runs: int) -> list[float]:
    """Host µs of one launch_canary_verify_kernel call (context and plan reused)."""
    n_slots = BS * (PREFIX + 1) + 1
    log = kc.ViolationLog.allocate(ring_capacity=1024, device=device)
    buf = kc.allocate_canary_buffer(n_slots, device=device)
    ctx = log.context(canary_buf=buf, kernel_kind=kc.CanaryLaunchTag.HEAD_K_FULL)
    plan = kc.VerifyPlan.allocate(verify_capacity=BS * PREFIX, device=device)
    plan.verify_num_valid.fill_(0)  # an empty plan: the host path is what is timed
    out = []
    for i in range(runs + 20):
        t0 = time.perf_counter()
        kc.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=False)
        if i >= 20:
            out.append((time.perf_counter() - t0) * 1e6)
        if i % 100 == 99 and device.type == "cuda":
            torch.cuda.synchronize(device)
    return out


def profile_steps(e: Engine, steps: int) -> str:
    """cProfile of ``steps`` step() calls (HEAD and TAIL alternating): the top functions by own time."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for i in range(steps):
        e.canary.step("head" if i % 2 == 0 else "tail", **e.batch)
    pr.disable()
    e.sync()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(22)
    return "\n".join(line for line in out.getvalue().splitlines() if line.strip())


def _per_call_us(fn, n: int = 2000) -> float:
    """Median µs of one ``fn()`` call (``n`` calls timed in 10 batches)."""
    per = []
    for _ in range(10):
        t0 = time.perf_counter()
        for _ in range(n // 10):
            fn()
        per.append((time.perf_counter() - t0) * 1e6 / (n // 10))
    return statistics.median(per)


def breakdown(e: Engine) -> list[tuple[str, float, str]]:
    """The host cost of each primitive a CUDA step is made of, measured one by one in this process: what a step
    would cost if it were only these calls (the rest is Python around them, the null-backend row)."""
    from kvcanary.ops import validation
    from kvcanary.ops.cuda import launch as L
    from kvcanary.ops.cuda import params as P
    from kvcanary.ops.cuda import pdl
    from kvcanary.ops.interop import Device, import_cupy

    dev = e.device
    d = Device("cuda", dev.index)
    cp = import_cupy()
    words = [0] * P.WRITE_TABLE.words
    src = (f"struct P {{ long long w[{len(words)}]; }};\n"
           "extern \"C\" __global__ void kvc_noop(P p) { if (p.w[0] == 1) p.w[1] = 0; }")
    with cp.cuda.Device(dev.index):
        fn = cp.RawKernel(src, "kvc_noop").kernel
    s = L.resolve_stream(None, d)
    buf = L.ArgBuffer(len(words))
    drv_launch = cp.cuda.driver.launchKernel
    stager = e.canary.collector._stager
    c, b = e.canary, e.batch
    x, table = b["input_ids"], b["req_to_token"]
    rows = [
        ("launch of one kernel with one struct argument, all words packed (launch(), the public ops' path)",
         _per_call_us(lambda: L.launch(fn, 1, 32, words, dev.index, s)), "0 per step"),
        ("  of which: struct bytes (params.kernel_arg), the CuPy Function fallback's cost",
         _per_call_us(lambda: P.kernel_arg(words)), ""),
        ("prepared launch, words already packed (launch_prepared)",
         _per_call_us(lambda: L.launch_prepared(fn, 1, 32, buf, dev.index, s)),
         "2 per step (each after one pack_into of the batch's words)"),
        ("  of which: cuLaunchKernel itself (CuPy's driver binding)",
         _per_call_us(lambda: drv_launch(fn.ptr, 1, 1, 1, 32, 1, 1, 0, s.ptr, buf.params_addr, 0)), ""),
        ("  or, for the plan-free kernels on sm_90+: cuLaunchKernelEx, programmatic dependent launch (pdl.launch)",
         _per_call_us(lambda: pdl.launch(fn.ptr, 1, 32, s.ptr, buf.params_addr)),
         "2 per step (instead of cuLaunchKernel) where the plan-free kernels take it"),
        ("pack the batch's words of a write (struct.pack_into)",
         _per_call_us(lambda: buf.packer.pack_into(buf.words, 0, *words)), "2 per step (fewer words each)"),
        ("raw stream handle (resolve_stream)", _per_call_us(lambda: L.resolve_stream(None, d)), "1 per step"),
        ("stage status block + take landed copies", _per_call_us(lambda: (stager.stage(0, s), stager.take_landed())),
         "1 per step"),
        ("one batch-array check (validation.batch_array)",
         _per_call_us(lambda: validation.batch_array("input_ids", x, "int64", d)), "7 per step"),
        ("the table passed again (KVCanary._table: same tensor, address, shape)",
         _per_call_us(lambda: c._table(table, None)), "1 per step"),
        ("staleness check of the long-lived arrays (CanaryState.refresh)",
         _per_call_us(lambda: c.state.refresh("tail")), "1 per step"),
        ("capture check of the launch stream (backend.capturing: cudaStreamIsCapturing)",
         _per_call_us(lambda: c._backend.capturing(s)), "1 per step"),
    ]
    torch.cuda.synchronize(dev)
    stager.take_landed(include_latest=True, wait=True)
    return rows


class _Timed:
    """``fn`` with its calls counted and timed (perf_counter_ns around each)."""

    def __init__(self, fn):
        self.fn, self.calls, self.ns = fn, 0, 0

    def __call__(self, *args):
        t0 = time.perf_counter_ns()
        try:
            return self.fn(*args)
        finally:
            self.ns += time.perf_counter_ns() - t0
            self.calls += 1


class _TimedModule:
    """An attribute proxy of CuPy's runtime module whose functions are :class:`_Timed` (one per name)."""

    def __init__(self, mod, timers: dict):
        self._mod, self._timers = mod, timers

    def __getattr__(self, name):
        v = getattr(self._mod, name)
        if not callable(v):
            return v
        t = self._timers.get(name)
        if t is None:
            t = self._timers[name] = _Timed(v)
        return t


def attribute(e: Engine, steps: int, chunk: int) -> list[tuple[str, float, str]]:
    """Real steps (the CUDA backend, HEAD and TAIL alternating), with every CUDA call a step makes timed where it is
    made: ``cuLaunchKernel`` or ``cuLaunchKernelEx`` (the prepared launches; the second, through ctypes, for the
    kernels launched with programmatic dependent launch) and each CUDA runtime call (the device check before a launch,
    the status copy's event, wait, copy and query). Returns per step: the whole step, the time inside each of them
    (µs and calls), and the rest (Python), less the timing wrappers' own cost measured alone."""
    from kvcanary.ops.cuda import launch as L
    from kvcanary.ops.cuda import pdl

    timers: dict[str, _Timed] = {}
    launch_t = _Timed(L._driver_launch or L._launch_kernel_fn())
    launch_ex_t = _Timed(pdl.launch)
    cuda_copies = e.canary.collector._stager._cuda
    saved = (L._driver_launch, L._rt, cuda_copies._rt, pdl.launch)
    L._driver_launch = launch_t
    pdl.launch = launch_ex_t  # type: ignore[assignment]
    L._rt = _TimedModule(saved[1] or L._runtime(), timers)
    cuda_copies._rt = _TimedModule(saved[2], timers)
    try:
        for t in [launch_t, launch_ex_t, *timers.values()]:
            t.calls = t.ns = 0
        host, _ = time_steps(e, steps, chunk)
        n = len(host)
        total = statistics.mean(host)
        per = [("cuLaunchKernel (CuPy's driver binding)", launch_t.ns / 1e3 / n, launch_t.calls / n),
               ("cuLaunchKernelEx (ctypes; programmatic dependent launch)", launch_ex_t.ns / 1e3 / n,
                launch_ex_t.calls / n)]
        per += [(f"cudaRuntime.{name}", t.ns / 1e3 / n, t.calls / n) for name, t in sorted(timers.items()) if t.calls]
    finally:
        L._driver_launch, L._rt, cuda_copies._rt, pdl.launch = saved  # type: ignore[assignment]
    wrapped_calls = sum(c for _, _, c in per)
    noop = _Timed(lambda: None)
    wrapper_us = _per_call_us(noop) - _per_call_us(lambda: None)
    inside = sum(us for _, us, _ in per)
    rows = [("whole step (mean, with the timing wrappers)", total, "1")]
    rows += [(name, us, f"{calls:g}") for name, us, calls in per]
    rows += [("the timing wrappers' own cost (measured alone)", wrapped_calls * wrapper_us, f"{wrapped_calls:g}"),
             ("the rest: Python (checks, packing, bookkeeping, staging's host copy)",
              total - inside - wrapped_calls * wrapper_us, "-")]
    return rows


def p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--steps", type=int, default=400, help="timed step() calls per case (CPU backend: 10)")
    ap.add_argument("--null-backend", action="store_true", help="launches do nothing (Python cost only)")
    ap.add_argument("--chunk", type=int, default=50,
                    help="steps between device syncs (small: the host never runs far ahead of the GPU)")
    ap.add_argument("--bs", type=int, default=BS)
    ap.add_argument("--prefix", type=int, default=PREFIX)
    ap.add_argument("--layers", type=int, default=1,
                    help="K and V real-KV sources per layer, this many layers (a TAIL step checks and folds them all)")
    ap.add_argument("--breakdown", action="store_true",
                    help="CUDA: also time each primitive of a step alone (launch, add_, staging, checks) and the "
                         "step with a null backend in the same process")
    ap.add_argument("--attribute", action="store_true",
                    help="CUDA: also time real K+V FULL steps with every CUDA call timed where it is made (µs inside "
                         "cuLaunchKernel and each runtime call, and the Python rest)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile 200 K+V FULL steps with cProfile: the host time call by call")
    args = ap.parse_args(argv)
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
        kc.warmup(dev)
    steps = args.steps if (dev.type == "cuda" or args.null_backend) else min(args.steps, 10)
    profile_text = ""
    parts: list[tuple[str, float, str]] = []
    attributed: list[tuple[str, float, str]] = []
    what = f"{torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else "CPU"
    rows = []
    for label, swa in (("step K+V FULL", False), ("step K+V FULL+SWA", True)):
        e = Engine(dev, swa=swa, bs=args.bs, prefix=args.prefix, layers=args.layers)
        for _ in range(4):  # warm the path (kernels loaded, staging slots touched)
            e.canary.step("head", **e.batch)
            e.canary.step("tail", **e.batch)
        if args.null_backend:
            with null_backend(dev.type):
                use_backend(e.canary)
                host, gpu = time_steps(e, steps, args.chunk)
        else:
            host, gpu = time_steps(e, steps, args.chunk)
        if args.profile and not swa:
            profile_text = profile_steps(e, 200)
        if args.attribute and not swa and dev.type == "cuda" and not args.null_backend:
            attributed = attribute(e, steps, args.chunk)
        if args.breakdown and not swa and dev.type == "cuda" and not args.null_backend:
            parts = breakdown(e)
            with null_backend(dev.type):
                use_backend(e.canary)
                null_host, _ = time_steps(e, steps, args.chunk)
            use_backend(e.canary)
            parts.insert(0, ("step K+V FULL with a null backend (Python only, this device)",
                             statistics.median(null_host), "per step"))
        found = e.canary.poll(sync=True)
        if found and not args.null_backend:
            print(f"FAILED: {label}: {len(found)} violation(s) on a clean workload, e.g. {found[0]}", file=sys.stderr)
            return 1
        # time_steps alternates HEAD and TAIL, HEAD first
        rows.append((label, statistics.median(host), statistics.mean(host), p90(host), gpu,
                     statistics.median(host[0::2]), statistics.median(host[1::2])))
        del e
    if args.null_backend:
        with null_backend(dev.type):
            ver = time_sglang_verify(dev, max(steps, 200))
    else:
        ver = time_sglang_verify(dev, max(steps, 200))
    rows.append(("verify op (SGLang-named)", statistics.median(ver), statistics.mean(ver), p90(ver), None, None, None))

    backend = "null backend (Python only)" if args.null_backend else f"{dev.type} backend"
    layers = "" if args.layers == 1 else f", {args.layers} layers (K and V real-KV sources of each)"
    lines = [f"Host time per call, {backend}, {what}, shape A ({args.bs} x {args.prefix}){layers}, eager, torch "
             f"{torch.__version__}", "",
             "| case | host µs median | host µs mean | host µs p90 | HEAD / TAIL median | GPU µs per step | host share |",
             "|---|---|---|---|---|---|---|"]

    def opt(x):
        return "-" if x is None else f"{x:.1f}"

    for label, med, mean, hi, gpu, head, tail in rows:
        share = "-" if gpu is None else f"{100 * med / max(gpu, med):.0f} %"
        split = "-" if head is None else f"{head:.1f} / {tail:.1f}"
        lines.append(f"| {label} | {med:.1f} | {mean:.1f} | {hi:.1f} | {split} | {opt(gpu)} | {share} |")
    if args.profile:
        lines += ["", "Host time call by call (cProfile, 200 steps of the K+V FULL case; tottime = the function's own "
                  "time, cumtime = with what it calls; the profiler adds its own overhead per call):", "", "```",
                  profile_text, "```"]
    if parts:
        lines += ["", "Host cost of the primitives of one step, each timed alone (median µs per call):", "",
                  "| primitive | µs per call | calls |", "|---|---|---|"]
        lines += [f"| {name} | {us:.2f} | {n} |" for name, us, n in parts]
    if attributed:
        lines += ["", "Where a real step's host time goes (K+V FULL, CUDA calls timed where they are made; µs per step, "
                  "mean):", "", "| part | µs per step | calls per step |", "|---|---|---|"]
        lines += [f"| {name} | {us:.2f} | {n} |" for name, us, n in attributed]
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "bench_host.md"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
