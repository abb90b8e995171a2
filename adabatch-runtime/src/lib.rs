//! The adabatch runtime: an adaptive-batch training engine on candle.
//!
//! The loop is written once here and monomorphised per trainer; the
//! `#[adaptive_trainer]` attribute (crate `adabatch-macros`) only emits typed glue.
//! See the `adabatch` crate for the user-facing documentation.
//!
//! The crate root is the stable surface: what a program needs. The folders below
//! it are the design, each concept in a file named after it, imports only running
//! downward; they are crate-private, public (and hidden from the docs) only under
//! the `internals` feature that the workspace's tests, benchmarks and tools
//! enable, and may change between releases:
//!
//! | module | what it holds |
//! |---|---|
//! | `user` | what a user implements or builds: model, data, trainer, parameters, callbacks, losses |
//! | `config` | settings: `TrainingArgs` (run time) and `TrainerPolicy` (the attribute) |
//! | `adapt` | the policies, what decides sizes and weights: schedules and ramps, the noise-scale estimator, goodput, mixers, learning rate |
//! | `data` | which examples go into which step: sampler, sources, length-aware epochs, planner |
//! | `memory` | predicting and measuring peak memory |
//! | `optim` | checkpointable optimizers ([`AdamW`], [`Sgd`]), their state, mixed precision |
//! | `dist` | communicators between ranks, rendezvous, device parsing |
//! | `report` | records ([`StepLog`], [`EvalLog`]) apart from their sinks (console, JSONL, TensorBoard, plots), the summary |
//! | `train` | on top of everything: the run's settings and every check of them, one step, evaluation, checkpoints, the controllers that adapt the run after a step (one interface, one order), the rank run as an object, the entry point ([`Run`]) |
//!
//! The building blocks models are made of (fused ops, autocast, the seeded
//! [`Parameters`] store, the Llama family) are crate `adabatch-nn`, re-exported
//! here as [`nn`] and [`models`].

#![warn(missing_docs)]
// Every type a public signature names can be named from the root (checked in
// every build without `internals`: the published crate, the docs, a user's).
#![cfg_attr(not(feature = "internals"), deny(unnameable_types))]

// The internal modules: crate-private, and public (hidden from the docs) under the
// `internals` feature, which the workspace's own tests, benchmarks and tools enable
// to reach the engine's parts; a program uses the crate root. Declared twice each,
// not through a macro, so that rustfmt (which does not expand macros) formats them.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod adapt;
#[cfg(not(feature = "internals"))]
mod adapt;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod config;
#[cfg(not(feature = "internals"))]
mod config;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod data;
#[cfg(not(feature = "internals"))]
mod data;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod dist;
#[cfg(not(feature = "internals"))]
mod dist;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod error;
#[cfg(not(feature = "internals"))]
mod error;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod memory;
#[cfg(not(feature = "internals"))]
mod memory;
/// Differentiable fused ops and layers (norms, softmax, ropes) for models from
/// candle's world: crate `adabatch-nn`, apart from the engine.
pub use adabatch_nn as nn;
/// Models built on the differentiable ops, under Hugging Face's weight names: a
/// Llama-family decoder ([`models::llama`]). Crate `adabatch-nn`'s.
pub use adabatch_nn::models;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod optim;
#[cfg(not(feature = "internals"))]
mod optim;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod report;
#[cfg(not(feature = "internals"))]
mod report;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod train;
#[cfg(not(feature = "internals"))]
mod train;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod user;
#[cfg(not(feature = "internals"))]
mod user;

pub use adabatch_nn::Parameters;
pub use adabatch_nn::{autocast, autocast_linear};
pub use adapt::aioli::AioliMixer;
pub use adapt::bounded_replay::BoundedReplay;
pub use adapt::goodput::{
    GoodputLog, GoodputReason, GoodputSpec, StepShape, StepTimeFit, StepTimeFn,
};
pub use adapt::lr::{adam_scale_gain, LrScaling, LrSchedulerType, StableDecay};
pub use adapt::mixer::{
    Closing, CurriculumMixer, Diagnostic, Exp3Mixer, FnMixer, LastEval, MixFn, MixWarmup, Mixer,
    OnlineMixer, SourceGradient, SourceStats,
};
pub use adapt::noise_cadence::SplitCostModel;
pub use adapt::noise_scale::{MeasureEvery, NoiseMeasurement, NoiseScalePolicy};
pub use adapt::pike::PikeMixer;
pub use adapt::replay_budget::ReplayBudget;
pub use adapt::schedule::{Growth, Ramp, ScheduleFn, ScheduleSpec};
pub use config::args::{
    BatchArgs, DataArgs, EvalArgs, IntervalStrategy, LaunchArgs, LengthAwareArgs, LogArgs, LrArgs,
    OptimArgs, OptimName, ReportTo, RunLengthArgs, SaveArgs, StepArgs, TrainingArgs,
};
pub use config::hf_argv::{hf_argv, hf_matches, ParseHf};
pub use config::policy::{
    GradAccum, MixSpec, OomPolicy, Reweight, StoppingStrategy, TrainerPolicy,
};
pub use data::source_spec::{MixUnit, SourceSpec};
pub use data::token_files::{TokenDocuments, TokenFile, TokenWidth, TokenWindows};
#[cfg(feature = "tokenizers")]
pub use data::tokenize;
pub use dist::communicator::{Communicator, Local, Single};
pub use dist::cpu_threads::share_cpu_cores;
#[cfg(feature = "nccl")]
pub use dist::nccl::{Nccl, NcclFailure};
#[cfg(feature = "nccl")]
pub use dist::rendezvous::{Rendezvous, TorchrunEnv};
pub use error::INTERRUPTED_EXIT_CODE;
pub use error::{
    exit_code, Cause, CheckpointError, DataError, DistributedError, Error, FileOp, ModelError,
    RendezvousError, Result, SettingsError, TrainingError,
};
pub use memory::memory_model::{
    BatchFeatures, MemoryModel, OnlineMemoryModel, OnlineMemoryState, PaddedTokens,
};
pub use optim::precision::Precision;
pub use optim::{
    AdamW, HeldParameters, OptimizerState, ParamGroups, ParamsAdamW, Sgd, TrainOptimizer,
};
/// The library's warnings and notes: `tracing` events of target `adabatch` under a
/// subscriber, else printed on standard error ([`messages::warning`]).
pub mod messages {
    pub use crate::report::messages::{note, warning};
}
pub use report::plot::{plot_runs, RunLog};
pub use report::record::{EvalLog, HeldOutCost, SourceGradientCost, SourceLog, StepLog};
pub use report::summary::{ClosingSummary, TrainSummary, Trained};
pub use train::dry_run::{dry_run, DryRun};
pub use train::launch::{RankFactory, Run};
pub use user::callback::{Callback, EarlyStopping, TrainerControl, TrainerState};
pub use user::data::{Collate, Dataset, WithLengths};
#[cfg(feature = "tokenizers")]
pub use user::domains::{prepare_domains, Domains, DomainsInfo};
pub use user::loss::{
    count_target_tokens, per_example_cross_entropy, per_example_token_cross_entropy,
    per_example_token_cross_entropy_sum, TokenReduction,
};
pub use user::sources::Sources;
pub use user::token_batches::{
    Document, PackedBatch, PackedCollate, PackedRows, WindowBatch, WindowCollate, IGNORE_INDEX,
};
pub use user::train_model::{Batch, TrainModel};
pub use user::trainer::{AdaptiveTrainer, CollateFor, RankContext};
pub use user::weights::{load_weights, save_pretrained, LoadPretrained, LoadReport};

// Reachable from public signatures (the sampler's sources, the checkpointed
// mixture), named here so that they can be named; not a stable API.
#[doc(hidden)]
pub use data::mixture::Mixture;
#[doc(hidden)]
pub use data::source_spec::{MixedSources, SourceCursor, SourcesState};
// The fault-injection hook of tests: only for the workspace's own builds.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub use train::out_of_memory::FaultInjector;
