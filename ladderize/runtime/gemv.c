/* Matrix-vector products for decode: y[m, o] = sum_i x[m, i] * W[o, i] (+ bias[o]), W row-major [out, in].
 *
 * Decode reads every weight once per token, so its speed is the speed of streaming W from
 * memory. These kernels walk W strictly in order, one row after the next, which keeps the
 * hardware prefetcher on a single stream; each W chunk is loaded once and multiplied with
 * all M (<= 8) input rows. Sums are kept in float32; bfloat16 outputs are rounded to nearest
 * even, as torch does. Rows are split into contiguous ranges across OpenMP threads (torch's
 * own OpenMP runtime, which is already loaded when ladderize loads this library).
 *
 * Two builds of each kernel: AVX512 (float32: AVX512F; bfloat16: AVX512-BF16 dot products) and
 * AVX2 + FMA (bfloat16 widened to float32 by a shift, then FMA). gemv.py reads the CPU's flags
 * and calls the AVX512 entry points where it can, else the AVX2 ones. The two sum in different
 * orders (16 vs 8 lanes), so their last bits can differ; each is deterministic.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MAX_ROWS 8
#define SAME(v) (v)

static inline uint16_t to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);                 /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

static inline float from_bf16(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* One weight row against M input rows. Two accumulators per input row (even and odd chunks)
 * keep independent dependency chains in flight when M is small. */
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline)) static inline void
row_bf16(const int M, const uint16_t *x, const uint16_t *w, int64_t in, float *sums) {
    __m512 even[MAX_ROWS], odd[MAX_ROWS];
    for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= in; i += 64) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + i), w1 = (__m512bh)_mm512_loadu_si512(w + i + 32);
        for (int m = 0; m < M; ++m) {
            even[m] = _mm512_dpbf16_ps(even[m], w0, (__m512bh)_mm512_loadu_si512(x + m * in + i));
            odd[m] = _mm512_dpbf16_ps(odd[m], w1, (__m512bh)_mm512_loadu_si512(x + m * in + i + 32));
        }
    }
    for (; i < in; i += 32) { /* tail: masked loads read zeros past the row's end */
        const __mmask32 mask = in - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (in - i)) - 1u);
        __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + i);
        for (int m = 0; m < M; ++m)
            even[m] = _mm512_dpbf16_ps(even[m], w0, (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * in + i));
    }
    for (int m = 0; m < M; ++m) sums[m] = _mm512_reduce_add_ps(_mm512_add_ps(even[m], odd[m]));
}

__attribute__((target("avx512f"), always_inline)) static inline void
row_f32(const int M, const float *x, const float *w, int64_t in, float *sums) {
    __m512 even[MAX_ROWS], odd[MAX_ROWS];
    for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= in; i += 32) {
        __m512 w0 = _mm512_loadu_ps(w + i), w1 = _mm512_loadu_ps(w + i + 16);
        for (int m = 0; m < M; ++m) {
            even[m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + m * in + i), even[m]);
            odd[m] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + m * in + i + 16), odd[m]);
        }
    }
    for (; i < in; i += 16) {
        const __mmask16 mask = in - i >= 16 ? 0xffff : (__mmask16)((1u << (in - i)) - 1u);
        __m512 w0 = _mm512_maskz_loadu_ps(mask, w + i);
        for (int m = 0; m < M; ++m) even[m] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(mask, x + m * in + i), even[m]);
    }
    for (int m = 0; m < M; ++m) sums[m] = _mm512_reduce_add_ps(_mm512_add_ps(even[m], odd[m]));
}

/* AVX2 + FMA: 8 float32 lanes. Horizontal sum of one accumulator. */
__attribute__((target("avx2,fma"), always_inline)) static inline float hsum_avx2(__m256 v) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
}

/* 8 bfloat16 values widened to float32 (a bfloat16 is the upper half of a float32). */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 load_bf16_avx2(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

__attribute__((target("avx2,fma"), always_inline)) static inline __m256 load_f32_avx2(const float *p) {
    return _mm256_loadu_ps(p);
}

/* One weight row against M input rows, as row_f32 does with 16 lanes; the tail (in % 8) is summed in scalar. */
#define DEFINE_ROW_AVX2(NAME, T, LOADV, LOADS)                                                              \
    __attribute__((target("avx2,fma"), always_inline)) static inline void NAME(const int M, const T *x,       \
                                                                              const T *w, int64_t in,         \
                                                                              float *sums) {                  \
        __m256 even[MAX_ROWS], odd[MAX_ROWS];                                                                \
        for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm256_setzero_ps();                                  \
        int64_t i = 0;                                                                                       \
        for (; i + 16 <= in; i += 16) {                                                                      \
            __m256 w0 = LOADV(w + i), w1 = LOADV(w + i + 8);                                                 \
            for (int m = 0; m < M; ++m) {                                                                    \
                even[m] = _mm256_fmadd_ps(w0, LOADV(x + m * in + i), even[m]);                               \
                odd[m] = _mm256_fmadd_ps(w1, LOADV(x + m * in + i + 8), odd[m]);                             \
            }                                                                                                \
        }                                                                                                    \
        for (; i + 8 <= in; i += 8) {                                                                        \
            __m256 w0 = LOADV(w + i);                                                                        \
            for (int m = 0; m < M; ++m) even[m] = _mm256_fmadd_ps(w0, LOADV(x + m * in + i), even[m]);       \
        }                                                                                                    \
        for (int m = 0; m < M; ++m) {                                                                        \
            float tail = 0.0f;                                                                               \
            for (int64_t j = i; j < in; ++j) tail += LOADS(w[j]) * LOADS(x[m * in + j]);                     \
            sums[m] = hsum_avx2(_mm256_add_ps(even[m], odd[m])) + tail;                                      \
        }                                                                                                    \
    }

DEFINE_ROW_AVX2(row_f32_avx2, float, load_f32_avx2, SAME)
DEFINE_ROW_AVX2(row_bf16_avx2, uint16_t, load_bf16_avx2, from_bf16)

/* The row loops, specialised per M so that the accumulators live in registers, and their exported entry point
 * ladderize_gemv_<SUFFIX> (ctypes): x [M, in], w [out, in], bias [out] or NULL, y [M, out]; all contiguous; 1 <= M <= 8. */
#define DEFINE_ROWS(SUFFIX, T, ROW, TARGET, LOAD, STORE)                                                    \
    __attribute__((target(TARGET))) static void rows_##SUFFIX(const int M, const T *x, const T *w,          \
                                                              const T *bias, T *y, int64_t out, int64_t in, \
                                                              int threads) {                                \
        _Pragma("omp parallel for if(threads > 1) num_threads(threads) schedule(static)")                 \
        for (int64_t o = 0; o < out; ++o) {                                                                \
            float sums[MAX_ROWS];                                                                          \
            switch (M) {                                                                                   \
            case 1: ROW(1, x, w + o * in, in, sums); break;                                                \
            case 2: ROW(2, x, w + o * in, in, sums); break;                                                \
            case 3: ROW(3, x, w + o * in, in, sums); break;                                                \
            case 4: ROW(4, x, w + o * in, in, sums); break;                                                \
            case 5: ROW(5, x, w + o * in, in, sums); break;                                                \
            case 6: ROW(6, x, w + o * in, in, sums); break;                                                \
            case 7: ROW(7, x, w + o * in, in, sums); break;                                                \
            default: ROW(8, x, w + o * in, in, sums); break;                                               \
            }                                                                                              \
            const float b = bias ? LOAD(bias[o]) : 0.0f;                                                   \
            for (int m = 0; m < M; ++m) y[m * out + o] = STORE(sums[m] + b);                               \
        }                                                                                                  \
    }                                                                                                      \
    void ladderize_gemv_##SUFFIX(const T *x, const T *w, const T *bias, T *y, int64_t rows, int64_t out,   \
                                 int64_t in, int threads) {                                                 \
        rows_##SUFFIX((int)rows, x, w, bias, y, out, in, threads);                                         \
    }

DEFINE_ROWS(bf16, uint16_t, row_bf16, "avx512f,avx512bw,avx512bf16", from_bf16, to_bf16)
DEFINE_ROWS(f32, float, row_f32, "avx512f", SAME, SAME)
DEFINE_ROWS(bf16_avx2, uint16_t, row_bf16_avx2, "avx2,fma", from_bf16, to_bf16)
DEFINE_ROWS(f32_avx2, float, row_f32_avx2, "avx2,fma", SAME, SAME)

int ladderize_gemv_max_rows(void) { return MAX_ROWS; }
