"""The 4-bit kernel alone: milliseconds for a 8960 x 1536 product (a Qwen 1.5B MLP
projection) of 1 to 64 rows, and nanoseconds per 16 x 32 block and row, on the
kernel build this CPU runs (`--isa` picks another runnable one). Medians of --reps.

    PYTHONPATH=. .venv/bin/python scripts/kernel_rows.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omnidraft.core.models import int4

ROWS = (1, 2, 3, 4, 8, 16, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--isa", choices=int4.runnable_isas(), default=None)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    n, k = 8960, 1536
    g = torch.Generator().manual_seed(0)
    packed = int4.pack(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g),
                       (torch.rand(n, k // 32, generator=g) * 0.01).half(),
                       (-torch.rand(n, k // 32, generator=g) * 0.05).half())
    blocks = n * k / (int4.CHANNELS * int4.GROUP)
    print(f"kernel: {args.isa or int4.kernel_isa()}, {torch.get_num_threads()} threads")
    for m in ROWS:
        x = torch.randn(m, k)
        int4.q4_mm(x, packed, n, args.isa)
        times = []
        for _ in range(args.reps):
            start = time.perf_counter()
            int4.q4_mm(x, packed, n, args.isa)
            times.append(time.perf_counter() - start)
        ms = 1000 * statistics.median(times)
        print(f"{m:3d} rows  {ms:7.3f} ms  {ms / m:6.3f} ms a row  {ms * 1e6 / (blocks * m):6.2f} ns per block-row")


if __name__ == "__main__":
    main()
