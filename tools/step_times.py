"""Milliseconds per forward of the target and the drafter, by tokens per forward.

What a speculative step costs, part by part, as the decode loops run them: the
target through its runtime (lean over int8 layers, and transformers' own forward
of the same model for comparison) and the drafter's lean runtime, each after a
--context-token prompt, for 1, 2, 3, 5 and 8 new tokens (the pending token plus
k proposals). Median of --reps forwards, rolled back after each. The drafter
twice: back to back (its weights stay in the caches) and each forward after a
one-token target forward, as decoding runs it (its weights come from memory).
With llama.cpp built (`make peers`), its own evals of the same GGUF beside them
(llama-bench, n tokens at the context's depth); and each runtime's prefill of the --context-token prompt, per prompt token.
Where the target's layers run as one kernel call (a Q4_K_M file's 4-bit and 6-bit
layers), the same runtime with its layers as torch ops is timed beside it.

    .venv/bin/python -m omnidraft.tools.step_times --json step-times.json
    OMNIDRAFT_KERNEL_ISA=avx2 .venv/bin/python -m omnidraft.tools.step_times --reps 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
from omnidraft.core.decoding.drafter import Drafter, DraftSettings
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog, bundled_path
from omnidraft.core.models.loader import load
from omnidraft.core.models.target_runtime import TargetRunner

from .common import kernels, output_file, positive_int, tool_parser, write_json

ROWS = (1, 2, 3, 5, 8)


def median_ms(fn, reps: int, before=None) -> float:
    """fn's median of reps calls after a warm-up; `before` (untimed) runs ahead of each."""
    times = []
    for rep in range(reps + 1):
        if before:
            before()
        start = time.perf_counter()
        fn()
        if rep:
            times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 2)


def target_ms(runner: TargetRunner, context: list[int], reps: int) -> dict[int, float]:
    session = runner.session()
    session.forward(context, last=1)
    out = {}
    for n in ROWS:
        def step(n=n):
            session.forward(context[:n])
            session.crop(n)
        out[n] = median_ms(step, reps)
    return out


def stack_or_layers_ms(runner: TargetRunner, context: list[int], reps: int) -> tuple[dict, dict]:
    """The lean target with its layers as one kernel call and as torch ops, the two
    alternating forward by forward (a busy machine slows both alike)."""
    net = runner.net
    stack = net.stack
    session = runner.session()
    session.forward(context, last=1)
    times: dict = {(n, way): [] for n in ROWS for way in ("stack", "layers")}
    for n in ROWS:
        for rep in range(reps + 1):
            for way in ("stack", "layers"):
                net.stack = stack if way == "stack" else None
                start = time.perf_counter()
                session.forward(context[:n])
                if rep:  # the first of each is a warm-up
                    times[n, way].append(time.perf_counter() - start)
                session.crop(n)
    net.stack = stack
    return tuple({n: round(1000 * statistics.median(times[n, way]), 2) for n in ROWS} for way in ("stack", "layers"))


def drafter_ms(drafter: Drafter, context: list[int], reps: int, between=None) -> dict[int, float]:
    """Back to back its weights stay in the caches; decoding runs a target forward
    (~1 GB of weights) between two drafts, so `between` (untimed) can do the same."""
    net = drafter.net
    net.reset()
    net.forward(context)
    out = {}
    for n in ROWS:
        def step(n=n):
            net.forward(context[:n])
            net.rollback(len(context))
        out[n] = median_ms(step, reps, between)
    return out


def target_step(runner: TargetRunner, context: list[int]):
    """One one-token target forward after the context, rolled back: what streams
    every target weight between two drafts."""
    session = runner.session()
    session.forward(context, last=1)

    def step():
        session.forward(context[:1])
        session.crop(1)
    return step


def llamacpp_ms(gguf: str, context_tokens: int, reps: int) -> tuple[dict[int, float], float] | None:
    """llama.cpp's (`make peers`) eval of n tokens after the context (llama-bench's
    n-token prompt at that depth, the median of its runs), and its prefill ms per
    token; None where llama.cpp is not built."""
    from omnidraft.bench import llamacpp

    if llamacpp.build_info() is None:
        return None

    def medians_ms(*args: str) -> dict[int, float]:
        cmd = [str(llamacpp.tool("llama-bench")), "-m", gguf, "-t", str(torch.get_num_threads()), "-r", str(reps),
               "-o", "json", "-n", "0", *args]
        runs = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        return {r["n_prompt"]: statistics.median(r["samples_ns"]) / 1e6 for r in runs}

    steps = medians_ms("-p", ",".join(map(str, ROWS)), "-d", str(context_tokens))
    prefill = medians_ms("-p", str(context_tokens))[context_tokens] / context_tokens
    return steps, round(prefill, 2)


def prefill_ms(runner: TargetRunner, context: list[int]) -> float:
    runner.session().forward(context[:16], last=1)  # warm
    runner.forget()  # nothing of the prompt kept from the warm-up
    start = time.perf_counter()
    runner.session().forward(context, last=1)
    return round(1000 * (time.perf_counter() - start) / len(context), 2)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__file__, __doc__)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="catalog id or model path")
    parser.add_argument("--context-tokens", type=positive_int, default=200,
                        help="tokens of context before the timed forwards")
    parser.add_argument("--reps", type=positive_int, default=15, help="forwards a median is taken over")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=output_file, help="write the report here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    catalog = ModelCatalog()
    target = load(catalog.get(args.target), torch.bfloat16, int8=True)
    drafter = Drafter(load(catalog.get(SMOLLM2_ID), torch.bfloat16), DraftSettings())
    # ~15 tokens a line: enough lines for --context-tokens
    text = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" * max(20, args.context_tokens // 10)
    t_ids = target.tokenizer(text)["input_ids"][: args.context_tokens]
    d_ids = drafter.tokenizer(text)["input_ids"][: args.context_tokens]
    report = {
        "target": args.target,
        "context_tokens": args.context_tokens,
        "threads": torch.get_num_threads(),
        "kernel": kernels().build.kernel_isa(),  # the kernels' build (OMNIDRAFT_KERNEL_ISA picks one by name)
        "rows": list(ROWS),
        "target_transformers_ms": target_ms(TargetRunner(target.model, lean=False), t_ids, args.reps),
        "drafter_ms": drafter_ms(drafter, d_ids, args.reps),
        "drafter_after_target_ms": drafter_ms(drafter, d_ids, args.reps, target_step(target.runner, t_ids)),
        "prefill_ms_per_token": {"target_lean": prefill_ms(target.runner, t_ids)},
    }
    net = target.runner.net
    if net is None or net.stack is None:
        report["target_lean_ms"] = target_ms(target.runner, t_ids, args.reps)
    else:
        report["target_lean_ms"], report["target_lean_torch_layers_ms"] = stack_or_layers_ms(
            target.runner, t_ids, args.reps)
        stack, net.stack = net.stack, None
        report["prefill_ms_per_token"]["target_lean_torch_layers"] = prefill_ms(target.runner, t_ids)
        net.stack = stack
    entry = catalog.get(args.target)
    gguf = entry.path or str(bundled_path(entry.id))
    peer = llamacpp_ms(gguf, len(t_ids), args.reps) if gguf.endswith(".gguf") else None
    if peer:
        report["llamacpp_ms"], report["prefill_ms_per_token"]["llamacpp"] = peer
    for key in ("target_lean_ms", "target_lean_torch_layers_ms", "target_transformers_ms", "drafter_ms",
                "drafter_after_target_ms", "llamacpp_ms"):
        if key in report:
            print(f"{key:24s}", "  ".join(f"{n}: {ms:6.1f}" for n, ms in report[key].items()))
    print("prefill ms per token    ", report["prefill_ms_per_token"])
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
