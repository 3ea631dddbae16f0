/* The decoder layers of a fp32 decode step in one call (engine/model/cpu_decode.py): M rows (one
 * new token per request, M <= 8), every layer, no Python between the operations.
 *
 * Per layer, for every row (the same arithmetic as engine/model/llama.py's run_layers):
 *
 *   x = rms_norm(h) * w_in                          fp32, mean of squares over hidden
 *   q | k | v = x @ Wqkv^T (+ bias)                 gemv_f32 / gemm_rows_f32 (gemv_avx2.c)
 *   q, k = rope(q), rope(k)                         x * cos + rotate_half(x) * sin, cos/sin given
 *   K[slot], V[slot] = k, v                         the row's new token into the paged cache
 *   a = softmax(scale * q . K[ctx]) . V[ctx]        per query head over its KV head (GQA), the
 *                                                   row's own context slots only
 *   h = h + a @ Wo^T (+ bias)
 *   x = rms_norm(h) * w_post
 *   g | u = x @ Wgu^T;  h = h + (silu(g) * u) @ Wdown^T
 *
 * Invariant: row i reads only its own context slots ctx[i, 0 .. len[i]) (written before, or just
 * now at slot_mapping[i]), so rows never see each other's K/V; each output element is summed by
 * one thread in one fixed order, so the result does not depend on the thread count.
 * Elementwise operations are compiled without FMA contraction (-ffp-contract=off), so they round
 * as torch's separate ops do; only the dot products (GEMVs, scores, softmax sums) differ from
 * torch in summation order. */
#include <math.h>
#include <stdint.h>

void gemv_f32(const float *W, const float *x, float *y, long N, long K, int threads);
void gemm_rows_f32(const float *W, const float *x, float *y, long N, long K, long M, int threads);

/* One layer's tensors (pointers into torch tensors; bias pointers may be NULL). */
typedef struct {
    const float *input_norm, *post_norm;  /* [H] */
    const float *qkv, *qkv_bias;          /* [(NQ + 2 NKV) D, H], [(NQ + 2 NKV) D] */
    const float *o, *o_bias;              /* [H, NQ D], [H] */
    const float *gate_up;                 /* [2 I, H] */
    const float *down;                    /* [H, I] */
    float *k_cache, *v_cache;             /* [num_slots, NKV, D] */
} Layer;

typedef struct {
    long hidden, heads, kv_heads, head_dim, intermediate;
    float eps, scale;
} Shape;

static void linear(const float *W, const float *bias, const float *x, float *y, long N, long K, long M,
                   int threads) {
    if (M == 1) gemv_f32(W, x, y, N, K, threads);
    else gemm_rows_f32(W, x, y, N, K, M, threads);
    if (bias)
        for (long m = 0; m < M; m++)
            for (long n = 0; n < N; n++) y[m * N + n] += bias[n];
}

static void rms_norm(const float *h, const float *w, float *x, long M, long H, float eps) {
    for (long m = 0; m < M; m++) {
        const float *r = h + m * H;
        float ss = 0.f;
        for (long j = 0; j < H; j++) ss += r[j] * r[j];
        float inv = 1.f / sqrtf(ss / (float)H + eps);
        for (long j = 0; j < H; j++) x[m * H + j] = w[j] * (r[j] * inv);
    }
}

/* x [heads, D] in place: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[D/2:], x[:D/2]). */
static void rope(float *x, long heads, long D, const float *cos, const float *sin) {
    long half = D / 2;
    for (long h = 0; h < heads; h++) {
        float *v = x + h * D;
        float t[512];  /* head_dim <= 512 (checked by the caller) */
        for (long j = 0; j < D; j++) t[j] = v[j];
        for (long j = 0; j < half; j++) v[j] = t[j] * cos[j] + (-t[j + half]) * sin[j];
        for (long j = half; j < D; j++) v[j] = t[j] * cos[j] + t[j - half] * sin[j];
    }
}

static float dot(const float *a, const float *b, long n) {
    float s = 0.f;
    for (long j = 0; j < n; j++) s += a[j] * b[j];
    return s;
}

/* out[m, hq, :] = softmax(scale * q[m, hq] . K[ctx]) . V[ctx] over row m's len[m] slots. */
static void attention(const float *q, const float *kc, const float *vc, const int64_t *ctx, const int64_t *lens,
                      long width, float *out, float *scores, long M, const Shape *s, int threads) {
    const long NQ = s->heads, NKV = s->kv_heads, D = s->head_dim, G = NQ / NKV, QW = NQ * D;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (long task = 0; task < M * NQ; task++) {
        long m = task / NQ, hq = task % NQ, g = hq / G, L = lens[m];
        const float *qv = q + m * QW + hq * D;
        const int64_t *slots = ctx + m * width;
        float *p = scores + task * width;
        float mx = -INFINITY;
        for (long j = 0; j < L; j++) {
            p[j] = dot(qv, kc + (slots[j] * NKV + g) * D, D) * s->scale;
            if (p[j] > mx) mx = p[j];
        }
        float sum = 0.f;
        for (long j = 0; j < L; j++) {
            p[j] = expf(p[j] - mx);
            sum += p[j];
        }
        float *o = out + m * QW + hq * D;
        for (long e = 0; e < D; e++) o[e] = 0.f;
        for (long j = 0; j < L; j++) {
            const float *vv = vc + (slots[j] * NKV + g) * D;
            float pj = p[j] / sum;
            for (long e = 0; e < D; e++) o[e] += pj * vv[e];
        }
    }
}

/* hidden [M, H] in place through every layer. scratch: scratch_floats(...) floats (below). */
long scratch_floats(long M, long H, long NQ, long NKV, long D, long I, long width) {
    return M * (2 * H + (NQ + 2 * NKV) * D + 2 * NQ * D + 3 * I) + M * NQ * width;
}

void decode_layers(const Layer *layers, long num_layers, const Shape *s, long M, float *hidden,
                   const float *cos, const float *sin, const int64_t *slot_mapping, const int64_t *ctx,
                   const int64_t *lens, long width, float *scratch, int threads) {
    const long H = s->hidden, NQ = s->heads, NKV = s->kv_heads, D = s->head_dim, I = s->intermediate;
    const long QKV = (NQ + 2 * NKV) * D, QW = NQ * D;
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
        rms_norm(hidden, L->input_norm, x, M, H, s->eps);
        linear(L->qkv, L->qkv_bias, x, qkv, QKV, H, M, threads);
        for (long m = 0; m < M; m++) {
            float *row = qkv + m * QKV;
            rope(row, NQ, D, cos + m * D, sin + m * D);
            rope(row + QW, NKV, D, cos + m * D, sin + m * D);
            float *kd = L->k_cache + slot_mapping[m] * NKV * D, *vd = L->v_cache + slot_mapping[m] * NKV * D;
            for (long j = 0; j < NKV * D; j++) {
                kd[j] = row[QW + j];
                vd[j] = row[QW + NKV * D + j];
            }
        }
        for (long m = 0; m < M; m++)  /* q rows are strided by QKV in qkv */
            for (long j = 0; j < QW; j++) q[m * QW + j] = qkv[m * QKV + j];
        attention(q, L->k_cache, L->v_cache, ctx, lens, width, att, scores, M, s, threads);
        linear(L->o, L->o_bias, att, tmp, H, QW, M, threads);
        for (long j = 0; j < M * H; j++) hidden[j] = hidden[j] + tmp[j];
        rms_norm(hidden, L->post_norm, x, M, H, s->eps);
        linear(L->gate_up, 0, x, gu, 2 * I, H, M, threads);
        for (long m = 0; m < M; m++)
            for (long j = 0; j < I; j++) {
                float g = gu[m * 2 * I + j], u = gu[m * 2 * I + I + j];
                act[m * I + j] = (g / (1.f + expf(-g))) * u;
            }
        linear(L->down, 0, act, tmp, H, I, M, threads);
        for (long j = 0; j < M * H; j++) hidden[j] = hidden[j] + tmp[j];
    }
}
