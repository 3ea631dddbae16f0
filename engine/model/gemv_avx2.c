/* Small-M fp32 GEMM for decode steps (engine/model/cpu_gemv.py): y[m, n] = sum_k W[n, k] x[m, k].
 *
 * Built with AVX2 + FMA, or with AVX-512 where the CPU has it (cpu_gemv.py picks the flags): the
 * same code over vectors of VL floats (8 or 16).
 *
 * gemv_f32 (one row of x):
 * Rule: one output row per iteration, W streamed strictly in address order (row n, then n + 1),
 * four independent FMA accumulators over k, summed (a0 + a1) + (a2 + a3) and horizontally at the
 * end of the row; a scalar tail when K % VL != 0. Rows are split statically over the threads, and
 * each row is summed by one thread in one fixed order, so the result does not depend on the
 * thread count.
 *
 * Why: MKL's sgemv read a weight at ~8 GB/s on one of this project's 2-core CPUs where a sum read
 * ~18 GB/s; one in-order stream per thread lets the hardware prefetcher run ahead (reference/cpu.md). */
#include <immintrin.h>

#ifdef __AVX512F__
#define VL 16
typedef __m512 vec;
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vadd(a, b) _mm512_add_ps(a, b)
static inline float hsum(vec v) { return _mm512_reduce_add_ps(v); }
#else
#define VL 8
typedef __m256 vec;
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vadd(a, b) _mm256_add_ps(a, b)
static inline float hsum(vec v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}
#endif

void gemv_f32(const float *W, const float *x, float *y, long N, long K, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n++) {
        const float *w = W + n * K;
        vec a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
        long k = 0;
        for (; k + 4 * VL <= K; k += 4 * VL) {
            a0 = vfma(vload(w + k), vload(x + k), a0);
            a1 = vfma(vload(w + k + VL), vload(x + k + VL), a1);
            a2 = vfma(vload(w + k + 2 * VL), vload(x + k + 2 * VL), a2);
            a3 = vfma(vload(w + k + 3 * VL), vload(x + k + 3 * VL), a3);
        }
        for (; k + VL <= K; k += VL)
            a0 = vfma(vload(w + k), vload(x + k), a0);
        float s = hsum(vadd(vadd(a0, a1), vadd(a2, a3)));
        for (; k < K; k++)
            s += w[k] * x[k];
        y[n] = s;
    }
}

/* gemm_rows_f32 (2..8 rows of x, a decode batch). Rule: two weight rows at a time, against up to
 * four x rows per pass (2 x 4 accumulators in registers): each vector of W is loaded once per pass
 * and each vector of x serves both weight rows, so a load feeds two FMAs; a second pass (rows 4..7)
 * re-reads the two weight rows from L1, so the weight is still read from memory once per step.
 * Each (m, n) is summed by one thread in one fixed order (k ascending, one accumulator), whatever
 * the thread count. */
static inline void pass(const float *w0, const float *w1, const float *x, float *y, long N, long K, long n,
                        const int R, int two) {
    vec a[2][4];
    for (int r = 0; r < R; r++) a[0][r] = a[1][r] = vzero();
    long k = 0;
    for (; k + VL <= K; k += VL) {
        vec v0 = vload(w0 + k), v1 = vload(w1 + k);  /* w1 == w0 for a last odd row */
        for (int r = 0; r < R; r++) {
            vec xv = vload(x + r * K + k);
            a[0][r] = vfma(v0, xv, a[0][r]);
            a[1][r] = vfma(v1, xv, a[1][r]);
        }
    }
    for (int r = 0; r < R; r++) {
        float s0 = hsum(a[0][r]), s1 = hsum(a[1][r]);
        for (long j = k; j < K; j++) {
            s0 += w0[j] * x[r * K + j];
            s1 += w1[j] * x[r * K + j];
        }
        y[r * N + n] = s0;
        if (two) y[r * N + n + 1] = s1;
    }
}

static inline void rows_kernel(const float *W, const float *x, float *y, long N, long K, const int M,
                               int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n += 2) {
        int two = n + 1 < N;
        const float *w0 = W + n * K, *w1 = two ? w0 + K : w0;
        for (int m0 = 0; m0 < M; m0 += 4) {
            int r = M - m0 < 4 ? M - m0 : 4;
            switch (r) {  /* a constant row count per case: the accumulators stay in registers */
                case 1: pass(w0, w1, x + m0 * K, y + m0 * N, N, K, n, 1, two); break;
                case 2: pass(w0, w1, x + m0 * K, y + m0 * N, N, K, n, 2, two); break;
                case 3: pass(w0, w1, x + m0 * K, y + m0 * N, N, K, n, 3, two); break;
                default: pass(w0, w1, x + m0 * K, y + m0 * N, N, K, n, 4, two); break;
            }
        }
    }
}

void gemm_rows_f32(const float *W, const float *x, float *y, long N, long K, long M, int threads) {
    if (M >= 2 && M <= 8) rows_kernel(W, x, y, N, K, (int)M, threads);
}
