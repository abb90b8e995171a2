//! Plain SGD (candle's update, in place), checkpointable.

use candle_core::backprop::GradStore;
use candle_core::Var;

use super::groups::{HeldParameters, ParamGroups};
use super::{OptimizerState, TrainOptimizer};
use crate::error::Result;

const KIND: &str = "adabatch::Sgd";

/// Stochastic gradient descent without momentum (`theta -= lr * grad`).
#[derive(Debug)]
pub struct Sgd {
    vars: Vec<Var>,
    lr: f64,
    /// Names declared frozen ([`Sgd::with_groups`]).
    frozen: Vec<String>,
}

impl Sgd {
    /// SGD over `vars` (non-float variables are skipped).
    pub fn new(vars: Vec<Var>, lr: f64) -> Self {
        Self {
            vars: vars.into_iter().filter(|v| v.dtype().is_float()).collect(),
            lr,
            frozen: Vec::new(),
        }
    }

    /// SGD over the trainable parameters of `named` (SGD has no weight decay:
    /// only `groups`' frozen set matters).
    pub fn with_groups(named: &[(String, Var)], groups: &ParamGroups, lr: f64) -> Self {
        let vars = groups.trainable(named).into_iter().map(|t| t.1).collect();
        Self {
            frozen: groups.frozen().map(String::from).collect(),
            ..Self::new(vars, lr)
        }
    }
}

impl candle_nn::Optimizer for Sgd {
    type Config = f64;

    fn new(vars: Vec<Var>, lr: f64) -> candle_core::Result<Self> {
        Ok(Sgd::new(vars, lr))
    }

    fn step(&mut self, grads: &GradStore) -> candle_core::Result<()> {
        for var in &self.vars {
            if let Some(grad) = grads.get(var.as_tensor()) {
                var.set(&var.as_tensor().sub(&(grad * self.lr)?)?)?;
            }
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }
}

impl TrainOptimizer for Sgd {
    fn held_parameters(&self) -> Option<HeldParameters> {
        Some(HeldParameters {
            vars: self.vars.clone(),
            frozen: self.frozen.clone(),
        })
    }

    fn export_state(&self, _params: &[(String, Var)]) -> Result<Option<OptimizerState>> {
        let mut state = OptimizerState::new(KIND, 0);
        state.hyper.insert("lr".into(), self.lr);
        Ok(Some(state))
    }

    fn import_state(&mut self, _params: &[(String, Var)], state: &OptimizerState) -> Result<()> {
        state.expect_kind(KIND)?;
        self.lr = state.hyper("lr")?;
        Ok(())
    }
}
