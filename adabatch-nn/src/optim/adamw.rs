//! AdamW's fused update of an f32 parameter: one pass reads the gradient once and
//! writes the parameter and both moments once. Its CPU body is here; its CUDA
//! body (`kernels/adamw.cu`, launched by `optim/cuda.rs`) does the same
//! operations rounded the same way, so both give the same bits. The engine's
//! `adabatch::AdamW` runs it.
//!
//! ```
//! # mod adabatch { pub mod nn { pub use adabatch_nn::*; } }
//! use adabatch::nn::AdamWStep;
//!
//! # fn main() -> candle_core::Result<()> {
//! // The first update (t = 1): the corrections make m̂ = g and v̂ = g², so the
//! // parameter moves by the rate against the gradient's sign.
//! let (beta1, beta2) = (0.9f32, 0.999f32);
//! let step = AdamWStep {
//!     lr: 0.1,
//!     beta1,
//!     beta2,
//!     one_minus_beta1: 1.0 - beta1,
//!     one_minus_beta2: 1.0 - beta2,
//!     keep: 1.0,
//!     eps: 0.0,
//!     scale_m: 1.0 / (1.0 - beta1),
//!     scale_v: 1.0 / (1.0 - beta2),
//! };
//! let (mut theta, mut m, mut v) = (vec![1.0f32, 1.0], vec![0.0; 2], vec![0.0; 2]);
//! step.apply(&mut theta, &[0.5, -3.0], &mut m, &mut v)?;
//! assert!((theta[0] - 0.9).abs() < 1e-5 && (theta[1] - 1.1).abs() < 1e-5);
//! # Ok(()) }
//! ```

use crate::cuda::kernel::Pass;
use crate::cuda::limits::ADAMW_THREADS;

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

    /// The CUDA kernel's launch over `n` elements (`kernels/adamw.cu`): blocks of
    /// [`ADAMW_THREADS`], a grid-stride loop past 65,535 blocks.
    #[cfg_attr(
        not(any(feature = "cuda", feature = "kernels-on-cpu")),
        allow(dead_code)
    )]
    pub(crate) fn pass(n: usize) -> Pass {
        Pass {
            entry: "adabatch_adamw_f32".into(),
            grid: ((n as u32).div_ceil(ADAMW_THREADS).min(65_535), 1, 1),
            block: (ADAMW_THREADS, 1, 1),
        }
    }

    /// The update on CPU: `theta`, `m` and `v` in place from `grad`; an error
    /// unless all four have one length.
    pub fn apply(
        &self,
        theta: &mut [f32],
        grad: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) -> candle_core::Result<()> {
        let n = theta.len();
        if grad.len() != n || m.len() != n || v.len() != n {
            candle_core::bail!(
                "adabatch AdamW: a parameter of {n}, a gradient of {} and moments of {} and {}",
                grad.len(),
                m.len(),
                v.len()
            )
        }
        #[cfg(feature = "kernels-on-cpu")]
        if crate::cuda::harness::kernels_on_cpu() {
            return self.apply_through_harness(&Self::pass(n), theta, grad, m, v);
        }
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
        Ok(())
    }
}

#[cfg(feature = "kernels-on-cpu")]
impl AdamWStep {
    /// The update by the CUDA body (`kernels/adamw.cu`) through the kernels'
    /// harness, launched as `pass` (`optim/cuda.rs` launches [`Self::pass`]; the
    /// checks also give it fewer blocks than elements, for its grid-stride loop).
    /// The four slices hold one length (`apply` checks it).
    pub(crate) fn apply_through_harness(
        &self,
        pass: &Pass,
        theta: &mut [f32],
        grad: &[f32],
        m: &mut [f32],
        v: &mut [f32],
    ) -> candle_core::Result<()> {
        use crate::cuda::harness::{Args, launch};
        let n = theta.len();
        if n == 0 {
            return Ok(());
        }
        let (theta, m, v) = (theta.as_mut_ptr(), m.as_mut_ptr(), v.as_mut_ptr());
        let (grad, len) = (grad.as_ptr(), n as i64);
        let args = Args::new()
            .arg(&theta)
            .arg(&grad)
            .arg(&m)
            .arg(&v)
            .arg(self)
            .arg(&len);
        // SAFETY: `adabatch_adamw_f32`'s arguments; `apply` checked that the four
        // slices hold `n` elements each.
        unsafe { launch(pass, args) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> AdamWStep {
        AdamWStep {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            one_minus_beta1: 0.1,
            one_minus_beta2: 0.001,
            keep: 0.99,
            eps: 1e-8,
            scale_m: 10.0,
            scale_v: 1000.0,
        }
    }

    #[test]
    fn one_step_follows_the_closed_form_and_refuses_mismatched_lengths() {
        let (mut theta, mut m, mut v) = ([1.0f32], [0.0f32], [0.0f32]);
        step().apply(&mut theta, &[2.0], &mut m, &mut v).unwrap();
        // m = 0.2, v = 0.004; m̂ = 2, v̂ = 4: θ = 0.99 − 0.1·2/(2 + 1e-8).
        assert_eq!((m[0], v[0]), (0.2, 0.004));
        assert!(
            (theta[0] - (0.99 - 0.1 * 2.0 / (2.0 + 1e-8))).abs() < 1e-6,
            "{theta:?}"
        );
        let mut short = [0.0f32];
        let err = step().apply(&mut [1.0, 2.0], &[1.0, 2.0], &mut short, &mut [0.0, 0.0]);
        assert!(err.is_err());
    }
}
