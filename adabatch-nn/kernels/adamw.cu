// AdamW's update of one f32 parameter in one pass (src/adamw.rs launches it): the
// arithmetic of the CPU twin (adabatch-runtime's fused AdamW) operation for
// operation, each rounded on its own (`__fmul_rn`, `__fadd_rn`: no fused
// multiply-add), so that CPU and CUDA give the same bits.

struct AdamWStep {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, keep, eps, scale_m, scale_v;
};

extern "C" __global__ void adabatch_adamw_f32(float *theta, const float *grad, float *m,
                                              float *v, AdamWStep a, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = grad[i];
        const float mi = __fadd_rn(__fmul_rn(m[i], a.beta1), __fmul_rn(g, a.one_minus_beta1));
        const float vi =
            __fadd_rn(__fmul_rn(v[i], a.beta2), __fmul_rn(__fmul_rn(g, g), a.one_minus_beta2));
        m[i] = mi;
        v[i] = vi;
        const float m_hat = __fmul_rn(mi, a.scale_m);
        const float v_hat = __fmul_rn(vi, a.scale_v);
        const float step = __fmul_rn(__fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), a.eps)), a.lr);
        theta[i] = __fsub_rn(__fmul_rn(theta[i], a.keep), step);
    }
}
