// Every kernel of kernels/*.cu, compiled for the CPU (cuda_cpu.h), and the table
// of their entry points by name, as a GPU module's functions are looked up. Each
// entry calls its kernel from a `void **` of pointers to the arguments, as
// cuLaunchKernel passes them.
//
// The tables are written by the .cu files' own entry macros, redefined after
// their inclusion: a kernel they define is a kernel listed here.

#include "cuda_cpu.h"

#include "../rows.cu"
#include "../attention.cu"
#include "../adamw.cu"

#include "kernels.h"

#undef ENTRY
#define ENTRY(NAME, SUFFIX, T, BODY)                                                               \
    {"adabatch_" #NAME "_" #SUFFIX, [](void **p) {                                                 \
         adabatch_##NAME##_##SUFFIX(*(const T **)p[0], *(const T **)p[1], *(const T **)p[2],       \
                                    *(T **)p[3], *(Acc<T>::type **)p[4], *(RowArgs *)p[5]);        \
     }},

#undef ATTENTION_ENTRY
#define ATTENTION_ENTRY(NAME, C, SUFFIX, T)                                                        \
    {"adabatch_" #NAME "_c" #C "_" #SUFFIX, [](void **p) {                                         \
         adabatch_##NAME##_c##C##_##SUFFIX(*(const T **)p[0], *(const T **)p[1],                  \
                                           *(const T **)p[2], *(const T **)p[3],                   \
                                           *(const T **)p[4], *(const int64_t **)p[5],             \
                                           *(Acc<T>::type **)p[6], *(Acc<T>::type **)p[7],         \
                                           *(T **)p[8], *(AttnArgs *)p[9]);                        \
     }},

// The dtypes each .cu file instantiates (its last lines), in the same order.
static const harness::KernelEntry KERNELS[] = {
    ROW_KERNELS(float, f32) ROW_KERNELS(double, f64) ROW_KERNELS(__half, f16)
        ROW_KERNELS(__nv_bfloat16, bf16)
    ATTENTION_KERNELS(float, f32) ATTENTION_KERNELS(double, f64) ATTENTION_KERNELS(__half, f16)
        ATTENTION_KERNELS(__nv_bfloat16, bf16)
    {"adabatch_adamw_f32",
     [](void **p) {
         adabatch_adamw_f32(*(float **)p[0], *(const float **)p[1], *(float **)p[2],
                            *(float **)p[3], *(AdamWStep *)p[4], *(long long *)p[5]);
     }},
};

namespace harness {

const KernelEntry *kernels(size_t *count) {
    *count = sizeof(KERNELS) / sizeof(KERNELS[0]);
    return KERNELS;
}

}  // namespace harness
