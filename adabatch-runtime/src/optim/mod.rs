//! Checkpointable optimizers: adabatch's own [`AdamW`] and [`Sgd`] (the updates of
//! candle's, fused and in place on the CPU, with their state saved by parameter
//! name), and the [`TrainOptimizer`] trait through which the engine saves and
//! restores any optimizer's state.

mod adamw;
pub mod groups;
pub mod precision;
mod sgd;
pub mod state;

pub use adamw::{AdamW, ParamsAdamW};
pub use groups::{HeldParameters, ParamGroups};
pub use sgd::Sgd;
pub use state::OptimizerState;

use candle_core::{Tensor, Var};

use crate::error::Result;

/// An optimizer the engine can train with and checkpoint. Implemented by
/// [`AdamW`] and [`Sgd`] (exact resume), by candle's `SGD` (stateless) and by
/// candle's `AdamW` (which cannot export its moments: a checkpoint then warns, and
/// resuming needs `--ignore-optimizer-state`). For an optimizer of your own, an
/// empty `impl TrainOptimizer for MyOptimizer {}` declares that it cannot save its
/// state.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an optimizer adabatch can train with",
    label = "the `#[optimizer]` field must implement `adabatch::TrainOptimizer`",
    note = "use `adabatch::AdamW` or `adabatch::Sgd` (checkpointable), candle's `AdamW`/`SGD`, or implement `candle_nn::Optimizer` and `adabatch::TrainOptimizer` for your own"
)]
pub trait TrainOptimizer: candle_nn::Optimizer {
    /// The variables this optimizer updates and the parameters declared frozen,
    /// or `None` when it cannot tell (candle's optimizers). With an answer the
    /// engine checks, before the first step, that it holds only parameters the
    /// model names and every one that is not frozen.
    fn held_parameters(&self) -> Option<HeldParameters> {
        None
    }

    /// Each of `params`' preconditioner, the factor its gradient is multiplied
    /// by before the gradient noise scale is measured under `lr_scaling =
    /// adamscale` (`None` inside: the identity), or `None` when this optimizer
    /// has none (the run then refuses `adamscale` before its first step).
    fn preconditioner(&self, params: &[(String, Var)]) -> Result<Option<Vec<Option<Tensor>>>> {
        let _ = params;
        Ok(None)
    }

    /// The state to checkpoint, keyed by the names of `params` (the model's named
    /// parameters), or `None` when this optimizer cannot export it.
    fn export_state(&self, params: &[(String, Var)]) -> Result<Option<OptimizerState>> {
        let _ = params;
        Ok(None)
    }

    /// Restores a state this kind of optimizer exported. The default refuses.
    fn import_state(&mut self, params: &[(String, Var)], state: &OptimizerState) -> Result<()> {
        let _ = params;
        Err(crate::error::Error::Checkpoint(
            crate::error::CheckpointError::OptimizerStateUnsupported {
                kind: state.kind.clone(),
            },
        ))
    }
}

/// candle's `AdamW` keeps its moments private: it cannot be checkpointed.
impl TrainOptimizer for candle_nn::AdamW {}

/// candle's `SGD` has no state besides the learning rate, which the engine sets.
impl TrainOptimizer for candle_nn::SGD {
    fn export_state(&self, _params: &[(String, Var)]) -> Result<Option<OptimizerState>> {
        Ok(Some(OptimizerState::new("candle_nn::SGD", 0)))
    }

    fn import_state(&mut self, _params: &[(String, Var)], state: &OptimizerState) -> Result<()> {
        state.expect_kind("candle_nn::SGD")
    }
}

/// Finds `var` among `params` by identity (the same variable, not an equal one).
pub(crate) fn name_of<'a>(params: &'a [(String, Var)], var: &Var) -> Option<&'a str> {
    let id = var.as_tensor().id();
    params
        .iter()
        .find(|(_, v)| v.as_tensor().id() == id)
        .map(|(name, _)| name.as_str())
}
