//! The controllers' parts of a checkpoint, one key each in its trainer state.

use crate::adapt::goodput::GoodputState;
use crate::adapt::noise_scale::NoiseScaleEstimator;
use crate::memory::memory_model::OnlineMemoryState;
use crate::optim::precision::LossScaler;

/// The controllers' parts of a checkpoint (flattened into its trainer state, one
/// key each).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ControllerStates {
    /// OOM events handled so far.
    pub oom_events: usize,
    /// The online memory model's fit (memory-aware runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_fit: Option<[f64; 5]>,
    /// Rank 0's online memory model whole, as checkpoints written before
    /// `memory_models` held it (read only when `memory_models` is absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_model: Option<OnlineMemoryState>,
    /// Every rank's online memory model whole (observations and sums), by rank:
    /// each rank fits its own measurements, and a resumed run refits as the
    /// uninterrupted one would. On another number of ranks, rank `r` continues
    /// rank `r % world_size`'s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_models: Option<Vec<OnlineMemoryState>>,
    /// The gradient noise scale estimator's moving averages, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_scale: Option<NoiseScaleEstimator>,
    /// `schedule = goodput(..)`: the measured step times and the last decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<GoodputState>,
    /// The mixer's state, when the run has one (its weights are in the planner's
    /// sources).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixer: Option<Vec<f64>>,
    /// The trainer's `#[callback]` state ([`crate::Callback::state`]), when it
    /// keeps one (`EarlyStopping`'s best value and patience used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<serde_json::Value>,
    /// `--fp16`'s loss scale and its count of clean steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
}
