/* Matrix-vector products for decode: y[m, o] = sum_i x[m, i] * W[o, i] (+ bias[o]), W row-major [out, in].
 *
 * Decode reads every weight once per token, so its speed is the speed of streaming W from
 * memory. These kernels walk W strictly in order, one row after the next, which keeps the
 * hardware prefetcher on a single stream; each W chunk is loaded once and multiplied with
 * all M (<= 8) input rows. Sums are kept in float32; bfloat16 outputs are rounded to nearest
 * even, as torch does. Rows are split into contiguous ranges across OpenMP threads (torch's
 * own OpenMP runtime, which is already loaded when ladderize loads this library).
 *
 * Built by ladderize/runtime/gemv.py with the compiler found on the machine; the bfloat16
 * kernel needs AVX512-BF16 and the float32 one AVX512F, which gemv.py checks before calling.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MAX_ROWS 8

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

/* The row loops, specialised per M so that the accumulators live in registers. */
#define DEFINE_ROWS(NAME, T, ROW, TARGET, LOAD, STORE)                                                      \
    __attribute__((target(TARGET))) static void NAME(const int M, const T *x, const T *w, const T *bias,    \
                                                     T *y, int64_t out, int64_t in, int threads) {          \
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
    }

#define SAME(v) (v)
DEFINE_ROWS(rows_bf16, uint16_t, row_bf16, "avx512f,avx512bw,avx512bf16", from_bf16, to_bf16)
DEFINE_ROWS(rows_f32, float, row_f32, "avx512f", SAME, SAME)

/* Entry points (ctypes): x [M, in], w [out, in], bias [out] or NULL, y [M, out]; all contiguous; 1 <= M <= 8. */
int ladderize_gemv_max_rows(void) { return MAX_ROWS; }

void ladderize_gemv_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y, int64_t rows,
                         int64_t out, int64_t in, int threads) {
    rows_bf16((int)rows, x, w, bias, y, out, in, threads);
}

void ladderize_gemv_f32(const float *x, const float *w, const float *bias, float *y, int64_t rows, int64_t out,
                        int64_t in, int threads) {
    rows_f32((int)rows, x, w, bias, y, out, in, threads);
}
