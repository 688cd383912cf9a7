"""Where one target forward's time goes, by kind of layer: the 4-bit products
(core/models/int4.py), the 6-bit ones (Q6_K layers), any int8 ones, the LM head,
and the rest (attention, norms, Python), for a prefill and for 1 / 2 / 3 / 5 / 8
new tokens after it. Each layer kind is timed by wrapping its forward, which
adds a little overhead of its own; medians of --reps forwards. The layers run as
torch ops here (a one-call decoder stack hides its parts from Python:
scripts/step_times.py times the two ways against each other).

    .venv/bin/python scripts/forward_breakdown.py --context-tokens 300
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from omnidraft.core.models import int4, quantize
from omnidraft.core.models.catalog import ModelCatalog
from omnidraft.core.models.loader import load

HEAD_MIN = 100_000  # an output this wide is the LM head


def time_int8(totals: collections.Counter) -> None:
    forward = quantize.Int8Linear.forward

    def wrapper(self, x):
        start = time.perf_counter()
        y = forward(self, x)
        totals["head" if self.out_features >= HEAD_MIN else "int8"] += time.perf_counter() - start
        return y

    quantize.Int8Linear.forward = wrapper


def time_int4(totals: collections.Counter) -> None:
    """Every 4-bit product of the target: its layers' own and the joined q/k/v and
    gate/up (int4.join) go through int4.q4_mm."""
    product = int4.q4_mm

    def wrapper(rows, packed, out_features, kind, isa=None):
        start = time.perf_counter()
        y = product(rows, packed, out_features, kind, isa)
        totals["head" if out_features >= HEAD_MIN else f"int{6 if kind == int4.Q6_K else 4}"] += (
            time.perf_counter() - start)
        return y

    int4.q4_mm = wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--context-tokens", type=int, default=300)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    target = load(ModelCatalog().get(args.target), torch.bfloat16, int8=True)
    text = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n' * 40
    ids = target.tokenizer(text)["input_ids"][: args.context_tokens]
    net = target.runner.net
    net.stack = None
    totals: collections.Counter = collections.Counter()
    time_int4(totals)
    time_int8(totals)

    def show(label: str, ms: float, reps: int) -> None:
        parts = "  ".join(f"{k} {1000 * v / reps:6.1f}" for k, v in sorted(totals.items()))
        print(f"{label:12s} {ms:7.1f} ms   {parts}")

    net.reset()
    start = time.perf_counter()
    net.forward(ids, last=1)
    show(f"prefill {len(ids)}", 1000 * (time.perf_counter() - start), 1)
    for n in (1, 2, 3, 5, 8):
        totals.clear()
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            net.forward(ids[:n])
            net.rollback(len(ids))
            times.append(time.perf_counter() - start)
        show(f"{n} tokens", 1000 * statistics.median(times), args.reps)


if __name__ == "__main__":
    main()
