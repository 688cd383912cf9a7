"""The kernels' sources at a git revision against the working tree's, interleaved in
one process (so a busy machine's load hits both alike): ms a one-row forward of the
bundled SmolLM2 drafter after a 200-token context, plain and with a random rank-8
adapter on all seven projections, and what the adapter adds, for each build.

With --gemm: the 4-bit products of 28 Qwen2.5-1.5B-shaped layers (819 MB, as
scripts/kernel_rows.py --layers) for 1 to 8 rows, the fastest of --reps passes
each, the two builds' results checked equal (--bits 6: the 6-bit products).

    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py --against 2f25811 [--reps 600]
    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py --gemm --against 2d11600 [--reps 7]
"""

from __future__ import annotations

import argparse
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


def build(folder: Path):
    """The kernels built from `folder`'s sources (int4.py's own build and cache)."""
    int4._SOURCES = [folder / "int4_gemm.c", folder / "decoder_stack.c"]
    int4._HEADERS = [path for path in [folder / "int4_gemm.h"] if path.exists()]
    int4._library.cache_clear()
    lib = int4._library()
    if isinstance(lib, int4.KernelUnavailable):
        raise SystemExit(f"{folder}: {lib}")
    return lib


def gemm_ab(libs: dict, reps: int, bits: int, current: dict) -> None:
    g = torch.Generator().manual_seed(0)
    if bits == 6:
        def pack(n, k):
            return int4.pack6(torch.randint(0, 64, (n, k), dtype=torch.uint8, generator=g),
                              (torch.rand(n, k // 16, generator=g) * 0.01).half())
    else:
        def pack(n, k):
            return random_packed(n, k, g)
    layers = [[(pack(n, k), k, n) for k, n in QWEN_LAYER] for _ in range(28)]
    xs = {(m, k): torch.randn(m, k, generator=g) for m in STREAM_ROWS for k in (1536, 8960)}
    best = {(lib, m): float("inf") for lib in libs for m in STREAM_ROWS}
    for _ in range(reps):
        for m in STREAM_ROWS:
            for lib, built in libs.items():
                current["lib"] = built
                start = time.perf_counter()
                for layer in layers:
                    for packed, k, n in layer:
                        int4.q4_mm(xs[m, k], packed, n, bits=bits)
                best[lib, m] = min(best[lib, m], time.perf_counter() - start)
    for m in STREAM_ROWS:  # the same bits from both builds
        packed, k, n = layers[0][2]
        got = []
        for built in libs.values():
            current["lib"] = built
            got.append(int4.q4_mm(xs[m, k], packed, n, bits=bits))
        if not torch.equal(*got):
            raise SystemExit(f"the builds differ at {m} rows")
    names = list(libs)
    print(f"{bits}-bit products of 28 layers, {torch.get_num_threads()} threads, fastest of {reps}: ms a pass")
    print(f"{'rows':>4} {names[0]:>14} {names[1]:>14} {'ratio':>7}")
    for m in STREAM_ROWS:
        a, b = (1000 * best[lib, m] for lib in names)
        print(f"{m:>4} {a:>14.2f} {b:>14.2f} {b / a:>7.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="a git revision")
    parser.add_argument("--reps", type=int, default=None, help="default 600, or 7 with --gemm")
    parser.add_argument("--gemm", action="store_true", help="time the target-shaped products instead")
    parser.add_argument("--bits", type=int, choices=(4, 6), default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp)
        for name in ("int4_gemm.c", "decoder_stack.c", "int4_gemm.h"):
            done = subprocess.run(["git", "show", f"{args.against}:core/models/{name}"], cwd=REPO,
                                  capture_output=True, check=False)
            if done.returncode == 0:
                (old / name).write_bytes(done.stdout)
        libs = {args.against: build(old), "working tree": build(HERE)}
    build_lib = int4._library
    current = {"lib": libs[args.against]}
    int4._library = lambda isa=None: current["lib"]  # LeanLlama asks for the library at each forward
    try:
        if args.gemm:
            gemm_ab(libs, args.reps or 7, args.bits, current)
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
