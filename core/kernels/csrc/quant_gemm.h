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

/* The builds' vector widths (build.py's ISAS). OMNI_ZMM: 512-bit code, where AVX-512
   is on and the build did not ask for the 256-bit code (OMNI_YMM: the avxvnni-evex
   build, AVX-VNNI's code in AVX-512 VL's encodings, to test and time it where
   AVX-512 VNNI runs). DPBUSD256: a 256-bit VPDPBUSD, AVX-VNNI's (Intel's desktop
   CPUs since Alder Lake, AMD's since Zen 5) or AVX-512 VL's; without it the AVX2
   code multiplies with VPMADDUBSW. */
#if defined(__AVX512F__) && !defined(OMNI_YMM)
#define OMNI_ZMM 1
#endif
#if defined(__AVXVNNI__)
#define DPBUSD256 _mm256_dpbusd_avx_epi32
#elif defined(OMNI_YMM) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
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
