"""What the decoder stack saves by stopping its last layer at the keys and values
for the rows no one reads: ms a prompt token of an N-token prompt read (forward
with last=1, as a reply's prompt is read) by the drafter and the
Qwen2.5-Coder-1.5B target, with the stack told which rows are read and with it
made to finish every row (the calls before this change), alternating in one
process; medians of --reps reads.

    PYTHONPATH=. .venv/bin/python scripts/last_rows_ab.py --prompt 200 --reps 25
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from kernel_ab import prompt_nets
from omnidraft.core.models import int4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=200, help="prompt tokens")
    parser.add_argument("--reps", type=int, default=25)
    args = parser.parse_args()
    nets = prompt_nets()
    if any(net.stack is None for net in nets.values()):
        raise SystemExit("the decoder stack does not run here")
    call = int4.DecoderStack.__call__
    ways = {"every row": lambda stack, x, start, kv, cos, sin, needed=None: call(stack, x, start, kv, cos, sin),
            "rows read": call}
    prompt = list(range(1000, 1000 + args.prompt))
    times = {(way, name): [] for way in ways for name in nets}
    try:
        with torch.no_grad():
            for rep in range(args.reps + 1):  # the first round warms up
                for way, run in ways.items():
                    int4.DecoderStack.__call__ = run
                    for name, net in nets.items():
                        net.reset()
                        start = time.perf_counter()
                        net.forward(prompt, last=1)
                        if rep:
                            times[(way, name)].append((time.perf_counter() - start) * 1e3 / args.prompt)
    finally:
        int4.DecoderStack.__call__ = call
    print(f"a {args.prompt}-token prompt read, ms a token (median of {args.reps})")
    print(f"{'':12s} {'drafter':>8s} {'target':>8s}")
    for way in ways:
        print(f"{way:12s} " + " ".join(f"{statistics.median(times[(way, name)]):8.3f}" for name in nets))


if __name__ == "__main__":
    main()
