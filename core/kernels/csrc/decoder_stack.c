/* A Llama-family decoder stack in one call, every projection 4-bit or 6-bit
(quant_gemm.c): the drafter's forward and a GGUF target's
(core/models/lean_llama.py).

Why: the drafter's weights stream in ~2 ms, but a forward of its 30 layers as
torch ops costs ~6 ms, most of it per-op overhead (~25 small ops a layer:
norms, RoPE, the KV copy, attention on one query row); the target's 28 layers
spent ~21 ms a token that way on an AVX2 CPU. Here a layer is its products and
plain loops between them, and the whole stack is one call.

Per layer, for the n new rows at positions start..start+n-1:
  h = rms_norm(x) * norm1;  q, k, v = h Wqkv^T (+ b);  RoPE on q and k;
  keys/values of the new positions into the cache; causal grouped-query attention
  (a drafter's within its window: first_recent);
  x += att Wo^T;  h = rms_norm(x) * norm2;  gate, up = h Wgu^T;  x += (silu(gate) * up) Wd^T.
x comes in as the embeddings and leaves as the last layer's residual stream, through
the final norm where one is given (the LM head stays in torch), in its last `needed`
rows; the last layer stops at the keys and values for the others, whose residual no
one reads (a prompt's rows but its last: 1/28 of the 1.5B's prompt read). Cache
layout [layer, 2, kv head, capacity, head_dim], as LeanLlama holds it, in fp16: after
thousands of positions the keys and values are what a step reads besides the weights (57 KB a position for
Qwen2.5-1.5B in float32, 46 KB for the drafter, whose weights are 84 MB), and the
ones written are the ones read, so a verified row still sees what its one-token
step would (docs/performance.md); cos/sin [capacity, head_dim] from the model's
own rotary embedding, so every RoPE variant comes out as the model computes it.
Attention's multiply-adds run in bf16 where the build has AVX512-BF16 (ATT_BF16,
below), float32 elsewhere.
A projection may come in parts side by side (a target whose file stores q and k
in 4 bits and v in 6), each its own product into its columns.

The norms, RoPE, SiLU and residual adds split their rows between the threads, as
the products and attention do: with the products on AMX tiles, those loops on one
thread were a sixth of a 200-token prompt read (tools/kernel_ab.py --prompt 200).
*/
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_gemm.h"

#ifdef OMNI_SIMD
#include <immintrin.h>
#endif

typedef struct {
    const uint8_t *packed; /* quant_gemm.c's block layouts */
    const float *bias;     /* NULL: none */
    int64_t out;           /* 0: no such part */
    int64_t kind;          /* the layout: LAYOUT_Q4_1, LAYOUT_Q4_K, LAYOUT_Q6_K or LAYOUT_Q8_0 */
    /* A learned adapter beside the 4-bit weight, y += (x A^T) B^T per part of a
       fused projection (q, k, v): rounding it into 4 bits would bury it
       (docs/learning.md). NULL: none. A [parts * rank, in] and B^T [rank, out],
       both fp16 (half the bytes to stream, ample precision for a change); part p
       covers outputs part_end[p-1]..part_end[p] (multiples of 16) and columns
       p*rank.. of x A^T. */
    const uint16_t *lora_a, *lora_b;
    const int64_t *part_end;
    int64_t parts, rank;
} Projection;

typedef struct {
    const float *norm1, *norm2;
    Projection qkv[3], o, gate_up[2], down;
} Layer;

/* Float vectors of VW lanes: AVX-512 (16) where the CPU has it, else AVX2 with FMA
and F16C (8), so one source serves both builds (core/kernels/build.py picks the flags). */
#ifdef OMNI_ZMM
#define VW 16
typedef __m512 vec;
typedef __mmask16 vmask;
#define vzero _mm512_setzero_ps
#define vset1 _mm512_set1_ps
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vdiv _mm512_div_ps
#define vmin _mm512_min_ps
#define vmax _mm512_max_ps
#define vfmadd _mm512_fmadd_ps
#define vfnmadd _mm512_fnmadd_ps
#define vsum _mm512_reduce_add_ps
#define vhmax _mm512_reduce_max_ps
/* The lanes of the next VW values of which `left` remain. */
static inline vmask tail(int64_t left) { return left >= 16 ? 0xFFFF : (vmask)((1u << left) - 1); }
static inline vec vload_tail(const float *p, vmask m) { return _mm512_maskz_loadu_ps(m, p); }
static inline void vstore_tail(float *p, vmask m, vec v) { _mm512_mask_storeu_ps(p, m, v); }
static inline vec vselect(vmask m, vec a, vec b) { return _mm512_mask_blend_ps(m, b, a); } /* m ? a : b */
static inline vec vhalf(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline void vstore_half(uint16_t *p, vec v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vec vround(vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vec vexp2_times(vec p, vec n) { return _mm512_scalef_ps(p, n); } /* p * 2^n */
#elif defined(OMNI_SIMD)
#define VW 8
typedef __m256 vec;
typedef __m256i vmask;
#define vzero _mm256_setzero_ps
#define vset1 _mm256_set1_ps
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vdiv _mm256_div_ps
#define vmin _mm256_min_ps
#define vmax _mm256_max_ps
#define vfmadd _mm256_fmadd_ps
#define vfnmadd _mm256_fnmadd_ps
static inline float vsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float vhmax(vec v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
static inline vmask tail(int64_t left) {
    static const int32_t lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(lanes + 8 - (left >= 8 ? 8 : left)));
}
static inline vec vload_tail(const float *p, vmask m) { return _mm256_maskload_ps(p, m); }
static inline void vstore_tail(float *p, vmask m, vec v) { _mm256_maskstore_ps(p, m, v); }
static inline vec vselect(vmask m, vec a, vec b) { return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m)); }
static inline vec vhalf(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void vstore_half(uint16_t *p, vec v) {
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vec vround(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vec vexp2_times(vec p, vec n) { /* n in -127..127: build 2^n from its exponent bits */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#else
#define VW 16 /* the generic build's: the unit run_stack splits a row's SiLU in */
#endif

#ifdef OMNI_SIMD
/* Row r of x [., dim] RMS-normalized and scaled by w into out; dim a multiple of 16. */
static void rms_norm_row(const float *x, const float *w, float eps, int64_t dim, float *out) {
    vec ss = vzero();
    for (int64_t i = 0; i < dim; i += VW) ss = vfmadd(vload(x + i), vload(x + i), ss);
    vec inv = vset1(1.0f / sqrtf(vsum(ss) / (float)dim + eps));
    for (int64_t i = 0; i < dim; i += VW) vstore(out + i, vmul(vmul(vload(x + i), inv), vload(w + i)));
}

/* x += add over dim values (a multiple of 16). */
static void add_row(float *x, const float *add, int64_t dim) {
    for (int64_t i = 0; i < dim; i += VW) vstore(x + i, vadd(vload(x + i), vload(add + i)));
}

/* a (float32) . b (fp16) over len values, a multiple of 32 (the 4-bit kernel's group);
   two accumulators, so consecutive multiply-adds do not wait on each other. */
static inline float dot(const float *a, const uint16_t *b, int64_t len) {
    vec acc0 = vzero(), acc1 = vzero();
    for (int64_t i = 0; i < len; i += 2 * VW) {
        acc0 = vfmadd(vload(a + i), vhalf(b + i), acc0);
        acc1 = vfmadd(vload(a + i + VW), vhalf(b + i + VW), acc1);
    }
    return vsum(vadd(acc0, acc1));
}
#else
/* The generic build's row loops: sums in order, the norm's in double as ggml's
   generic rms_norm takes it. */
static void rms_norm_row(const float *x, const float *w, float eps, int64_t dim, float *out) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; i++) ss += (double)(x[i] * x[i]);
    float inv = 1.0f / sqrtf((float)(ss / (double)dim) + eps);
    for (int64_t i = 0; i < dim; i++) out[i] = x[i] * inv * w[i];
}

static void add_row(float *x, const float *add, int64_t dim) {
    for (int64_t i = 0; i < dim; i++) x[i] += add[i];
}

static inline float dot(const float *a, const uint16_t *b, int64_t len) {
    float s = 0.0f;
    for (int64_t i = 0; i < len; i++) s += a[i] * half_to_float(b[i]);
    return s;
}
#endif

/* The adapter and the bias beside a projection's product, on its threads (a Beside,
   quant_gemm.h): t = x A^T while the product quantizes its rows, then y += t B^T
   and the bias. As a parallel region of its own after the product, a rank-8 adapter
   on all seven projections added 0.59-1.03 ms to a drafter's one-row forward, and
   0.43-0.74 ms this way (tools/kernel_ab.py --against 2f25811, AVX2). */
typedef struct {
    const Projection *p;
    const float *x;
    float *y, *t; /* t [parts * rank, n] */
    int64_t n, k, ldy;
} Extra;

#ifdef OMNI_SIMD
/* A prompt or a re-sync (n >= 8): item = a block of 4 rows (in L1) run over every
   factor row, each fp16 factor vector widened once for four rows (row by row, factor
   rows outer, the drafter's 160-token prompt read took 1.55x as long with a rank-32
   adapter as without; git show 524cea4:scripts/adapter_cost.py). A few rows: item =
   a factor row. */
static void extra_prepare(void *ctx, int64_t item) {
    const Extra *e = ctx;
    const Projection *p = e->p;
    int64_t n = e->n, k = e->k, width = p->parts * p->rank;
    if (n < 8) {
        for (int64_t r = 0; r < n; r++) e->t[item * n + r] = dot(e->x + r * k, p->lora_a + item * k, k);
        return;
    }
    int64_t r = 4 * item;
    const float *x0 = e->x + r * k;
    for (int64_t j = 0; j < width; j++) {
        const uint16_t *a = p->lora_a + j * k;
        if (r + 4 > n) {
            for (int64_t q = r; q < n; q++) e->t[j * n + q] = dot(e->x + q * k, a, k);
            continue;
        }
        vec s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero();
        for (int64_t i = 0; i < k; i += VW) {
            vec w = vhalf(a + i);
            s0 = vfmadd(vload(x0 + i), w, s0);
            s1 = vfmadd(vload(x0 + k + i), w, s1);
            s2 = vfmadd(vload(x0 + 2 * k + i), w, s2);
            s3 = vfmadd(vload(x0 + 3 * k + i), w, s3);
        }
        float *tj = e->t + j * n + r;
        tj[0] = vsum(s0), tj[1] = vsum(s1), tj[2] = vsum(s2), tj[3] = vsum(s3);
    }
}

/* Outputs o0..o0+15, all in one part (parts end at multiples of 16): y += sum over
   the rank of t * B^T rows, then the bias. */
static void extra_finish(void *ctx, int64_t o0) {
    const Extra *e = ctx;
    const Projection *p = e->p;
    int64_t n = e->n, ldy = e->ldy;
    if (p->lora_a) {
        int64_t part = 0;
        while (o0 >= p->part_end[part]) part++;
        const float *tp = e->t + part * p->rank * n;
        for (int64_t o = o0; o < o0 + 16; o += VW) {
            const uint16_t *b = p->lora_b + o;
            int64_t r = 0;
            for (; r + 4 <= n; r += 4) {
                float *y0 = e->y + r * ldy + o;
                vec s0 = vload(y0), s1 = vload(y0 + ldy), s2 = vload(y0 + 2 * ldy), s3 = vload(y0 + 3 * ldy);
                for (int64_t i = 0; i < p->rank; i++) {
                    vec w = vhalf(b + i * p->out);
                    const float *ti = tp + i * n + r;
                    s0 = vfmadd(vset1(ti[0]), w, s0);
                    s1 = vfmadd(vset1(ti[1]), w, s1);
                    s2 = vfmadd(vset1(ti[2]), w, s2);
                    s3 = vfmadd(vset1(ti[3]), w, s3);
                }
                vstore(y0, s0), vstore(y0 + ldy, s1), vstore(y0 + 2 * ldy, s2), vstore(y0 + 3 * ldy, s3);
            }
            for (; r < n; r++) {
                vec acc = vload(e->y + r * ldy + o);
                for (int64_t i = 0; i < p->rank; i++) acc = vfmadd(vset1(tp[i * n + r]), vhalf(b + i * p->out), acc);
                vstore(e->y + r * ldy + o, acc);
            }
        }
    }
    if (p->bias)
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = o0; i < o0 + 16; i++) e->y[r * ldy + i] += p->bias[i];
}
#else
/* The generic build's adapter: the items split as above, each of t's values one
   dot() whatever item computes it. */
static void extra_prepare(void *ctx, int64_t item) {
    const Extra *e = ctx;
    const Projection *p = e->p;
    int64_t n = e->n, k = e->k, width = p->parts * p->rank;
    if (n < 8) {
        for (int64_t r = 0; r < n; r++) e->t[item * n + r] = dot(e->x + r * k, p->lora_a + item * k, k);
        return;
    }
    for (int64_t r = 4 * item; r < n && r < 4 * item + 4; r++)
        for (int64_t j = 0; j < width; j++) e->t[j * n + r] = dot(e->x + r * k, p->lora_a + j * k, k);
}

static void extra_finish(void *ctx, int64_t o0) {
    const Extra *e = ctx;
    const Projection *p = e->p;
    int64_t n = e->n, ldy = e->ldy;
    if (p->lora_a) {
        int64_t part = 0;
        while (o0 >= p->part_end[part]) part++;
        const float *tp = e->t + part * p->rank * n;
        for (int64_t r = 0; r < n; r++)
            for (int64_t o = o0; o < o0 + 16; o++) {
                float acc = e->y[r * ldy + o];
                for (int64_t i = 0; i < p->rank; i++) acc += tp[i * n + r] * half_to_float(p->lora_b[i * p->out + o]);
                e->y[r * ldy + o] = acc;
            }
    }
    if (p->bias)
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = o0; i < o0 + 16; i++) e->y[r * ldy + i] += p->bias[i];
}
#endif

/* y [n, ldy] columns 0..out-1 = x p^T (+ adapter, + bias), by the current team (the
   caller's next team_wait completes y); t: room for x A^T. The layout is one
   gemm_team knows (scan_layers checked), so every thread runs it. */
static void project(const Projection *p, const float *x, int64_t n, int64_t k, float *y, int64_t ldy,
                    const GemmRoom *room, float *t, TeamBarrier *bar) {
    int kind = (int)p->kind;
    if (!p->lora_a && !p->bias) {
        gemm_team(kind, x, n, k, p->packed, p->out, y, ldy, NULL, room, bar);
        return;
    }
    int64_t width = p->lora_a ? p->parts * p->rank : 0;
    Extra extra = {p, x, y, t, n, k, ldy};
    Beside beside = {width ? (n >= 8 ? (n + 3) / 4 : width) : 0, extra_prepare, extra_finish, &extra};
    gemm_team(kind, x, n, k, p->packed, p->out, y, ldy, &beside, room, bar);
}

/* The parts of one projection side by side into y [n, width], complete when every
   thread has returned. */
static void project_parts(const Projection *parts, int count, const float *x, int64_t n, int64_t k, float *y,
                          int64_t width, const GemmRoom *room, float *t, TeamBarrier *bar) {
    for (int64_t i = 0, col = 0; i < count && parts[i].out; col += parts[i].out, i++) {
        project(parts + i, x, n, k, y + col, width, room, t, bar);
        team_wait(bar); /* the parts share the room's rows and t, and the caller reads y */
    }
}

/* What a forward needs to know of its layers before its threads start: the widest
   x A^T of their adapters, per row (0: none), or -1 where a projection's layout is
   not one of the products' (checked here, not by each thread of the team). */
static int64_t scan_layers(const Layer *layers, int64_t n_layers) {
    int64_t widest = 0;
    for (int64_t l = 0; l < n_layers; l++) {
        const Layer *L = layers + l;
        const Projection *all[7] = {L->qkv, L->qkv + 1, L->qkv + 2, &L->o, L->gate_up, L->gate_up + 1, &L->down};
        for (int i = 0; i < 7; i++) {
            const Projection *p = all[i];
            if (!p->out) continue;
            if (p->kind != LAYOUT_Q4_1 && p->kind != LAYOUT_Q4_K && p->kind != LAYOUT_Q6_K && p->kind != LAYOUT_Q8_0)
                return -1;
            if (p->lora_a && p->parts * p->rank > widest) widest = p->parts * p->rank;
        }
    }
    return widest;
}

/* x clamped to fp16's finite range: a model whose keys or values outgrow it (Qwen2.5's
   reach ~360) would otherwise store infinities and attend with NaNs. */
#ifdef OMNI_SIMD
static inline vec fp16_range(vec x) { return vmin(vmax(x, vset1(-65504.0f)), vset1(65504.0f)); }
#else
static inline float fp16_range(float x) { return x < -65504.0f ? -65504.0f : x > 65504.0f ? 65504.0f : x; }
#endif

/* x * cos + rotate_half(x) * sin, in place, for one head's vector at one position. */
static void rope(float *x, const float *cos, const float *sin, int64_t d) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

#ifdef OMNI_SIMD
/* A new row's RoPE on its query and key heads, and its keys and values into the
   cache (fp16) at position pos. */
static void rope_and_store(float *row, const float *c, const float *s, int64_t n_heads, int64_t n_kv, int64_t d,
                           uint16_t *keys, uint16_t *values, int64_t capacity, int64_t pos) {
    for (int64_t hd = 0; hd < n_heads + n_kv; hd++) rope(row + hd * d, c, s, d);
    for (int64_t j = 0; j < n_kv; j++)
        for (int64_t i = 0; i < d; i += VW) {
            vstore_half(keys + (j * capacity + pos) * d + i, fp16_range(vload(row + (n_heads + j) * d + i)));
            vstore_half(values + (j * capacity + pos) * d + i, fp16_range(vload(row + (n_heads + n_kv + j) * d + i)));
        }
}
#else
static void rope_and_store(float *row, const float *c, const float *s, int64_t n_heads, int64_t n_kv, int64_t d,
                           uint16_t *keys, uint16_t *values, int64_t capacity, int64_t pos) {
    for (int64_t hd = 0; hd < n_heads + n_kv; hd++) rope(row + hd * d, c, s, d);
    for (int64_t j = 0; j < n_kv; j++)
        for (int64_t i = 0; i < d; i++) {
            keys[(j * capacity + pos) * d + i] = float_to_half(fp16_range(row[(n_heads + j) * d + i]));
            values[(j * capacity + pos) * d + i] = float_to_half(fp16_range(row[(n_heads + n_kv + j) * d + i]));
        }
}
#endif

#ifdef OMNI_SIMD
/* e^x for VW floats (Cephes' expf: x = n ln2 + r, a degree-7 polynomial in r, then
   times 2^n; relative error ~1e-7). The loops' scalar expf cost more than the
   4-bit products of a one-token step. */
static inline vec vexp(vec x) {
    x = vmax(vmin(x, vset1(88.0f)), vset1(-88.0f));
    vec n = vround(vmul(x, vset1(1.44269504088896341f)));
    vec r = vfnmadd(n, vset1(0.693359375f), x);
    r = vfnmadd(n, vset1(-2.12194440e-4f), r);
    vec p = vset1(1.9875691500e-4f);
    p = vfmadd(p, r, vset1(1.3981999507e-3f));
    p = vfmadd(p, r, vset1(8.3334519073e-3f));
    p = vfmadd(p, r, vset1(4.1665795894e-2f));
    p = vfmadd(p, r, vset1(1.6666665459e-1f));
    p = vfmadd(p, r, vset1(5.0000001201e-1f));
    p = vfmadd(p, vmul(r, r), vadd(r, vset1(1.0f)));
    return vexp2_times(p, n);
}

/* Lane j of the result: the sum of v[j]'s lanes, by the same tree of additions for
   every j (a transpose-and-add: ~3 instructions a vector instead of a reduction's ~10). */
static inline vec lane_sums(const vec v[VW]) {
#ifdef OMNI_ZMM
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++) /* per 128-bit chunk: (a0+a2, b0+b2, a1+a3, b1+b3) */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per chunk c: vectors 4i..4i+3's sums over chunk c (pairs moved as doubles) */
        __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
    __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
#else
    __m256 t[4], u[2];
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 2; i++) {
        __m256d a = _mm256_castps_pd(t[2 * i]), b = _mm256_castps_pd(t[2 * i + 1]);
        u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
#endif
}
#endif

#define MAX_HEAD_DIM 256 /* decoder_stack refuses more (lean_llama.py checks first) */

#ifdef OMNI_SIMD
/* A query's scores sc[0..seen) (already scaled) to softmax numerators in place,
   against their largest, *top; returns their sum. */
static float softmax_in_place(float *sc, int64_t seen, float *top) {
    vec best = vset1(-INFINITY);
    for (int64_t p = 0; p < seen; p += VW) {
        vmask m = tail(seen - p);
        best = vmax(best, vselect(m, vload_tail(sc + p, m), vset1(-INFINITY)));
    }
    *top = vhmax(best);
    vec t = vset1(*top), sum = vzero();
    for (int64_t p = 0; p < seen; p += VW) {
        vmask m = tail(seen - p);
        vec e = vselect(m, vexp(vsub(vload_tail(sc + p, m), t)), vzero());
        vstore_tail(sc + p, m, e);
        sum = vadd(sum, e);
    }
    return vsum(sum);
}

/* Scores of positions p0..p0+count-1 (count <= VW) for query q into sc[0..count),
   summed by lane_sums; keys: position p0's. A whole block of VW keys runs VW
   independent chains of multiply-adds side by side (d a constant where inlined, so
   each key is an offset from one pointer); a short one (the row's last, where the
   cache may end) one position after another. Either way a position's chain and sum
   are the same, so its score does not depend on the positions beside it. */
static inline __attribute__((always_inline)) void score_positions(const float *q, const float *keys, int64_t count,
                                                                  int64_t d, float scale, float *sc) {
    vec acc[VW];
    if (count == VW) {
        for (int j = 0; j < VW; j++) acc[j] = vzero();
        for (int64_t k = 0; k < d; k += VW) {
            vec qk = vload(q + k);
            for (int j = 0; j < VW; j++) acc[j] = vfmadd(qk, vload(keys + j * d + k), acc[j]);
        }
    } else {
        for (int j = 0; j < VW; j++) {
            acc[j] = vzero();
            if (j < count)
                for (int64_t k = 0; k < d; k += VW) acc[j] = vfmadd(vload(q + k), vload(keys + j * d + k), acc[j]);
        }
    }
    vstore_tail(sc, tail(count), vmul(lane_sums(acc), vset1(scale)));
}

/* out1 += sc1[0..stop1) times values 0..stop1-1, and out2 the same for sc2 (NULL: no
   second query): `lanes` vectors a value (a constant where inlined, so the sums stay
   in registers); outs start at zero where `first`. Two queries side by side share
   each value's loads and run twice the independent chains of multiply-adds (a head
   of 64 has 4 a query, too few to hide their latency); each output lane still sums
   its positions in order, so a query's bits do not depend on its partner. */
static inline __attribute__((always_inline)) void weigh_values(const float *sc1, const float *sc2,
                                                               const float *values, int first, int64_t stop1,
                                                               int64_t stop2, int64_t lanes, float *out1,
                                                               float *out2) {
    vec a1[MAX_HEAD_DIM / VW], a2[MAX_HEAD_DIM / VW];
    int64_t both = sc2 ? (stop1 < stop2 ? stop1 : stop2) : 0;
    for (int64_t l = 0; l < lanes; l++) {
        a1[l] = first ? vzero() : vload(out1 + l * VW);
        if (sc2) a2[l] = first ? vzero() : vload(out2 + l * VW);
    }
    for (int64_t p = 0; p < both; p++) {
        vec s1 = vset1(sc1[p]), s2 = vset1(sc2[p]);
        const float *v = values + p * lanes * VW;
        for (int64_t l = 0; l < lanes; l++) {
            vec x = vload(v + l * VW);
            a1[l] = vfmadd(s1, x, a1[l]), a2[l] = vfmadd(s2, x, a2[l]);
        }
    }
    for (int64_t p = both; p < stop1; p++) {
        vec s1 = vset1(sc1[p]);
        for (int64_t l = 0; l < lanes; l++) a1[l] = vfmadd(s1, vload(values + p * lanes * VW + l * VW), a1[l]);
    }
    if (sc2)
        for (int64_t p = both; p < stop2; p++) {
            vec s2 = vset1(sc2[p]);
            for (int64_t l = 0; l < lanes; l++) a2[l] = vfmadd(s2, vload(values + p * lanes * VW + l * VW), a2[l]);
        }
    for (int64_t l = 0; l < lanes; l++) {
        vstore(out1 + l * VW, a1[l]);
        if (sc2) vstore(out2 + l * VW, a2[l]);
    }
}
#endif

#define ATT_BLOCK 32 /* positions whose keys (then values) stay in L1 while every query of a task reads them */
#define ATT_ROWS 8   /* new rows a task takes at most (a verification's all; a prompt's in blocks) */
/* Positions a softmax part: a query's positions 0.., ATT_PART at a time, each part
   summed alone and the parts folded in order (fold_part). The grid is fixed, so a
   query's bits depend on its position only; it lets the drafter's 3 key/value heads
   split between 2 threads by positions, not by reading a head's cache twice. */
#define ATT_PART 256
#define PART_STREAM (2 * ATT_PART / ATT_BLOCK) /* a whole part's blocks, keys then values */

#ifdef OMNI_SIMD
/* Positions b..b+count-1 of an fp16 cache row (keys or values) widened into `wide`:
   once a block for all the task's queries, not once a query (a 5-row verification
   of Qwen2.5-1.5B has 30 queries a key/value head, and widening each load for each
   made its attention slower than the float32 cache's). */
static void widen_block(const uint16_t *cache, int64_t b, int64_t count, int64_t d, float *wide) {
    for (int64_t i = 0; i < count * d; i += VW) vstore(wide + i, vhalf(cache + b * d + i));
}

/* `call` with D its head size, a constant for the common ones (64, 128) where the
   loops it inlines unroll and keep their sums in registers. */
#define BY_HEAD(dim, call)                                                                                               \
    do {                                                                                                               \
        if ((dim) == 64) {                                                                                             \
            enum { D = 64 };                                                                                           \
            call;                                                                                                      \
        } else if ((dim) == 128) {                                                                                     \
            enum { D = 128 };                                                                                          \
            call;                                                                                                      \
        } else {                                                                                                       \
            const int64_t D = (dim);                                                                                   \
            call;                                                                                                      \
        }                                                                                                              \
    } while (0)

#if defined(OMNI_ZMM) && defined(__AVX512BF16__)
/* Attention's multiply-adds in bf16 (AVX512-BF16: VDPBF16PS sums two products a lane,
   twice an FMA's 16, and reads half the bytes), where the CPU has it (a Zen 4, Xeons
   since Cooper Lake): queries, keys, softmax numerators and values rounded to bf16,
   scores and sums in float32, as the bf16 models these targets are run in bf16
   (Qwen2.5, Gemma 3 and Llama are trained so). After 3,000 positions attention was
   ~45% of a 4-row verification of Qwen2.5-Coder-1.5B, its fp32 multiply-adds most of
   it (docs/performance.md). Every query's steps are still fixed by its
   position alone: a verified row's bits are its one-token step's. */
#define ATT_BF16 1

/* 32 floats to bf16 (round to nearest even) in order: lo's 16, then hi's. */
static inline __m512i bf16_32(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

/* A query (d floats, d a multiple of 32) in bf16. */
static inline void query_bf16(const float *q, int64_t d, uint16_t *out) {
    for (int64_t i = 0; i < d; i += 32) _mm512_storeu_si512(out + i, bf16_32(vload(q + i), vload(q + i + 16)));
}

/* Positions b..b+count-1 of the fp16 key cache in bf16, in the cache's order. */
static void keys_bf16(const uint16_t *cache, int64_t b, int64_t count, int64_t d, uint16_t *out) {
    const uint16_t *in = cache + b * d;
    for (int64_t i = 0; i < count * d; i += 32) _mm512_storeu_si512(out + i, bf16_32(vhalf(in + i), vhalf(in + i + 16)));
}

/* Positions b..b+count-1 of the fp16 value cache in bf16, by pairs of positions (2i,
   2i+1) interleaved value by value, as VDPBF16PS takes them: pair i's 2d values at
   out + 2d i, dims 16c..16c+15 of both positions in its c-th 32. An odd count's last
   pair has zeros for its second position (its numerator is zero too). */
static void values_bf16(const uint16_t *cache, int64_t b, int64_t count, int64_t d, uint16_t *out) {
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    for (int64_t i = 0; 2 * i < count; i++) {
        const uint16_t *first = cache + (b + 2 * i) * d, *second = first + d;
        int both = 2 * i + 1 < count;
        for (int64_t c = 0; c < d; c += 16)
            _mm512_storeu_si512(out + 2 * (i * d + c),
                                _mm512_permutexvar_epi16(zip, bf16_32(vhalf(first + c), both ? vhalf(second + c) : vzero())));
    }
}

/* score_positions in bf16: q and keys (position p0's first) from query_bf16 and
   keys_bf16. */
static inline __attribute__((always_inline)) void score_positions_bf16(const uint16_t *q, const uint16_t *keys,
                                                                       int64_t count, int64_t d, float scale,
                                                                       float *sc) {
    vec acc[VW];
    for (int j = 0; j < VW; j++) acc[j] = vzero();
    if (count == VW) {
        for (int64_t k = 0; k < d; k += 32) {
            __m512bh qk = (__m512bh)_mm512_loadu_si512(q + k);
            for (int j = 0; j < VW; j++)
                acc[j] = _mm512_dpbf16_ps(acc[j], qk, (__m512bh)_mm512_loadu_si512(keys + j * d + k));
        }
    } else {
        for (int j = 0; j < count; j++)
            for (int64_t k = 0; k < d; k += 32)
                acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512(q + k),
                                          (__m512bh)_mm512_loadu_si512(keys + j * d + k));
    }
    vstore_tail(sc, tail(count), vmul(lane_sums(acc), vset1(scale)));
}

/* A block's softmax numerators sc[0..stop) as 16 bf16 pairs, zeros past stop. */
static inline void numerator_pairs(const float *sc, int64_t stop, uint32_t pairs[16]) {
    _mm512_storeu_si512(pairs, bf16_32(vload_tail(sc, tail(stop)), vload_tail(sc + 16, tail(stop > 16 ? stop - 16 : 0))));
}

/* weigh_values in bf16: values from values_bf16, a pair of positions a VDPBF16PS. */
static inline __attribute__((always_inline)) void weigh_values_bf16(const float *sc1, const float *sc2,
                                                                    const uint16_t *values, int first, int64_t stop1,
                                                                    int64_t stop2, int64_t lanes, float *out1,
                                                                    float *out2) {
    vec a1[MAX_HEAD_DIM / VW], a2[MAX_HEAD_DIM / VW];
    uint32_t p1[16], p2[16];
    numerator_pairs(sc1, stop1, p1);
    if (sc2) numerator_pairs(sc2, stop2, p2);
    int64_t n1 = (stop1 + 1) / 2, n2 = sc2 ? (stop2 + 1) / 2 : 0, both = n1 < n2 ? n1 : n2;
    for (int64_t l = 0; l < lanes; l++) {
        a1[l] = first ? vzero() : vload(out1 + l * VW);
        if (sc2) a2[l] = first ? vzero() : vload(out2 + l * VW);
    }
    for (int64_t i = 0; i < both; i++) {
        __m512bh s1 = (__m512bh)_mm512_set1_epi32((int)p1[i]), s2 = (__m512bh)_mm512_set1_epi32((int)p2[i]);
        const uint16_t *v = values + i * 2 * lanes * VW;
        for (int64_t l = 0; l < lanes; l++) {
            __m512bh x = (__m512bh)_mm512_loadu_si512(v + l * 32);
            a1[l] = _mm512_dpbf16_ps(a1[l], s1, x), a2[l] = _mm512_dpbf16_ps(a2[l], s2, x);
        }
    }
    for (int64_t i = both; i < n1; i++) {
        __m512bh s1 = (__m512bh)_mm512_set1_epi32((int)p1[i]);
        for (int64_t l = 0; l < lanes; l++)
            a1[l] = _mm512_dpbf16_ps(a1[l], s1, (__m512bh)_mm512_loadu_si512(values + i * 2 * lanes * VW + l * 32));
    }
    for (int64_t i = both; i < n2; i++) {
        __m512bh s2 = (__m512bh)_mm512_set1_epi32((int)p2[i]);
        for (int64_t l = 0; l < lanes; l++)
            a2[l] = _mm512_dpbf16_ps(a2[l], s2, (__m512bh)_mm512_loadu_si512(values + i * 2 * lanes * VW + l * 32));
    }
    for (int64_t l = 0; l < lanes; l++) {
        vstore(out1 + l * VW, a1[l]);
        if (sc2) vstore(out2 + l * VW, a2[l]);
    }
}
#endif

/* Block s of a task's stream (for each of its parts g0..g1-1, the part's blocks of
   keys, then of values), asked for before use: the cache comes from memory after a
   forward's weights have flushed it, and a step's few queries compute too little per
   block to hide a load's latency, so widening the blocks as they came took over half
   of attend_group's samples (perf annotate; a drafted token 6.3 -> 5.6 ms after 2,000
   positions, docs/performance.md). The task's parts: g0, then those from lo on (a window
   skips 1..lo-1); the k-th one's stream starts at k * PART_STREAM, a short last
   part's is shorter. */
static inline void ask_block(const uint16_t *keys, const uint16_t *values, int64_t s, int64_t g0, int64_t lo,
                             int64_t g1, int64_t end, int64_t d) {
    int64_t k = s / PART_STREAM, w = s % PART_STREAM, g = k == 0 ? g0 : (g0 + k > lo ? g0 + k : lo + k - 1);
    if (g >= g1) return;
    int64_t p0 = g * ATT_PART, blocks = ((end - p0 < ATT_PART ? end - p0 : ATT_PART) + ATT_BLOCK - 1) / ATT_BLOCK;
    if (w >= 2 * blocks) return;
    const uint16_t *cache = w < blocks ? keys : values;
    int64_t b = p0 + (w < blocks ? w : w - blocks) * ATT_BLOCK, stop = (b + ATT_BLOCK < end ? b + ATT_BLOCK : end) * d;
    for (int64_t i = b * d; i < stop; i += 32) _mm_prefetch((const char *)(cache + i), _MM_HINT_T0); /* a line */
}

#define ATT_AHEAD 2 /* blocks asked for ahead of the one widened */

/* A query's result over its parts so far (out: its values' unnormalized sum; *top,
   *sum: its scores' largest and its numerators' sum) and one more part's (o, top_g,
   sum_g) as one, both rescaled to the larger top. */
static void fold_part(float *out, float *top, float *sum, const float *o, float top_g, float sum_g, int64_t lanes) {
    float t = *top > top_g ? *top : top_g, a = expf(*top - t), b = expf(top_g - t);
    for (int64_t l = 0; l < lanes; l++)
        vstore(out + l * VW, vfmadd(vload(o + l * VW), vset1(b), vmul(vload(out + l * VW), vset1(a))));
    *sum = *sum * a + sum_g * b, *top = t;
}
#endif

/* What a layer's attention tasks share. */
typedef struct {
    const float *qkv;              /* [row, qkv_width]: RoPE'd queries first */
    const uint16_t *keys, *values; /* the layer's cache, key/value head 0's [capacity, d] */
    float *att;                    /* [row, n_heads * d]: the result */
    float *parts;                  /* NULL, or a split's per-part sums [part, row - first, head, d] */
    float *tops;                   /* beside them, [part, row - first, head, 2]: top and sum */
    int64_t qkv_width, start, n_heads, capacity, d, first, split_rows;
    int64_t window; /* 0: a query sees every position before it; else part 0 and the parts
                       that hold its last `window` positions (see first_recent) */
    float scale;
} Attention;

#ifdef OMNI_SIMD
/* Positions b..b+count-1 of a cache row (keys, or values where is_values) as the
   task's multiply-adds read them: in bf16 where bf (ATT_BF16), else widened. */
static void read_block(const uint16_t *cache, int is_values, int bf, int64_t b, int64_t count, int64_t d, float *wide) {
#ifdef ATT_BF16
    if (bf) {
        (is_values ? values_bf16 : keys_bf16)(cache, b, count, d, (uint16_t *)wide);
        return;
    }
#endif
    (void)bf, (void)is_values;
    widen_block(cache, b, count, d, wide);
}
#endif

/* The first part past part 0 a query that sees `seen` positions reads: with a
   window, part 0 (the attention sink every context starts with) and the parts
   that hold its last `window` positions, whole parts, so a query's view (and its
   bits) depend on its position only. */
static inline int64_t first_recent(const Attention *A, int64_t seen) {
    int64_t lo = A->window > 0 && seen > A->window ? (seen - A->window) / ATT_PART : 1;
    return lo > 1 ? lo : 1;
}

#ifdef OMNI_SIMD
/* Whether row r's queries read part g. */
static inline int sees(const Attention *A, int64_t r, int64_t g) {
    int64_t seen = A->start + r + 1;
    return seen > g * ATT_PART && (g == 0 || g >= first_recent(A, seen));
}

/* A thread's room: scores (ATT_PART a query), a part's top and sum and the folded
   ones (4 a query), a part's values (d a query), a widened block (ATT_BLOCK * d). */
typedef struct {
    float *sc, *tops, *o, *wide;
    uint16_t *qb; /* the task's queries in bf16 (ATT_BF16: d a query) */
} AttRoom;

/* Query (row r, head h)'s part g in a split's room: its sum at A->parts + this * d,
   its top and sum of numerators at A->tops + this * 2. */
static inline int64_t split_at(const Attention *A, int64_t g, int64_t r, int64_t h) {
    return (g * A->split_rows + r - A->first) * A->n_heads + h;
}

/* Where query (row r, head h)'s sum over part g goes: the split's room, else the
   result itself (the first part) or the thread's room (later parts, to fold in). */
static float *part_sum(const Attention *A, const AttRoom *R, int64_t i, int64_t r, int64_t h, int64_t g) {
    if (A->parts) return A->parts + split_at(A, g, r, h) * A->d;
    return g == 0 ? A->att + (r * A->n_heads + h) * A->d : R->o + i * A->d;
}

/* Query heads h0..h1-1, which share key/value head j, for new rows r0..r1-1 (row r
   sees positions 0..start+r), over parts g0..g1-1. Each block of keys and of values
   is read once for all these queries, not once per head and row: a 5-row
   verification of Qwen2.5-Coder-1.5B after 2,000 positions re-read each layer's 4 MB
   of keys and values 30 times that way (docs/performance.md). Each query sums a part's
   positions in order and folds its parts in order, by the same steps whatever
   queries and parts share its task, so a row's bits are those of its one-token step
   (a verification stays lossless) on any number of threads. Without A->parts the
   task covers all its rows' parts (g0 = 0) and finishes their results; with it, it
   leaves each part's sum, top and sum of numerators there for merge_parts. */
static void attend_group(const Attention *A, const AttRoom *R, int64_t j, int64_t r0, int64_t r1, int64_t h0,
                         int64_t h1, int64_t g0, int64_t g1) {
    int64_t d = A->d, rows = r1 - r0, queries = (h1 - h0) * rows, end = A->start + r1, lanes = d / VW;
    const uint16_t *keys = A->keys + j * A->capacity * d, *values = A->values + j * A->capacity * d;
    float *tops = R->tops; /* per query: the part's top and sum, then the folded ones */
    /* The row that sees fewest positions (r0) reads from the earliest recent part. */
    int64_t lo = first_recent(A, A->start + r0 + 1), k = 0;
#ifdef ATT_BF16
    /* VDPBF16PS takes 32 values of a query at a time: other heads (16) keep float32
       attention on every build, amx included; on amx only a product of AMX_ROWS rows
       or more (a prompt's block) leaves the integer kernel, for bf16 tiles. */
    const int bf = d % 32 == 0;
    uint16_t *wide16 = (uint16_t *)R->wide;
    if (bf)
        for (int64_t i = 0; i < queries; i++)
            query_bf16(A->qkv + (r0 + i % rows) * A->qkv_width + (h0 + i / rows) * d, d, R->qb + i * d);
#else
    const int bf = 0;
    (void)bf;
#endif
    for (int64_t s = 0; s < ATT_AHEAD; s++) ask_block(keys, values, s, g0, lo, g1, end, d);
    for (int64_t g = g0; g < g1; g = g == g0 && g + 1 < lo ? lo : g + 1, k++) {
        int64_t p0 = g * ATT_PART, pend = p0 + ATT_PART < end ? p0 + ATT_PART : end, s0 = k * PART_STREAM;
        int64_t blocks = (pend - p0 + ATT_BLOCK - 1) / ATT_BLOCK;
        for (int64_t b = p0; b < pend; b += ATT_BLOCK) {
            ask_block(keys, values, s0 + (b - p0) / ATT_BLOCK + ATT_AHEAD, g0, lo, g1, end, d);
            read_block(keys, 0, bf, b, b + ATT_BLOCK < pend ? ATT_BLOCK : pend - b, d, R->wide);
            for (int64_t i = 0; i < queries; i++) {
                int64_t r = r0 + i % rows, seen = A->start + r + 1, stop = b + ATT_BLOCK < seen ? b + ATT_BLOCK : seen;
                if (!sees(A, r, g)) continue;
                const float *q = A->qkv + r * A->qkv_width + (h0 + i / rows) * d;
                float *sc = R->sc + i * ATT_PART - p0; /* position p's score at sc[p] */
                for (int64_t p = b; p < stop; p += VW) {
                    int64_t n = stop - p < VW ? stop - p : VW;
#ifdef ATT_BF16
                    if (bf) {
                        BY_HEAD(d, score_positions_bf16(R->qb + i * d, wide16 + (p - b) * d, n, D, A->scale, sc + p));
                        continue;
                    }
#endif
                    BY_HEAD(d, score_positions(q, R->wide + (p - b) * d, n, D, A->scale, sc + p));
                }
            }
        }
        for (int64_t i = 0; i < queries; i++) {
            int64_t seen = A->start + r0 + i % rows + 1;
            if (sees(A, r0 + i % rows, g))
                tops[4 * i + 1] = softmax_in_place(R->sc + i * ATT_PART, (seen < pend ? seen : pend) - p0, tops + 4 * i);
        }
        for (int64_t b = p0; b < pend; b += ATT_BLOCK) {
            ask_block(keys, values, s0 + blocks + (b - p0) / ATT_BLOCK + ATT_AHEAD, g0, lo, g1, end, d);
            read_block(values, 1, bf, b, b + ATT_BLOCK < pend ? ATT_BLOCK : pend - b, d, R->wide);
            for (int64_t i = 0; i < queries;) {
                int64_t pick[2], live = 0, stop[2] = {0, 0};
                float *out[2] = {NULL, NULL};
                for (; i < queries && live < 2; i++) { /* the next two queries that see block b */
                    int64_t r = r0 + i % rows, seen = A->start + r + 1;
                    if (b >= seen || !sees(A, r, g)) continue;
                    stop[live] = (b + ATT_BLOCK < seen ? b + ATT_BLOCK : seen) - b;
                    out[live] = part_sum(A, R, i, r, h0 + i / rows, g);
                    pick[live++] = i;
                }
                if (!live) break;
                const float *sc1 = R->sc + pick[0] * ATT_PART + b - p0;
                const float *sc2 = live > 1 ? R->sc + pick[1] * ATT_PART + b - p0 : NULL;
#ifdef ATT_BF16
                if (bf) {
                    BY_HEAD(d, weigh_values_bf16(sc1, sc2, wide16, b == p0, stop[0], stop[1], D / VW, out[0], out[1]));
                    continue;
                }
#endif
                BY_HEAD(d, weigh_values(sc1, sc2, R->wide, b == p0, stop[0], stop[1], D / VW, out[0], out[1]));
            }
        }
        for (int64_t i = 0; i < queries; i++) {
            int64_t r = r0 + i % rows, h = h0 + i / rows;
            if (!sees(A, r, g)) continue;
            if (A->parts) {
                float *t = A->tops + split_at(A, g, r, h) * 2;
                t[0] = tops[4 * i], t[1] = tops[4 * i + 1];
            } else if (g == 0) {
                tops[4 * i + 2] = tops[4 * i], tops[4 * i + 3] = tops[4 * i + 1];
            } else {
                fold_part(part_sum(A, R, i, r, h, 0), tops + 4 * i + 2, tops + 4 * i + 3, R->o + i * d, tops[4 * i],
                          tops[4 * i + 1], lanes);
            }
        }
    }
    if (A->parts) return;
    for (int64_t i = 0; i < queries; i++) {
        float *out = part_sum(A, R, i, r0 + i % rows, h0 + i / rows, 0), inv = 1.0f / tops[4 * i + 3];
        for (int64_t l = 0; l < lanes; l++) vstore(out + l * VW, vmul(vload(out + l * VW), vset1(inv)));
    }
}

/* Query (row r, head h)'s result from a split's parts, folded in order as
   attend_group folds them. */
static void merge_parts(const Attention *A, int64_t r, int64_t h) {
    int64_t d = A->d, lanes = d / VW, parts = (A->start + r + ATT_PART) / ATT_PART; /* those row r sees */
    int64_t at = split_at(A, 0, r, h);
    float *out = A->att + (r * A->n_heads + h) * d, top = A->tops[2 * at], sum = A->tops[2 * at + 1];
    memcpy(out, A->parts + at * d, sizeof(float) * (size_t)d);
    for (int64_t g = first_recent(A, A->start + r + 1); g < parts; g++) {
        at = split_at(A, g, r, h);
        fold_part(out, &top, &sum, A->parts + at * d, A->tops[2 * at], A->tops[2 * at + 1], lanes);
    }
    float inv = 1.0f / sum;
    for (int64_t l = 0; l < lanes; l++) vstore(out + l * VW, vmul(vload(out + l * VW), vset1(inv)));
}

/* out = silu(gate) * up over `count` values (a multiple of 16). */
static void silu_mul(const float *gate, const float *up, int64_t count, float *out) {
    for (int64_t i = 0; i < count; i += VW) {
        vec g = vload(gate + i);
        vec s = vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g))));
        vstore(out + i, vmul(s, vload(up + i)));
    }
}
#else
/* The generic build's attention (ggml's generic soft_max and dot products, in
   order): a task is one new row r and key/value head j, for the `group` query heads
   that share it. The positions a query sees are the SIMD builds' parts (part 0,
   then from first_recent's part on), visited in order; each key and value row is
   widened once for the task's queries. The scores, their softmax, then the values:
   a query's steps depend on its position alone, so a verified row's bits are its
   one-token step's, on any number of threads. sc: room for group * (seen + 1)
   floats; wide: for d. */
static void attend_row(const Attention *A, float *sc, float *wide, int64_t j, int64_t r, int64_t group) {
    int64_t d = A->d, seen = A->start + r + 1, h0 = j * group;
    int64_t head_end = seen < ATT_PART ? seen : ATT_PART, lo = first_recent(A, seen) * ATT_PART;
    const uint16_t *keys = A->keys + j * A->capacity * d, *values = A->values + j * A->capacity * d;
    float *sums = sc + group * seen;
#define EACH_POSITION(p) for (int64_t p = 0; p < seen; p = p + 1 == head_end && lo > p + 1 ? lo : p + 1)
    EACH_POSITION(p) {
        for (int64_t i = 0; i < d; i++) wide[i] = half_to_float(keys[p * d + i]);
        for (int64_t h = 0; h < group; h++) {
            const float *q = A->qkv + r * A->qkv_width + (h0 + h) * d;
            float s = 0.0f;
            for (int64_t i = 0; i < d; i++) s += q[i] * wide[i];
            sc[h * seen + p] = s * A->scale;
        }
    }
    for (int64_t h = 0; h < group; h++) {
        float top = -INFINITY, sum = 0.0f, *row = sc + h * seen;
        EACH_POSITION(p) top = row[p] > top ? row[p] : top;
        EACH_POSITION(p) {
            row[p] = expf(row[p] - top);
            sum += row[p];
        }
        sums[h] = sum;
        float *out = A->att + (r * A->n_heads + h0 + h) * d;
        for (int64_t i = 0; i < d; i++) out[i] = 0.0f;
    }
    EACH_POSITION(p) {
        for (int64_t i = 0; i < d; i++) wide[i] = half_to_float(values[p * d + i]);
        for (int64_t h = 0; h < group; h++) {
            float e = sc[h * seen + p], *out = A->att + (r * A->n_heads + h0 + h) * d;
            for (int64_t i = 0; i < d; i++) out[i] += e * wide[i];
        }
    }
#undef EACH_POSITION
    for (int64_t h = 0; h < group; h++) {
        float inv = 1.0f / sums[h], *out = A->att + (r * A->n_heads + h0 + h) * d;
        for (int64_t i = 0; i < d; i++) out[i] *= inv;
    }
}

static void silu_mul(const float *gate, const float *up, int64_t count, float *out) {
    for (int64_t i = 0; i < count; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}
#endif

#ifdef STACK_PHASES
/* Seconds each phase of the layers' loop took, summed over calls: what
   the script at git show 524cea4:scripts/stack_phases.py builds with
   -DSTACK_PHASES to show where a forward's time goes. The shipped build compiles
   none of it. */
static double phase_seconds[STACK_PHASES];
void stack_phases(double *out, int reset) {
    for (int i = 0; i < STACK_PHASES; i++) {
        out[i] = phase_seconds[i];
        if (reset) phase_seconds[i] = 0;
    }
}
#define PHASE(i)                                                                                           \
    do {                                                                                                   \
        double now_ = omp_get_wtime();                                                                     \
        if (omp_get_thread_num() == 0) phase_seconds[i] += now_ - then_; /* the team's phases align */     \
        then_ = now_;                                                                                      \
    } while (0)
#define PHASES_START double then_ = omp_get_wtime()
#else
#define PHASE(i)
#define PHASES_START
#endif

/* Returns 0, or -1 when out of memory or for a layout the products do not know.
   hidden and the MLP width: multiples of 32 (the products' groups); head_dim a
   multiple of 16, at most MAX_HEAD_DIM. Every loop computes a row the same way
   whatever rows run beside it and whichever thread runs it, so a row's bits do not
   depend on the block it comes in (a verification's rows are a step's). final_norm
   (NULL: none): the weights of the norm the last `needed` rows then get in place.
   The whole stack is one parallel region: its threads split each loop and product
   and meet at a spinning barrier (team_wait) between them. A region a product, as
   before, cost each forward's hundreds of products a fork, a join and libgomp
   barriers, which make a futex syscall each: a 30-layer forward made 724, now 4, and
   its cost beside the weights fell from 12 to 5.5 us a layer
   (git show 524cea4:scripts/forward_overhead.py; docs/performance.md). */
static int run_stack(float *x, int64_t n, int64_t needed, int64_t start, const Layer *layers, int64_t n_layers,
                     uint16_t *kv, int64_t capacity, const float *cos, const float *sin, int64_t hidden,
                     int64_t n_heads, int64_t n_kv, int64_t d, int64_t inter, float eps, const float *final_norm,
                     int threads, int64_t window) {
    int64_t qkv_width = (n_heads + 2 * n_kv) * d, end = start + n, group = n_heads / n_kv;
    float *h = lines(sizeof(float) * (size_t)(n * hidden));
    float *qkv = lines(sizeof(float) * (size_t)(n * qkv_width));
    float *att = lines(sizeof(float) * (size_t)(n * n_heads * d));
    float *gu = lines(sizeof(float) * (size_t)(n * 2 * inter));
    float *act = lines(sizeof(float) * (size_t)(n * inter));
    int64_t widest_in = hidden > inter ? hidden : inter, t_width = scan_layers(layers, n_layers);
    if (n_heads * d > widest_in) widest_in = n_heads * d;
    float *t_room = t_width > 0 ? malloc(sizeof(float) * (size_t)(n * t_width)) : NULL;
    GemmRoom room;
    int failed = !h || !qkv || !att || !gu || !act || t_width < 0 || (t_width > 0 && !t_room) || d > MAX_HEAD_DIM;
    failed |= gemm_room(&room, n, widest_in, threads) != 0; /* (room stays freeable either way) */
    float scale = 1.0f / sqrtf((float)d);
    /* Attention's tasks: per key/value head, its query heads in chunks, and the rows
       in blocks of ATT_ROWS. Each task widens its key/value head's cache once, so as
       few chunks as keep the threads evenly busy: Qwen2.5's 2 key/value heads whole
       on 2 threads, SmolLM2's 3 of 3 in chunks of 2 and 1. Where the heads do not
       split evenly and a layer's rows make one block, past ATT_PART positions the
       tasks are a head's parts instead (a split), merged after: each thread reads
       half the cache once, where chunks read a head's cache in both. */
    int64_t chunks = n_kv % threads == 0 ? 1 : (2 * threads + n_kv - 1) / n_kv;
    if (chunks > group) chunks = group;
    int64_t chunk = (group + chunks - 1) / chunks;
    int64_t task_rows = n < ATT_ROWS ? n : ATT_ROWS; /* a step's one row needs one row's scores, not 8 */
    int64_t parts = (end + ATT_PART - 1) / ATT_PART, may_split = threads > 1 && n_kv % threads != 0 && parts > 1;
#ifdef OMNI_SIMD
    int64_t per_thread = group * task_rows, per_query = ATT_PART; /* queries a task takes at most, scores each */
#else
    int64_t per_thread = group, per_query = end + 1; /* attend_row: a row's every score and its sum */
#endif
    float *score_room = lines(sizeof(float) * (size_t)(threads * per_thread * per_query));
    float *top_room = lines(sizeof(float) * (size_t)(threads * per_thread * 4));
    float *o_room = lines(sizeof(float) * (size_t)(threads * per_thread * d));
    float *wide_room = lines(sizeof(float) * (size_t)(threads * ATT_BLOCK * d));
    uint16_t *qb_room = lines(sizeof(uint16_t) * (size_t)(threads * per_thread * d));
    float *split_room = may_split ? lines(sizeof(float) * (size_t)(parts * task_rows * n_heads * (d + 2))) : NULL;
    failed |= !score_room || !top_room || !o_room || !wide_room || !qb_room || (may_split && !split_room);
    TeamBarrier bar = {0};
    if (!failed) {
#pragma omp parallel num_threads(threads) if (threads > 1)
        {
            int me = omp_get_thread_num(); /* this thread's room, one task's at a time */
#ifdef OMNI_SIMD
            AttRoom room_me = {score_room + me * per_thread * per_query, top_room + me * per_thread * 4,
                               o_room + me * per_thread * d, wide_room + me * ATT_BLOCK * d,
                               qb_room + me * per_thread * d};
#else
            float *my_scores = score_room + me * per_thread * per_query, *my_wide = wide_room + me * ATT_BLOCK * d;
#endif
            for (int64_t l = 0; l < n_layers; l++) {
                const Layer *L = layers + l;
                /* Rows from `first` on go past the cache: in the last layer only the `needed`
                   whose residual the caller reads (a prompt's last, for the LM head); the
                   others' keys and values are all later positions need of it. */
                int64_t first = l == n_layers - 1 ? n - needed : 0, blocks = (n - first + ATT_ROWS - 1) / ATT_ROWS;
                uint16_t *keys = kv + (l * 2) * n_kv * capacity * d, *values = keys + n_kv * capacity * d;
                PHASES_START;
#pragma omp for schedule(static) nowait
                for (int64_t r = 0; r < n; r++) rms_norm_row(x + r * hidden, L->norm1, eps, hidden, h + r * hidden);
                team_wait(&bar);
                PHASE(0);
                project_parts(L->qkv, 3, h, n, hidden, qkv, qkv_width, &room, t_room, &bar);
                PHASE(1);
#pragma omp for schedule(static) nowait
                for (int64_t r = 0; r < n; r++)
                    rope_and_store(qkv + r * qkv_width, cos + (start + r) * d, sin + (start + r) * d, n_heads, n_kv, d,
                                   keys, values, capacity, start + r);
                team_wait(&bar);
                PHASE(2);
#ifdef OMNI_SIMD
                int split = may_split && blocks == 1;
                Attention A = {qkv, keys, values, att, split ? split_room : NULL,
                               split ? split_room + parts * task_rows * n_heads * d : NULL,
                               qkv_width, start, n_heads, capacity, d, first, task_rows, window, scale};
                if (split) {
#pragma omp for schedule(dynamic, 1) nowait
                    for (int64_t t = 0; t < n_kv * parts; t++) {
                        int64_t g = t % parts; /* a part before the window of every row: nothing to read */
                        if (g == 0 || g >= first_recent(&A, start + first + 1))
                            attend_group(&A, &room_me, t / parts, first, n, t / parts * group,
                                         (t / parts + 1) * group, g, g + 1);
                    }
                    team_wait(&bar);
#pragma omp for schedule(static) nowait
                    for (int64_t u = 0; u < (n - first) * n_heads; u++) merge_parts(&A, first + u / n_heads, u % n_heads);
                } else {
#pragma omp for schedule(static) nowait
                    for (int64_t t = 0; t < n_kv * chunks * blocks; t++) {
                        int64_t j = t / (chunks * blocks), c = t / blocks % chunks, r0 = first + t % blocks * ATT_ROWS;
                        int64_t h0 = j * group + c * chunk;
                        int64_t h1 = h0 + chunk < (j + 1) * group ? h0 + chunk : (j + 1) * group;
                        int64_t r1 = r0 + ATT_ROWS < n ? r0 + ATT_ROWS : n;
                        if (h0 < h1) attend_group(&A, &room_me, j, r0, r1, h0, h1, 0, (start + r1 + ATT_PART - 1) / ATT_PART);
                    }
                }
#else
                (void)blocks, (void)chunk, (void)split_room;
                Attention A = {qkv, keys, values, att, NULL, NULL, qkv_width, start, n_heads, capacity, d, first,
                               task_rows, window, scale};
#pragma omp for schedule(static) nowait
                for (int64_t t = 0; t < n_kv * (n - first); t++)
                    attend_row(&A, my_scores, my_wide, t / (n - first), first + t % (n - first), group);
#endif
                team_wait(&bar);
                PHASE(3);
                int64_t m = n - first; /* rows [first, n) from here on */
                if (m == 0) break;
                float *xm = x + first * hidden, *hm = h + first * hidden;
                project_parts(&L->o, 1, att + first * n_heads * d, m, n_heads * d, hm, hidden, &room, t_room, &bar);
                PHASE(4);
#pragma omp for schedule(static) nowait
                for (int64_t r = 0; r < m; r++) {
                    add_row(xm + r * hidden, hm + r * hidden, hidden);
                    rms_norm_row(xm + r * hidden, L->norm2, eps, hidden, hm + r * hidden);
                }
                team_wait(&bar);
                PHASE(5);
                project_parts(L->gate_up, 2, hm, m, hidden, gu, 2 * inter, &room, t_room, &bar);
                PHASE(6);
                /* By pieces of each row, so a step's rows split between the threads too: on one
                   thread the target's SiLU took 0.13 ms of a one-token step and 0.97 of a 4-row
                   verification (git show 524cea4:scripts/stack_phases.py). Each value's math
                   is the same. */
                int64_t piece = (inter / VW + threads - 1) / threads * VW;
#pragma omp for schedule(static) nowait
                for (int64_t t = 0; t < m * threads; t++) {
                    int64_t r = t / threads, i0 = t % threads * piece, count = inter - i0 < piece ? inter - i0 : piece;
                    if (count > 0)
                        silu_mul(gu + r * 2 * inter + i0, gu + r * 2 * inter + inter + i0, count, act + r * inter + i0);
                }
                team_wait(&bar);
                PHASE(7);
                project_parts(&L->down, 1, act, m, inter, hm, hidden, &room, t_room, &bar);
                PHASE(8);
#pragma omp for schedule(static) nowait
                for (int64_t r = 0; r < m; r++) add_row(xm + r * hidden, hm + r * hidden, hidden);
                team_wait(&bar);
                PHASE(9);
            }
        }
    }
    /* The model's final norm on the rows read, in place: as a torch op after the call it
       cost a drafted token 0.2 ms, its code and data cold after the weights' stream. */
    if (final_norm && !failed)
        for (int64_t r = n - needed; r < n; r++) rms_norm_row(x + r * hidden, final_norm, eps, hidden, x + r * hidden);
    free(h), free(qkv), free(att), free(gu), free(act), free(t_room), free(score_room), free(top_room), free(o_room),
        free(wide_room), free(qb_room), free(split_room);
    gemm_room_free(&room);
    return failed ? -1 : 0;
}

/* The stack's arguments in one struct, which core/kernels/stack.py mirrors
   (StackParams): abi first, KERNEL_ABI where the caller's struct, Layer and
   Projection are laid out as here. */
typedef struct {
    int64_t abi;
    float *x;                 /* [n, hidden]: the new rows' embeddings in, their residual stream out */
    int64_t n, needed, start; /* rows, the last `needed` of them read, the first one's position */
    const Layer *layers;
    int64_t n_layers;
    uint16_t *kv; /* fp16 [layers, 2, n_kv, capacity, head_dim] */
    int64_t capacity;
    const float *cos, *sin; /* [capacity, head_dim] */
    int64_t hidden, n_heads, n_kv, head_dim, inter;
    float eps;
    const float *final_norm; /* NULL: none */
    int threads;
    int64_t window; /* 0: every position; else first_recent's */
} StackParams;

int kernel_abi(void) { return KERNEL_ABI; }

/* The hash of the sources and flags this library was built from (build.py's
   source_tag, which its build passes in): build.py loads a prebuilt library only
   for the sources it was built from. */
#ifndef OMNI_SOURCE_TAG
#define OMNI_SOURCE_TAG ""
#endif
const char *kernel_source_tag(void) { return OMNI_SOURCE_TAG; }

/* run_stack on p's arguments: 0, -1 as there, or STACK_WRONG_ABI where p comes from
   code built for another version of the struct (its fields would be read askew). */
int decoder_stack(const StackParams *p) {
    if (p == NULL || p->abi != KERNEL_ABI) return STACK_WRONG_ABI;
    return run_stack(p->x, p->n, p->needed, p->start, p->layers, p->n_layers, p->kv, p->capacity, p->cos, p->sin,
                     p->hidden, p->n_heads, p->n_kv, p->head_dim, p->inter, p->eps, p->final_norm, p->threads,
                     p->window);
}
