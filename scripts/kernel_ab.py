"""The kernels' sources at a git revision against the working tree's, interleaved in
one process (so a busy machine's load hits both alike): ms a one-row forward of the
bundled SmolLM2 drafter after a 200-token context, plain and with a random rank-8
adapter on all seven projections, and what the adapter adds, for each build.

    PYTHONPATH=. .venv/bin/python scripts/kernel_ab.py --against 2f25811 [--reps 600]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="a git revision")
    parser.add_argument("--reps", type=int, default=600)
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
