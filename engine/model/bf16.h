/* bfloat16 <-> float for the C library (gemv_avx2.c, decode_avx2.c): a bf16 value is the top half
 * of a float; rounding to bf16 is to nearest, ties to even (finite values), as torch's is. */
#ifndef INFERSCOPE_BF16_H
#define INFERSCOPE_BF16_H
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
#endif
