/* The decoder layers of a decode step in one call (engine/model/cpu_decode.py): M rows (one new
 * token per request, M <= 8), every layer, no Python between the operations. Two formats:
 *
 *   fp32   fp32 weights, activations and KV cache;
 *   int4   the int4 scheme of engine/model/quantization.py: int4 projections (torch's int4pack
 *          layout, gemv_int4_f32), bfloat16 activations, norm weights and biases; its KV cache
 *          bf16 or fp32 (holding bf16 values, exactly).
 *          Every operation's result is rounded to bfloat16 where torch's bf16 op rounds it (R()),
 *          so the values match the torch layers' up to summation order.
 *
 * Per layer, for every row (the same arithmetic as engine/model/llama.py's run_layers):
 *
 *   x = R(w_in * R(rms_norm(h)))                    mean of squares over hidden, in fp32
 *   q | k | v = R(x @ Wqkv^T (+ bias))
 *   q, k = R(R(x * cos) + R(rotate_half(x) * sin))  cos / sin given per row
 *   K[slot], V[slot] = k, v                         the row's new token into the paged cache
 *   a = R(softmax(scale * q . K[ctx]) . V[ctx])     per query head over its KV head (GQA), the
 *                                                   row's own context slots only, fp32 inside
 *   h = R(h + R(a @ Wo^T (+ bias)))
 *   x = R(w_post * R(rms_norm(h)))
 *   g | u = R(x @ Wgu^T);  h = R(h + R(R(R(silu(g)) * u) @ Wdown^T))
 *
 * (R() is the identity in fp32.) Invariant: row i reads only its own context slots
 * ctx[i, 0 .. len[i]) (written before, or just now at slot_mapping[i]), so rows never see each
 * other's K/V; each output element is summed by one thread in one fixed order, so the result does
 * not depend on the thread count. Elementwise operations are compiled without FMA contraction
 * (-ffp-contract=off), so they round as torch's separate ops do; only the dot products (GEMVs,
 * attention scores, softmax sums) differ from torch in summation order. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

void gemv_f32(const float *W, const float *x, float *y, long N, long K, int threads);
void gemm_rows_f32(const float *W, const float *x, float *y, long N, long K, long M, int threads);
int gemv_int4_f32(const uint8_t *W, const uint16_t *sz, const float *x, float *y, long N, long K, long M,
                  long G, int threads);

/* A projection: fp32 [N, K], or int4pack [N, K/2] with bf16 scales and zeros [N/64, K/G, 64, 2]. */
typedef struct {
    const void *weight;
    const uint16_t *scales_zeros;  /* int4 only */
} Proj;

/* One layer's tensors (pointers into torch tensors; bias pointers may be NULL). Norm weights,
 * biases and the caches are fp32 in the fp32 format and bf16 in the int4 one. */
typedef struct {
    const void *input_norm, *post_norm;  /* [H] */
    Proj qkv;                            /* [(NQ + 2 NKV) D, H] */
    const void *qkv_bias;                /* [(NQ + 2 NKV) D] */
    Proj o;                              /* [H, NQ D] */
    const void *o_bias;                  /* [H] */
    Proj gate_up;                        /* [2 I, H] */
    Proj down;                           /* [H, I] */
    void *k_cache, *v_cache;             /* [num_slots, NKV, D] */
} Layer;

typedef struct {
    long hidden, heads, kv_heads, head_dim, intermediate;
    float eps, scale;
    long int4_group;  /* 0: the fp32 format; else the int4 format with this group size */
    long kv_bf16;     /* the caches hold bf16 (1) or fp32 (0) values */
} Shape;


/* R(): the value rounded to bf16 in the int4 format, itself in fp32 */
#define R(v) (bf ? bf16_to_f32(f32_to_bf16(v)) : (v))

/* element i of a vector stored in the format's storage type */
static inline float at(const void *p, long i, int bf) {
    return bf ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static int linear(const Proj *w, const void *bias, const float *x, float *y, long N, long K, long M,
                  const Shape *s, int threads) {  /* 0, or -1 when out of memory */
    const int bf = s->int4_group != 0;
    if (bf) {
        if (gemv_int4_f32(w->weight, w->scales_zeros, x, y, N, K, M, s->int4_group, threads)) return -1;
    } else if (M == 1) gemv_f32(w->weight, x, y, N, K, threads);
    else gemm_rows_f32(w->weight, x, y, N, K, M, threads);
    if (bias)
        for (long m = 0; m < M; m++)
            for (long n = 0; n < N; n++) y[m * N + n] = R(y[m * N + n] + at(bias, n, bf));
    return 0;
}

static inline void store(void *p, long i, float v, int bf) {
    if (bf) ((uint16_t *)p)[i] = f32_to_bf16(v);  /* exact: v is a bf16 value (R()) */
    else ((float *)p)[i] = v;
}

/* 1 / rms of the H values from element i of h (stored as the format stores them): the mean of
 * squares in fp32, as torch's rms_norm computes it after x.float(). */
static inline float inv_rms(const void *h, long i, long H, float eps, int bf) {
    float ss = 0.f;
    for (long j = 0; j < H; j++) ss += at(h, i + j, bf) * at(h, i + j, bf);
    return 1.f / sqrtf(ss / (float)H + eps);
}

static void rms_norm(const float *h, const void *w, float *x, long M, long H, float eps, int bf) {
    for (long m = 0; m < M; m++) {
        const float *r = h + m * H;
        const float inv = inv_rms(r, 0, H, eps, 0);
        for (long j = 0; j < H; j++) x[m * H + j] = R(at(w, j, bf) * R(r[j] * inv));
    }
}

/* The model's final norm over M rows h [M, H] into out [M, H], both stored as the format stores
 * activations (fp32, or bf16 where bf): the layers' norm, for the LM head's input. */
void rms_norm_rows(const void *h, const void *w, void *out, long M, long H, float eps, int bf) {
    for (long m = 0; m < M; m++) {
        const float inv = inv_rms(h, m * H, H, eps, bf);
        for (long j = 0; j < H; j++) store(out, m * H + j, R(at(w, j, bf) * R(at(h, m * H + j, bf) * inv)), bf);
    }
}

/* x [heads, D] in place: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[D/2:], x[:D/2]). */
static void rope(float *x, long heads, long D, const float *cos, const float *sin, int bf) {
    long half = D / 2;
    for (long h = 0; h < heads; h++) {
        float *v = x + h * D;
        float t[512];  /* head_dim <= 512 (checked by the caller) */
        for (long j = 0; j < D; j++) t[j] = v[j];
        for (long j = 0; j < half; j++) v[j] = R(R(t[j] * cos[j]) + R((-t[j + half]) * sin[j]));
        for (long j = half; j < D; j++) v[j] = R(R(t[j] * cos[j]) + R(t[j - half] * sin[j]));
    }
}

/* 8 cache values from element i on, as floats (AVX2 on every build: D is small). */
static inline __m256 kv8(const void *p, long i, const int kvb) {
    if (kvb) {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  /* bf16: the top half */
    }
    return _mm256_loadu_ps((const float *)p + i);
}

static inline float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}

/* One (row, query head): o = softmax(scale * q . K[slots]) . V[slots] over L slots; p: L floats. */
static inline void attend(const float *qv, const void *kc, const void *vc, const int64_t *slots, long L, long NKV,
                          long g, long D, float scale, float *p, float *o, const int kvb) {
    float mx = -INFINITY;
    for (long j = 0; j < L; j++) {
        long base = (slots[j] * NKV + g) * D, e = 0;
        __m256 acc = _mm256_setzero_ps();
        for (; e + 8 <= D; e += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(qv + e), kv8(kc, base + e, kvb), acc);
        float dot = hsum8(acc);
        for (; e < D; e++) dot += qv[e] * at(kc, base + e, kvb);
        p[j] = dot * scale;
        if (p[j] > mx) mx = p[j];
    }
    float sum = 0.f;
    for (long j = 0; j < L; j++) {
        p[j] = expf(p[j] - mx);
        sum += p[j];
    }
    for (long e = 0; e < D; e++) o[e] = 0.f;
    for (long j = 0; j < L; j++) {
        long base = (slots[j] * NKV + g) * D, e = 0;
        float pj = p[j] / sum;
        __m256 pv = _mm256_set1_ps(pj);
        for (; e + 8 <= D; e += 8)
            _mm256_storeu_ps(o + e, _mm256_fmadd_ps(pv, kv8(vc, base + e, kvb), _mm256_loadu_ps(o + e)));
        for (; e < D; e++) o[e] += pj * at(vc, base + e, kvb);
    }
}

/* out[m, hq, :] = softmax(scale * q[m, hq] . K[ctx]) . V[ctx] over row m's len[m] slots. */
static void attention(const float *q, const void *kc, const void *vc, const int64_t *ctx, const int64_t *lens,
                      long width, float *out, float *scores, long M, const Shape *s, int threads) {
    const long NQ = s->heads, NKV = s->kv_heads, D = s->head_dim, G = NQ / NKV, QW = NQ * D;
    const int bf = s->int4_group != 0, kvb = s->kv_bf16 != 0;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long task = 0; task < M * NQ; task++) {
        long m = task / NQ, hq = task % NQ;
        float *o = out + m * QW + hq * D;
        const float *qv = q + m * QW + hq * D;
        if (kvb) attend(qv, kc, vc, ctx + m * width, lens[m], NKV, hq / G, D, s->scale, scores + task * width, o, 1);
        else attend(qv, kc, vc, ctx + m * width, lens[m], NKV, hq / G, D, s->scale, scores + task * width, o, 0);
        for (long e = 0; e < D; e++) o[e] = R(o[e]);
    }
}

/* Floats of scratch decode_layers needs. */
long scratch_floats(long M, long H, long NQ, long NKV, long D, long I, long width) {
    return M * (2 * H + (NQ + 2 * NKV) * D + 2 * NQ * D + 3 * I) + M * NQ * width;
}

/* hidden [M, H] fp32 (bf16 values in the int4 format) in place through every layer; cos / sin
 * [M, D] fp32 (bf16 values in the int4 format). */
int decode_layers(const Layer *layers, long num_layers, const Shape *s, long M, float *hidden,
                  const float *cos, const float *sin, const int64_t *slot_mapping, const int64_t *ctx,
                  const int64_t *lens, long width, float *scratch, int threads) {  /* 0, or -1: out of memory */
    const long H = s->hidden, NQ = s->heads, NKV = s->kv_heads, D = s->head_dim, I = s->intermediate;
    const long QKV = (NQ + 2 * NKV) * D, QW = NQ * D;
    const int bf = s->int4_group != 0;
    float *x = scratch;                 /* [M, H] normed input */
    float *tmp = x + M * H;             /* [M, H] o / down projection output */
    float *qkv = tmp + M * H;           /* [M, QKV] */
    float *q = qkv + M * QKV;           /* [M, QW] the q part of qkv, contiguous */
    float *att = q + M * QW;            /* [M, QW] */
    float *gu = att + M * QW;           /* [M, 2 I] */
    float *act = gu + M * 2 * I;        /* [M, I] */
    float *scores = act + M * I;        /* [M * NQ, width] */
    for (long l = 0; l < num_layers; l++) {
        const Layer *L = layers + l;
        rms_norm(hidden, L->input_norm, x, M, H, s->eps, bf);
        if (linear(&L->qkv, L->qkv_bias, x, qkv, QKV, H, M, s, threads)) return -1;
        for (long m = 0; m < M; m++) {
            float *row = qkv + m * QKV;
            rope(row, NQ, D, cos + m * D, sin + m * D, bf);
            rope(row + QW, NKV, D, cos + m * D, sin + m * D, bf);
            long at_slot = slot_mapping[m] * NKV * D;
            for (long j = 0; j < NKV * D; j++) {
                store(L->k_cache, at_slot + j, row[QW + j], s->kv_bf16 != 0);
                store(L->v_cache, at_slot + j, row[QW + NKV * D + j], s->kv_bf16 != 0);
            }
        }
        for (long m = 0; m < M; m++)  /* q rows are strided by QKV in qkv */
            for (long j = 0; j < QW; j++) q[m * QW + j] = qkv[m * QKV + j];
        attention(q, L->k_cache, L->v_cache, ctx, lens, width, att, scores, M, s, threads);
        if (linear(&L->o, L->o_bias, att, tmp, H, QW, M, s, threads)) return -1;
        for (long j = 0; j < M * H; j++) hidden[j] = R(hidden[j] + tmp[j]);
        rms_norm(hidden, L->post_norm, x, M, H, s->eps, bf);
        if (linear(&L->gate_up, 0, x, gu, 2 * I, H, M, s, threads)) return -1;
        for (long m = 0; m < M; m++)
            for (long j = 0; j < I; j++) {
                float g = gu[m * 2 * I + j], u = gu[m * 2 * I + I + j];
                act[m * I + j] = R(R(g / (1.f + expf(-g))) * u);
            }
        if (linear(&L->down, 0, act, tmp, H, I, M, s, threads)) return -1;
        for (long j = 0; j < M * H; j++) hidden[j] = R(hidden[j] + tmp[j]);
    }
    return 0;
}
