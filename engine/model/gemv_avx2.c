/* The GEMVs of a decode step (engine/model/cpu_gemv.py), y[m, n] = sum_k W[n, k] x[m, k] for up to
 * 16 rows of x: fp32 weights (gemv_f32, gemm_rows_f32), int4 weights in torch's int4pack layout
 * (gemv_int4, gemv_int4_f32) and int8 ones (gemv_int8).
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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

/* Bytes ahead of the quantized codes being read that the int4 / int8 kernels prefetch: without
 * it their reads from memory ran at 8-9 GB/s on a 2-core VM whose read loop reaches 23 (the
 * hardware prefetcher fell behind the unpacking); with it, at the read loop's rate. */
#define PREFETCH 2048

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

/* gemm_rows_f32 (2..MAX_ROWS rows of x, a decode batch). Rule: WR weight rows at a time (4 with
 * AVX-512's 32 registers, 2 with AVX2's 16), against up to four x rows per pass (WR x 4
 * accumulators in registers): each vector of W is loaded once per pass and each vector of x serves
 * every weight row of the tile, so a load feeds WR FMAs; further passes (x rows 4.., 8.., ...)
 * re-read the tile's weight rows from L1, so the weight is still read from memory once per step.
 * Each (m, n) is summed by one thread in one fixed order (k ascending, one accumulator), whatever
 * the thread count. */
#ifdef __AVX512F__
#define WR 4
#else
#define WR 2
#endif

static inline void pass(const float *const *w, const float *x, float *y, long N, long K, long n, const int R,
                        int rows) {
    vec a[WR][4];
    for (int i = 0; i < WR; i++)
        for (int r = 0; r < R; r++) a[i][r] = vzero();
    long k = 0;
    for (; k + VL <= K; k += VL) {
        vec v[WR];
        for (int i = 0; i < WR; i++) {
            _mm_prefetch((const char *)(w[i] + k) + PREFETCH, _MM_HINT_T0);
            v[i] = vload(w[i] + k);  /* rows past the last repeat it */
        }
        for (int r = 0; r < R; r++) {
            vec xv = vload(x + r * K + k);
            for (int i = 0; i < WR; i++) a[i][r] = vfma(v[i], xv, a[i][r]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int i = 0; i < rows; i++) {
            float t = hsum(a[i][r]);
            for (long j = k; j < K; j++) t += w[i][j] * x[r * K + j];
            y[r * N + n + i] = t;
        }
}

static inline void rows_kernel(const float *W, const float *x, float *y, long N, long K, const int M,
                               int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n += WR) {
        int rows = N - n < WR ? (int)(N - n) : WR;
        const float *w[WR];
        for (int i = 0; i < WR; i++) w[i] = W + (n + (i < rows ? i : rows - 1)) * K;
        for (int m0 = 0; m0 < M; m0 += 4) {
            int r = M - m0 < 4 ? M - m0 : 4;
            switch (r) {  /* a constant row count per case: the accumulators stay in registers */
                case 1: pass(w, x + m0 * K, y + m0 * N, N, K, n, 1, rows); break;
                case 2: pass(w, x + m0 * K, y + m0 * N, N, K, n, 2, rows); break;
                case 3: pass(w, x + m0 * K, y + m0 * N, N, K, n, 3, rows); break;
                default: pass(w, x + m0 * K, y + m0 * N, N, K, n, 4, rows); break;
            }
        }
    }
}

void gemm_rows_f32(const float *W, const float *x, float *y, long N, long K, long M, int threads) {
    if (M >= 2) rows_kernel(W, x, y, N, K, (int)M, threads);
}

/* gemv_int4 (weight-only int4, group-wise along K; engine/model/quantization.py's int4 scheme):
 * y[m, n] = bf16(sum_k ((q[n, k] - 8) * scale[g, n] + zero[g, n]) * x[m, k]),  g = k / G,
 * read straight from torch's CPU int4pack layout: rows in blocks of 64; within a block, for each
 * k, 32 bytes, byte j holding row j (low nibble) and row j + 32 (high nibble):
 *
 *     block b, k:  W + b * 32 K + 32 k   [ r0|r32  r1|r33  ...  r31|r63 ]   (lo|hi nibble)
 *
 * scales_zeros: bf16 [N / 64, K / G, 64, 2] (scale, zero; cpu_gemv.int4_block_scales lays out
 * torch's [K / G, N, 2] so: a block's pairs are one sequential stream, where torch's layout made
 * every group of a block a stream of its own, a page apart, and the reads ran at 8-9 GB/s).
 * x: bf16 [M, K]; y: bf16 [M, N].
 * Rule: per row block and x row, each group's integer-weighted sum s_q[n] = sum_k q[n, k] x[k]
 * (64 lanes, exact small integers times x, FMAs in k order), then
 *     acc[n] += scale * (s_q[n] - 8 sum_k x[k]) + zero * sum_k x[k]
 * (the dequantized product, regrouped: one multiply per group instead of one per weight); the
 * output is rounded to bf16 (to nearest even) once. Blocks are split over threads; each output
 * is summed by one thread in one fixed order. N must be a multiple of 64 (cpu_gemv checks). */

/* The 64 codes of one k of a block (32 bytes) as 64 floats in NV vectors (rows 0..63 in order). */
#ifdef __AVX512F__
#define NV 4
static inline void block_codes(const uint8_t *p, vec *out) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p), mask = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(lo)));
    out[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(lo, 1)));
    out[2] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(hi)));
    out[3] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(hi, 1)));
}
static inline vec vset1(float f) { return _mm512_set1_ps(f); }
static inline void vstore(float *p, vec v) { _mm512_storeu_ps(p, v); }
/* 16 (scale, zero) bf16 pairs -> their values as floats: bf16 is the top half of a float */
static inline void scales_zeros(const uint16_t *p, vec *scale, vec *zero) {
    __m512i u = _mm512_loadu_si512((const void *)p);
    *scale = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    *zero = _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xFFFF0000)));
}
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vsub(a, b) _mm512_sub_ps(a, b)
#else
#define NV 8
static inline __m256 eight(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)); }
static inline void block_codes(const uint8_t *p, vec *out) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p), mask = _mm256_set1_epi8(15);
    __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    __m128i parts[4] = {_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1),
                        _mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)};
    for (int i = 0; i < 4; i++) {
        out[2 * i] = eight(parts[i]);
        out[2 * i + 1] = eight(_mm_srli_si128(parts[i], 8));
    }
}
static inline vec vset1(float f) { return _mm256_set1_ps(f); }
static inline void vstore(float *p, vec v) { _mm256_storeu_ps(p, v); }
static inline void scales_zeros(const uint16_t *p, vec *scale, vec *zero) {
    __m256i u = _mm256_loadu_si256((const __m256i *)p);
    *scale = _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    *zero = _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32((int)0xFFFF0000)));
}
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vsub(a, b) _mm256_sub_ps(a, b)
#endif

/* The int4 product with fp32 rows in and fp32 out (each output rounded to a bf16 value): the fused
 * decode layers' form (decode_avx2.c); gemv_int4 below is the bf16 one. */
int gemv_int4_f32(const uint8_t *W, const uint16_t *sz, const float *x, float *y, long N, long K, long M,
                  long G, int threads) {  /* 0, or -1 when out of memory */
    const long groups = K / G;
    float *gsum = malloc(sizeof(float) * (M * groups > 0 ? M * groups : 1));  /* [M, groups] sum of x */
    if (!gsum) return -1;
    for (long m = 0; m < M; m++)
        for (long g = 0; g < groups; g++) {
            float s = 0.f;
            for (long k = g * G; k < (g + 1) * G; k++) s += x[m * K + k];
            gsum[m * groups + g] = s;
        }
    /* block outer, rows of x inner: a block's codes are read from memory once, then from cache */
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long b = 0; b < N / 64; b++) {
        const uint8_t *wb = W + b * 32 * K;
        for (long m = 0; m < M; m++) {
            const float *xm = x + m * K;
            vec acc[NV];
            for (int v = 0; v < NV; v++) acc[v] = vzero();
            for (long g = 0; g < groups; g++) {
                vec a[NV], q[NV];
                for (int v = 0; v < NV; v++) a[v] = vzero();
                for (long k = g * G; k < (g + 1) * G; k++) {
                    _mm_prefetch((const char *)(wb + 32 * k + PREFETCH), _MM_HINT_T0);
                    block_codes(wb + 32 * k, q);
                    vec xk = vset1(xm[k]);
                    for (int v = 0; v < NV; v++) a[v] = vfma(q[v], xk, a[v]);
                }
                /* acc += scale * (s_q - 8 sum x) + zero * sum x, rows 64 / NV at a time */
                const uint16_t *s = sz + (b * groups + g) * 128;  /* block b's pairs, group g */
                float gs = gsum[m * groups + g];
                vec sum = vset1(gs), eight = vset1(8.f * gs);
                for (int v = 0; v < NV; v++) {
                    vec scale, zero;
                    scales_zeros(s + v * 2 * (64 / NV), &scale, &zero);
                    acc[v] = vadd(acc[v], vadd(vmul(scale, vsub(a[v], eight)), vmul(zero, sum)));
                }
            }
            float out[64];
            for (int v = 0; v < NV; v++) vstore(out + v * (64 / NV), acc[v]);
            for (int j = 0; j < 64; j++) y[m * N + b * 64 + j] = bf16_to_f32(f32_to_bf16(out[j]));
        }
    }
    free(gsum);
    return 0;
}

int gemv_int4(const uint8_t *W, const uint16_t *sz, const uint16_t *x16, uint16_t *y, long N, long K, long M,
              long G, int threads) {  /* 0, or -1 when out of memory */
    float *x = malloc(sizeof(float) * (M * K + M * N)), *out = x + M * K;
    if (!x) return -1;
    for (long i = 0; i < M * K; i++) x[i] = bf16_to_f32(x16[i]);
    int failed = gemv_int4_f32(W, sz, x, out, N, K, M, G, threads);
    for (long i = 0; i < M * N && !failed; i++) y[i] = f32_to_bf16(out[i]);  /* exact: already bf16 values */
    free(x);
    return failed;
}

/* gemv_int8 (weight-only int8 per output channel: the int8 scheme's projections and every
 * quantized scheme's LM head, engine/model/quantization.py):
 * y[m, n] = bf16(scale[n] * sum_k q[n, k] x[m, k]),  q int8 [N, K], scale bf16 [N], x bf16 [M, K].
 * Rule: per weight row, each chunk of VL codes is widened to floats once and multiplied into every
 * x row (one fp32 accumulator per x row, k ascending; one row of x: four, summed at the end of
 * the row as gemv_f32 does), with a prefetch ahead of the row stream;
 * one thread per row, so the result does not depend on the thread count. 0, or -1 when out of
 * memory. */
/* VL int8 codes as floats */
static inline vec codes8(const int8_t *p) {
#ifdef __AVX512F__
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#else
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#endif
}

int gemv_int8(const int8_t *W, const uint16_t *scale, const uint16_t *x16, uint16_t *y, long N, long K, long M,
              int threads) {
    float *x = malloc(sizeof(float) * (M * K > 0 ? M * K : 1));
    if (!x) return -1;
    for (long i = 0; i < M * K; i++) x[i] = bf16_to_f32(x16[i]);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long n = 0; n < N; n++) {
        const int8_t *w = W + n * K;
        if (M == 1) {  /* four accumulators over k: one FMA chain per row would wait on its latency */
            vec a[4] = {vzero(), vzero(), vzero(), vzero()};
            long k = 0;
            for (; k + 4 * VL <= K; k += 4 * VL) {
                _mm_prefetch((const char *)(w + k + PREFETCH), _MM_HINT_T0);
                for (int u = 0; u < 4; u++) a[u] = vfma(codes8(w + k + u * VL), vload(x + k + u * VL), a[u]);
            }
            for (; k + VL <= K; k += VL) a[0] = vfma(codes8(w + k), vload(x + k), a[0]);
            float sum = hsum(vadd(vadd(a[0], a[1]), vadd(a[2], a[3])));
            for (; k < K; k++) sum += (float)w[k] * x[k];
            y[n] = f32_to_bf16(sum * bf16_to_f32(scale[n]));
            continue;
        }
        float s = bf16_to_f32(scale[n]);
        for (long m0 = 0; m0 < M; m0 += 8) {  /* x rows 8 at a time (the row is in L1 after the first) */
            long rows = M - m0 < 8 ? M - m0 : 8;
            const float *xr = x + m0 * K;
            vec acc[8];
            for (long m = 0; m < rows; m++) acc[m] = vzero();
            long k = 0;
            for (; k + VL <= K; k += VL) {
                _mm_prefetch((const char *)(w + k + PREFETCH), _MM_HINT_T0);
                vec wv = codes8(w + k);
                for (long m = 0; m < rows; m++) acc[m] = vfma(wv, vload(xr + m * K + k), acc[m]);
            }
            for (long m = 0; m < rows; m++) {
                float sum = hsum(acc[m]);
                for (long j = k; j < K; j++) sum += (float)w[j] * xr[m * K + j];
                y[(m0 + m) * N + n] = f32_to_bf16(sum * s);
            }
        }
    }
    free(x);
    return 0;
}
