//! # adabatch
//!
//! Training loops whose batch size changes while training runs, on candle.
//! One attribute on a struct generates a typed trainer; the engine samples global
//! batches that are resized between steps, splits them over ranks, reweights the
//! gradients so that `W` ranks of `b` compute what one rank of `W·b` would, and
//! accounts for progress by coverage (`train_coverage`, a float `epoch`).
//!
//! ```ignore
//! use adabatch::prelude::*;
//!
//! #[adaptive_trainer(schedule = interval(5, +1), drop_last = false, reweight = sample_count)]
//! struct ReplayTrainer {
//!     #[model] model: Classifier,
//!     #[optimizer] opt: candle_nn::AdamW,
//! }
//! ```

pub use adabatch_runtime::*;

/// The candle tensor crate adabatch is built on (`Tensor`, `Device`, `DType`, `Var`):
/// `use adabatch::candle_core;` keeps your versions in step with adabatch's.
pub use candle_core;
/// candle's layers and optimizers (`Linear`, `VarBuilder`, `AdamW`, `Optimizer`).
pub use candle_nn;
/// The command-line parser of [`TrainingArgs`]: `#[command(flatten)]` it into your
/// own `#[derive(clap::Parser)]` through `adabatch::clap`. The derive's generated
/// code names the crate `clap`, so bring the crate itself into scope beside the
/// derive, with no `clap` dependency of your own:
///
/// ```
/// use adabatch::clap::{self, Parser};
///
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     train: adabatch::TrainingArgs,
///     /// An option of your own.
///     #[arg(long, default_value_t = 2)]
///     layers: usize,
/// }
///
/// let cli = Cli::parse_from(["prog", "--layers", "3", "--learning-rate", "0.1"]);
/// assert_eq!((cli.layers, cli.train.learning_rate), (3, 0.1));
/// ```
pub use clap;

#[doc = include_str!("../docs/adaptive_trainer.md")]
pub use adabatch_macros::adaptive_trainer;

/// The names most programs need: `use adabatch::prelude::*;`.
pub mod prelude {
    pub use crate::adaptive_trainer;
    pub use adabatch_runtime::{
        per_example_cross_entropy, per_example_token_cross_entropy, AdamW, AdaptiveTrainer, Batch,
        Collate, Dataset, MemoryModel, ParamGroups, Parameters, ParamsAdamW, RankContext, Result,
        Run, TokenReduction, TrainModel, TrainSummary, Trained, TrainingArgs, WithLengths,
    };
}

/// Paths used by the code `#[adaptive_trainer]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use adabatch_runtime::adapt::goodput::{GoodputSpec, StepTimeFn};
    pub use adabatch_runtime::adapt::lr::LrScaling;
    pub use adabatch_runtime::adapt::mixer::MixFn;
    pub use adabatch_runtime::adapt::noise_scale::NoiseScalePolicy;
    pub use adabatch_runtime::adapt::schedule::{Growth, Ramp, ScheduleFn, ScheduleSpec};
    pub use adabatch_runtime::config::policy::{
        GradAccum, MixSpec, OomPolicy, Reweight, TrainerPolicy,
    };
    pub use adabatch_runtime::user::trainer::CollateFor;
    pub use adabatch_runtime::Result;
    pub use adabatch_runtime::{
        AdaptiveTrainer, Callback, Collate, Dataset, MemoryModel, Mixer, RankContext, Run,
        TrainModel, TrainSummary, Trained, TrainingArgs,
    };
    pub use candle_nn::Optimizer;
}
