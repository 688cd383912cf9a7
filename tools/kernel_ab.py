"""The kernels' sources at a git revision against the working tree's, interleaved in
one process (so a busy machine's load hits both alike): ms a one-row forward of the
bundled SmolLM2 drafter after a 200-token context, plain and with a random rank-8
adapter on all seven projections, and what the adapter adds, for each build.

With --gemm: the 4-bit products of 28 Qwen2.5-1.5B-shaped layers (q/k/v, o,
gate/up, down; 29 MB of 4-bit weights a layer, so 28 outgrow any CPU cache) for 1
to 8 rows, the fastest of --reps passes each (--bits 6: the 6-bit products;
--shapes gemma: Gemma-3-270M's Q4_K ones; --rows 64,200: blocks of a prompt's
size, on AMX tiles where the CPU has them). Each build gets weights packed by its
own revision's kernel code, so a layout change is measured too; where both revisions
pack alike, both builds read one copy (where the OS placed a copy each moved the
ratio by up to 13%) and their results are checked equal.

With --prompt N: ms a prompt token of an N-token prompt read (one forward from an
empty cache) by the drafter and by the Qwen2.5-Coder-1.5B target, medians of
--reps reads each.

    .venv/bin/python -m omnidraft.tools.kernel_ab --against 2f25811 [--reps 600]
    (the drafter's forward: revisions whose kernels take the same arguments)
    .venv/bin/python -m omnidraft.tools.kernel_ab --gemm --against 2d11600 [--reps 7]
    .venv/bin/python -m omnidraft.tools.kernel_ab --gemm --shapes gemma --against b5b0880 --reps 200
    .venv/bin/python -m omnidraft.tools.kernel_ab --gemm --rows 64,200 --layers 2 --against HEAD --reps 9
    .venv/bin/python -m omnidraft.tools.kernel_ab --prompt 200 --against HEAD --reps 15
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
    kernels,
    module_at,
    non_negative_int,
    positive_int,
    prompt_nets,
    sources_at,
    tool_parser,
    use_build,
    working_build,
)

# A LoRA adapter on every projection of the drafter (what the learner adapts).
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# --gemm's default rows: a one-token step and verifications of up to 7 drafted tokens.
STREAM_ROWS = (1, 2, 3, 4, 5, 8)
# (inputs, outputs) of one Qwen2.5-1.5B layer's products: q/k/v, o, gate/up, down
QWEN_LAYER = ((1536, 2048), (1536, 1536), (1536, 17920), (8960, 1536))


def random_adapter(model, rank: int, names: tuple[str, ...]) -> dict:
    """Random low-rank factors (A, B) for `model`'s Linear layers named in `names`."""
    gen = torch.Generator().manual_seed(rank)
    out = {}
    for path, module in model.named_modules():
        if path.split(".")[-1] in names and isinstance(module, torch.nn.Linear):
            out[path] = (torch.randn(rank, module.in_features, generator=gen) * 1e-3,
                         torch.randn(module.out_features, rank, generator=gen) * 1e-3)
    return out


def random_packed(n: int, k: int, g: torch.Generator, module) -> torch.Tensor:
    """Random n x k weights in Q4_K's layout, as a Q4_K_M target's 4-bit layers
    (module: the kernel module to pack them with, a revision's own or the working tree's)."""
    supers = -(-k // 256)
    return module.Q4K(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g),
                      (torch.rand(n, supers, generator=g) * 1e-3).half(),
                      (torch.rand(n, supers, generator=g) * 1e-3).half(),
                      torch.randint(0, 64, (n, k // 32), dtype=torch.uint8, generator=g),
                      torch.randint(0, 64, (n, k // 32), dtype=torch.uint8, generator=g)).packed()


def random_weights(module, n: int, k: int, bits: int, g: torch.Generator) -> torch.Tensor:
    """Random n x k weights in `module`'s packed layout (a Q4_K_M target's: Q4_K, or
    Q6_K with bits 6)."""
    def codes(top: int, cols: int) -> torch.Tensor:
        return torch.randint(0, top, (n, cols), dtype=torch.uint8, generator=g)

    q6 = codes(64, k), (torch.rand(n, k // 16, generator=g) * 0.01).half()
    if not hasattr(module, "Q4K"):  # before the Q4_K layout: module functions, fp16 scale and offset per 32
        if bits == 6:
            return module.pack6(*q6)
        return module.pack(codes(16, k), (torch.rand(n, k // 32, generator=g) * 0.01).half(),
                           (-torch.rand(n, k // 32, generator=g) * 0.05).half())
    return module.Q6(*q6).packed() if bits == 6 else random_packed(n, k, g, module)


def product(module, x: torch.Tensor, packed: torch.Tensor, n: int, bits: int) -> torch.Tensor:
    """x @ W^T through `module`'s own entry point (its signature changed with Q4_K)."""
    if hasattr(module, "Q4K"):
        return module.q4_mm(x, packed, n, module.Q6_K if bits == 6 else module.Q4_K)
    return module.q4_mm(x, packed, n, bits=bits)


# The 4-bit (Q4_K) products of a target's file: Qwen2.5-1.5B's 28 layers, or
# Gemma-3-270M's file's Q4_K tensors (18 attention outputs, 9 MLP down
# projections; its other layers are Q5_0 / Q8_0, run in int8).
SHAPES = {"qwen": [shape for _ in range(28) for shape in QWEN_LAYER],
          "gemma": [(1024, 640)] * 18 + [(2048, 640)] * 9}


def gemm_ab(modules: dict, reps: int, bits: int, shapes: str, rows: tuple[int, ...] | None, layers: int | None
            ) -> None:
    g = torch.Generator().manual_seed(0)
    chosen = SHAPES[shapes] if layers is None or shapes != "qwen" else SHAPES[shapes][:layers * len(QWEN_LAYER)]
    layers = {lib: [(random_weights(module, n, k, bits, torch.Generator().manual_seed(i)), k, n)
                    for i, (k, n) in enumerate(chosen)]
              for lib, module in modules.items()}
    first, *others = layers.values()
    alike = all(torch.equal(a[0], b[0]) for other in others for a, b in zip(first, other))
    if alike:
        # Both builds read the one copy, so where the OS placed each copy (one ran
        # 13% faster than the other here) does not enter the ratio.
        layers = {lib: first for lib in layers}
    rows = rows or (STREAM_ROWS if shapes == "qwen" else (1, 3, 5))
    xs = {(m, k): torch.randn(m, k, generator=g) for m in rows for k, _ in set(chosen)}
    best = {(lib, m): float("inf") for lib in modules for m in rows}
    for _ in range(reps):
        for m in rows:
            for lib, module in modules.items():
                start = time.perf_counter()
                for packed, k, n in layers[lib]:
                    product(module, xs[m, k], packed, n, bits)
                best[lib, m] = min(best[lib, m], time.perf_counter() - start)
    for lib in modules:
        total = sum(p.numel() for p, _, _ in layers[lib])
        print(f"{lib}: {total / 1e6:.0f} MB of {bits}-bit weights")
    names = list(modules)
    print(f"{bits}-bit products of {shapes}'s layers, {torch.get_num_threads()} threads, fastest of {reps}: "
          "ms a pass")
    print(f"{'rows':>4} {names[0]:>14} {names[1]:>14} {'ratio':>7}")
    for m in rows:
        a, b = (1000 * best[lib, m] for lib in names)
        print(f"{m:>4} {a:>14.2f} {b:>14.2f} {b / a:>7.3f}")
    if not alike:
        print("the revisions pack the weights differently: results not compared")
        return
    packed = random_weights(next(iter(modules.values())), 2048, 1536, bits, torch.Generator().manual_seed(1))
    for m in rows:  # then the same bits from both builds
        x = torch.randn(m, 1536, generator=g)
        got = [product(module, x, packed, 2048, bits) for module in modules.values()]
        if not torch.equal(*got):  # AMX blocks may sum in another order: bf16 products' rounding
            error = ((got[0] - got[1]).abs().max() / got[0].abs().max()).item()
            amx_rows = kernels().amx_rows()
            if m < amx_rows or not amx_rows or error > 1e-5:
                raise SystemExit(f"the builds differ at {m} rows (max relative difference {error:.2e})")


def prompt_ab(libs: dict, tokens: int, reps: int) -> None:
    """A prompt read by the drafter and the target, build by build, read by read."""
    nets = prompt_nets()
    prompt = list(range(1000, 1000 + tokens))
    times = {(lib, net): [] for lib in libs for net in nets}
    with torch.no_grad():
        for rep in range(reps + 1):
            for lib, built in libs.items():
                use_build(built)
                for name, net in nets.items():
                    net.reset()
                    start = time.perf_counter()
                    net.forward(prompt, last=1)
                    if rep:  # the first of each is a warm-up
                        times[lib, name].append(time.perf_counter() - start)
    ms = {key: 1000 * statistics.median(v) / tokens for key, v in times.items()}
    print(f"a {tokens}-token prompt read, ms a token (median of {reps})")
    print(f"{'build':<14} {'drafter':>9} {'target':>9}")
    for lib in libs:
        print(f"{lib:<14} {ms[lib, 'drafter']:>9.3f} {ms[lib, 'target']:>9.3f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = tool_parser(__file__, __doc__)
    parser.add_argument("--against", required=True, help="a git revision")
    parser.add_argument("--reps", type=positive_int, default=None,
                        help="default 600, or 7 with --gemm, or 15 with --prompt")
    parser.add_argument("--gemm", action="store_true", help="time the target-shaped products instead")
    parser.add_argument("--bits", type=int, choices=(4, 6), default=4, help="--gemm's weights: 4- or 6-bit")
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="qwen", help="whose products --gemm times")
    parser.add_argument("--rows", type=int_list, default=None,
                        help="--gemm's rows a product, comma-separated (default 1,2,3,4,5,8; gemma's 1,3,5)")
    parser.add_argument("--layers", type=positive_int, default=None,
                        help="--gemm on qwen's shapes: only the first N layers")
    parser.add_argument("--prompt", type=non_negative_int, default=0,
                        help="time a prompt read of this many tokens instead")
    args = parser.parse_args(argv)
    if not args.gemm:
        given = [name for name, value, default in (("--bits", args.bits, 4), ("--shapes", args.shapes, "qwen"),
                                                   ("--rows", args.rows, None), ("--layers", args.layers, None))
                 if value != default]
        if given:
            parser.error(f"{', '.join(given)} only with --gemm")
    elif args.prompt:
        parser.error("--prompt times a prompt read, --gemm the products: one at a time")
    elif args.layers is not None and args.shapes != "qwen":
        parser.error("--layers picks qwen's layers (--shapes qwen)")
    check_revision(parser, "--against", args.against)
    if args.reps is None:
        args.reps = 7 if args.gemm else 15 if args.prompt else 600
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old = sources_at(args.against, Path(tmp))
        modules = {args.against: module_at(old), "working tree": kernels()}
        libs = {args.against: build_at(modules[args.against], old), "working tree": working_build()}
    if args.gemm:
        for lib, module in modules.items():
            use_build(libs[lib], module)
        gemm_ab(modules, args.reps, args.bits, args.shapes, args.rows, args.layers)
        return 0
    use_build(libs[args.against])  # the nets ask for the library at each forward: from loading on
    try:
        if args.prompt:
            prompt_ab(libs, args.prompt, args.reps)
            return 0
        model = load(ModelCatalog().get(SMOLLM2_ID), torch.bfloat16).model
        nets = {"plain": LeanLlama(model, int8=True, int4=True, max_len=1024),
                "rank 8": LeanLlama(model, int8=True, int4=True, adapter=random_adapter(model, 8, ALL), max_len=1024)}
        context = list(range(100, 300))
        times = {(lib, net): [] for lib in libs for net in nets}
        with torch.no_grad():
            for net in nets.values():
                net.forward(context)
            for _ in range(args.reps):
                for lib, built in libs.items():
                    use_build(built)
                    for name, net in nets.items():
                        start = time.perf_counter()
                        net.forward([42])
                        times[lib, name].append(time.perf_counter() - start)
                        net.rollback(len(context))
    finally:
        use_build(None)
    ms = {key: 1000 * statistics.median(v) for key, v in times.items()}
    print(f"{'build':<14} {'plain ms':>9} {'rank 8 ms':>10} {'adapter adds':>13}")
    for lib in libs:
        print(f"{lib:<14} {ms[lib, 'plain']:>9.3f} {ms[lib, 'rank 8']:>10.3f} "
              f"{ms[lib, 'rank 8'] - ms[lib, 'plain']:>10.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
