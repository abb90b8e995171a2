//! Mixed precision's half in the model: candle has no autocast of its own, so a
//! model opts in where it computes. Under a scope ([`AutocastScope`], which the
//! engine enters for `--bf16` / `--fp16`) [`autocast`] casts floating tensors to the
//! compute dtype; outside one it returns its input.
//!
//! ```
//! # use candle_core::{Device, Tensor};
//! # let layer = candle_nn::Linear::new(Tensor::ones((2, 3), candle_core::DType::F32, &Device::Cpu)?, None);
//! # let x = Tensor::ones((4, 3), candle_core::DType::F32, &Device::Cpu)?;
//! // In `per_example_loss`: half-precision matmuls, f32 loss.
//! let hidden = adabatch_nn::autocast_linear(&layer, &x)?; // `adabatch::autocast_linear`
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! The casts are differentiable: a gradient flows back through them into the f32
//! variable, in f32.

use std::cell::Cell;

use candle_core::{DType, Tensor};

thread_local! {
    /// The compute dtype of the forward pass running on this thread (each rank is
    /// a thread), and how many casts the model made under it.
    static AUTOCAST: Cell<(Option<DType>, usize)> = const { Cell::new((None, 0)) };
}

/// `tensor` in the compute dtype while a model runs under an [`AutocastScope`] of
/// a half dtype; otherwise (and for integer tensors) `tensor` itself.
pub fn autocast(tensor: &Tensor) -> candle_core::Result<Tensor> {
    let (dtype, casts) = AUTOCAST.get();
    match dtype {
        Some(dtype) if tensor.dtype().is_float() => {
            AUTOCAST.set((Some(dtype), casts + 1));
            if tensor.dtype() == dtype {
                Ok(tensor.clone())
            } else {
                tensor.to_dtype(dtype)
            }
        }
        _ => Ok(tensor.clone()),
    }
}

/// `layer` applied to `x` under [`autocast`]: weight, bias and input cast, then
/// `x·Wᵀ + b` in the compute dtype.
pub fn autocast_linear(layer: &candle_nn::Linear, x: &Tensor) -> candle_core::Result<Tensor> {
    use candle_nn::Module;
    let cast = candle_nn::Linear::new(
        autocast(layer.weight())?,
        layer.bias().map(autocast).transpose()?,
    );
    cast.forward(&autocast(x)?)
}

/// The forward passes that run on this thread while it lives compute in its
/// dtype (`None`: f32, casts return their input); dropping it restores f32.
#[derive(Debug)]
pub struct AutocastScope {
    dtype: Option<DType>,
}

impl AutocastScope {
    /// Casts on this thread go to `dtype` until the scope is dropped.
    pub fn enter(dtype: Option<DType>) -> Self {
        AUTOCAST.set((dtype, 0));
        Self { dtype }
    }

    /// The dtype casts go to.
    pub fn dtype(&self) -> Option<DType> {
        self.dtype
    }

    /// How many floating tensors the model has cast since the scope began: zero
    /// under a half dtype means the model never opted in and computes in f32.
    pub fn casts(&self) -> usize {
        AUTOCAST.get().1
    }
}

impl Drop for AutocastScope {
    fn drop(&mut self) {
        AUTOCAST.set((None, 0));
    }
}
