/* Small-M fp32 GEMM for decode steps (engine/model/cpu_gemv.py): y[m, n] = sum_k W[n, k] x[m, k].
 *
 * gemv_f32 (one row of x):
 * Rule: one output row per iteration, W streamed strictly in address order (row n, then n + 1),
 * four independent AVX2 FMA accumulators over k (8 floats each), summed (a0 + a1) + (a2 + a3) and
 * horizontally at the end of the row; a scalar tail when K % 8 != 0. Rows are split statically
 * over the threads, and each row is summed by one thread in one fixed order, so the result does not
 * depend on the thread count.
 *
 * Why: MKL's sgemv reads a weight at ~8 GB/s on this 2-core CPU where a sum reads ~18 GB/s; one
 * in-order stream per thread lets the hardware prefetcher run ahead (reference/cpu.md). */
#include <immintrin.h>

static inline float hsum(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}

void gemv_f32(const float *W, const float *x, float *y, long N, long K, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n++) {
        const float *w = W + n * K;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        long k = 0;
        for (; k + 32 <= K; k += 32) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
        }
        for (; k + 8 <= K; k += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
        float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        for (; k < K; k++)
            s += w[k] * x[k];
        y[n] = s;
    }
}

/* gemm_rows_f32 (2..8 rows of x, a decode batch): per weight row, one accumulator per x row; each
 * 8-float chunk of W is loaded once and multiplied into every x row (x stays in L1/L2), so the
 * weight is still read once per step. Each (m, n) is summed by one thread in one fixed order
 * (k ascending, a single accumulator), whatever the thread count. */
static inline void rows_kernel(const float *W, const float *x, float *y, long N, long K, const int M,
                               int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n++) {
        const float *w = W + n * K;
        __m256 acc[8];
        for (int m = 0; m < M; m++) acc[m] = _mm256_setzero_ps();
        long k = 0;
        for (; k + 8 <= K; k += 8) {
            __m256 wv = _mm256_loadu_ps(w + k);
            for (int m = 0; m < M; m++)
                acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + m * K + k), acc[m]);
        }
        for (int m = 0; m < M; m++) {
            float s = hsum(acc[m]);
            for (long j = k; j < K; j++)
                s += w[j] * x[m * K + j];
            y[m * N + n] = s;
        }
    }
}

void gemm_rows_f32(const float *W, const float *x, float *y, long N, long K, long M, int threads) {
    switch (M) {  /* a constant M per case: the accumulators stay in registers */
        case 2: rows_kernel(W, x, y, N, K, 2, threads); break;
        case 3: rows_kernel(W, x, y, N, K, 3, threads); break;
        case 4: rows_kernel(W, x, y, N, K, 4, threads); break;
        case 5: rows_kernel(W, x, y, N, K, 5, threads); break;
        case 6: rows_kernel(W, x, y, N, K, 6, threads); break;
        case 7: rows_kernel(W, x, y, N, K, 7, threads); break;
        case 8: rows_kernel(W, x, y, N, K, 8, threads); break;
        default: break;
    }
}
