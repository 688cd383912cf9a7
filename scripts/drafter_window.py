"""The bundled drafter's cost after a long context with and without its attention
window (DraftSettings.window): ms of a one-token forward (a drafted token) and a
--rows-row read (the drafter's read of a new message in a long conversation),
after each of --contexts positions, the two settings alternating forward by
forward in one process (medians of --reps). The cache holds the same random
tokens for both; only the positions a query reads differ.

    PYTHONPATH=. .venv/bin/python scripts/drafter_window.py --window 1024 --contexts 1000,2000,3000
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.lean_llama import LeanLlama
from omnidraft.core.models.loader import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--contexts", default="1000,2000,3000")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    net = LeanLlama(load(ModelCatalog().get(SMOLLM2_ID), torch.bfloat16).model, int8=True, int4=True,
                    max_len=8192)
    contexts = [int(c) for c in args.contexts.split(",")]
    ids = torch.randint(100, 20000, (max(contexts) + args.rows,), generator=torch.Generator().manual_seed(0)).tolist()
    settings = {"every position": 0, f"window {args.window}": args.window}
    print(f"ms (median of {args.reps}): a one-token forward; a {args.rows}-row read, a row")
    for ctx in contexts:
        net.window = 0
        net.reset()
        net.forward(ids[:ctx], last=1)
        times = {(name, n): [] for name in settings for n in (1, args.rows)}
        for _ in range(args.reps):
            for n in (1, args.rows):
                for name, window in settings.items():
                    net.window = window
                    start = time.perf_counter()
                    net.forward(ids[ctx:ctx + n], last=1)
                    times[name, n].append(time.perf_counter() - start)
                    net.rollback(ctx)
        print(f"after {ctx} positions: " + "  ".join(
            f"{name} {1000 * statistics.median(times[name, 1]):.2f} / "
            f"{1000 * statistics.median(times[name, args.rows]) / args.rows:.3f}" for name in settings))


if __name__ == "__main__":
    main()
