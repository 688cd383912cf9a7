"""The ceiling of the 4-bit kernel's many-row products on this CPU: how many AVX2
VPMADDUBSW (the kernel's integer multiply) one core issues a nanosecond, with
twelve independent chains so latency does not limit them, beside a clock estimate
(a chain of dependent adds, one a cycle). The kernel needs 16 VPMADDUBSW and 2
VPMADDWD per 16 x 32 weights and row; the printed bound is what that costs for a
row of 28 Qwen2.5-1.5B-shaped layers on --threads cores, were the multiplies all
that ran. Needs cc and AVX2.

    .venv/bin/python scripts/multiply_rate.py

With --avx512 (a CPU with AVX-512 VNNI): the same for the 512-bit VPDPBUSD, and
what shares its pipes, as ns a round of 16 independent VPDPBUSDs alone and beside
4 FMAs, 2 VPMULLDs (Q4_K's sub-scale), 12 ANDs and adds (unpacking), or with
each VPDPBUSD's input broadcast from memory (docs/speed.md, "Rows in turn").
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
# 16 independent 512-bit VPDPBUSDs a round (accumulators zmm0-15), then what runs beside them.
AVX512_SOURCE = r"""
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
#define D(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define M(r) "vpdpbusd (%0)%{1to16%}, %%zmm31, %%zmm" #r "\n\t"
#define F(r) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #r "\n\t"
#define L(r) "vpmulld %%zmm30, %%zmm" #r ", %%zmm" #r "\n\t"
#define A(r) "vpandd %%zmm30, %%zmm" #r ", %%zmm" #r "\n\t vpaddd %%zmm31, %%zmm" #r ", %%zmm" #r "\n\t"
#define D16 D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11) D(12) D(13) D(14) D(15)
#define M16 M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) M(13) M(14) M(15)
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11","xmm12", \
    "xmm13","xmm14","xmm15","xmm16","xmm17","xmm18","xmm19","xmm20","xmm21"
#define ROUND(body) do { double t = now(); for (long i = 0; i < n; i++) __asm__ volatile(body :: "r"(x) : CL); \
    printf("%f ", (now() - t) / n * 1e9); } while (0)
int main(void) {
    long n = 20000000; int x[16] = {1};
    ROUND(D16);
    ROUND(D16 F(16) F(17) F(18) F(19));
    ROUND(D16 L(16) L(17));
    ROUND(D16 A(16) A(17) A(18) A(19) A(20) A(21));
    ROUND(M16);
    printf("\n");
    return 0;
}
"""
AVX512_ROUNDS = ("alone", "beside 4 FMAs", "beside 2 VPMULLDs", "beside 12 ANDs and adds",
                 "inputs broadcast from memory")
QWEN_WEIGHTS = 28 * sum(k * n for k, n in QWEN_LAYER)  # the 28 layers' projections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--avx512", action="store_true", help="the 512-bit VPDPBUSD instead (AVX-512 VNNI)")
    args = parser.parse_args()
    if args.avx512:
        avx512_rate(args)
        return
    runs = measured(SOURCE, ["-mavx2"], args.runs)
    ghz, rate = max(r[0] for r in runs), max(r[1] for r in runs)
    multiplies = QWEN_WEIGHTS / 512 * 18  # per row: 18 per 16 x 32 block
    print(f"clock ~{ghz:.2f} GHz (dependent adds), VPMADDUBSW {rate:.2f} a ns = {rate / ghz:.2f} a cycle "
          f"(best of {args.runs})")
    print(f"bound for one row of 28 Qwen2.5-1.5B layers on {args.threads} cores: "
          f"{multiplies / rate / args.threads / 1e6:.1f} ms of multiplies")


def measured(source_text: str, flags: list[str], runs: int) -> list[list[float]]:
    """The numbers a C program prints, compiled with flags and run `runs` times."""
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "rate.c", Path(tmp) / "rate"
        source.write_text(source_text)
        subprocess.run(["cc", "-O2", *flags, str(source), "-o", str(binary)], check=True)
        return [list(map(float, subprocess.run([str(binary)], capture_output=True, text=True,
                                               check=True).stdout.split())) for _ in range(runs)]


def avx512_rate(args) -> None:
    runs = measured(AVX512_SOURCE, ["-mavx512f", "-mavx512vnni"], args.runs)
    best = [min(r[i] for r in runs) for i in range(len(AVX512_ROUNDS))]
    for name, ns in zip(AVX512_ROUNDS, best, strict=True):
        print(f"16 VPDPBUSD (512-bit) {name}: {ns:.2f} ns a round")
    rate = 16 / best[0]
    print(f"VPDPBUSD {rate:.2f} a ns a core = {rate * 64:.0f} G multiply-adds a second a core, "
          f"{rate * 64 * args.threads:.0f} on {args.threads} (best of {args.runs})")
    # Q4_K per 16 x 32 block and row: 8 VPDPBUSDs, 1 VPMULLD, half a VPMADDWD on those pipes
    print(f"bound for one row of 28 Qwen2.5-1.5B layers on {args.threads} cores (Q4_K): "
          f"{QWEN_WEIGHTS / 512 * 9.5 / rate / args.threads / 1e6:.2f} ms")


if __name__ == "__main__":
    main()
