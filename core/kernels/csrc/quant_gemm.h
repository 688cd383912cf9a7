/* The 4-bit, 6-bit and 8-bit products (quant_gemm.c), as decoder_stack.c calls them. */
#include <stdint.h>
#include <stdlib.h>

/* The version of the library's interface: quant_gemm's arguments, the layouts' numbers,
   and decoder_stack's StackParams, Layer and Projection structs. kernel_abi() reports
   it; core/kernels/build.py refuses a library that reports another, and decoder_stack
   returns STACK_WRONG_ABI for a struct whose abi field differs. Raise it with any
   change to those. */
#define KERNEL_ABI 1
#define STACK_WRONG_ABI (-2)
int kernel_abi(void);

/* OMNI_SIMD: the x86 builds' intrinsics (build.py's ISAS: AVX2 and above). Without
   it (the generic build, -DOMNI_GENERIC, or a compiler for another CPU) every kernel
   is plain C: scalar loops after ggml's *_generic code, the reference the SIMD builds
   are tested against and the fallback where none of them runs (old x86, ARM, macOS). */
#if defined(__AVX2__) && !defined(OMNI_GENERIC)
#define OMNI_SIMD 1
#endif
/* AMX's tiles are lent by Linux only (quant_gemm.c asks with arch_prctl). */
#if defined(OMNI_SIMD) && defined(__AMX_BF16__) && defined(__linux__)
#define OMNI_AMX 1
#endif

/* OpenMP where the compiler has it (Apple's clang has not): without it the
   pragmas are ignored and each kernel runs on the calling thread. */
#ifdef _OPENMP
#include <omp.h>
#else
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_num_procs(void) { return 1; }
#endif

/* fp16 <-> float32 in plain C (ggml's fp16 conversions without F16C): the generic
   build's scales and KV cache. Round to nearest even, as F16C's VCVTPS2PH with
   _MM_FROUND_TO_NEAREST_INT, so both builds store the same cache bits for the same
   floats. */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13); /* infinity, NaN */
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalize */
        int shift = 0;
        while (!(man & 0x400)) man <<= 1, shift++;
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3FF) << 13);
    } else {
        bits = sign;
    }
    union { uint32_t u; float f; } v = {bits};
    return v.f;
}

static inline uint16_t float_to_half(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t x = v.u, sign = (x >> 16) & 0x8000, abs = x & 0x7FFFFFFF;
    if (abs > 0x7F800000u) return (uint16_t)(sign | 0x7E00); /* NaN */
    if (abs >= 0x477FF000u) return (uint16_t)(sign | 0x7C00); /* rounds past 65504: infinity */
    if (abs < 0x38800000u) { /* below fp16's smallest normal: a subnormal or zero */
        if (abs < 0x33000000u) return (uint16_t)sign; /* under half the smallest subnormal */
        uint32_t man = (abs & 0x7FFFFF) | 0x800000, shift = 126 - (abs >> 23);
        uint32_t half = man >> shift, rest = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((abs >> 13) - (112u << 10)), rest = abs & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half++;
    return (uint16_t)(sign | half);
}

/* The builds' vector widths (build.py's ISAS). OMNI_ZMM: 512-bit code, where AVX-512
   is on and the build did not ask for the 256-bit code (OMNI_YMM: the avxvnni-evex
   build, AVX-VNNI's code in AVX-512 VL's encodings, to test and time it where
   AVX-512 VNNI runs). DPBUSD256: a 256-bit VPDPBUSD, AVX-VNNI's (Intel's desktop
   CPUs since Alder Lake, AMD's since Zen 5) or AVX-512 VL's; without it the AVX2
   code multiplies with VPMADDUBSW. */
#if defined(OMNI_SIMD) && defined(__AVX512F__) && !defined(OMNI_YMM)
#define OMNI_ZMM 1
#endif
#if defined(OMNI_SIMD) && defined(__AVXVNNI__)
#define DPBUSD256 _mm256_dpbusd_avx_epi32
#elif defined(OMNI_SIMD) && defined(OMNI_YMM) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD256 _mm256_dpbusd_epi32
#endif

/* Buffers on whole cache lines: a 64-byte load (a tile row, a vector of 64 bytes)
   that straddles two lines costs two reads; with malloc's 16-byte alignment a
   product of 200 rows on AMX tiles ran 1.6x slower in some processes than in
   others (tools/kernel_ab.py --gemm --rows 200). */
static inline void *lines(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

/* Work a caller runs beside a product on the product's own threads, so it needs no
   fork of its own (a drafter forward runs hundreds of products). `items` calls of
   prepare(ctx, i), split between the threads while the rows are quantized (they may
   read x, not y); then, once the whole product is in y, finish(ctx, o) for each 16
   outputs o..o+15. (Finishing each 16 outputs right after the product wrote them
   measured slower: the factors' reads broke up the weights' stream.) */
typedef struct {
    int64_t items;
    void (*prepare)(void *ctx, int64_t item);
    void (*finish)(void *ctx, int64_t o);
    void *ctx;
} Beside;

/* The weights' layouts (quant_gemm.c), numbered as GGML numbers the quantization
   each holds: 4 bits in groups of 32 with an fp16 scale and offset each (Q4_1's
   form, layouts.fit's), Q4_K's superblocks, Q6_K's blocks, Q8_0's blocks. */
enum { LAYOUT_Q4_1 = 3, LAYOUT_Q8_0 = 8, LAYOUT_Q4_K = 12, LAYOUT_Q6_K = 14 };

int quant_gemm(int kind, const float *x, int64_t m, int64_t k, const uint8_t *weights, int64_t n, float *y,
               int64_t ldy, int threads);

/* A barrier for the threads of the current OpenMP team (all of them call
   team_wait; outside a parallel region it returns at once). libgomp's own barrier
   makes a futex syscall each time it opens, and a step's forward passes hundreds of
   them; this one spins, and sleeps only after a while (quant_gemm.c). Zero-initialized. */
typedef struct {
    _Atomic int arrived, generation, sleepers;
} TeamBarrier;
void team_wait(TeamBarrier *bar);

/* Room for products of at most `rows` rows and `k` inputs: the rows in int8, their
   scales, group sums and per-row terms, and on AMX tiles the rows in bf16 and each
   thread's column of weights (gemm_team allocates nothing, so a team never parts
   ways over a failed allocation). */
typedef struct {
    int64_t rows, k;
    int8_t *xq;
    float *row_scale;
    int16_t *sums;
    void *terms;
    uint16_t *xb, *wt; /* AMX only; else NULL */
} GemmRoom;
int gemm_room(GemmRoom *room, int64_t rows, int64_t k, int threads); /* 0, or -1 when out of memory */
void gemm_room_free(GemmRoom *room);
/* gemm_beside's product run by every thread of the current team (or by one thread
   outside a parallel region), in room; y is complete only after the caller's next
   team_wait. Returns -1 for an unknown layout (every thread alike), else 0. */
int gemm_team(int kind, const float *x, int64_t m, int64_t k, const uint8_t *weights, int64_t n, float *y,
              int64_t ldy, const Beside *beside, const GemmRoom *room, TeamBarrier *bar);
/* The product with `beside` (NULL: nothing) run along. */
int gemm_beside(int kind, const float *x, int64_t m, int64_t k, const uint8_t *weights, int64_t n, float *y,
                int64_t ldy, int threads, const Beside *beside);
/* Rows from which a product runs on AMX tiles in bf16 (quant_gemm.c); 0: never here
   (a build without AMX, or the OS did not lend the tiles). */
int amx_rows(void);
