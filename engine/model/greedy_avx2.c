/* Greedy sampling's pick in C (engine/model/cpu_decode.py greedy_tokens): for each of M rows of V
 * fp32 logits, the first index of the row's maximum (torch.argmax's choice, ties to the lowest
 * index), or -1 where the row holds a NaN or an infinity (the sampler then reports that row).
 *
 * Rule: one vector pass keeps the running maximum and sums v - v (0 for every finite v, NaN for an
 * infinity or a NaN, and NaN stays NaN); a scalar pass then finds the first index equal to the
 * maximum (-0.0 == 0.0, as torch compares). Why: after a decode step's weights have streamed
 * through the caches, torch's isfinite / max / tolist cost tens of µs each; this is one call. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

void argmax_rows(const float *x, long M, long V, int64_t *out) {
    for (long m = 0; m < M; m++) {
        const float *r = x + m * V;
        __m256 mx = _mm256_set1_ps(-INFINITY), bad = _mm256_setzero_ps();
        long k = 0;
        for (; k + 8 <= V; k += 8) {
            __m256 v = _mm256_loadu_ps(r + k);
            mx = _mm256_max_ps(mx, v);
            bad = _mm256_add_ps(bad, _mm256_sub_ps(v, v));
        }
        float lanes[8], sums[8], best = -INFINITY, nonfinite = 0.f;
        _mm256_storeu_ps(lanes, mx);
        _mm256_storeu_ps(sums, bad);
        for (int i = 0; i < 8; i++) {
            best = lanes[i] > best ? lanes[i] : best;
            nonfinite += sums[i];
        }
        for (; k < V; k++) {
            best = r[k] > best ? r[k] : best;
            nonfinite += r[k] - r[k];
        }
        if (nonfinite != 0.f || V == 0) {  /* NaN != 0 */
            out[m] = -1;
            continue;
        }
        long i = 0;
        while (r[i] != best) i++;
        out[m] = i;
    }
}
