"""The 4-bit kernel alone: milliseconds for a 8960 x 1536 product (a Qwen 1.5B MLP
projection) of 1 to 256 rows (a prompt's block; from int4.amx_rows() rows on AMX
tiles where the CPU has them), nanoseconds per 16 x 32 block and row, and the
multiply-adds' rate, on the kernel build this CPU runs (`--isa` picks another
runnable one: `--isa avx512vnni` against `--isa amx`). Medians of --reps.

With --layers N: the products of N Qwen2.5-1.5B-shaped layers (q/k/v, o, gate/up,
down; 29 MB of 4-bit weights each, so 28 layers outgrow any CPU cache) for 1 to
8 rows, the fastest of --reps passes: what a verification of that many tokens
costs in weight streaming and products, without attention or the LM head (the
weights in one block on 2 MB pages, as a model's are).

    PYTHONPATH=. .venv/bin/python scripts/kernel_rows.py
    PYTHONPATH=. .venv/bin/python scripts/kernel_rows.py --layers 28 --reps 6
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omnidraft.core.models import huge_pages, int4

ROWS = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256)
STREAM_ROWS = (1, 2, 3, 4, 5, 8)
# (inputs, outputs) of one Qwen2.5-1.5B layer's products: q/k/v, o, gate/up, down
QWEN_LAYER = ((1536, 2048), (1536, 1536), (1536, 17920), (8960, 1536))


def random_packed(n: int, k: int, g: torch.Generator, module=int4) -> torch.Tensor:
    """Random n x k weights in Q4_K's layout, as a Q4_K_M target's 4-bit layers
    (module: the int4.py to pack them with; scripts/kernel_ab.py passes a
    revision's own)."""
    supers = -(-k // 256)
    return module.Q4K(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g),
                    (torch.rand(n, supers, generator=g) * 1e-3).half(), (torch.rand(n, supers, generator=g) * 1e-3).half(),
                    torch.randint(0, 64, (n, k // 32), dtype=torch.uint8, generator=g),
                    torch.randint(0, 64, (n, k // 32), dtype=torch.uint8, generator=g)).packed()


def stream(layers: int, reps: int, isa: str | None) -> None:
    g = torch.Generator().manual_seed(0)
    weights = [[(random_packed(n, k, g), k, n) for k, n in QWEN_LAYER] for _ in range(layers)]
    total = sum(p.numel() for layer in weights for p, _, _ in layer)
    # In one block on 2 MB pages, as a model's weights are (core/models/huge_pages.py).
    room, start = huge_pages.block(total + 64 * 4 * layers), 0
    for layer in weights:
        for i, (packed, k, n) in enumerate(layer):
            copy = room[start : start + packed.numel()].view(packed.shape)
            copy.copy_(packed)
            layer[i], start = (copy, k, n), start + -(-packed.numel() // 64) * 64  # on cache lines
    print(f"kernel: {isa or int4.kernel_isa()}, {torch.get_num_threads()} threads, "
          f"{layers} layers, {total / 1e6:.0f} MB of 4-bit weights")
    for m in STREAM_ROWS:
        x = {k: torch.randn(m, k) for k in {k for k, _ in QWEN_LAYER}}  # contiguous: no copy while timed
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            for layer in weights:
                for packed, k, n in layer:
                    int4.q4_mm(x[k], packed, n, int4.Q4_K, isa)
            best = min(best, time.perf_counter() - start)
        print(f"{m:3d} rows  {1000 * best:7.2f} ms a pass")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--isa", choices=int4.runnable_isas(), default=None)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--layers", type=int, default=0, help="time this many layers' products streaming instead")
    args = parser.parse_args()
    if args.layers:
        stream(args.layers, args.reps, args.isa)
        return
    n, k = 8960, 1536
    packed = random_packed(n, k, torch.Generator().manual_seed(0))
    blocks = n * k / (int4.CHANNELS * int4.GROUP)
    print(f"kernel: {args.isa or int4.kernel_isa()}, {torch.get_num_threads()} threads")
    for m in ROWS:
        x = torch.randn(m, k)
        int4.q4_mm(x, packed, n, int4.Q4_K, args.isa)
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            int4.q4_mm(x, packed, n, int4.Q4_K, args.isa)
            times.append(time.perf_counter() - start)
        ms = 1000 * statistics.median(times)
        print(f"{m:3d} rows  {ms:7.3f} ms  {ms / m:6.3f} ms a row  {ms * 1e6 / (blocks * m):6.2f} ns per block-row"
              f"  {2 * m * n * k / ms / 1e9:5.2f} TFLOP/s")


if __name__ == "__main__":
    main()
