/* The AVX-512 intrinsics core/kernels/csrc/quant_gemm.c and decoder_stack.c use, emulated
   lane by lane on an AVX2 CPU, so that their AVX-512 paths run (slowly) where
   AVX-512 does not: tests/test_kernels.py builds the kernels with `-include` of this
   file and checks them against the AVX2 build. Each emulation does what the instruction does to
   the values the kernel gives it (same rounding: fmaf rounds once, as VFMADD does;
   float conversions round to nearest even, as the default MXCSR does). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct { float f[16]; } E512;
typedef union { int32_t i[16]; int16_t h[32]; uint8_t b[64]; } E512i;

#define E static inline
E E512 e_setzero_ps(void) { E512 r; memset(&r, 0, sizeof r); return r; }
E E512i e_setzero_si512(void) { E512i r; memset(&r, 0, sizeof r); return r; }
E E512 e_set1_ps(float v) { E512 r; for (int i = 0; i < 16; i++) r.f[i] = v; return r; }
E E512i e_set1_epi32(int32_t v) { E512i r; for (int i = 0; i < 16; i++) r.i[i] = v; return r; }
E E512i e_set1_epi8(char v) { E512i r; memset(r.b, (uint8_t)v, 64); return r; }
E E512 e_loadu_ps(const float *p) { E512 r; memcpy(&r, p, 64); return r; }
E E512i e_loadu_si512(const void *p) { E512i r; memcpy(&r, p, 64); return r; }
E void e_storeu_ps(float *p, E512 v) { memcpy(p, &v, 64); }

#define LANES(T, n, expr) { T r; for (int i = 0; i < (n); i++) expr; return r; }
E E512 e_add_ps(E512 a, E512 b) LANES(E512, 16, r.f[i] = a.f[i] + b.f[i])
E E512 e_sub_ps(E512 a, E512 b) LANES(E512, 16, r.f[i] = a.f[i] - b.f[i])
E E512 e_mul_ps(E512 a, E512 b) LANES(E512, 16, r.f[i] = a.f[i] * b.f[i])
E E512 e_div_ps(E512 a, E512 b) LANES(E512, 16, r.f[i] = a.f[i] / b.f[i])
E E512 e_min_ps(E512 a, E512 b) LANES(E512, 16, r.f[i] = a.f[i] < b.f[i] ? a.f[i] : b.f[i])
E E512 e_roundscale_ps(E512 a, int mode) LANES(E512, 16, r.f[i] = nearbyintf(a.f[i]) + 0 * mode) /* to nearest */
E E512 e_scalef_ps(E512 a, E512 b) LANES(E512, 16, r.f[i] = ldexpf(a.f[i], (int)floorf(b.f[i])))
E E512 e_maskz_loadu_ps(__mmask16 m, const float *p) LANES(E512, 16, r.f[i] = (m >> i) & 1 ? p[i] : 0.0f)
E E512 e_mask_blend_ps(__mmask16 m, E512 a, E512 b) LANES(E512, 16, r.f[i] = (m >> i) & 1 ? b.f[i] : a.f[i])
E E512 e_max_ps(E512 a, E512 b) LANES(E512, 16, r.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i])
E E512 e_abs_ps(E512 a) LANES(E512, 16, r.f[i] = fabsf(a.f[i]))
E E512 e_fmadd_ps(E512 a, E512 b, E512 c) LANES(E512, 16, r.f[i] = fmaf(a.f[i], b.f[i], c.f[i]))
E E512 e_fnmadd_ps(E512 a, E512 b, E512 c) LANES(E512, 16, r.f[i] = fmaf(-a.f[i], b.f[i], c.f[i]))
E E512 e_cvtepi32_ps(E512i a) LANES(E512, 16, r.f[i] = (float)a.i[i])
E E512i e_cvtps_epi32(E512 a) LANES(E512i, 16, r.i[i] = (int32_t)nearbyintf(a.f[i]))
E E512i e_add_epi32(E512i a, E512i b) LANES(E512i, 16, r.i[i] = (int32_t)((uint32_t)a.i[i] + (uint32_t)b.i[i]))
E E512i e_sub_epi32(E512i a, E512i b) LANES(E512i, 16, r.i[i] = (int32_t)((uint32_t)a.i[i] - (uint32_t)b.i[i]))
E E512i e_mullo_epi32(E512i a, E512i b) LANES(E512i, 16, r.i[i] = (int32_t)((uint32_t)a.i[i] * (uint32_t)b.i[i]))
E E512i e_and_si512(E512i a, E512i b) LANES(E512i, 16, r.i[i] = a.i[i] & b.i[i])
E E512i e_or_si512(E512i a, E512i b) LANES(E512i, 16, r.i[i] = a.i[i] | b.i[i])
E E512i e_srli_epi16(E512i a, int n) LANES(E512i, 32, r.h[i] = (int16_t)((uint16_t)a.h[i] >> n))
E E512i e_slli_epi16(E512i a, int n) LANES(E512i, 32, r.h[i] = (int16_t)((uint16_t)a.h[i] << n))
E E512i e_madd_epi16(E512i a, E512i b)
    LANES(E512i, 16, r.i[i] = a.h[2 * i] * b.h[2 * i] + a.h[2 * i + 1] * b.h[2 * i + 1])
E E512i e_dpbusd_epi32(E512i src, E512i a, E512i b) /* a's bytes unsigned, b's signed */
    LANES(E512i, 16, { r.i[i] = src.i[i]; for (int j = 0; j < 4; j++) r.i[i] += a.b[4 * i + j] * (int8_t)b.b[4 * i + j]; })

E void e_mask_storeu_ps(float *p, __mmask16 m, E512 v) {
    for (int i = 0; i < 16; i++)
        if ((m >> i) & 1) p[i] = v.f[i];
}
/* GCC's own order: the halves added, then their halves, then pairs. */
E float e_reduce_add_ps(E512 a) {
    float t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = a.f[i + 8] + a.f[i];
    for (int i = 0; i < 4; i++) u[i] = t[i + 4] + t[i];
    return (u[0] + u[2]) + (u[1] + u[3]);
}
E float e_reduce_max_ps(E512 a) { float m = a.f[0]; for (int i = 1; i < 16; i++) m = a.f[i] > m ? a.f[i] : m; return m; }
E int32_t e_reduce_add_epi32(E512i a) { uint32_t s = 0; for (int i = 0; i < 16; i++) s += (uint32_t)a.i[i]; return (int32_t)s; }
E __m128i e_cvtepi32_epi8(E512i a) { /* VPMOVDB: truncation */
    int8_t out[16];
    for (int i = 0; i < 16; i++) out[i] = (int8_t)a.i[i];
    return _mm_loadu_si128((const __m128i *)out);
}
E E512 e_cvtph_ps(__m256i h) {
    E512 r;
    _mm256_storeu_ps(r.f, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_storeu_ps(r.f + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    return r;
}
E __m256i e_cvtps_ph(E512 a, int rounding) {
    __m128i lo = _mm256_cvtps_ph(_mm256_loadu_ps(a.f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128i hi = _mm256_cvtps_ph(_mm256_loadu_ps(a.f + 8), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    (void)rounding; /* the stack only rounds to nearest */
    return _mm256_set_m128i(hi, lo);
}
E E512i e_cvtepu8_epi32(__m128i v) { uint8_t b[16]; _mm_storeu_si128((__m128i *)b, v); LANES(E512i, 16, r.i[i] = b[i]) }
E E512i e_cvtepu8_epi16(__m256i v) { uint8_t b[32]; _mm256_storeu_si256((__m256i *)b, v); LANES(E512i, 32, r.h[i] = b[i]) }
/* Within each 128-bit chunk c (floats 4c..4c+3), as the instructions do. __m512d is
   held as 16 floats, a double as its two: only moved, never computed on, here. */
E E512 e_unpacklo_ps(E512 a, E512 b)
    LANES(E512, 16, r.f[i] = (i % 2 ? b : a).f[i / 4 * 4 + i % 4 / 2])
E E512 e_unpackhi_ps(E512 a, E512 b)
    LANES(E512, 16, r.f[i] = (i % 2 ? b : a).f[i / 4 * 4 + 2 + i % 4 / 2])
E E512 e_unpacklo_pd(E512 a, E512 b) LANES(E512, 16, r.f[i] = (i % 4 < 2 ? a : b).f[i / 4 * 4 + i % 2])
E E512 e_unpackhi_pd(E512 a, E512 b) LANES(E512, 16, r.f[i] = (i % 4 < 2 ? a : b).f[i / 4 * 4 + 2 + i % 2])
E E512 e_shuffle_f32x4(E512 a, E512 b, int imm)
    LANES(E512, 16, r.f[i] = (i < 8 ? a : b).f[(imm >> (2 * (i / 4)) & 3) * 4 + i % 4])
E E512 e_cast(E512 a) { return a; }
#undef LANES
#undef E

#define __m512 E512
#define __m512i E512i
#define __m512d E512
#define _mm512_unpacklo_ps e_unpacklo_ps
#define _mm512_unpackhi_ps e_unpackhi_ps
#define _mm512_unpacklo_pd e_unpacklo_pd
#define _mm512_unpackhi_pd e_unpackhi_pd
#define _mm512_shuffle_f32x4 e_shuffle_f32x4
#define _mm512_castps_pd e_cast
#define _mm512_castpd_ps e_cast
#define _mm512_setzero_ps e_setzero_ps
#define _mm512_setzero_si512 e_setzero_si512
#define _mm512_set1_ps e_set1_ps
#define _mm512_set1_epi32 e_set1_epi32
#define _mm512_set1_epi8 e_set1_epi8
#define _mm512_loadu_ps e_loadu_ps
#define _mm512_loadu_si512 e_loadu_si512
#define _mm512_storeu_ps e_storeu_ps
#define _mm512_add_ps e_add_ps
#define _mm512_sub_ps e_sub_ps
#define _mm512_mul_ps e_mul_ps
#define _mm512_div_ps e_div_ps
#define _mm512_min_ps e_min_ps
#define _mm512_roundscale_ps e_roundscale_ps
#define _mm512_scalef_ps e_scalef_ps
#define _mm512_maskz_loadu_ps e_maskz_loadu_ps
#define _mm512_mask_storeu_ps e_mask_storeu_ps
#define _mm512_mask_blend_ps e_mask_blend_ps
#define _mm512_reduce_add_ps e_reduce_add_ps
#define _mm512_max_ps e_max_ps
#define _mm512_abs_ps e_abs_ps
#define _mm512_fmadd_ps e_fmadd_ps
#define _mm512_fnmadd_ps e_fnmadd_ps
#define _mm512_cvtepi32_ps e_cvtepi32_ps
#define _mm512_cvtps_epi32 e_cvtps_epi32
#define _mm512_add_epi32 e_add_epi32
#define _mm512_sub_epi32 e_sub_epi32
#define _mm512_mullo_epi32 e_mullo_epi32
#define _mm512_and_si512 e_and_si512
#define _mm512_or_si512 e_or_si512
#define _mm512_srli_epi16 e_srli_epi16
#define _mm512_slli_epi16 e_slli_epi16
#define _mm512_madd_epi16 e_madd_epi16
#define _mm512_dpbusd_epi32 e_dpbusd_epi32
#define _mm512_reduce_max_ps e_reduce_max_ps
#define _mm512_reduce_add_epi32 e_reduce_add_epi32
#define _mm512_cvtepi32_epi8 e_cvtepi32_epi8
#define _mm512_cvtph_ps e_cvtph_ps
#define _mm512_cvtps_ph e_cvtps_ph
#define _mm512_cvtepu8_epi32 e_cvtepu8_epi32
#define _mm512_cvtepu8_epi16 e_cvtepu8_epi16
#define __AVX512F__ 1
#define __AVX512VNNI__ 1
