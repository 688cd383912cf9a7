/* y = x W^T for 4-bit, 6-bit and 8-bit weights: the target's verification kernels
(core/kernels/linear.py), in four layouts (quant_gemm.h). Each stores 16 output
channels' weights as one column, front to back along the inputs, so a thread
streams its channels' weights in order; each group of 32 inputs holds 256 bytes
of nibbles laid out for VPDPBUSD (byte t*64 + j*4 + b holds channel j's inputs
4t+b in the low nibble and 16+4t+b in the high one).

Q4_K (a GGUF Q4_K tensor, exactly): per channel and group of 32 inputs
w = d * sc * q - dmin * m, q in 0..15, sc and m in 0..63, d and dmin fp16 per
superblock of 8 groups (256 inputs; a row's last superblock may hold fewer).
Per superblock 64 bytes of the 16 channels' d, then dmin; then per group 288
bytes: nibbles, 16 sc, 16 m. 296 bytes per 16 x 32 weights (the file's: 288).

Q4_1's form (layouts.fit's, the drafter's: SmolLM2's file is Q4_1): per channel and
group w = s * q + z, s and z fp16. Per group 320 bytes: nibbles, 16 s, 16 z.

Q6_K (exactly): w = s * (q - 32), q in 0..63, one fp16 scale per channel and 16
inputs. Per group 448 bytes: q's low nibbles (256), then its high bit pairs
(128: 32-byte chunk 2s+h holds, for byte i of nibble register 4s+f of half h,
bits 2f..2f+1), then the 32 scales ([16-input part s][channel]).

Q8_0 (exactly): w = s * q, q int8, one fp16 scale per channel and group. Per
group 544 bytes: q + 128 as unsigned bytes (512, in the nibbles' order: byte
t*64 + j*4 + b holds channel j's input 4t+b, t < 8), then the 16 scales. (A Q5_0
model's LM head and v projections: Qwen2.5-Coder-0.5B's.)

Activations: each row quantized to int8 on its own scale (absmax / 127), so a
row's result never depends on the rows computed beside it, and the integer
products are exact. Q4_K: per group and row, the integer dot products times sc
sum in int32 over the superblock (at most 8 x 63 x 32 x 15 x 127 < 2^31), as do
the row's group sums times m; then, once per superblock, acc += d * dots -
dmin * mins. Q4_1: per group acc += s * dot + z * sum(group). Q6_K: per 16
inputs acc += s * (dot - 32 sum). Q8_0: per group acc += s * (dot - 128 sum). Finally y = acc * row scale. Every build
(AVX-512 VNNI, AVX2 with or without AVX-VNNI's 256-bit VPDPBUSD) computes the same
integers and the same float steps, so the same bits.

The weights are unpacked once per group and used by up to 8 rows, so up to 8
rows cost about what one does while the weights stream from memory (a
speculative verification of k+1 tokens), which is what no library kernel on
this CPU gives (docs/performance.md). Q4_K's one float step per superblock instead of
one per group matters on AVX2, where the rows' products, not the stream, set
the cost of several rows (docs/performance.md).
*/
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_gemm.h"

#ifdef OMNI_SIMD
#include <immintrin.h>
#include <x86intrin.h>
#endif
/* team_wait's sleep: a futex on Linux; elsewhere the waiter yields its CPU. */
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#elif defined(_WIN32)
#include <windows.h>
#else
#include <sched.h>
#endif

#define GROUP 32
#define CHANNELS 16
#define Q4_BLOCK_BYTES 320 /* Q4_1's form: 16 x 32 nibbles, 16 fp16 scales, 16 fp16 offsets */
#define SUPER_GROUPS 8     /* groups per Q4_K superblock */
#define SUPER_HEAD 64      /* a Q4_K superblock's d and dmin */
#define GROUP_BYTES 288    /* a Q4_K group's nibbles, sc and m */
#define Q6_BLOCK_BYTES 448
#define Q8_BLOCK_BYTES 544
#define MAX_ROWS 8

/* One row to int8 on its own scale (absmax / 127), and the sums of its int8 values
   per `width` inputs (32, or 16 for the 6-bit layout; at most 32 x 127, an int16).
   CVTPS2DQ rounds to nearest, ties to even, as nearbyintf does in the default mode,
   so the integers are those of the plain loop. Vectorized and split between the threads: as a scalar loop on one
   thread it was a visible part of a long prompt's 8960-wide products. k: a
   multiple of 32. */
#ifdef OMNI_SIMD
static void quantize_row(const float *xr, int64_t k, int8_t *qr, float *row_scale, int16_t *sums, int64_t width) {
#ifdef OMNI_ZMM
    __m512 top = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16) top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_loadu_ps(xr + i)));
    float amax = _mm512_reduce_max_ps(top);
#else
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 top = _mm256_setzero_ps();
    for (int64_t i = 0; i < k; i += 8) top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(xr + i), magnitude));
    __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    t4 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
    float amax = _mm_cvtss_f32(_mm_max_ss(t4, _mm_movehdup_ps(t4)));
#endif
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    *row_scale = amax / 127.0f;
    for (int64_t g = 0; g < k / width; g++) {
#ifdef OMNI_ZMM
        __m512i sum = _mm512_setzero_si512();
        for (int64_t i = g * width; i < (g + 1) * width; i += 16) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xr + i), _mm512_set1_ps(inv)));
            _mm_storeu_si128((__m128i *)(qr + i), _mm512_cvtepi32_epi8(q));
            sum = _mm512_add_epi32(sum, q);
        }
        sums[g] = (int16_t)_mm512_reduce_add_epi32(sum);
#else
        __m256i sum = _mm256_setzero_si256();
        for (int64_t i = g * width; i < (g + 1) * width; i += 8) {
            __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + i), _mm256_set1_ps(inv)));
            __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            _mm_storel_epi64((__m128i *)(qr + i), _mm_packs_epi16(words, words)); /* |q| <= 127: no saturation */
            sum = _mm256_add_epi32(sum, q);
        }
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        sums[g] = (int16_t)_mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
#endif
    }
}
#else
/* The plain loop: the same absmax, scale and rounding (lrintf: to nearest, ties to
   even, in the default mode), so the same integers as the SIMD builds'. */
static void quantize_row(const float *xr, int64_t k, int8_t *qr, float *row_scale, int16_t *sums, int64_t width) {
    float amax = 0.0f;
    for (int64_t i = 0; i < k; i++) amax = fabsf(xr[i]) > amax ? fabsf(xr[i]) : amax;
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    *row_scale = amax / 127.0f;
    for (int64_t g = 0; g < k / width; g++) {
        int32_t sum = 0;
        for (int64_t i = g * width; i < (g + 1) * width; i++) {
            int32_t q = (int32_t)lrintf(xr[i] * inv);
            qr[i] = (int8_t)q;
            sum += q;
        }
        sums[g] = (int16_t)sum;
    }
}
#endif

/* A row's per-group term for the layouts other than Q4_K (gemm_team). */
typedef union {
    int32_t shift; /* Q6_K: -32 sum, Q8_0: -128 sum */
    float sum;     /* Q4_1 */
} Term;

static void row_terms(int kind, const int16_t *sums, int64_t count, Term *out) {
    for (int64_t g = 0; g < count; g++) {
        if (kind == LAYOUT_Q6_K)
            out[g].shift = -32 * (int32_t)sums[g];
        else if (kind == LAYOUT_Q8_0)
            out[g].shift = -128 * (int32_t)sums[g];
        else
            out[g].sum = (float)sums[g];
    }
}

/* Ask for the weights PREFETCH bytes ahead in this thread's stream while the
   current block computes. Left to the hardware prefetcher, the stream stalled
   whenever the rows' products took a while: the products of 28 Qwen2.5-1.5B-shaped
   layers (819 MB, git show 524cea4:scripts/kernel_rows.py, --layers 28) took
   42-43 / 57 / 68-79 ms for 1 / 4 / 8 rows, and 34-35 / 38-39 / 45-47 ms with this (2-16 KB ahead all
   alike). A prefetch past the end of the weights is harmless: it never faults.
   From 3 rows the multiply-adds take long enough that this no longer keeps enough
   lines in flight (L1 holds few misses at a time), so those also ask L2 for the
   weights FAR bytes ahead: a Qwen2.5-1.5B verification of 4 / 5 rows 8-11% faster
   where memory is fast, 2-3% where it is slow; for 1-2 rows it cost up to 6% (more
   instructions, no stall to hide), and blocks of 8 (a prompt's, whose weights
   stay in cache after the first block) gained nothing. Nor do products under
   FAR_MIN_BYTES (Gemma-3-270M's layers, a Qwen's q/k/v and o): their streams are
   short, the far prefetch runs mostly past their end (Gemma's layers' products of
   3-5 rows were 1-2% slower with it). AVX2's products are bound by
   their multiplies from 3 rows, and gained nothing either (4-5 rows 1-2% slower)
   (tools/attention_ab.py --rows, tools/kernel_ab.py --gemm; docs/performance.md).
   The near prefetch is non-temporal: weights read once a forward need not displace
   what is read again (the KV caches, the activations, the other model's last
   layers); on the Zen 4 EPYC a drafter forward right after a target step 2-5%
   cheaper, the target's step within the noise (tools/attention_ab.py --step;
   docs/performance.md). */
#define PREFETCH 4096
#define FAR 16384
#define FAR_MIN_BYTES (4 << 20) /* smaller products: the far prefetch runs mostly past their end */
#if defined(OMNI_AMX)
/* Intel's Xeons (the amx build runs on Sapphire Rapids and later only): there the
   near prefetch alone left a one-row product at half the stream's speed (a 2-core
   Xeon, step_times: a Qwen2.5-1.5B forward of 1 / 2 / 3 rows 85.6 / 77.0 / 46.4 ms,
   a Qwen2-7B-shaped one's 377.6 / 330.9 / 189.3): the far prefetch from one row
   (tools/kernel_ab.py --gemm; docs/performance.md). */
#define FAR_ROWS 1
#elif defined(OMNI_ZMM)
#define FAR_ROWS 3
#else
#define FAR_ROWS MAX_ROWS
#endif
#ifdef OMNI_SIMD
/* far: also FAR bytes ahead into L2 (gemm_team decides, per product and block of rows). */
static inline __attribute__((always_inline)) void ahead(const uint8_t *b, int bytes, int far) {
    for (int line = 0; line < bytes; line += 64) _mm_prefetch((const char *)b + PREFETCH + line, _MM_HINT_NTA);
    if (far)
        for (int line = 0; line < bytes; line += 64) _mm_prefetch((const char *)b + FAR + line, _MM_HINT_T1);
}

/* A Q4_K superblock's m of groups 2p and 2p+1 (0 past its last group) for channels
   8h..8h+7, interleaved: byte 2j holds channel 8h+j's m of group 2p, byte 2j+1
   its m of group 2p+1. first: the superblock's first group. */
static inline __attribute__((always_inline)) __m128i min_pair_bytes(const uint8_t *first, int p, int count, int h) {
    __m128i m0 = _mm_loadu_si128((const __m128i *)(first + 2 * p * GROUP_BYTES + 272));
    __m128i m1 = 2 * p + 1 < count ? _mm_loadu_si128((const __m128i *)(first + (2 * p + 1) * GROUP_BYTES + 272))
                                   : _mm_setzero_si128();
    return h ? _mm_unpackhi_epi8(m0, m1) : _mm_unpacklo_epi8(m0, m1);
}

/* One block column of 16 channels for `rows` (1..8, a constant once inlined) rows. */
#ifdef OMNI_ZMM
/* A block's nibbles as 8 registers of unsigned bytes: inputs 4t.. (t < 4, low
   nibbles) and 16 + 4(t - 4).. (high nibbles), 16 channels each. */
static inline __attribute__((always_inline)) void nibbles(const uint8_t *b, __m512i w[8]) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int t = 0; t < 4; t++) {
        __m512i v = _mm512_loadu_si512((const void *)(b + 64 * t));
        w[t] = _mm512_and_si512(v, low);
        w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
}

/* d[r] += w times row r's inputs 4t..4t+3 (x: the first row's group as int32s, the
   next row's `step` further on), a row at a time: consecutive VPDPBUSDs feed
   different rows' sums and never wait on each other. With each row's eight in a
   chain, as before, the multipliers waited on them: 10% of a prompt's products
   on a Zen 4 (docs/performance.md). */
static inline __attribute__((always_inline)) void dots_rows(__m512i *d, int rows, __m512i w, const int32_t *x,
                                                            int64_t step, int t) {
    for (int r = 0; r < rows; r++) d[r] = _mm512_dpbusd_epi32(d[r], w, _mm512_set1_epi32(x[r * step + t]));
}

/* d[r] = a group's nibbles (b: nibbles() order) times row r's 32 inputs, each
   byte of nibbles unpacked as it is used. */
static inline __attribute__((always_inline)) void nibble_dots(const uint8_t *b, __m512i *d, int rows, const int32_t *x,
                                                               int64_t step) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int r = 0; r < rows; r++) d[r] = _mm512_setzero_si512();
    for (int t = 0; t < 4; t++) {
        __m512i v = _mm512_loadu_si512((const void *)(b + 64 * t));
        dots_rows(d, rows, _mm512_and_si512(v, low), x, step, t);
        dots_rows(d, rows, _mm512_and_si512(_mm512_srli_epi16(v, 4), low), x, step, t + 4);
    }
}

/* A superblock's mins as int16 pairs per channel (group 2p's m, group 2p+1's m):
   VPMADDWD with a row's pair of group sums gives the channel's m * sum for both
   groups. */
static inline __attribute__((always_inline)) __m512i min_pairs(const uint8_t *first, int p, int count) {
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(min_pair_bytes(first, p, count, 1),
                                                 min_pair_bytes(first, p, count, 0)));
}

static inline __attribute__((always_inline)) void q4k_column(
    const uint8_t *column, int64_t groups, const int8_t *xq, const int16_t *sums, int64_t stride,
    const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *head = column;
    for (int64_t g0 = 0; g0 < groups; g0 += SUPER_GROUPS) {
        int count = groups - g0 < SUPER_GROUPS ? (int)(groups - g0) : SUPER_GROUPS;
        const uint8_t *first = head + SUPER_HEAD;
        __m512i dots[MAX_ROWS];
        for (int r = 0; r < rows; r++) dots[r] = _mm512_setzero_si512();
        for (int i = 0; i < count; i++) {
            const uint8_t *b = first + i * GROUP_BYTES;
            ahead(b, GROUP_BYTES, far);
            __m512i d[MAX_ROWS];
            nibble_dots(b, d, rows, (const int32_t *)(xq + (g0 + i) * GROUP), k / 4);
            __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 256)));
            for (int r = 0; r < rows; r++) dots[r] = _mm512_add_epi32(dots[r], _mm512_mullo_epi32(d[r], sc));
        }
        __m512 dd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
        __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(head + 32)));
        int pairs = (count + 1) / 2;
        __m512i mp[SUPER_GROUPS / 2];
        for (int p = 0; p < pairs; p++) mp[p] = min_pairs(first, p, count);
        for (int r = 0; r < rows; r++) {
            const int32_t *xs = (const int32_t *)(sums + r * stride + g0); /* pairs of group sums */
            __m512i mins = _mm512_setzero_si512();
            for (int p = 0; p < pairs; p++) mins = _mm512_add_epi32(mins, _mm512_madd_epi16(mp[p], _mm512_set1_epi32(xs[p])));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[r]), dd, acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), dm, acc[r]);
        }
        head = first + count * GROUP_BYTES;
    }
    for (int r = 0; r < rows; r++)
        _mm512_storeu_ps(y + r * ldy, _mm512_mul_ps(acc[r], _mm512_set1_ps(row_scale[r])));
}

/* Q4_1's form. */
static inline __attribute__((always_inline)) void q4_column(
    const uint8_t *blocks, int64_t groups, const int8_t *xq, const float *group_sum, int64_t stride,
    const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q4_BLOCK_BYTES;
        ahead(b, Q4_BLOCK_BYTES, far);
        __m512i d[MAX_ROWS];
        nibble_dots(b, d, rows, (const int32_t *)(xq + g * GROUP), k / 4);
        __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 256)));
        __m512 z = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 288)));
        for (int r = 0; r < rows; r++) {
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r]), s, acc[r]);
            acc[r] = _mm512_fmadd_ps(z, _mm512_set1_ps(group_sum[r * stride + g]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++)
        _mm512_storeu_ps(y + r * ldy, _mm512_mul_ps(acc[r], _mm512_set1_ps(row_scale[r])));
}

/* Register 4s + f of a Q6_K group's q (0..63) in the nibble registers' layout: the
   low nibble of byte chunk f (s = 0) or its high one (s = 1), completed by its
   high bit pair from chunk s of the pairs. */
static inline __attribute__((always_inline)) __m512i six_bit_register(const uint8_t *b, int s, int f) {
    const __m512i low = _mm512_set1_epi8(0x0F), pair = _mm512_set1_epi8(0x30);
    __m512i v = _mm512_loadu_si512((const void *)(b + 64 * f));
    __m512i hb = _mm512_loadu_si512((const void *)(b + 256 + 64 * s));
    __m512i q = _mm512_and_si512(s ? _mm512_srli_epi16(v, 4) : v, low);
    __m512i h = f == 0 ? _mm512_slli_epi16(hb, 4)
                : f == 1 ? _mm512_slli_epi16(hb, 2)
                : f == 2 ? hb
                         : _mm512_srli_epi16(hb, 2);
    return _mm512_or_si512(q, _mm512_and_si512(h, pair));
}

/* A Q6_K group's q, all 8 registers (as nibbles() lays out 4 bits). */
static inline __attribute__((always_inline)) void six_bits(const uint8_t *b, __m512i w[8]) {
    for (int t = 0; t < 8; t++) w[t] = six_bit_register(b, t / 4, t % 4);
}

/* A Q6_K group's 16-input part s (inputs 16s..16s+15) into dots_rows(), a register
   at a time: unpacked as used, the rows' sums and results stay in registers. */
static inline __attribute__((always_inline)) void six_bit_dots(const uint8_t *b, int s, __m512i *d, int rows,
                                                                const int32_t *x, int64_t step) {
    for (int f = 0; f < 4; f++) dots_rows(d, rows, six_bit_register(b, s, f), x, step, 4 * s + f);
}

/* 6-bit: per 16-input part s, d = sum(q x) - 32 sum(x) exactly, then acc += s * d. */
static inline __attribute__((always_inline)) void q6k_column(
    const uint8_t *blocks, int64_t groups, const int8_t *xq, const int32_t *part_shift, int64_t stride,
    const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q6_BLOCK_BYTES;
        ahead(b, Q6_BLOCK_BYTES, far);
        for (int s = 0; s < 2; s++) {
            __m512i d[MAX_ROWS];
            for (int r = 0; r < rows; r++) d[r] = _mm512_set1_epi32(part_shift[r * stride + 2 * g + s]);
            six_bit_dots(b, s, d, rows, (const int32_t *)(xq + g * GROUP), k / 4);
            __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 384 + 32 * s)));
            for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r]), sc, acc[r]);
        }
    }
    for (int r = 0; r < rows; r++)
        _mm512_storeu_ps(y + r * ldy, _mm512_mul_ps(acc[r], _mm512_set1_ps(row_scale[r])));
}

/* 8-bit: per group d = sum((q + 128) x) - 128 sum(x) = sum(q x) exactly, then acc += s * d. */
static inline __attribute__((always_inline)) void q8_column(
    const uint8_t *blocks, int64_t groups, const int8_t *xq, const int32_t *group_shift, int64_t stride,
    const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q8_BLOCK_BYTES;
        ahead(b, Q8_BLOCK_BYTES, far);
        __m512i d[MAX_ROWS];
        for (int r = 0; r < rows; r++) d[r] = _mm512_set1_epi32(group_shift[r * stride + g]);
        for (int t = 0; t < 8; t++)
            dots_rows(d, rows, _mm512_loadu_si512((const void *)(b + 64 * t)), (const int32_t *)(xq + g * GROUP), k / 4, t);
        __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 512)));
        for (int r = 0; r < rows; r++) acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r]), s, acc[r]);
    }
    for (int r = 0; r < rows; r++)
        _mm512_storeu_ps(y + r * ldy, _mm512_mul_ps(acc[r], _mm512_set1_ps(row_scale[r])));
}

#else
/* Half h's nibbles (8 channels, from b + 32h) as 8 registers, as above. */
static inline __attribute__((always_inline)) void nibbles(const uint8_t *b, __m256i w[8]) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int t = 0; t < 4; t++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(b + 64 * t));
        w[t] = _mm256_and_si256(v, low);
        w[t + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
}

/* A half group's 8 channels times a row's 32 int8 inputs (xr: as 8 int32 of 4 bytes)
   as int16 pairs: channel j's two partial sums in lanes 2j and 2j+1. */
static inline __attribute__((always_inline)) __m256i pair_sums(const __m256i w[8], const int32_t *xr) {
    __m256i d = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], _mm256_set1_epi32(xr[0])),
                                 _mm256_maddubs_epi16(w[1], _mm256_set1_epi32(xr[1])));
    __m256i e = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], _mm256_set1_epi32(xr[2])),
                                 _mm256_maddubs_epi16(w[3], _mm256_set1_epi32(xr[3])));
    d = _mm256_add_epi16(d, _mm256_maddubs_epi16(w[4], _mm256_set1_epi32(xr[4])));
    e = _mm256_add_epi16(e, _mm256_maddubs_epi16(w[5], _mm256_set1_epi32(xr[5])));
    d = _mm256_add_epi16(d, _mm256_maddubs_epi16(w[6], _mm256_set1_epi32(xr[6])));
    e = _mm256_add_epi16(e, _mm256_maddubs_epi16(w[7], _mm256_set1_epi32(xr[7])));
    return _mm256_add_epi16(d, e);
}

#ifdef DPBUSD256
/* The same half group's 8 channels times a row's 32 inputs as int32 sums, by 8
   VPDPBUSDs in two chains (the same integers as pair_sums joined by VPMADDWD, in
   a third of the instructions). */
static inline __attribute__((always_inline)) __m256i vnni_sums(const __m256i w[8], const int32_t *xr, __m256i d) {
    __m256i e = _mm256_setzero_si256();
    for (int t = 0; t < 8; t += 2) {
        d = DPBUSD256(d, w[t], _mm256_set1_epi32(xr[t]));
        e = DPBUSD256(e, w[t + 1], _mm256_set1_epi32(xr[t + 1]));
    }
    return _mm256_add_epi32(d, e);
}
#endif

/* Q4_K with AVX2 (no VNNI): each half of a group's 64 bytes holds 8 channels'
   4 inputs; VPMADDUBSW multiplies the unsigned nibbles by the int8 inputs and adds
   pairs into int16, which sum over the group's 8 steps without overflow
   (8 x 2 x 15 x 127 < 32768); VPMADDWD then joins each channel's two pairs and
   multiplies them by its sc in one instruction. Same integers and float steps as
   above, so the same results.
   AVX2 has 16 registers: a whole group's nibbles (16) left none for the rows, and
   the compiler spilled nibbles and the rows' sums alike. So one half group (8
   registers) goes through all the rows before the other, and the rows' sums live
   in L1 (a load and a store beside 8 multiplies). */
static inline __attribute__((always_inline)) void q4k_column(
    const uint8_t *column, int64_t groups, const int8_t *xq, const int16_t *sums, int64_t stride,
    const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    float partial[MAX_ROWS * 16] __attribute__((aligned(32)));  /* [row][channel]: the rows' results so far */
    int32_t dot_sums[MAX_ROWS * 16] __attribute__((aligned(32))); /* the superblock's sc * dots so far */
    float *accm = partial;
    int32_t *dots = dot_sums;
    __asm__("" : "+r"(accm)); /* opaque: kept in L1, not 16 registers the halves' nibbles need */
    __asm__("" : "+r"(dots));
    for (int i = 0; i < rows * 16; i += 8) {
        _mm256_store_ps(accm + i, _mm256_setzero_ps());
        _mm256_store_si256((__m256i *)(dots + i), _mm256_setzero_si256());
    }
    /* sc (8 channels' bytes, in both 128-bit lanes) -> int16 pairs (sc_j, sc_j) */
#ifndef DPBUSD256
    const __m256i twice = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                           4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
#endif
    const uint8_t *head = column;
    for (int64_t g0 = 0; g0 < groups; g0 += SUPER_GROUPS) {
        int count = groups - g0 < SUPER_GROUPS ? (int)(groups - g0) : SUPER_GROUPS;
        const uint8_t *first = head + SUPER_HEAD;
        for (int i = 0; i < count; i++) {
            const uint8_t *b = first + i * GROUP_BYTES;
            ahead(b, GROUP_BYTES, far);
            for (int h = 0; h < 2; h++) { /* channels 8h..8h+7 */
                __m256i w[8];
                nibbles(b + 32 * h, w);
#ifdef DPBUSD256
                __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 256 + 8 * h)));
#else
                __m256i sc = _mm256_shuffle_epi8(
                    _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)(b + 256 + 8 * h))), twice);
#endif
                const int8_t *xg = xq + (g0 + i) * GROUP;
                __asm__("" : "+r"(xg)); /* no sharing of the rows' broadcasts between halves */
                for (int r = 0; r < rows; r++) {
                    __m256i *a = (__m256i *)(dots + r * 16 + 8 * h);
#ifdef DPBUSD256
                    __m256i scaled = _mm256_mullo_epi32(vnni_sums(w, (const int32_t *)(xg + r * k), _mm256_setzero_si256()), sc);
#else
                    __m256i scaled = _mm256_madd_epi16(pair_sums(w, (const int32_t *)(xg + r * k)), sc);
#endif
                    _mm256_store_si256(a, _mm256_add_epi32(_mm256_load_si256(a), scaled));
                }
            }
        }
        int pairs = (count + 1) / 2;
        for (int h = 0; h < 2; h++) {
            __m256 dd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 16 * h)));
            __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(head + 32 + 16 * h)));
            __m256i mp[SUPER_GROUPS / 2]; /* the mins as int16 pairs, as min_pairs above */
            for (int p = 0; p < pairs; p++) mp[p] = _mm256_cvtepu8_epi16(min_pair_bytes(first, p, count, h));
            for (int r = 0; r < rows; r++) {
                const int32_t *xs = (const int32_t *)(sums + r * stride + g0);
                __m256i mins = _mm256_setzero_si256();
                for (int p = 0; p < pairs; p++)
                    mins = _mm256_add_epi32(mins, _mm256_madd_epi16(mp[p], _mm256_set1_epi32(xs[p])));
                __m256i *dr = (__m256i *)(dots + r * 16 + 8 * h);
                float *a = accm + r * 16 + 8 * h;
                __m256 acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256(dr)), dd, _mm256_load_ps(a));
                _mm256_store_ps(a, _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), dm, acc));
                _mm256_store_si256(dr, _mm256_setzero_si256());
            }
        }
        head = first + count * GROUP_BYTES;
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(y + r * ldy + 8 * h, _mm256_mul_ps(_mm256_load_ps(accm + r * 16 + 8 * h),
                                                                _mm256_set1_ps(row_scale[r])));
}
/* Q4_1's form with AVX2: q4k_column's loop with a float step per group. (Split into
   halves as there: 28 Qwen2.5-1.5B-shaped layers' products on an AVX2 Zen 4, two
   runs of tools/kernel_ab.py --gemm --against 2d11600, 3 / 4 / 8 rows took
   0.87-0.92 / 0.83-0.91 / 0.78-0.92 of the unsplit loop's time, 1 row the same.
   The 6-bit path below shares its inputs' broadcasts between the halves instead:
   split the same way it gained nothing.) */
static inline __attribute__((always_inline)) void q4_column(
    const uint8_t *blocks, int64_t groups, const int8_t *xq, const float *group_sum, int64_t stride,
    const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    float partial[MAX_ROWS * 16] __attribute__((aligned(32))); /* [row][channel]: the rows' results so far, in L1 */
    float *accm = partial;
    __asm__("" : "+r"(accm)); /* opaque: kept in memory, not 16 registers the halves' nibbles need */
    for (int i = 0; i < rows * 16; i += 8) _mm256_store_ps(accm + i, _mm256_setzero_ps());
#ifndef DPBUSD256
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q4_BLOCK_BYTES;
        ahead(b, Q4_BLOCK_BYTES, far);
        for (int h = 0; h < 2; h++) { /* channels 8h..8h+7 */
            __m256i w[8];
            nibbles(b + 32 * h, w);
            __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 256 + 16 * h)));
            __m256 z = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 288 + 16 * h)));
            const int8_t *xg = xq + g * GROUP;
            __asm__("" : "+r"(xg)); /* no sharing of the rows' broadcasts between halves */
            for (int r = 0; r < rows; r++) {
#ifdef DPBUSD256
                __m256 dot = _mm256_cvtepi32_ps(vnni_sums(w, (const int32_t *)(xg + r * k), _mm256_setzero_si256()));
#else
                __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pair_sums(w, (const int32_t *)(xg + r * k)), ones));
#endif
                float *a = accm + r * 16 + 8 * h;
                __m256 acc = _mm256_fmadd_ps(dot, s, _mm256_load_ps(a));
                _mm256_store_ps(a, _mm256_fmadd_ps(z, _mm256_set1_ps(group_sum[r * stride + g]), acc));
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(y + r * ldy + 8 * h, _mm256_mul_ps(_mm256_load_ps(accm + r * 16 + 8 * h),
                                                                _mm256_set1_ps(row_scale[r])));
}
/* 6-bit with AVX2: pair sums of two steps fit int16 (2 x 2 x 63 x 127 < 32768);
   same integers and float steps as the AVX-512 path. */
static inline __attribute__((always_inline)) void q6k_column(
    const uint8_t *blocks, int64_t groups, const int8_t *xq, const int32_t *part_shift, int64_t stride,
    const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    __m256 acc[MAX_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const __m256i pair = _mm256_set1_epi8(0x30);
#ifndef DPBUSD256
    const __m256i ones = _mm256_set1_epi16(1);
#endif
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q6_BLOCK_BYTES;
        ahead(b, Q6_BLOCK_BYTES, far);
        __m256i w[2][8];
        __m256 sc[2][2];
        for (int h = 0; h < 2; h++) {
            nibbles(b + 32 * h, w[h]);
            for (int s = 0; s < 2; s++) {
                __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 256 + 32 * (2 * s + h)));
                __m256i *ws = w[h] + 4 * s;
                ws[0] = _mm256_or_si256(ws[0], _mm256_and_si256(_mm256_slli_epi16(hb, 4), pair));
                ws[1] = _mm256_or_si256(ws[1], _mm256_and_si256(_mm256_slli_epi16(hb, 2), pair));
                ws[2] = _mm256_or_si256(ws[2], _mm256_and_si256(hb, pair));
                ws[3] = _mm256_or_si256(ws[3], _mm256_and_si256(_mm256_srli_epi16(hb, 2), pair));
                sc[s][h] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 384 + 32 * s + 16 * h)));
            }
        }
        for (int r = 0; r < rows; r++) {
            const int32_t *xr = (const int32_t *)(xq + r * k + g * GROUP);
            for (int s = 0; s < 2; s++) {
                __m256i x0 = _mm256_set1_epi32(xr[4 * s]), x1 = _mm256_set1_epi32(xr[4 * s + 1]);
                __m256i x2 = _mm256_set1_epi32(xr[4 * s + 2]), x3 = _mm256_set1_epi32(xr[4 * s + 3]);
                __m256i shift = _mm256_set1_epi32(part_shift[r * stride + 2 * g + s]);
                for (int h = 0; h < 2; h++) {
                    const __m256i *ws = w[h] + 4 * s;
#ifdef DPBUSD256
                    __m256i d = DPBUSD256(DPBUSD256(shift, ws[0], x0), ws[1], x1);
                    d = _mm256_add_epi32(d, DPBUSD256(DPBUSD256(_mm256_setzero_si256(), ws[2], x2), ws[3], x3));
#else
                    __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(ws[0], x0), _mm256_maddubs_epi16(ws[1], x1));
                    __m256i q = _mm256_add_epi16(_mm256_maddubs_epi16(ws[2], x2), _mm256_maddubs_epi16(ws[3], x3));
                    __m256i d = _mm256_add_epi32(_mm256_madd_epi16(p, ones), _mm256_madd_epi16(q, ones));
                    d = _mm256_add_epi32(d, shift);
#endif
                    acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sc[s][h], acc[r][h]);
                }
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(y + r * ldy + 8 * h, _mm256_mul_ps(acc[r][h], _mm256_set1_ps(row_scale[r])));
}
/* 8-bit with AVX2: VPMADDUBSW takes unsigned times signed bytes, and (q + 128) x
   pairs would saturate int16, so each product is |q| times x with q's sign
   (2 x 128 x 127 < 32768 a pair), widened to int32 at once: the same integer
   sum(q x) and float step as the AVX-512 path. */
static inline __attribute__((always_inline)) void q8_column(
    const uint8_t *blocks, int64_t groups, const int8_t *xq, const int32_t *group_shift, int64_t stride,
    const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
#ifndef DPBUSD256
    (void)group_shift, (void)stride;
#endif
    __m256 acc[MAX_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
#ifndef DPBUSD256
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
#endif
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q8_BLOCK_BYTES;
        ahead(b, Q8_BLOCK_BYTES, far);
        for (int h = 0; h < 2; h++) { /* channels 8h..8h+7 */
            __m256i w[8];
            __m256 s = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + 512 + 16 * h)));
#ifdef DPBUSD256
            /* as the AVX-512 path: sum((q + 128) x) - 128 sum(x), the row's group term */
            for (int t = 0; t < 8; t++) w[t] = _mm256_loadu_si256((const __m256i *)(b + 64 * t + 32 * h));
            for (int r = 0; r < rows; r++) {
                __m256i d = vnni_sums(w, (const int32_t *)(xq + r * k + g * GROUP),
                                      _mm256_set1_epi32(group_shift[r * stride + g]));
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc[r][h]);
            }
#else
            for (int t = 0; t < 8; t++)
                w[t] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 64 * t + 32 * h)), flip); /* q */
            for (int r = 0; r < rows; r++) {
                const int32_t *xr = (const int32_t *)(xq + r * k + g * GROUP);
                __m256i d = _mm256_setzero_si256();
                for (int t = 0; t < 8; t++) {
                    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w[t]), _mm256_sign_epi8(_mm256_set1_epi32(xr[t]), w[t]));
                    d = _mm256_add_epi32(d, _mm256_madd_epi16(p, ones));
                }
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), s, acc[r][h]);
            }
#endif
        }
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++)
            _mm256_storeu_ps(y + r * ldy + 8 * h, _mm256_mul_ps(acc[r][h], _mm256_set1_ps(row_scale[r])));
}
#endif
#else
/* The generic build's columns (ggml's *_generic dot products: scalar loops, no
   intrinsics). Each group's weights are unpacked once into q[channel][input] and
   used by every row of the block; the integers are the SIMD builds' exactly, and
   the float steps are theirs in the same order (fmaf for their fused multiply-adds),
   so every layout gives the SIMD builds' bits (tests/test_kernels.py). far: unused
   (no prefetch hints in plain C). */

/* A group's 16 x 32 nibbles (nibbles()'s layout: byte t*64 + j*4 + b holds channel
   j's inputs 4t+b, low nibble, and 16+4t+b, high nibble). */
static void unpack_nibbles(const uint8_t *b, uint8_t q[CHANNELS][GROUP]) {
    for (int t = 0; t < 4; t++)
        for (int j = 0; j < CHANNELS; j++)
            for (int i = 0; i < 4; i++) {
                uint8_t byte = b[64 * t + 4 * j + i];
                q[j][4 * t + i] = byte & 0x0F;
                q[j][16 + 4 * t + i] = byte >> 4;
            }
}

/* sum(q[i] * x[i]) over `count` inputs, in integers. */
static inline int32_t int_dot(const uint8_t *q, const int8_t *x, int count) {
    int32_t d = 0;
    for (int i = 0; i < count; i++) d += (int32_t)q[i] * x[i];
    return d;
}

static inline void store_rows(float acc[MAX_ROWS][CHANNELS], const float *row_scale, int rows, float *y,
                              int64_t ldy) {
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < CHANNELS; j++) y[r * ldy + j] = acc[r][j] * row_scale[r];
}

static void q4k_column(const uint8_t *column, int64_t groups, const int8_t *xq, const int16_t *sums, int64_t stride,
                       const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    (void)far;
    float acc[MAX_ROWS][CHANNELS] = {{0}};
    uint8_t q[CHANNELS][GROUP];
    const uint8_t *head = column;
    for (int64_t g0 = 0; g0 < groups; g0 += SUPER_GROUPS) {
        int count = groups - g0 < SUPER_GROUPS ? (int)(groups - g0) : SUPER_GROUPS;
        const uint8_t *first = head + SUPER_HEAD;
        int32_t dots[MAX_ROWS][CHANNELS] = {{0}}, mins[MAX_ROWS][CHANNELS] = {{0}};
        for (int i = 0; i < count; i++) {
            const uint8_t *b = first + i * GROUP_BYTES, *sc = b + 256, *m = b + 272;
            unpack_nibbles(b, q);
            for (int r = 0; r < rows; r++) {
                const int8_t *x = xq + r * k + (g0 + i) * GROUP;
                int32_t group_sum = sums[r * stride + g0 + i];
                for (int j = 0; j < CHANNELS; j++) {
                    dots[r][j] += int_dot(q[j], x, GROUP) * sc[j];
                    mins[r][j] += m[j] * group_sum;
                }
            }
        }
        for (int j = 0; j < CHANNELS; j++) {
            float d = half_to_float(((const uint16_t *)head)[j]), dmin = half_to_float(((const uint16_t *)head)[16 + j]);
            for (int r = 0; r < rows; r++) {
                acc[r][j] = fmaf((float)dots[r][j], d, acc[r][j]);
                acc[r][j] = fmaf(-(float)mins[r][j], dmin, acc[r][j]);
            }
        }
        head = first + count * GROUP_BYTES;
    }
    store_rows(acc, row_scale, rows, y, ldy);
}

/* Q4_1's form: per group acc += s * dot + z * sum(group). */
static void q4_column(const uint8_t *blocks, int64_t groups, const int8_t *xq, const float *group_sum, int64_t stride,
                      const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    (void)far;
    float acc[MAX_ROWS][CHANNELS] = {{0}};
    uint8_t q[CHANNELS][GROUP];
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q4_BLOCK_BYTES;
        const uint16_t *s = (const uint16_t *)(b + 256), *z = (const uint16_t *)(b + 288);
        unpack_nibbles(b, q);
        for (int r = 0; r < rows; r++) {
            const int8_t *x = xq + r * k + g * GROUP;
            float sum = group_sum[r * stride + g];
            for (int j = 0; j < CHANNELS; j++) {
                acc[r][j] = fmaf((float)int_dot(q[j], x, GROUP), half_to_float(s[j]), acc[r][j]);
                acc[r][j] = fmaf(half_to_float(z[j]), sum, acc[r][j]);
            }
        }
    }
    store_rows(acc, row_scale, rows, y, ldy);
}

/* 6-bit: q = low nibble | high bit pair << 4 (six_bit_register's layout: the pairs
   of register 4s+f's byte i at bits 2f..2f+1 of byte i of the 64 at 256 + 64s);
   per 16-input part s, d = sum(q x) - 32 sum(x), acc += scale * d. */
static void q6k_column(const uint8_t *blocks, int64_t groups, const int8_t *xq, const int32_t *part_shift,
                       int64_t stride, const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    (void)far;
    float acc[MAX_ROWS][CHANNELS] = {{0}};
    uint8_t q[CHANNELS][GROUP];
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q6_BLOCK_BYTES;
        unpack_nibbles(b, q);
        for (int s = 0; s < 2; s++)
            for (int f = 0; f < 4; f++)
                for (int j = 0; j < CHANNELS; j++)
                    for (int i = 0; i < 4; i++)
                        q[j][16 * s + 4 * f + i] |= ((b[256 + 64 * s + 4 * j + i] >> (2 * f)) & 3) << 4;
        for (int r = 0; r < rows; r++) {
            const int8_t *x = xq + r * k + g * GROUP;
            for (int s = 0; s < 2; s++) {
                const uint16_t *sc = (const uint16_t *)(b + 384 + 32 * s);
                int32_t shift = part_shift[r * stride + 2 * g + s];
                for (int j = 0; j < CHANNELS; j++)
                    acc[r][j] = fmaf((float)(shift + int_dot(q[j] + 16 * s, x + 16 * s, 16)), half_to_float(sc[j]),
                                     acc[r][j]);
            }
        }
    }
    store_rows(acc, row_scale, rows, y, ldy);
}

/* 8-bit: byte t*64 + j*4 + i holds channel j's input 4t+i as q + 128; per group
   acc += scale * sum(q x). */
static void q8_column(const uint8_t *blocks, int64_t groups, const int8_t *xq, const int32_t *group_shift,
                      int64_t stride, const float *row_scale, int64_t k, int rows, int far, float *y, int64_t ldy) {
    (void)far, (void)group_shift, (void)stride;
    float acc[MAX_ROWS][CHANNELS] = {{0}};
    int8_t q[CHANNELS][GROUP];
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *b = blocks + g * Q8_BLOCK_BYTES;
        const uint16_t *sc = (const uint16_t *)(b + 512);
        for (int t = 0; t < 8; t++)
            for (int j = 0; j < CHANNELS; j++)
                for (int i = 0; i < 4; i++) q[j][4 * t + i] = (int8_t)(b[64 * t + 4 * j + i] ^ 0x80);
        for (int r = 0; r < rows; r++) {
            const int8_t *x = xq + r * k + g * GROUP;
            for (int j = 0; j < CHANNELS; j++) {
                int32_t d = 0;
                for (int i = 0; i < GROUP; i++) d += (int32_t)q[j][i] * x[i];
                acc[r][j] = fmaf((float)d, half_to_float(sc[j]), acc[r][j]);
            }
        }
    }
    store_rows(acc, row_scale, rows, y, ldy);
}
#endif

#ifdef OMNI_AMX
/* Long row blocks (a prompt's prefill, the drafter's prompt read) on AMX tiles: the
   products of many rows are compute-bound, and VPDPBUSD reaches ~0.5 TFLOPS on two
   cores where AMX's bf16 tiles multiply 16 x 16 x 32 at once. Each thread
   dequantizes two block columns (32 channels) to bf16 in the tiles' layout, once
   per call, then runs every row block over them. The rows go in as bf16: a row's
   result still depends on that row alone, but not on the same bits as the
   few-row path, so a speculative verification (k + 1 <= 9 rows) and a one-token
   step keep the integer kernel above and stay bit-identical (docs/performance.md). */

#define AMX_ROWS 32          /* rows from which a product runs on tiles */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_BF16 512        /* bf16 values a tile holds: 16 rows of 64 bytes */

/* Linux lends the tile registers to a process that asks (5.16 and later). */
static int amx_granted(void) {
    static int state = 0; /* 0 not asked, 1 granted, -1 refused; asked from the calling thread */
    if (!state) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state > 0;
}

int amx_rows(void) { return amx_granted() ? AMX_ROWS : 0; }

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Tiles 0-3: results (two row blocks x two block columns), 4-5: rows, 6-7: weights. */
static void configure_tiles(void) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.colsb[t] = 64, c.rows[t] = 16;
    _tile_loadconfig(&c);
}

/* One nibble register's 64 weights (16 channels x inputs 4t..4t+3, byte 4j+b:
   channel j, input 4t+b) as w = S q - M, into the weight tile's rows 2t and 2t+1
   (row i holds, per channel j, the bf16 pair of inputs 2i and 2i+1). s[qd], m[qd]:
   the channels' S and M spread to match the register's quarter qd (channels
   4qd..4qd+3, four lanes each). */
static inline __attribute__((always_inline)) void emit_bf16(__m512i w, const __m512 s[4], const __m512 m[4],
                                                            uint16_t *rows) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
#define QUARTER(qd) \
    _mm512_fmsub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(w, qd))), s[qd], m[qd])
    __m512i low = (__m512i)_mm512_cvtne2ps_pbh(QUARTER(1), QUARTER(0)); /* channels 0-7: dword 2j+h */
    __m512i high = (__m512i)_mm512_cvtne2ps_pbh(QUARTER(3), QUARTER(2));
#undef QUARTER
    _mm512_storeu_si512((void *)rows, _mm512_permutex2var_epi32(low, even, high));
    _mm512_storeu_si512((void *)(rows + 32), _mm512_permutex2var_epi32(low, odd, high));
}

/* The 16 channels' S and M spread for each quarter of a nibble register. */
static inline __attribute__((always_inline)) void spread(__m512 s, __m512 m, __m512 ss[4], __m512 ms[4]) {
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int qd = 0; qd < 4; qd++) {
        __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(4 * qd), _mm512_srli_epi32(lane, 2));
        ss[qd] = _mm512_permutexvar_ps(idx, s), ms[qd] = _mm512_permutexvar_ps(idx, m);
    }
}

/* A block column's weights as bf16 weight tiles, one per group of 32 inputs. */
static void dequantize_column(int kind, const uint8_t *column, int64_t groups, uint16_t *out) {
    __m512 ss[4], ms[4];
    if (kind == LAYOUT_Q4_K) {
        const uint8_t *head = column;
        for (int64_t g0 = 0; g0 < groups; g0 += SUPER_GROUPS) {
            int count = groups - g0 < SUPER_GROUPS ? (int)(groups - g0) : SUPER_GROUPS;
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)head));
            __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(head + 32)));
            const uint8_t *first = head + SUPER_HEAD;
            for (int i = 0; i < count; i++) {
                const uint8_t *b = first + i * GROUP_BYTES;
                __m512i w[8];
                nibbles(b, w);
                __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 256))));
                __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 272))));
                spread(_mm512_mul_ps(d, sc), _mm512_mul_ps(dmin, mn), ss, ms);
                for (int t = 0; t < 8; t++) emit_bf16(w[t], ss, ms, out + (g0 + i) * TILE_BF16 + 64 * t);
            }
            head = first + count * GROUP_BYTES;
        }
    } else if (kind == LAYOUT_Q8_0) {
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *b = column + g * Q8_BLOCK_BYTES;
            __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 512)));
            spread(sc, _mm512_mul_ps(sc, _mm512_set1_ps(128.0f)), ss, ms); /* s (q + 128) - 128 s */
            for (int t = 0; t < 8; t++)
                emit_bf16(_mm512_loadu_si512((const void *)(b + 64 * t)), ss, ms, out + g * TILE_BF16 + 64 * t);
        }
    } else if (kind == LAYOUT_Q6_K) {
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *b = column + g * Q6_BLOCK_BYTES;
            __m512i w[8];
            six_bits(b, w);
            for (int s = 0; s < 2; s++) {
                __m512 sc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 384 + 32 * s)));
                spread(sc, _mm512_mul_ps(sc, _mm512_set1_ps(32.0f)), ss, ms); /* s (q - 32) */
                for (int f = 0; f < 4; f++) emit_bf16(w[4 * s + f], ss, ms, out + g * TILE_BF16 + 64 * (4 * s + f));
            }
        }
    } else {
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *b = column + g * Q4_BLOCK_BYTES;
            __m512i w[8];
            nibbles(b, w);
            __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 256)));
            __m512 z = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 288)));
            spread(s, _mm512_sub_ps(_mm512_setzero_ps(), z), ss, ms); /* s q + z */
            for (int t = 0; t < 8; t++) emit_bf16(w[t], ss, ms, out + g * TILE_BF16 + 64 * t);
        }
    }
}

/* Row r of x as bf16 (rows past m: zeros, so whole row blocks can run). */
static void bf16_row(const float *x, int64_t m, int64_t k, int64_t r, uint16_t *out) {
    for (int64_t i = 0; i < k; i += 16) {
        __m256i v = r < m ? (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + r * k + i)) : _mm256_setzero_si256();
        _mm256_storeu_si256((__m256i *)(out + r * k + i), v);
    }
}

/* Block columns c and c + 1 (when c + 1 < columns) for every row block, from their
   weight tiles wt (two columns' worth). */
static void amx_columns(const uint16_t *xb, int64_t m, int64_t padded, int64_t k, const uint16_t *wt, int64_t c,
                        int64_t columns, float *y, int64_t ldy) {
    int64_t groups = k / GROUP, stride = k * 2;
    const uint16_t *w0 = wt, *w1 = wt + groups * TILE_BF16;
    float out[4][16 * 16];
    for (int64_t r0 = 0; r0 < padded; r0 += 32) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        const uint16_t *a0 = xb + r0 * k, *a1 = a0 + 16 * k;
        for (int64_t g = 0; g < groups; g++) {
            _tile_loadd(4, a0 + g * GROUP, stride);
            _tile_loadd(5, a1 + g * GROUP, stride);
            _tile_loadd(6, w0 + g * TILE_BF16, 64);
            _tile_loadd(7, w1 + g * TILE_BF16, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, out[0], 64);
        _tile_stored(1, out[1], 64);
        _tile_stored(2, out[2], 64);
        _tile_stored(3, out[3], 64);
        for (int half = 0; half < 2; half++)
            for (int side = 0; side < 2 && c + side < columns; side++)
                for (int64_t i = 0; i < 16 && r0 + 16 * half + i < m; i++)
                    memcpy(y + (r0 + 16 * half + i) * ldy + (c + side) * CHANNELS, out[2 * half + side] + 16 * i,
                           sizeof(float) * CHANNELS);
    }
}

/* A product of many rows on AMX tiles, by the current team (gemm_team): the rows in
   bf16 into room->xb, each thread's pair of columns dequantized into its own room->wt. */
static void amx_team(int kind, const float *x, int64_t m, int64_t k, const uint8_t *weights, int64_t column_bytes,
                     int64_t n, float *y, int64_t ldy, const Beside *beside, const GemmRoom *room, TeamBarrier *bar) {
    int64_t padded = (m + 31) / 32 * 32, columns = n / CHANNELS, pairs = (columns + 1) / 2, groups = k / GROUP;
    uint16_t *xb = room->xb, *wt = room->wt + (int64_t)omp_get_thread_num() * 2 * (room->k / GROUP) * TILE_BF16;
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < padded; r++) bf16_row(x, m, k, r, xb);
    if (beside) {
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < beside->items; i++) beside->prepare(beside->ctx, i);
    }
    team_wait(bar);
    configure_tiles();
#pragma omp for schedule(static) nowait
    for (int64_t p = 0; p < pairs; p++) {
        int64_t c = 2 * p;
        dequantize_column(kind, weights + c * column_bytes, groups, wt);
        if (c + 1 < columns)
            dequantize_column(kind, weights + (c + 1) * column_bytes, groups, wt + groups * TILE_BF16);
        else
            memset(wt + groups * TILE_BF16, 0, sizeof(uint16_t) * (size_t)(groups * TILE_BF16));
        amx_columns(xb, m, padded, k, wt, c, columns, y, ldy);
    }
    _tile_release();
    if (beside) {
        team_wait(bar);
#pragma omp for schedule(static) nowait
        for (int64_t c = 0; c < columns; c++) beside->finish(beside->ctx, c * CHANNELS);
    }
}
#else
int amx_rows(void) { return 0; }
#endif

#define ROWS_CASE(R, COLUMN, TERMS)                                                                        \
    case R:                                                                                                \
        COLUMN(column, groups, xq + r0 * k, (TERMS) + r0 * stride, stride, row_scale + r0, k, R,           \
               far && R >= FAR_ROWS && R < MAX_ROWS, y + r0 * ldy + c * CHANNELS, ldy);                    \
        break;
#define ROWS(COLUMN, TERMS)                                                                                \
    switch (rows) {                                                                                        \
        ROWS_CASE(1, COLUMN, TERMS) ROWS_CASE(2, COLUMN, TERMS) ROWS_CASE(3, COLUMN, TERMS)                \
        ROWS_CASE(4, COLUMN, TERMS) ROWS_CASE(5, COLUMN, TERMS) ROWS_CASE(6, COLUMN, TERMS)                \
        ROWS_CASE(7, COLUMN, TERMS) ROWS_CASE(8, COLUMN, TERMS)                                            \
    }

/* How long a thread spins at team_wait before it sleeps (TSC ticks: ~1-3 ms at 1-4
   GHz): the threads' shares of a target's product can finish tens of us apart, and
   a sleeper wakes late enough to show (with ~20 us, the residual add after a
   target's down product read 0.10 ms a forward, 0.02 with this:
   git show 524cea4:scripts/stack_phases.py). With more threads than CPUs a waiter
   holds the CPU of the thread it waits for, so it soon sleeps: pure spinning stalled such a forward
   for whole scheduler slices. */
#define SPIN_TICKS 3000000
#define CROWDED_SPIN_TICKS 2000
/* The clock a waiter spins by and its pause: the TSC on x86; in the generic build
   a count of polls (~1 ns each) and no pause instruction. */
#ifdef OMNI_SIMD
#define SPIN_CLOCK() __rdtsc()
#define SPIN_PAUSE() _mm_pause()
#else
static inline uint64_t spin_polls(void) {
    static _Thread_local uint64_t polls = 0;
    return polls++;
}
#define SPIN_CLOCK() spin_polls()
#define SPIN_PAUSE() ((void)0)
#endif

/* Sleep while *word holds value (sleep_while), or wake its sleepers: a futex on
   Linux; elsewhere the waiter yields its CPU and polls again (nothing to wake). */
static void sleep_while(_Atomic int *word, int value) {
#ifdef __linux__
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
#else
    (void)word, (void)value;
#ifdef _WIN32
    SwitchToThread();
#else
    sched_yield();
#endif
#endif
}

static void wake_all(_Atomic int *word) {
#ifdef __linux__
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
#else
    (void)word;
#endif
}

void team_wait(TeamBarrier *bar) {
    int threads = omp_get_num_threads();
    if (threads == 1) return;
    /* Read before arriving: the generation moves on only once every thread has arrived. */
    int generation = atomic_load_explicit(&bar->generation, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&bar->arrived, 1, memory_order_acq_rel) == threads - 1) {
        atomic_store_explicit(&bar->arrived, 0, memory_order_relaxed);
        atomic_store(&bar->generation, generation + 1);
        /* A syscall only for a sleeper (libgomp's barrier wakes every time). A waiter
           counts itself before it sleeps, and its futex wait checks the generation, so
           either this sees it or it sees the new generation. */
        if (atomic_load(&bar->sleepers))
            wake_all(&bar->generation);
        return;
    }
    static _Atomic int cpus = 0; /* omp_get_num_procs() asks the OS each time */
    if (!cpus) cpus = omp_get_num_procs();
    uint64_t until = SPIN_CLOCK() + (threads > cpus ? CROWDED_SPIN_TICKS : SPIN_TICKS);
    while (atomic_load_explicit(&bar->generation, memory_order_acquire) == generation) {
        if (SPIN_CLOCK() < until) {
            SPIN_PAUSE();
            continue;
        }
        atomic_fetch_add(&bar->sleepers, 1);
        sleep_while(&bar->generation, generation);
        atomic_fetch_sub(&bar->sleepers, 1);
    }
}

int gemm_room(GemmRoom *room, int64_t rows, int64_t k, int threads) {
    /* A row's sums padded to an even count (the Q4_K kernel reads them in pairs);
       the 6-bit layout's groups are of 16. */
    int64_t stride = k / 16 + 1;
    *room = (GemmRoom){.rows = rows, .k = k};
    room->xq = (int8_t *)lines((size_t)(rows * k));
    room->row_scale = (float *)malloc(sizeof(float) * (size_t)rows);
    room->sums = (int16_t *)malloc(sizeof(int16_t) * (size_t)(rows * stride));
    room->terms = malloc(sizeof(Term) * (size_t)(rows * stride));
    int failed = !room->xq || !room->row_scale || !room->sums || !room->terms;
#ifdef OMNI_AMX
    if (rows >= AMX_ROWS && amx_granted()) {
        room->xb = (uint16_t *)lines(sizeof(uint16_t) * (size_t)((rows + 31) / 32 * 32 * k));
        room->wt = (uint16_t *)lines(sizeof(uint16_t) * (size_t)(threads * 2 * (k / GROUP) * TILE_BF16));
        failed |= !room->xb || !room->wt;
    }
#else
    (void)threads;
#endif
    if (failed) gemm_room_free(room);
    return failed ? -1 : 0;
}

void gemm_room_free(GemmRoom *room) {
    free(room->xq), free(room->row_scale), free(room->sums), free(room->terms), free(room->xb), free(room->wt);
    *room = (GemmRoom){0};
}

/* x [m, k] float32 times weights [n, k] in layout `kind` (quant_gemm.h) into y [m, ldy]
   columns 0..n-1; k a multiple of 32, n of 16; m and k within the room's. */
int gemm_team(int kind, const float *x, int64_t m, int64_t k, const uint8_t *weights, int64_t n, float *y,
              int64_t ldy, const Beside *beside, const GemmRoom *room, TeamBarrier *bar) {
    int64_t groups = k / GROUP, supers = (groups + SUPER_GROUPS - 1) / SUPER_GROUPS, column_bytes;
    switch (kind) {
    case LAYOUT_Q4_1: column_bytes = groups * Q4_BLOCK_BYTES; break;
    case LAYOUT_Q4_K: column_bytes = supers * SUPER_HEAD + groups * GROUP_BYTES; break;
    case LAYOUT_Q6_K: column_bytes = groups * Q6_BLOCK_BYTES; break;
    case LAYOUT_Q8_0: column_bytes = groups * Q8_BLOCK_BYTES; break;
    default: return -1;
    }
#ifdef OMNI_AMX
    if (m >= AMX_ROWS && room->xb) {
        amx_team(kind, x, m, k, weights, column_bytes, n, y, ldy, beside, room, bar);
        return 0;
    }
#endif
    int64_t width = kind == LAYOUT_Q6_K ? 16 : GROUP, per_row = k / width, stride = per_row + per_row % 2;
    int8_t *xq = room->xq;
    float *row_scale = room->row_scale;
    int16_t *sums = room->sums;
    /* What the other layouts' kernels take per row and group from the sums, ready to
       broadcast from memory: Q6_K's -32 sum and Q8_0's -128 sum (int32), Q4_1's sum
       as a float. Each formed in the loop as a broadcast from a general register cost
       its 6-bit kernel 11-13% at 8-64 rows (docs/performance.md). */
    Term *terms = kind == LAYOUT_Q4_K ? NULL : (Term *)room->terms;
    int64_t columns = n / CHANNELS;
    /* The far prefetch (ahead): for long streams only, and not for Q4_1's products
       (the drafter's: its 3-4-row forwards were 3% slower with it). */
#ifdef OMNI_AMX
    /* On Intel's Xeons every product streams better with it, the drafter's Q4_1 and
       the small ones included: its one-row forward 8.44 -> 4.36 ms, the target's
       products 2-11% faster at 1-8 rows (tools/kernel_ab.py, plain and --gemm). */
    int far = 1;
#else
    int far = kind != LAYOUT_Q4_1 && columns * column_bytes >= FAR_MIN_BYTES;
#endif
#pragma omp for schedule(static) nowait
    for (int64_t r = 0; r < m; r++) {
        quantize_row(x + r * k, k, xq + r * k, row_scale + r, sums + r * stride, width);
        if (stride > per_row) sums[r * stride + per_row] = 0;
        if (terms) row_terms(kind, sums + r * stride, per_row, terms + r * stride);
    }
    if (beside) {
#pragma omp for schedule(static) nowait
        for (int64_t i = 0; i < beside->items; i++) beside->prepare(beside->ctx, i);
    }
    team_wait(bar);
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < columns; c++) {
        const uint8_t *column = weights + c * column_bytes;
        for (int64_t r0 = 0; r0 < m; r0 += MAX_ROWS) {
            int64_t rows = m - r0 < MAX_ROWS ? m - r0 : MAX_ROWS;
            if (kind == LAYOUT_Q4_K) {
                ROWS(q4k_column, sums)
            } else if (kind == LAYOUT_Q6_K) {
                ROWS(q6k_column, (const int32_t *)terms)
            } else if (kind == LAYOUT_Q8_0) {
                ROWS(q8_column, (const int32_t *)terms)
            } else {
                ROWS(q4_column, (const float *)terms)
            }
        }
    }
    if (beside) {
        team_wait(bar);
#pragma omp for schedule(static) nowait
        for (int64_t c = 0; c < columns; c++) beside->finish(beside->ctx, c * CHANNELS);
    }
    return 0;
}

/* One product on `threads` threads of its own (one fork: the rows' quantization,
   the columns, what runs beside). Returns 0, or -1 when out of memory or for an
   unknown layout. */
int gemm_beside(int kind, const float *x, int64_t m, int64_t k, const uint8_t *weights, int64_t n, float *y,
                int64_t ldy, int threads, const Beside *beside) {
    GemmRoom room;
    if (gemm_room(&room, m, k, threads)) return -1;
    TeamBarrier bar = {0};
    int failed = 0;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        if (gemm_team(kind, x, m, k, weights, n, y, ldy, beside, &room, &bar)) failed = 1;
    }
    gemm_room_free(&room);
    return failed ? -1 : 0;
}

int quant_gemm(int kind, const float *x, int64_t m, int64_t k, const uint8_t *weights, int64_t n, float *y,
               int64_t ldy, int threads) {
    return gemm_beside(kind, x, m, k, weights, n, y, ldy, threads, NULL);
}
