"""The kernels' sources at a git revision against the working tree's, interleaved in
one process (so a busy machine's load hits both alike): ms a one-row forward of the
bundled SmolLM2 drafter after a 200-token context, plain and with a random rank-8
adapter on all seven projections, and what the adapter adds, for each build.

With --gemm: the 4-bit products of 28 Qwen2.5-1.5B-shaped layers (as
scripts/kernel_rows.py --layers) for 1 to 8 rows, the fastest of --reps passes
each (--bits 6: the 6-bit products; --shapes gemma: Gemma-3-270M's Q4_K ones;
--rows 64,200: blocks of a prompt's size, on AMX tiles where the CPU has them).
Each build gets weights packed by its own revision's int4.py, so a layout change
is measured too; where both revisions pack alike, both builds read one copy (where
the OS placed a copy each moved the ratio by up to 13%) and their results are
checked equal.

With --prompt N: ms a prompt token of an N-token prompt read (one forward from an
empty cache) by the drafter and by the Qwen2.5-Coder-1.5B target, medians of
--reps reads each.

    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py --against 2f25811 [--reps 600]
    (the drafter's forward: revisions whose kernels take the same arguments)
    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py --gemm --against 2d11600 [--reps 7]
    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py --gemm --shapes gemma --against b5b0880 --reps 200
    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py --gemm --rows 64,200 --layers 2 --against HEAD --reps 9
    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py --prompt 200 --against HEAD --reps 15
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from adapter_cost import ALL, random_adapter
from kernel_rows import QWEN_LAYER, STREAM_ROWS, random_packed
from omnidraft.core.models import int4
from omnidraft.core.models.catalog import SMOLLM2_ID, ModelCatalog
from omnidraft.core.models.lean_llama import LeanLlama
from omnidraft.core.models.loader import load

HERE = Path(int4.__file__).parent
REPO = Path(__file__).resolve().parent.parent


def build(module, folder: Path):
    """The kernels built from `folder`'s sources by `module` (an int4.py: its own
    build, cache and ctypes signatures)."""
    module._SOURCES = [folder / "int4_gemm.c", folder / "decoder_stack.c"]
    module._HEADERS = [path for path in [folder / "int4_gemm.h"] if path.exists()]
    module._library.cache_clear()
    lib = module._library()
    if isinstance(lib, module.KernelUnavailable):
        raise SystemExit(f"{folder}: {lib}")
    return lib


# The kernels' sources and the int4.py that builds and binds them.
SOURCES = ("int4_gemm.c", "decoder_stack.c", "int4_gemm.h", "int4.py")


def sources_at(revision: str, folder: Path) -> Path:
    """SOURCES as git `revision` holds them, written into folder (a file it lacks,
    as int4_gemm.h before there was one, left out)."""
    for name in SOURCES:
        done = subprocess.run(["git", "show", f"{revision}:core/models/{name}"], cwd=REPO, capture_output=True,
                              check=False)
        if done.returncode == 0:
            (folder / name).write_bytes(done.stdout)
    return folder


def int4_at(folder: Path):
    """The int4.py in `folder` as a module of its own (its packers), beside the
    working tree's."""
    spec = importlib.util.spec_from_file_location(f"{int4.__package__}._int4_{abs(hash(folder))}", folder / "int4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


# The 4-bit (Q4_K) products of a target's file: Qwen2.5-1.5B's 28 layers (as
# kernel_rows.py --layers), or Gemma-3-270M's file's Q4_K tensors (18 attention
# outputs, 9 MLP down projections; its other layers are Q5_0 / Q8_0, run in int8).
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
            if m < int4.amx_rows() or not int4.amx_rows() or error > 1e-5:
                raise SystemExit(f"the builds differ at {m} rows (max relative difference {error:.2e})")


def prompt_nets(max_len: int = 1024, target: str = "qwen2.5-coder-1.5b-instruct") -> dict:
    """The bundled drafter's net (room for max_len positions) and the target's, as a
    reply reads a prompt with them."""
    catalog = ModelCatalog()
    return {"drafter": LeanLlama(load(catalog.get(SMOLLM2_ID), torch.bfloat16).model, int8=True, int4=True,
                                 max_len=max_len),
            "target": load(catalog.get(target), torch.bfloat16, int8=True).runner.net}


def prompt_ab(libs: dict, current: dict, tokens: int, reps: int) -> None:
    """A prompt read by the drafter and the target, build by build, read by read."""
    nets = prompt_nets()
    prompt = list(range(1000, 1000 + tokens))
    times = {(lib, net): [] for lib in libs for net in nets}
    with torch.no_grad():
        for rep in range(reps + 1):
            for lib, built in libs.items():
                current["lib"] = built
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="a git revision")
    parser.add_argument("--reps", type=int, default=None, help="default 600, or 7 with --gemm")
    parser.add_argument("--gemm", action="store_true", help="time the target-shaped products instead")
    parser.add_argument("--bits", type=int, choices=(4, 6), default=4)
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="qwen", help="whose products --gemm times")
    parser.add_argument("--rows", type=lambda text: tuple(int(r) for r in text.split(",")), default=None,
                        help="--gemm's rows a product, comma-separated (default 1-8)")
    parser.add_argument("--layers", type=int, default=None, help="--gemm on qwen's shapes: only the first N layers")
    parser.add_argument("--prompt", type=int, default=0, help="time a prompt read of this many tokens instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = sources_at(args.against, Path(tmp))
        modules = {args.against: int4_at(old), "working tree": int4}
        libs = {args.against: build(modules[args.against], old), "working tree": build(int4, HERE)}
    if args.gemm:
        for lib, module in modules.items():
            module._library = lambda isa=None, built=libs[lib]: built
        gemm_ab(modules, args.reps or 7, args.bits, args.shapes, args.rows, args.layers)
        return
    build_lib = int4._library
    current = {"lib": libs[args.against]}
    int4._library = lambda isa=None: current["lib"]  # LeanLlama asks for the library at each forward
    try:
        if args.prompt:
            prompt_ab(libs, current, args.prompt, args.reps or 15)
            return
        model = load(ModelCatalog().get(SMOLLM2_ID), torch.bfloat16).model
        nets = {"plain": LeanLlama(model, int8=True, int4=True, max_len=1024),
                "rank 8": LeanLlama(model, int8=True, int4=True, adapter=random_adapter(model, 8, ALL), max_len=1024)}
        context = list(range(100, 300))
        times = {(lib, net): [] for lib in libs for net in nets}
        with torch.no_grad():
            for net in nets.values():
                net.forward(context)
            for _ in range(args.reps or 600):
                for lib, built in libs.items():
                    current["lib"] = built
                    for name, net in nets.items():
                        start = time.perf_counter()
                        net.forward([42])
                        times[lib, name].append(time.perf_counter() - start)
                        net.rollback(len(context))
    finally:
        int4._library = build_lib
    ms = {key: 1000 * statistics.median(v) for key, v in times.items()}
    print(f"{'build':<14} {'plain ms':>9} {'rank 8 ms':>10} {'adapter adds':>13}")
    for lib in libs:
        print(f"{lib:<14} {ms[lib, 'plain']:>9.3f} {ms[lib, 'rank 8']:>10.3f} {ms[lib, 'rank 8'] - ms[lib, 'plain']:>10.3f} ms")


if __name__ == "__main__":
    main()
