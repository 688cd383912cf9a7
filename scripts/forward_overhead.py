"""What a forward of the one-call decoder stack costs beside its weights: a tiny
random Llama (hidden 64, --layers layers, 1,024 tokens) whose weights stay in
cache, one new token after 200 of context, us a forward (median of --reps) on
--threads threads; with --against, a git revision's kernels beside the working
tree's, alternating. What is left is the stack's own cost per layer: its parallel
regions and barriers, attention's setup, the calls from Python.

    PYTHONPATH=. .venv/bin/python scripts/forward_overhead.py --against 0d56285
    perf stat -e syscalls:sys_enter_futex env PYTHONPATH=. .venv/bin/python scripts/forward_overhead.py --reps 3000
    (and with --against 0d56285 --alone: that revision's syscalls only)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from kernel_ab import build, int4_at, sources_at
from omnidraft.core.models import int4
from omnidraft.core.models.lean_llama import LeanLlama

from tests.tiny import tiny_llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default=None, help="a git revision whose kernels to time beside the working tree's")
    parser.add_argument("--layers", type=int, default=30, help="30: the drafter's count")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--alone", action="store_true", help="time --against's kernels only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    libs = {"working tree": int4._library()}
    if args.against:
        folder = sources_at(args.against, Path(tempfile.mkdtemp(prefix="kernels-")))
        against = {args.against: build(int4_at(folder), folder)}
        libs = against if args.alone else {**against, **libs}
    net = LeanLlama(tiny_llama(1024, layers=args.layers), int8=True, int4=True, max_len=4096)
    if net.stack is None:
        raise SystemExit("the decoder stack does not run as one kernel call here")
    net.forward(list(range(5, 205)))
    times = {name: [] for name in libs}
    for _ in range(args.reps):
        for name, lib in libs.items():
            int4._library = lambda isa=None, lib=lib: lib
            start = time.perf_counter()
            net.forward([42])
            times[name].append(time.perf_counter() - start)
            net.rollback(200)
    print(f"{args.layers} layers of hidden 64, {args.threads} threads, one token after 200 (median of {args.reps})")
    for name, t in times.items():
        us = 1e6 * statistics.median(t)
        print(f"{name:<14} {us:7.1f} us a forward, {us / args.layers:5.2f} a layer")


if __name__ == "__main__":
    main()
