"""Command line: ``python -m kvcanary demo [--device cpu|cuda] [--steps N] [--seed S] [--engine sim|transformers]``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """``python -m kvcanary demo [...]``: runs :func:`kvcanary.testing.demo.main`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m kvcanary demo [--device cpu|cuda] [--steps N] [--seed S] [--engine sim|transformers]\n\n"
              "  demo   drive a KVCanary through a simulated serving workload, then run every fault injector\n"
              "         (--engine transformers: HF transformers' continuous batching, with bugs planted in it)")
        return 0 if argv else 2
    if argv[0] == "demo":
        from kvcanary.testing.demo import main as demo_main

        return demo_main(argv[1:])
    print(f"kv-canary: unknown command {argv[0]!r}; try: python -m kvcanary demo", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
