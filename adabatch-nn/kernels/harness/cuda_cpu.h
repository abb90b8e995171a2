// The CUDA programming model on the CPU, for running adabatch-nn's kernels
// (kernels/*.cu, included unchanged by kernels.cpp) where no GPU is: test code,
// compiled by g++ only under the `kernels-on-cpu` feature (build.rs,
// scripts/kernels-on-cpu.sh).
//
// What it models:
// - One OS thread per CUDA thread of a block; the blocks of a launch run one
//   after another, on the same threads (runtime.cpp).
// - threadIdx, blockIdx, blockDim and gridDim per thread.
// - __shared__ arrays, one per block (function statics: the blocks run one at a
//   time), filled with NaN bytes at each block's start, so that a read before a
//   write shows in the results.
// - __syncthreads, __syncthreads_or and __syncwarp as barriers over the block or
//   the warp. Every thread of the block (or warp) must reach the same barrier:
//   one that others pass by, or a thread that returns while others wait, fails
//   the launch (divergence, deadlock) instead of hanging; a watchdog fails a
//   launch whose threads stop making progress.
// - __shfl_xor_sync per warp through a slot array between warp barriers: the
//   lanes of one warp exchange values, so a shuffle only warp 0 runs works; a
//   mask other than the warp's lanes, or a width other than 32, fails.
// - __half and __nv_bfloat16 as 16-bit patterns, converted from float rounding
//   to nearest even (as __float2half and __float2bfloat16 do), NaNs kept NaN.
// - The _rn intrinsics, each one IEEE operation; kernels.cpp is compiled with
//   -ffp-contract=off, so no multiply-add is fused anywhere.
//
// What it cannot see (only a GPU can tell):
// - Speed, occupancy, register spills and bank conflicts.
// - FMA contraction: nvcc fuses a·b + c by default, the harness never does; the
//   twins' tolerances cover the difference, AdamW's `_rn` arithmetic is bit-equal.
// - libdevice's math: expf, logf and sqrtf here are the host's (a few ulp apart).
// - Warps that run ahead of each other: the harness's warps are interleaved by
//   the OS, which is one schedule among those a GPU may take; ThreadSanitizer
//   (scripts/kernels-on-cpu.sh) makes a missing barrier a race in any schedule.
// - Memory-model effects across blocks (no kernel here communicates between
//   blocks) and atomics (none is used).
// - Launch limits: registers and shared memory per block are checked from
//   ptxas's report in the GPU build (build.rs with the `cuda` feature).

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
};

// The builtin variables of the running thread, set by the runtime.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One array per kernel instance, shared by the block's threads; kernels.cpp is
// compiled with -fno-weak so that each is a common symbol the runtime places
// (build.rs: shared.cpp defines each, with a redzone under AddressSanitizer, and
// lists them for the fill at each block's start).
#define __shared__ static

namespace harness {

// A barrier of the running block, `site` naming it in errors; returns the OR of
// every thread's `predicate`.
int sync_block(const char *site, int predicate);
// A barrier of the running thread's warp.
void sync_warp(unsigned mask, const char *site);
// The value of lane (this lane ^ lane_mask) of the warp, as 8 bytes.
uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask, int width, const char *site);

template <typename V> V shfl_xor(unsigned mask, V value, int lane_mask, int width, const char *site) {
    static_assert(sizeof(V) <= 8, "a shuffled value has at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(V));
    bits = shuffle_xor(mask, bits, lane_mask, width, site);
    V out;
    std::memcpy(&out, &bits, sizeof(V));
    return out;
}

}  // namespace harness

#define HARNESS_STR2(x) #x
#define HARNESS_STR(x) HARNESS_STR2(x)
#define HARNESS_SITE __FILE__ ":" HARNESS_STR(__LINE__)

#define __syncthreads() ((void)harness::sync_block("__syncthreads at " HARNESS_SITE, 0))
#define __syncthreads_or(p) harness::sync_block("__syncthreads_or at " HARNESS_SITE, (p) ? 1 : 0)
#define __syncwarp(...) harness::sync_warp(harness_mask_or_all(__VA_ARGS__), "__syncwarp at " HARNESS_SITE)
#define __shfl_xor_sync(mask, value, ...)                                                          \
    harness::shfl_xor((mask), (value), harness_lane_and_width(__VA_ARGS__), "__shfl_xor_sync at " HARNESS_SITE)

inline unsigned harness_mask_or_all() { return 0xffffffffu; }
inline unsigned harness_mask_or_all(unsigned mask) { return mask; }
// __shfl_xor_sync(mask, value, lane_mask[, width = 32]): the last two arguments.
#define harness_lane_and_width(...) HARNESS_LW(__VA_ARGS__, 32, 0)
#define HARNESS_LW(lane, width, ...) (lane), (width)

// Half and bfloat16 storage: the bit pattern, as on the device.
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

inline uint32_t harness_float_bits(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
}

inline float harness_bits_float(uint32_t u) {
    float v;
    std::memcpy(&v, &u, 4);
    return v;
}

// float -> binary16, rounding to nearest even (subnormals, overflow to
// infinity, NaN kept quiet NaN).
inline __half __float2half(float f) {
    const uint32_t x = harness_float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xffu) {
        return {(uint16_t)(sign | 0x7c00u | (man ? 0x0200u | (man >> 13) : 0u))};
    }
    const int half_exp = (int)exp - 127 + 15;
    if (half_exp >= 0x1f) {
        return {(uint16_t)(sign | 0x7c00u)};
    }
    if (half_exp <= 0) {
        if (14 - half_exp > 24) {
            return {(uint16_t)sign};
        }
        const uint32_t full = man | 0x800000u;
        uint32_t half_man = full >> (14 - half_exp);
        const uint32_t round_bit = 1u << (13 - half_exp);
        if ((full & round_bit) && (full & (3 * round_bit - 1))) {
            ++half_man;
        }
        return {(uint16_t)(sign | half_man)};
    }
    uint32_t out = sign | ((uint32_t)half_exp << 10) | (man >> 13);
    const uint32_t round_bit = 0x1000u;
    if ((man & round_bit) && (man & (3 * round_bit - 1))) {
        ++out;  // a carry into the exponent is the correct rounding
    }
    return {(uint16_t)out};
}

inline float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
    const uint32_t exp = (h.bits >> 10) & 0x1fu, man = h.bits & 0x3ffu;
    if (exp == 0x1fu) {
        return harness_bits_float(sign | 0x7f800000u | (man << 13));
    }
    if (exp == 0) {
        const float v = std::ldexp((float)man, -24);  // exact
        return sign ? -v : v;
    }
    return harness_bits_float(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

// float -> bfloat16, rounding to nearest even, NaN kept quiet NaN.
inline __nv_bfloat16 __float2bfloat16(float f) {
    const uint32_t x = harness_float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return {(uint16_t)((x >> 16) | 0x0040u)};
    }
    return {(uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

inline float __bfloat162float(__nv_bfloat16 b) { return harness_bits_float((uint32_t)b.bits << 16); }

// One IEEE operation each, rounded to nearest (no contraction: -ffp-contract=off).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }

// CUDA's overloads of min and max for the device (fminf / fmaxf for floats).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// expf, logf, sqrtf, nanf, exp, log, sqrt and nan are the host's (<cmath>).
