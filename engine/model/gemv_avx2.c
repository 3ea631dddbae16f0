/* Batch-1 fp32 GEMV for the decode step (engine/model/cpu_gemv.py): y[n] = sum_k W[n, k] x[k].
 *
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
