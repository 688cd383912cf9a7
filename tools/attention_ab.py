"""The kernels at a git revision against the working tree's on a target's whole
forward (or with --drafter the bundled drafter's), at growing context lengths: ms
a forward of --rows new rows (default 1 and 5) after --contexts random tokens (medians of --reps,
the two builds interleaved), whether both builds give the same logits (or how far
apart, where one keeps its cache in float32 and the other in fp16), and whether a
5-row block's logits are its rows' one-token steps' bit for bit (what keeps
speculative decoding lossless).

    .venv/bin/python -m omnidraft.tools.attention_ab --against c7095f9~1
    .venv/bin/python -m omnidraft.tools.attention_ab --against HEAD~1 --drafter --contexts 200,1000,2000

With --step: a decoding step's forwards as the engine runs them, after --contexts
tokens: the target's forward of each --rows, then the drafter's one-token forward
right after it (its weights come back from memory, as in decoding) and a second one
(a draft's next token), the builds alternating step by step.

    .venv/bin/python -m omnidraft.tools.attention_ab --against HEAD~1 --step --contexts 200 --rows 1,4 --reps 60
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.lean_llama import LeanLlama
from omnidraft.core.models.loader import load

from .common import (
    build_at,
    check_revision,
    int_list,
    module_at,
    positive_int,
    prompt_nets,
    sources_at,
    tool_parser,
    use_build,
    working_build,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__file__, __doc__)
    parser.add_argument("--against", required=True, help="git revision whose kernels to compare")
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="catalog id or model path")
    parser.add_argument("--contexts", type=int_list, default=(200, 1000, 2000),
                        help="context lengths, comma-separated (default 200,1000,2000)")
    parser.add_argument("--reps", type=positive_int, default=9, help="forwards a median is taken over")
    parser.add_argument("--drafter", action="store_true", help="the bundled drafter's forward, not the target's")
    parser.add_argument("--rows", type=int_list, default=(1, 5),
                        help="new rows a forward, comma-separated (default 1,5)")
    parser.add_argument("--step", action="store_true", help="a step's target forward, then two drafter forwards")
    args = parser.parse_args(argv)
    if args.step and args.drafter:
        parser.error("--step times the target's forward and the drafter's: leave out --drafter")
    check_revision(parser, "--against", args.against)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = list(args.rows)
    contexts = list(args.contexts)
    folder = sources_at(args.against, Path(tempfile.mkdtemp(prefix="kernels-")))
    libs = {args.against: build_at(module_at(folder), folder), "working tree": working_build()}
    # Each build's cache: fp16 since the stack kept it so, float32 before.
    fp16 = "uint16_t *kv" in (folder / "decoder_stack.c").read_text()
    dtypes = {args.against: torch.float16 if fp16 else torch.float32, "working tree": torch.float16}
    if args.step:
        if not fp16:
            raise SystemExit(f"--step needs a revision whose cache is fp16, as the working tree's ({args.against}'s is not)")
        step_times(libs, args.target, contexts, rows, args.reps)
        return 0
    if args.drafter:
        net = LeanLlama(load(ModelCatalog().get(SMOLLM2_ID), torch.bfloat16).model, int8=True, int4=True,
                        max_len=8192)
    else:
        net = load(ModelCatalog().get(args.target), torch.bfloat16, int8=True).runner.net
    if net is None or net.stack is None:
        raise SystemExit(f"{'the drafter' if args.drafter else args.target} does not run as one decoder-stack call here")
    caches, using = {}, []

    def use(name: str) -> None:
        """The build's kernels and its own cache (both hold the same positions)."""
        use_build(libs[name])
        if using:
            caches[using.pop()] = net.kv
        using.append(name)
        net.kv_dtype = net.stack.kv_dtype = dtypes[name]
        net.kv = caches.get(name, net.kv.to(dtypes[name]))

    ids = torch.randint(100, 20000, (max(contexts) + 8,), generator=torch.Generator().manual_seed(0)).tolist()
    logits = {}
    for name in libs:
        use(name)
        net.reset()
        logits[name] = [net.forward(ids[:300])[0], net.forward(ids[300:305])[0], net.forward(ids[305:306])[0]]
    if len(set(dtypes.values())) == 1:
        # Past 256 positions attention sums in softmax parts of 256; a revision
        # from before those parts rounds apart there: how far, then.
        same = all(torch.equal(a, b) for a, b in zip(*logits.values()))
        print("same logits from both builds:", same if same else "no, largest difference " +
              f"{max(float((a - b).abs().max()) for a, b in zip(*logits.values())):.2e}")
    else:
        print("largest logit difference between the builds' caches (float32 and fp16):",
              max(float((a - b).abs().max()) for a, b in zip(*logits.values())))
    for ctx in contexts:
        for name in libs:  # each build's cache holds the context
            use(name)
            net.reset()
            net.forward(ids[:ctx], last=1)
        times = {(name, n): [] for name in libs for n in rows}
        for _ in range(args.reps):
            for n in rows:
                for name in libs:
                    use(name)
                    start = time.perf_counter()
                    net.forward(ids[ctx:ctx + n], last=n)
                    times[name, n].append(time.perf_counter() - start)
                    net.rollback(ctx)
        print(f"after {ctx} positions: " + "  ".join(
            f"{name} {n} rows {1000 * statistics.median(v):.2f} ms" for (name, n), v in times.items()))
    use("working tree")
    for ctx in sorted({min(contexts), 254}):  # 254: the block straddles a softmax part's edge
        net.reset()
        net.forward(ids[:ctx], last=1)
        block = net.forward(ids[ctx:ctx + 5])[0]
        net.rollback(ctx)
        single = torch.cat([net.forward([t])[0] for t in ids[ctx:ctx + 5]])
        print(f"after {ctx}: a 5-row block's logits are its rows' one-token steps', bit for bit:",
              torch.equal(block, single))
    return 0


def step_times(libs: dict, target_name: str, contexts: list[int], rows: list[int], reps: int) -> None:
    nets = prompt_nets(max_len=8192, target=target_name)
    drafter, target = nets["drafter"], nets["target"]
    ids = torch.randint(100, 20000, (max(contexts) + 16,), generator=torch.Generator().manual_seed(0)).tolist()
    for ctx in contexts:
        for net in (drafter, target):
            net.reset()
            net.forward(ids[:ctx], last=1)
        times = {(name, n, part): [] for n in rows for name in libs for part in ("target", "drafter", "again")}
        for _ in range(reps):
            for n in rows:
                for name, lib in libs.items():
                    use_build(lib)
                    for part, net, new in (("target", target, ids[ctx:ctx + n]), ("drafter", drafter, ids[ctx:ctx + 1]),
                                           ("again", drafter, ids[ctx + 1:ctx + 2])):
                        start = time.perf_counter()
                        net.forward(new, last=len(new))
                        times[name, n, part].append(time.perf_counter() - start)
                    target.rollback(ctx)
                    drafter.rollback(ctx)
        print(f"after {ctx} positions, ms (median of {reps}): the target's forward, then the drafter's and its next")
        for (name, n, part), v in times.items():
            if part == "target":
                print(f"  {name:<14} {n} rows {1000 * statistics.median(v):7.2f}", end="")
            else:
                print(f"  {part} {1000 * statistics.median(v):6.3f}", end="" if part == "drafter" else "\n")


if __name__ == "__main__":
    sys.exit(main())
