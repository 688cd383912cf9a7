"""Where a forward's time goes: the decoder stack's phases (norm, q/k/v product,
RoPE and the cache write, attention, o product, add and norm, gate/up product,
SiLU, down product, add), the LM head and the rest (Python, the embedding, the
final norm), in ms a forward, for the bundled drafter (right after a target step,
and again right after itself) and the Qwen2.5-Coder-1.5B target at --rows new rows,
after --context tokens.

It builds the kernels with -DSTACK_PHASES (decoder_stack.c then sums each phase's
seconds; the shipped build compiles none of that) and times --reps forwards.

    PYTHONPATH=. .venv/bin/python scripts/stack_phases.py --context 200 --rows 1,4
    PYTHONPATH=. .venv/bin/python scripts/stack_phases.py --context 200 --prompt
    PYTHONPATH=. .venv/bin/python scripts/stack_phases.py --context 3000 --rows 1,4
"""

from __future__ import annotations

import argparse
import ctypes
import time

import torch
from kernel_ab import prompt_nets
from omnidraft.core.models import int4

PHASES = ("norm", "q/k/v", "RoPE+cache", "attention", "o", "add+norm", "gate/up", "SiLU", "down", "add")


class Timed:
    """Wraps a net's stack and head to sum their seconds."""

    def __init__(self, net):
        self.net, self.stack, self.head = net, net.stack, net.head
        self.seconds = {"stack": 0.0, "head": 0.0}
        net.stack, net.head = self._stack, self._head

    def _stack(self, *args, **kwargs):
        start = time.perf_counter()
        self.stack(*args, **kwargs)
        self.seconds["stack"] += time.perf_counter() - start

    def _head(self, x):
        start = time.perf_counter()
        y = self.head(x)
        self.seconds["head"] += time.perf_counter() - start
        return y


def measure(lib, timed: Timed, run, reps: int) -> list[float]:
    """ms a forward: each phase, the LM head, the rest, and the whole; run() does
    what comes before a forward (untimed), then returns the forward's seconds."""
    phases = (ctypes.c_double * len(PHASES))()
    sums = [0.0] * len(PHASES)
    stack = head = whole = 0.0
    for _ in range(reps):
        took, seconds = run(lambda: lib.stack_phases(phases, 1))
        lib.stack_phases(phases, 1)
        sums = [a + b for a, b in zip(sums, phases)]
        stack, head, whole = stack + seconds["stack"], head + seconds["head"], whole + took
    return [1000 * s / reps for s in [*sums, head, whole - stack - head, whole]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--rows", default="1,4", help="the target's new rows a forward")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--prompt", action="store_true",
                    help="also each net's read of a --context-token prompt (ms a prompt token)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    int4._FLAGS = [*int4._FLAGS, f"-DSTACK_PHASES={len(PHASES)}"]
    int4._library.cache_clear()
    lib = int4._library()
    lib.stack_phases.argtypes = [ctypes.c_void_p, ctypes.c_int]
    nets = prompt_nets(max_len=max(1024, args.context + 64))
    drafter, target = Timed(nets["drafter"]), Timed(nets["target"])
    context = list(range(1000, 1000 + args.context))
    end = len(context)

    def forward(timed: Timed, ids: list[int], before=None, keep: int = end, last: int = 0):
        def run(zero_phases) -> tuple[float, dict]:
            if before:
                before()
            timed.net.rollback(keep)
            zero_phases()  # what came before is not this forward's
            timed.seconds = dict.fromkeys(timed.seconds, 0.0)
            start = time.perf_counter()
            timed.net.forward(ids, last=last)
            took = time.perf_counter() - start
            timed.net.rollback(end)
            return took, timed.seconds
        return run

    def target_step():
        target.net.forward([5])
        target.net.rollback(end)

    with torch.no_grad():
        for net in nets.values():
            net.reset()
            net.forward(context, last=1)
        rows = {"drafter, after a target step": measure(lib, drafter, forward(drafter, [5], target_step), args.reps),
                "drafter, again": measure(lib, drafter, forward(drafter, [5]), args.reps)}
        for n in (int(r) for r in args.rows.split(",")):
            rows[f"target, {n} row{'s' * (n > 1)}"] = measure(
                lib, target, forward(target, list(range(5, 5 + n))), max(10, args.reps // 4))
        if args.prompt:  # ms a prompt token: a read's phases divided by its tokens
            for label, timed in (("drafter", drafter), ("target", target)):
                ms = measure(lib, timed, forward(timed, context, keep=0, last=1), max(3, args.reps // 20))
                rows[f"{label}, prompt read, a token"] = [v / len(context) for v in ms]
    print(f"ms a forward after {args.context} tokens of context (the kernels built with -DSTACK_PHASES)")
    names = [*PHASES, "LM head", "the rest", "whole"]
    print(f"{'':<30}" + "".join(f"{name:>11}" for name in names))
    for label, ms in rows.items():
        print(f"{label:<30}" + "".join(f"{v:>11.3f}" for v in ms))


if __name__ == "__main__":
    main()
