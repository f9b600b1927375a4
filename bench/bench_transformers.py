#!/usr/bin/env python3
"""Generation throughput of HF transformers' continuous batching with and without the kvcanary integration.

Usage on the H200 image (transformers 5.17 and torch 2.11 installed; the integration is written for 5.24.0, whose
wheel has no other new requirement, so it is installed next to the image's packages and put first on the path),
from the repository root, with the wheel carried along (``run(carry=[".whl"], ...)``)::

    python3 -m pip install -q --no-deps --no-index --target /tmp/site .whl/transformers-5.24.0-py3-none-any.whl \\
      && OUT=$OUT PYTHONPATH=/tmp/site:$PWD python3 bench/bench_transformers.py

(and the GPU test the same way: ``PYTHONPATH=/tmp/site:$PWD python3 -m pytest -q tests/gpu/test_transformers_gpu.py``).
Quick check of the script on a CPU: ``PYTHONPATH=. python3 bench/bench_transformers.py --small``.

Model: a random Llama (8 layers, hidden 1024, 8 attention heads of 128 with 8 KV heads, MLP 2816, vocabulary
32000), bfloat16, SDPA (``auto_switch_to_flash=False``: the canary refuses flash), on GPU 0. Cache: pages of 32
tokens, 512 blocks, a 2048-token budget per forward (so a batch of 64 prefills in 4 chunked forwards).

Workload per batch size ``B`` (``--batch-sizes``, default 1, 16, 64): ``B`` prompts of 128 random tokens, 64 new
tokens each (greedy, no EOS), all admitted at once (``max_requests_per_batch = B``). Prompts are distinct: no
prefix sharing, the cost measured is the canary's per-step work.

Timing: the manager is built and warmed up (engine cache and canary allocated) outside the timed region, which
runs from ``add_requests`` to the last result: the generation loop, Python scheduling included. Throughput =
generated tokens / that time. Each (``B``, canary) pair first runs once untimed (CUDA kernels compiled and
loaded), then ``--repeats`` times, alternating without / with; the median counts. The canary runs as
:func:`kvcanary.integrations.transformers.attach` sets it up by default: HEAD and TAIL around every forward
(K and V, one real-KV source per layer and half, PARTIAL fingerprints), the token check, a sweep of the prefix
cache every 16 steps, mode ``"log"``.

Reported: engine steps per run, tokens/s without and with the canary, the overhead
``(tok/s without) / (tok/s with) - 1`` in percent, and the extra milliseconds per engine step. Checks: the
canary reports nothing and the greedy tokens are those of the run without it. The markdown table is printed last
and, when ``$OUT`` is set (or ``--out`` is given), written to ``$OUT/bench_transformers.md``. Exit status 1 if a
check failed. Expected wall time on one H200: about a minute (most of it the untimed runs and start/stop).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

import torch


@dataclass
class Run:
    seconds: float
    steps: int
    tokens: dict[str, list[int]]
    violations: int


def build_model(small: bool, device: str):
    import transformers

    torch.manual_seed(0)
    if small:
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                       max_position_embeddings=512)
    else:
        cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                       num_attention_heads=8, num_key_value_heads=8, vocab_size=32000,
                                       max_position_embeddings=4096)
    dtype = torch.float32 if small else torch.bfloat16
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dtype)
    return model.eval(), cfg


def run_once(model, prompts: list[list[int]], new_tokens: int, *, page_size: int, num_blocks: int,
             max_batch_tokens: int, canary: bool) -> Run:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    from kvcanary.integrations.transformers import attach

    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    config = ContinuousBatchingConfig(page_size=page_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens,
                                      max_requests_per_batch=len(prompts), auto_switch_to_flash=False)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=config)
    handle = attach(manager, mode="log") if canary else None
    try:
        manager.warmup()                     # builds the engine's cache (and the canary) outside the timed region
        manager.start()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        ids = manager.add_requests(prompts, max_new_tokens=new_tokens)
        results = {}
        while len(results) < len(ids):
            r = manager.get_result(timeout=300)
            if r is None:
                raise RuntimeError("the generation loop stopped before every request finished")
            if r.is_finished():
                results[r.request_id] = r
        seconds = time.perf_counter() - t0
        steps = int(manager.current_batch)
    finally:
        manager.stop(block=True)
        manager.destroy()
        if handle is not None:
            handle.detach()
    errors = [r.error for r in results.values() if r.error]
    if errors:
        raise RuntimeError(f"a request failed: {errors[0]}")
    violations = len(handle.violations) if handle is not None else 0
    out = Run(seconds, steps, {k: list(r.generated_tokens) for k, r in results.items()}, violations)
    del handle, manager
    gc.collect()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a 2-layer hidden-64 model on the CPU (checks the script)")
    ap.add_argument("--out", default=None, help="markdown file (default: $OUT/bench_transformers.md when OUT is set)")
    args = ap.parse_args(argv)

    import transformers

    device = "cpu" if args.small else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("kv-canary: no CUDA GPU (use --small for a CPU check of the script)", file=sys.stderr)
        return 2
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.small:
        sizes = [min(b, 4) for b in sizes]
        args.prompt_len, args.new_tokens, args.repeats = 16, 8, 1
    page_size = 4 if args.small else 32
    per_request = -(-(args.prompt_len + args.new_tokens) // page_size)
    num_blocks = max(64, 2 * per_request * max(sizes))
    max_batch_tokens = 64 if args.small else 2048

    model, cfg = build_model(args.small, device)
    g = torch.Generator().manual_seed(1)
    started = time.perf_counter()
    rows, failures = [], []
    for b in sizes:
        prompts = [torch.randint(1, cfg.vocab_size, (args.prompt_len,), generator=g).tolist() for _ in range(b)]
        kw = dict(page_size=page_size, num_blocks=num_blocks, max_batch_tokens=max_batch_tokens)
        run_once(model, prompts, args.new_tokens, canary=False, **kw)      # untimed: warm caches, compile kernels
        run_once(model, prompts, args.new_tokens, canary=True, **kw)
        off, on = [], []
        for _ in range(args.repeats):
            off.append(run_once(model, prompts, args.new_tokens, canary=False, **kw))
            on.append(run_once(model, prompts, args.new_tokens, canary=True, **kw))
        if any(r.violations for r in on):
            failures.append(f"batch {b}: the canary reported {max(r.violations for r in on)} violations")
        if any(r.tokens != off[0].tokens for r in on + off):
            failures.append(f"batch {b}: the generated tokens differ between runs")
        t_off = statistics.median(r.seconds for r in off)
        t_on = statistics.median(r.seconds for r in on)
        steps = on[0].steps
        generated = b * args.new_tokens
        rows.append((b, steps, generated / t_off, generated / t_on, 100 * (t_on / t_off - 1),
                     1e3 * (t_on - t_off) / steps))
        print(f"batch {b}: {steps} steps, {generated / t_off:.0f} tok/s without, {generated / t_on:.0f} tok/s with "
              f"the canary ({rows[-1][4]:+.1f} %)", flush=True)

    dev_name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "CPU"
    lines = [
        "# kvcanary on HF transformers continuous batching: generation throughput",
        "",
        f"{dev_name}; torch {torch.__version__}; transformers {transformers.__version__}; python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"Model: random Llama, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"{cfg.num_key_value_heads} KV heads of {cfg.hidden_size // cfg.num_attention_heads}, "
        f"{'float32' if args.small else 'bfloat16'}, SDPA. Cache: page {page_size}, {num_blocks} blocks, "
        f"{max_batch_tokens} tokens per forward. Workload: B prompts of {args.prompt_len} tokens, "
        f"{args.new_tokens} new tokens each (greedy). Median of {args.repeats} runs; canary defaults of attach() "
        "(HEAD+TAIL, K and V of every layer, PARTIAL, token check, sweep every 16 steps).",
        "",
        "| batch | engine steps | tok/s without | tok/s with canary | overhead | extra ms/step |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for b, steps, tps_off, tps_on, pct, ms in rows:
        lines.append(f"| {b} | {steps} | {tps_off:.0f} | {tps_on:.0f} | {pct:+.1f} % | {ms:.2f} |")
    lines += ["", f"checks: {'; '.join(failures) if failures else 'all clean (no violation, identical tokens)'}",
              f"wall time: {time.perf_counter() - started:.0f} s"]
    text = "\n".join(lines)
    print()
    print(text)
    out = args.out or (os.path.join(os.environ["OUT"], "bench_transformers.md") if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
