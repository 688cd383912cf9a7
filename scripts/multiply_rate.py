"""The ceiling of the 4-bit kernel's many-row products on this CPU: how many AVX2
VPMADDUBSW (the kernel's integer multiply) one core issues a nanosecond, with
twelve independent chains so latency does not limit them, beside a clock estimate
(a chain of dependent adds, one a cycle). The kernel needs 16 VPMADDUBSW and 2
VPMADDWD per 16 x 32 weights and row; the printed bound is what that costs for a
row of 28 Qwen2.5-1.5B-shaped layers on --threads cores, were the multiplies all
that ran. Needs cc and AVX2.

    .venv/bin/python scripts/multiply_rate.py
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from kernel_rows import QWEN_LAYER

SOURCE = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
    long n = 50000000, a = 0, one = 1;
    double t = now();
    /* A register operand: Intel's Golden Cove folds chains of add-immediate at
       renaming, so those ran ~19 "GHz" on a Sapphire Rapids-class Xeon. */
    for (long i = 0; i < n; i++)
        __asm__ volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
                         "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0"
                         : "+r"(a) : "r"(one));
    double ghz = n * 10 / (now() - t) / 1e9;
    __m256i w[12];
    for (int i = 0; i < 12; i++) w[i] = _mm256_set1_epi8((char)(i + 1));
    long m = 20000000;
    t = now();
    for (long i = 0; i < m; i++)
        for (int j = 0; j < 12; j++) w[j] = _mm256_maddubs_epi16(w[j], w[j]);
    double rate = m * 12 / (now() - t) / 1e9;
    int s = 0;
    for (int i = 0; i < 12; i++) s += _mm256_extract_epi32(w[i], 0);
    printf("%f %f %d\n", ghz, rate, s & 1);
    return 0;
}
"""
QWEN_WEIGHTS = 28 * sum(k * n for k, n in QWEN_LAYER)  # the 28 layers' projections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "rate.c", Path(tmp) / "rate"
        source.write_text(SOURCE)
        subprocess.run(["cc", "-O2", "-mavx2", str(source), "-o", str(binary)], check=True)
        runs = [tuple(map(float, subprocess.run([str(binary)], capture_output=True, text=True,
                                                check=True).stdout.split()[:2])) for _ in range(args.runs)]
    ghz, rate = max(r[0] for r in runs), max(r[1] for r in runs)
    multiplies = QWEN_WEIGHTS / 512 * 18  # per row: 18 per 16 x 32 block
    print(f"clock ~{ghz:.2f} GHz (dependent adds), VPMADDUBSW {rate:.2f} a ns = {rate / ghz:.2f} a cycle "
          f"(best of {args.runs})")
    print(f"bound for one row of 28 Qwen2.5-1.5B layers on {args.threads} cores: "
          f"{multiplies / rate / args.threads / 1e6:.1f} ms of multiplies")


if __name__ == "__main__":
    main()
