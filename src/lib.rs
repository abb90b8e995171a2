//! # adabatch
//!
//! Training loops whose **batch size changes while training runs**, on candle. One
//! attribute on a struct, [`#[adaptive_trainer(...)]`](adaptive_trainer), gives a
//! typed trainer; the engine draws global batches that can be resized after every
//! optimisation step (by a schedule, a ramp, the gradient noise scale, goodput or a
//! memory model), splits them over ranks, reweights gradients so that `W` ranks of
//! `b` compute exactly what one rank of `W·b` would, mixes several data sources in
//! every batch, and accounts for progress by coverage (`train_coverage`, a float
//! `epoch`) because the number of steps is not known in advance. Runs checkpoint and
//! resume exactly, also on another number of ranks.
//!
//! A complete program (the README's, `cargo run --release --example readme`):
//!
//! ```no_run
//! //! A complete adabatch program: a linear classifier on a generated table, its
//! //! per-device batch growing from 4 to 32 over the first 50 steps.
//! //! `cargo run --release --example readme -- --nproc-per-node 2 --learning-rate 0.05`
//!
//! use adabatch::candle_core::{self, DType, Device, Tensor, Var};
//! use adabatch::candle_nn::{linear, Linear, Module};
//! use adabatch::clap::Parser;
//! use adabatch::prelude::*;
//! use adabatch::{AdamW, ParamsAdamW};
//!
//! /// A collated batch: points `[n, 2]`, classes `[n]`.
//! struct Points {
//!     xy: Tensor,
//!     class: Tensor,
//! }
//!
//! impl Batch for Points {
//!     fn num_examples(&self) -> usize {
//!         self.class.dims()[0]
//!     }
//! }
//!
//! struct Model {
//!     layer: Linear,
//!     params: Parameters,
//! }
//!
//! impl TrainModel for Model {
//!     type Batch = Points;
//!     // One loss per example: the engine weights and averages them across ranks.
//!     fn per_example_loss(&self, batch: &Points) -> candle_core::Result<Tensor> {
//!         per_example_cross_entropy(&self.layer.forward(&batch.xy)?, &batch.class)
//!     }
//!     fn named_parameters(&self) -> Vec<(String, Var)> {
//!         self.params.named_parameters()
//!     }
//! }
//!
//! #[adaptive_trainer(schedule = linear(4, 32, over = 50), reweight = sample_count)]
//! struct Classifier {
//!     #[model]
//!     model: Model,
//!     #[optimizer]
//!     opt: AdamW,
//! }
//!
//! fn main() -> adabatch::Result<()> {
//!     let args = TrainingArgs::parse(); // every flag of `TrainingArgs`: --help
//!     let grid = (0..1024).map(|i| [i % 32, i / 32].map(|v| v as f32 / 16.0 - 1.0));
//!     let data: Vec<[f32; 2]> = grid.collect();
//!     let collate = |rows: &[[f32; 2]], device: &Device| -> candle_core::Result<Points> {
//!         let class: Vec<u32> = rows.iter().map(|[x, y]| u32::from(x + y > 0.0)).collect();
//!         let xy = Tensor::from_vec(rows.concat(), (rows.len(), 2), device)?;
//!         let class = Tensor::new(class, device)?;
//!         Ok(Points { xy, class })
//!     };
//!     let trained = Classifier::launch(&data, &collate, &args, |ctx: &RankContext| {
//!         let params = ctx.parameters(); // seeded: the same weights on every rank
//!         let layer = linear(2, 2, params.var_builder(DType::F32, ctx.device()))?;
//!         // Its rate is set every step from `--learning-rate` and the LR schedule.
//!         let opt = AdamW::new(params.all_vars(), ParamsAdamW::default())?;
//!         Ok(Classifier::new(Model { layer, params }, opt))
//!     })?;
//!     println!("{}", trained.summary); // trained.trainer: rank 0's trained model
//!     Ok(())
//! }
//! ```
//!
//! # The guide
//!
//! | chapter | what it covers |
//! |---|---|
//! | [getting started](guide::getting_started) | the two commands, the quickstart program, the examples, the flags worth knowing |
//! | [the attribute](guide::attribute) | `#[adaptive_trainer(...)]`: its grammar, every key, the fields, what it generates |
//! | [semantics](guide::semantics) | global batches, `drop_last`, reweighting, coverage and epochs, exactness across ranks, OOM |
//! | [data](guide::data) | datasets and collates; language-model data: tokenizing, token files, packing, domains |
//! | [mixing](guide::mixing) | several sources in one run: the allocator, mixers, domains in tokens, continual pretraining |
//! | [adaptation](guide::adaptation) | schedules and ramps, the gradient noise scale, goodput, memory-aware batches, what to pick |
//! | [checkpoints](guide::checkpoints) | checkpoints, exact resume, output directories, weights in and out, preemption |
//! | [seeing a run](guide::seeing_a_run) | the dry run, the JSONL log, TensorBoard, plots |
//! | [porting](guide::porting) | porting a candle-transformers model |
//! | [GPUs](guide::gpu) | CUDA and NCCL |
//!
//! # The main types
//!
//! - **Your model**: [`TrainModel`] (a loss per example and the named parameters),
//!   its [`Batch`]; [`Parameters`] (seeded, the same on every rank);
//!   [`per_example_cross_entropy`], [`per_example_token_cross_entropy_sum`].
//! - **Your data**: [`Dataset`] (a `Vec<T: Clone>` is one), [`Collate`] (a closure
//!   `Fn(&[Item], &Device) -> candle_core::Result<Batch>`), [`WithLengths`] for
//!   length-aware batching, [`Sources`] for several sources; token data:
//!   [`TokenFile`], [`TokenDocuments`], [`PackedCollate`].
//! - **The trainer**: [`adaptive_trainer`] generates an [`AdaptiveTrainer`] with
//!   `T::train(&mut trainer, &data, &collate, &args)`, `T::launch(&data, &collate,
//!   &args, factory)`, `T::launch_with_eval(&train, &eval, &collate, &args,
//!   factory)` and `T::evaluate(&mut trainer, &eval, &collate, &args)` (no
//!   training); [`Run`] is the builder for everything else
//!   (`Run::new(&data, &collate, &args).with_eval(&eval).launch(factory)`). A
//!   factory gets a [`RankContext`] and builds one rank's trainer; [`Trained`]
//!   holds rank 0's trainer and the [`TrainSummary`].
//! - **Settings**: [`TrainingArgs`] (run time, Hugging Face's flag names, a clap
//!   parser in flag groups: [`RunLengthArgs`], [`BatchArgs`], [`LengthAwareArgs`],
//!   [`LrArgs`], [`StepArgs`], [`DataArgs`], [`LaunchArgs`], [`LogArgs`],
//!   [`EvalArgs`], [`SaveArgs`]) and [`TrainerPolicy`] (the attribute's, fixed at
//!   compile time).
//! - **Optimizers**: the checkpointable [`AdamW`] and [`Sgd`], [`ParamGroups`]
//!   (frozen parameters, no weight decay), any [`TrainOptimizer`].
//! - **During a run**: [`Callback`] and [`EarlyStopping`], [`Mixer`]s
//!   ([`OnlineMixer`], [`Exp3Mixer`], [`CurriculumMixer`]), [`MemoryModel`]; the
//!   records [`StepLog`] and [`EvalLog`].
//! - **Errors**: [`Error`], [`Result`], [`exit_code`].
//!
//! Everything else is reachable under its module path and may change between
//! releases; [`nn`] and [`models`] hold differentiable ops and a Llama-family
//! decoder.

pub use adabatch_runtime::*;

pub mod guide;

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
/// assert_eq!((cli.layers, cli.train.lr.learning_rate), (3, 0.1));
/// ```
pub use clap;

#[doc = include_str!("../docs/adaptive_trainer.md")]
pub use adabatch_macros::adaptive_trainer;

/// The names most programs need: `use adabatch::prelude::*;`.
pub mod prelude {
    pub use crate::adaptive_trainer;
    pub use adabatch_runtime::{
        per_example_cross_entropy, per_example_token_cross_entropy, AdamW, AdaptiveTrainer, Batch,
        Collate, Dataset, LoadPretrained, MemoryModel, ParamGroups, Parameters, ParamsAdamW,
        RankContext, Result, Run, TokenReduction, TrainModel, TrainSummary, Trained, TrainingArgs,
        WithLengths,
    };
}

/// Paths used by the code `#[adaptive_trainer]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use adabatch_runtime::{
        AdaptiveTrainer, Callback, Collate, CollateFor, Dataset, EvalLog, GoodputSpec, GradAccum,
        Growth, LrScaling, MeasureEvery, MemoryModel, MixFn, MixSpec, MixWarmup, Mixer,
        NoiseScalePolicy, OomPolicy, Ramp, RankContext, Result, Reweight, Run, ScheduleFn,
        ScheduleSpec, StepTimeFn, TrainModel, TrainSummary, Trained, TrainerPolicy, TrainingArgs,
    };
    pub use candle_nn::Optimizer;
}
