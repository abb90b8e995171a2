// What the kernels of adabatch-nn share: the type each dtype computes in (float
// for f32, f16 and bf16, double for f64), conversions, and warp reductions.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
    return __float2bfloat16(v);
}
template <typename T> __device__ __forceinline__ T from_acc(double v) { return v; }

__device__ __forceinline__ float acc_exp(float v) { return expf(v); }
__device__ __forceinline__ double acc_exp(double v) { return exp(v); }
__device__ __forceinline__ float acc_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double acc_sqrt(double v) { return sqrt(v); }

__device__ __forceinline__ float acc_log(float v) { return logf(v); }
__device__ __forceinline__ double acc_log(double v) { return log(v); }
template <typename A> __device__ __forceinline__ A acc_nan();
template <> __device__ __forceinline__ float acc_nan<float>() { return nanf(""); }
template <> __device__ __forceinline__ double acc_nan<double>() { return nan(""); }

template <typename A> __device__ __forceinline__ A warp_sum(A v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffff, v, offset);
    }
    return v;
}

template <typename A> __device__ __forceinline__ A warp_max(A v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        A other = __shfl_xor_sync(0xffffffff, v, offset);
        v = other > v ? other : v;
    }
    return v;
}
