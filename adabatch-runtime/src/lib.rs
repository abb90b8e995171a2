//! The adabatch runtime: an adaptive-batch training engine on candle.
//!
//! The loop is written once here and monomorphised per trainer; the
//! `#[adaptive_trainer]` attribute (crate `adabatch-macros`) only emits typed glue.
//! See the `adabatch` crate for the user-facing documentation.

#![warn(missing_docs)]

pub mod args;
pub mod checkpoint;
pub mod communicator;
pub mod device_memory;
pub mod engine;
pub mod error;
pub mod length_batching;
pub mod logging;
pub mod lr;
pub mod memory;
pub mod model;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod oom;
pub mod params;
pub mod planner;
pub mod policy;
pub mod rendezvous;
mod run_plan;
pub mod sampler;
pub mod schedule;
mod step;
pub mod trainer;

pub use args::{LrSchedulerType, TrainingArgs};

pub use checkpoint::TrainerState;
pub use communicator::{Communicator, Local, Single};
pub use device_memory::{memory_info, MemoryInfo, PeakSampler, StepMemory};
pub use engine::TrainSummary;
pub use error::{Error, Result};
pub use logging::StepLog;
#[cfg(feature = "nccl")]
pub use nccl::{launch_nccl, Nccl};
pub use rendezvous::{Rendezvous, RendezvousError, TorchrunEnv};
pub use sampler::{GlobalBatchSampler, StepPlan};

pub use length_batching::{EpochPlan, LengthBatching, LengthIndex, LengthOptions};
pub use memory::{
    cpu_memory_proxy, BatchFeatures, MemoryModel, MostConservative, OnlineMemoryModel, PaddedTokens,
};
pub use model::{Batch, Collate, Dataset, TrainModel, WithLengths};
pub use oom::FaultInjector;
pub use params::Parameters;
pub use planner::{RunLength, StepBatches, StepPlanner};
pub use policy::{GradAccum, LrScaling, OomPolicy, Reweight, TrainerPolicy};

pub use schedule::{BatchLimits, Growth, Schedule, ScheduleFn, ScheduleSpec};
pub use trainer::{launch, launch_group, train, AdaptiveTrainer, RankContext};
