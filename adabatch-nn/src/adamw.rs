//! AdamW's fused update of an f32 parameter: one pass reads the gradient once and
//! writes the parameter and both moments once. Its CPU body is here; its CUDA
//! body (`kernels/adamw.cu`, launched by `cuda_adamw.rs`) does the same
//! operations rounded the same way, so both give the same bits. The engine's
//! `adabatch::AdamW` runs it.

/// The constants of one AdamW update: `1 - beta`s and `keep` (`1 - lr·decay`)
/// computed in f64 and rounded once, as the CPU twin takes them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// The learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// `1 - beta1`.
    pub one_minus_beta1: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `1 - lr · weight_decay` (1 without decay).
    pub keep: f32,
    /// Added to the root of the second moment.
    pub eps: f32,
    /// `1 / (1 - beta1^t)`.
    pub scale_m: f32,
    /// `1 / (1 - beta2^t)`.
    pub scale_v: f32,
}

// SAFETY: a `repr(C)` struct of nine f32s, laid out as the kernel's `AdamWStep`.
#[cfg(feature = "cuda")]
unsafe impl candle_core::cuda_backend::cudarc::driver::DeviceRepr for AdamWStep {}

impl AdamWStep {
    /// The same constants without weight decay (`keep` = 1, an exact no-op).
    pub fn without_decay(self) -> Self {
        Self { keep: 1.0, ..self }
    }

    /// The update on CPU: `theta`, `m` and `v` in place from `grad` (all of one
    /// length).
    pub fn apply(&self, theta: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32]) {
        let u = self;
        for (((t, &g), m), v) in theta
            .iter_mut()
            .zip(grad)
            .zip(m.iter_mut())
            .zip(v.iter_mut())
        {
            *m = *m * u.beta1 + g * u.one_minus_beta1;
            *v = *v * u.beta2 + g * g * u.one_minus_beta2;
            let m_hat = *m * u.scale_m;
            let v_hat = *v * u.scale_v;
            *t = *t * u.keep - m_hat / (v_hat.sqrt() + u.eps) * u.lr;
        }
    }
}
