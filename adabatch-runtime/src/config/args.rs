//! Run-time settings, with the names Hugging Face `TrainingArguments` users know,
//! in flag groups: each group is one concern of the run, checked and resolved into
//! its rules on its own (`train::settings`), the groups composed once.

use std::path::PathBuf;

use clap::Parser;

use crate::adapt::lr::{LrScaling, LrSchedulerType};
use crate::config::policy::{OomPolicy, StoppingStrategy};

/// Run-time settings of a training run, one field per flag group. `#[command(flatten)]`
/// it into your own clap parser, or start from [`TrainingArgs::default`] and set
/// fields:
///
/// ```
/// let mut args = adabatch_runtime::TrainingArgs::default();
/// args.batch.per_device_train_batch_size = 16;
/// args.save.output_dir = "runs/first".into();
/// ```
///
/// The flags keep their Hugging Face names (`--per-device-train-batch-size`,
/// `--save-steps`, ...), and so do the fields within the groups.
#[derive(Debug, Clone, Parser, serde::Serialize)]
#[command(about = "adabatch training run")]
pub struct TrainingArgs {
    /// How long the run lasts: epochs, steps or tokens.
    #[command(flatten)]
    #[serde(flatten)]
    pub length: RunLengthArgs,
    /// The batch: its size per device or over all ranks, Megatron-LM's ramp, accumulation.
    #[command(flatten)]
    #[serde(flatten)]
    pub batch: BatchArgs,
    /// Length-aware batching: global batches sized by the examples' lengths.
    #[command(flatten)]
    #[serde(flatten)]
    pub length_aware: LengthAwareArgs,
    /// The learning rate: its peak, schedule, warm-up and scaling with the global batch.
    #[command(flatten)]
    #[serde(flatten)]
    pub lr: LrArgs,
    /// How each step trains: precision, clipping, out-of-memory handling, the noise scale.
    #[command(flatten)]
    #[serde(flatten)]
    pub step: StepArgs,
    /// The optimizer and its settings, as HF names them (`--optim`, `--weight-decay`,
    /// `--adam-beta1`, `--adam-beta2`, `--adam-epsilon`).
    #[command(flatten)]
    #[serde(flatten)]
    pub optim: OptimArgs,
    /// The data: the seed, drop_last, collate workers, the mixture of sources.
    #[command(flatten)]
    #[serde(flatten)]
    pub data: DataArgs,
    /// Where the run trains: ranks, device, or only a plan.
    #[command(flatten)]
    #[serde(flatten)]
    pub launch: LaunchArgs,
    /// What the run says while it trains, and where.
    #[command(flatten)]
    #[serde(flatten)]
    pub logging: LogArgs,
    /// When and how the run evaluates (with an eval dataset).
    #[command(flatten)]
    #[serde(flatten)]
    pub eval: EvalArgs,
    /// Where checkpoints go and when, what a run resumes or starts from, and the best model.
    #[command(flatten)]
    #[serde(flatten)]
    pub save: SaveArgs,
}

/// How long the run lasts: epochs, steps or tokens.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Run length")]
pub struct RunLengthArgs {
    /// Passes over the training set.
    #[arg(long, default_value_t = 3)]
    pub num_train_epochs: usize,
    /// Stop after this many optimisation steps (overrides epochs when reached first).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Stop once this many tokens are trained (the step that reaches it is the
    /// last; each example counts its `Dataset::example_len`): runs of different
    /// mixtures or batch sizes compared at one token budget. The learning-rate
    /// schedule then runs over tokens too. Replaces epochs and `--max-steps`.
    #[arg(long, conflicts_with = "max_steps")]
    pub max_train_tokens: Option<u64>,
}

/// The batch: its size per device or over all ranks, Megatron-LM's ramp, accumulation.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Batch size")]
pub struct BatchArgs {
    /// Initial per-device batch size (the schedule may start elsewhere).
    #[arg(long, default_value_t = 8)]
    pub per_device_train_batch_size: usize,
    /// Micro-batches accumulated into each optimisation step (HF name): replaces
    /// the trainer's `grad_accum` with `fixed(N)`. A step then trains N
    /// micro-batches of the per-device size on every rank (under a schedule in
    /// global units, its global batch split into N).
    #[arg(long)]
    pub gradient_accumulation_steps: Option<usize>,
    /// Global batch size (Megatron-LM): the examples of one optimisation step over
    /// all ranks, split unevenly when it does not divide by them; the end of
    /// `--rampup-batch-size`, or a constant global batch alone. Overrides the
    /// trainer's schedule.
    #[arg(long)]
    pub global_batch_size: Option<usize>,
    /// Megatron-LM's batch-size ramp, in global units: `START INCR SAMPLES` grows
    /// the global batch from START by INCR over SAMPLES examples consumed, up to
    /// `--global-batch-size` (required with it). Overrides the trainer's schedule.
    #[arg(long, num_args = 3, value_names = ["START", "INCR", "SAMPLES"])]
    pub rampup_batch_size: Option<Vec<usize>>,
    /// Count `--rampup-batch-size`'s SAMPLES in tokens consumed (the dataset's
    /// example lengths), as in DeepSeek's batch warm-up; the global batch still
    /// counts examples.
    #[arg(long)]
    pub rampup_in_tokens: bool,
}

/// Length-aware batching: global batches sized by the examples' lengths.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Length-aware batching")]
pub struct LengthAwareArgs {
    /// Length-aware token-budget batching: global batches of examples sorted by
    /// length, as many as fit in this many padded tokens (replaces the schedule).
    #[arg(long)]
    pub max_tokens_per_batch: Option<usize>,
    /// With `--max-tokens-per-batch`: count the budget in tokens summed, as packed
    /// rows hold them, and draw documents in a random order each epoch (not sorted
    /// by length): global batches of about N tokens for packed language-model data.
    #[arg(long)]
    pub packed_token_budget: bool,
    /// Length-aware batching: round batch sizes down to 2^n or 3·2^n.
    #[arg(long)]
    pub friendly_batch_sizes: bool,
    /// Length-aware batching: round batch sizes down to even numbers.
    #[arg(long)]
    pub even_batch_sizes: bool,
    /// Length-aware batching: the first (hardest) batches kept first when batch
    /// order is shuffled, so an OOM shows early.
    #[arg(long, default_value_t = 1)]
    pub keep_first_batches: usize,
    /// Length-aware batching: largest growth between consecutive batches, as a
    /// fraction of the first batch's size.
    #[arg(long, allow_negative_numbers = true)]
    pub max_batch_growth: Option<f64>,
    /// Safety margin of the online memory model (0.05 = 5 %).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub memory_margin: f64,
}

/// The learning rate: its peak, schedule, warm-up and scaling with the global batch.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Learning rate")]
pub struct LrArgs {
    /// Peak learning rate.
    #[arg(long, default_value_t = 5e-5, allow_negative_numbers = true)]
    pub learning_rate: f64,
    /// Learning-rate schedule over examples consumed.
    #[arg(long, value_enum, default_value_t = LrSchedulerType::Constant)]
    pub lr_scheduler_type: LrSchedulerType,
    /// How the rate follows the global batch: `sqrt` (Adam), `linear` (SGD),
    /// `adamscale` (AdaptDL's AdamScale: × the square root of the gain at the
    /// measured noise scale of Adam-preconditioned gradients; needs `noise_scale`
    /// or `goodput` and adabatch's AdamW) or `none`; overrides the trainer's
    /// `lr_scaling`. The rate is rescaled at every batch change, whatever changes
    /// it (`adabatch::adapt::lr`).
    #[arg(long, value_enum)]
    pub lr_scaling: Option<LrScaling>,
    /// The global batch at which `--learning-rate` holds (default: the run's first
    /// global batch); a step of global batch B trains at the rate scaled by
    /// `--lr-scaling` from this reference to B.
    #[arg(long)]
    pub lr_reference_batch: Option<usize>,
    /// Fraction of the run's examples spent warming the learning rate up from 0.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub warmup_ratio: f64,
    /// Warm the learning rate up over the run's first N steps (HF: overrides
    /// `--warmup-ratio` when above 0). The warm-up still runs on examples
    /// consumed: it ends after the examples those N planned steps take.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: usize,
    /// `warmup_stable_decay`: the fraction of the run in the final decay (HF's
    /// `num_decay_steps`, as a fraction; default 0.2).
    #[arg(long)]
    pub lr_decay_ratio: Option<f64>,
    /// `warmup_stable_decay`: the rate at the end, as a fraction of the peak (HF's
    /// `min_lr_ratio`; default 0).
    #[arg(long)]
    pub min_lr_ratio: Option<f64>,
    /// `warmup_stable_decay`: the stable phase's rate as a fraction of the peak
    /// (default 1); below 1, the infinite schedule: a cosine from the peak down to
    /// it over `--lr-cooldown-ratio` of the run after the warm-up.
    #[arg(long)]
    pub lr_stable_ratio: Option<f64>,
    /// `warmup_stable_decay` with `--lr-stable-ratio`: the fraction of the run over
    /// which the rate cools down to the stable rate (default 0).
    #[arg(long)]
    pub lr_cooldown_ratio: Option<f64>,
}

/// How each step trains: precision, clipping, out-of-memory handling, the noise scale.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Training step")]
pub struct StepArgs {
    /// Mixed precision: the model computes in bfloat16 where it casts with
    /// `adabatch::autocast`; weights, optimizer state and all-reduced gradients
    /// stay f32.
    #[arg(long, conflicts_with = "fp16")]
    pub bf16: bool,
    /// Mixed precision in float16, with dynamic loss scaling (steps whose
    /// gradients overflow are skipped and logged).
    #[arg(long)]
    pub fp16: bool,
    /// `--fp16`: the loss scale starts at 2^N (DeepSpeed's `initial_scale_power`).
    #[arg(long, default_value_t = 16, allow_negative_numbers = true)]
    pub fp16_initial_scale_power: i32,
    /// Clip the global gradient norm to this value (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub max_grad_norm: f64,
    /// Override the policy's OOM handling.
    #[arg(long, value_enum)]
    pub oom: Option<OomPolicy>,
    /// Fault injection: the first attempt of these steps runs out of memory on one
    /// rank (rank `step % k` of the `k` ranks with examples in that step), e.g.
    /// `--inject-oom-at-steps 3,7`. A test hook: accepted, but listed neither in
    /// `--help` nor in the documentation (not a stable API).
    #[doc(hidden)]
    #[arg(long, value_delimiter = ',', hide = true)]
    pub inject_oom_at_steps: Vec<usize>,
    /// Estimate the gradient noise scale B_simple = tr(Σ)/|G|² on the steps
    /// `--noise-scale-every` picks (from each rank's or micro-batch's gradient and
    /// the all-reduced one; one rank without accumulation splits those steps in
    /// two) and log it as `gradient_noise_scale`.
    #[arg(long)]
    pub log_gradient_noise_scale: bool,
    /// Every how many steps the gradient noise scale is measured: `model` (the
    /// default: from a fixed model of what splitting a step costs on the device,
    /// on CPU every 10th step at 8 examples per rank to every 4th from 32 on, every
    /// 19th on CUDA; every step on four ranks or with accumulation;
    /// reproducible), `auto` (from the *measured* cost of a split,
    /// at most 5 % of the run's time: reads the clock, so two runs with the same
    /// seed can differ) or a number of steps. Overrides the schedule's `every`.
    #[arg(long, value_name = "model|auto|STEPS")]
    pub noise_scale_every: Option<crate::adapt::noise_scale::MeasureEvery>,
}

/// The data: the seed, drop_last, collate workers, the mixture of sources.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Data")]
pub struct DataArgs {
    /// Seed of permutations and parameter initialisation (default: the policy's).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override the policy's `drop_last` (`true` or `false`).
    #[arg(long, action = clap::ArgAction::Set)]
    pub dataloader_drop_last: Option<bool>,
    /// Threads that collate the next steps' batches while a step computes (0:
    /// collate on the rank's own thread). Batches are the same either way.
    #[arg(long, default_value_t = 0)]
    pub dataloader_num_workers: usize,
    /// Leave glibc's malloc as it is, which returns freed host memory to the OS at
    /// once. By default a run keeps freed memory for the next step (process-wide:
    /// each step's tensors otherwise fault their pages in again; BENCHMARKS.md).
    #[arg(long)]
    pub release_freed_memory: bool,
    /// Mixing weights of a dataset of several sources, replacing its own:
    /// `--mix-weights new=0.75,replay=0.25` (sources left out get 0).
    #[arg(long, value_delimiter = ',')]
    pub mix_weights: Vec<String>,
    /// When an epoch of several sources ends (HF's `stopping_strategy`): a pass
    /// over the first source (`primary`), `first_exhausted` or `all_exhausted`.
    /// Overrides the dataset's (`Sources::with_stopping_strategy`).
    #[arg(long, value_enum)]
    pub stopping_strategy: Option<StoppingStrategy>,
}

/// Where the run trains: ranks, device, or only a plan.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Ranks and device")]
pub struct LaunchArgs {
    /// Ranks on this node (CPU: threads with a real all-reduce).
    #[arg(long, default_value_t = 1)]
    pub nproc_per_node: usize,
    /// Device: `cpu`, or `cuda` / `cuda:N` when built with the `cuda` feature.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Plan the whole run without training: print a summary (steps, examples per
    /// epoch, global batch range, learning rate, size changes) and, with
    /// `--log-jsonl`, write the planned steps (no loss).
    #[arg(long)]
    pub dry_run: bool,
}

/// What the run says while it trains, and where.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log every this many steps (console and JSONL).
    #[arg(long, default_value_t = 1)]
    pub logging_steps: usize,
    /// Also log the first step (HF `logging_first_step`).
    #[arg(long)]
    pub logging_first_step: bool,
    /// Write one JSON object per logged step to this file.
    #[arg(long)]
    pub log_jsonl: Option<PathBuf>,
    /// Print every rank's local batch size and indices on logged steps.
    #[arg(long)]
    pub log_indices: bool,
    /// Print no per-step lines and no progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Hide the progress bar (HF `disable_tqdm`).
    #[arg(long)]
    pub disable_tqdm: bool,
    /// Where else logs go (HF `report_to`): `tensorboard` writes event files to
    /// `--logging-dir`; `none` (the default) writes none.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub report_to: Vec<ReportTo>,
    /// Directory of the TensorBoard event files (default: `<output_dir>/runs`).
    #[arg(long)]
    pub logging_dir: Option<PathBuf>,
    /// At the end of the run, draw its logged steps to this SVG or PNG file
    /// (batch size, coverage and epoch, loss and learning rate).
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// When and how the run evaluates (with an eval dataset).
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Evaluation")]
pub struct EvalArgs {
    /// When to evaluate (HF `eval_strategy`): `no`, `steps` (every `--eval-steps`,
    /// else every `--logging-steps`) or `epoch` (at each epoch's end). Default:
    /// `steps` with `--eval-steps`, else `no`. A run with an eval dataset always
    /// evaluates at its end.
    #[arg(long, value_enum)]
    pub eval_strategy: Option<IntervalStrategy>,
    /// With an eval dataset: evaluate every this many steps (and always at the end).
    #[arg(long)]
    pub eval_steps: Option<usize>,
    /// Eval examples per forward pass on each rank.
    #[arg(long, default_value_t = 8)]
    pub per_device_eval_batch_size: usize,
    /// Evaluate once before the first step, a sanity check of the eval pipeline
    /// (HF `eval_on_start`; needs an eval dataset). What a callback asks at that
    /// evaluation is not acted on.
    #[arg(long)]
    pub eval_on_start: bool,
    /// The held-out set a mixer may ask losses of (`Mixer::wants_held_out`, e.g.
    /// `--aioli-held-out`): this many examples of each source of the eval set
    /// that the mixer reads (its first ones, the same at every request),
    /// evaluated whenever the mixer asks. Their tokens and seconds are counted
    /// in the logs and the summary.
    #[arg(long)]
    pub mixer_eval_examples: Option<usize>,
}

/// Where checkpoints go and when, what a run resumes or starts from, and the best model.
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Checkpoints")]
pub struct SaveArgs {
    /// Where checkpoints go (`checkpoint-{step}/`).
    #[arg(long, default_value = "adabatch_output")]
    pub output_dir: PathBuf,
    /// When to save (HF `save_strategy`): `no`, `steps` (every `--save-steps`) or
    /// `epoch` (at each epoch's end). Default: `steps` with `--save-steps` above 0,
    /// else `no`. A run that saves also saves at its end.
    #[arg(long, value_enum)]
    pub save_strategy: Option<IntervalStrategy>,
    /// Save a checkpoint every this many steps, and at the end (0 = never).
    #[arg(long, default_value_t = 0)]
    pub save_steps: usize,
    /// Keep only the newest N checkpoints in `--output-dir`.
    #[arg(long)]
    pub save_total_limit: Option<usize>,
    /// Resume from this checkpoint directory (weights, optimizer state, position in
    /// the data), or `latest`: the newest complete checkpoint in `--output-dir`.
    #[arg(long)]
    pub resume_from_checkpoint: Option<PathBuf>,
    /// Resume even when the checkpoint has no optimizer state this optimizer can
    /// restore, or one built under other settings (`--adam-beta2`, ...): its
    /// moments then start afresh.
    #[arg(long)]
    pub ignore_optimizer_state: bool,
    /// Start from these weights: a safetensors file, or a directory with
    /// `model.safetensors` (a saved model, a checkpoint, or a sharded save with its
    /// index), loaded by parameter name before the first step. The optimizer and
    /// the schedule start afresh; `--resume-from-checkpoint` restores everything
    /// and takes precedence.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// With `--init-from`: names or shapes that do not fit the model are an error
    /// (`true`), or are skipped and listed (`false`).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub init_from_strict: bool,
    /// At the end, load the weights of the checkpoint whose evaluation scored best
    /// on `--metric-for-best-model` (HF); `--save-total-limit` never removes that
    /// checkpoint. Needs an eval dataset and a save at every evaluation's step
    /// (the same strategy; with `steps`, `--save-steps` a multiple of
    /// `--eval-steps`).
    #[arg(long)]
    pub load_best_model_at_end: bool,
    /// The metric of `--load-best-model-at-end`: `loss` (the default) or an eval
    /// metric's name, with or without its `eval_` prefix.
    #[arg(long)]
    pub metric_for_best_model: Option<String>,
    /// Whether a larger `--metric-for-best-model` is better (default: `false` for
    /// the loss, `true` for any other metric).
    #[arg(long, action = clap::ArgAction::Set)]
    pub greater_is_better: Option<bool>,
}

/// The optimizer and its settings, with HF's names and defaults. The run does not
/// build the optimizer (the trainer's factory does): `adabatch::ParamsAdamW::from_args`
/// builds the one they name in one call, and an example sets its own defaults
/// (`--help` shows them).
#[derive(Debug, Clone, PartialEq, clap::Args, serde::Serialize)]
#[command(next_help_heading = "Optimizer")]
pub struct OptimArgs {
    /// The optimizer (HF `optim`): `adamw_torch` or `adamw_torch_fused`, both
    /// adabatch's AdamW, whose update is one fused kernel on every device.
    #[arg(long, value_enum, default_value_t = OptimName::AdamwTorch)]
    pub optim: OptimName,
    /// Decoupled weight decay (HF `weight_decay`), on the parameters a parameter
    /// group does not exempt.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// AdamW's first-moment decay (HF `adam_beta1`).
    #[arg(long, default_value_t = 0.9)]
    pub adam_beta1: f64,
    /// AdamW's second-moment decay (HF `adam_beta2`).
    #[arg(long, default_value_t = 0.999)]
    pub adam_beta2: f64,
    /// Added to the root of AdamW's second moment (HF `adam_epsilon`).
    #[arg(long, default_value_t = 1e-8)]
    pub adam_epsilon: f64,
}

impl OptimArgs {
    /// The optimizer and its settings in words, as a dry run's plan shows them.
    pub fn describe(&self) -> String {
        let name = match self.optim {
            OptimName::AdamwTorch => "adamw_torch",
            OptimName::AdamwTorchFused => "adamw_torch_fused",
        };
        format!(
            "{name} (beta1 {}, beta2 {}, epsilon {:e}, weight decay {})",
            self.adam_beta1, self.adam_beta2, self.adam_epsilon, self.weight_decay
        )
    }

    /// The optimizer flags given on the command line `matches` parsed, as typed:
    /// a program that trains with another optimizer (SGD) refuses them rather
    /// than leave them inert.
    pub fn given(matches: &clap::ArgMatches) -> Vec<String> {
        [
            "optim",
            "weight_decay",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
        ]
        .into_iter()
        .filter(|id| {
            matches!(matches.try_get_raw(id), Ok(Some(_)))
                && matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
        })
        .map(|id| format!("--{}", id.replace('_', "-")))
        .collect()
    }
}

/// The optimizers `--optim` names, as HF spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimName {
    /// PyTorch's AdamW in HF: adabatch's AdamW.
    #[value(name = "adamw_torch")]
    AdamwTorch,
    /// PyTorch's fused AdamW in HF: adabatch's AdamW (fused already).
    #[value(name = "adamw_torch_fused")]
    AdamwTorchFused,
}

/// When something happens during a run (HF `IntervalStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IntervalStrategy {
    /// Never during the run.
    No,
    /// Every N steps.
    Steps,
    /// At the end of each epoch.
    Epoch,
}

/// Integrations that receive the logs besides the console and JSONL (HF `report_to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportTo {
    /// No integration.
    None,
    /// TensorBoard event files in `--logging-dir`.
    Tensorboard,
    /// Every integration adabatch has (TensorBoard).
    All,
}

impl TrainingArgs {
    /// Whether TensorBoard event files are written.
    pub fn reports_to_tensorboard(&self) -> bool {
        self.logging
            .report_to
            .iter()
            .any(|r| matches!(r, ReportTo::Tensorboard | ReportTo::All))
    }

    /// The directory of TensorBoard event files: `--logging-dir`, else
    /// `<output_dir>/runs`.
    pub fn tensorboard_dir(&self) -> PathBuf {
        (self.logging.logging_dir.clone()).unwrap_or_else(|| self.save.output_dir.join("runs"))
    }
}

impl Default for TrainingArgs {
    fn default() -> Self {
        TrainingArgs::parse_from(["adabatch"])
    }
}

/// Each group's default is its flags' defaults, as in `TrainingArgs::default()`.
macro_rules! group_defaults {
    ($($group:ident => $field:ident),* $(,)?) => {$(
        impl Default for $group {
            fn default() -> Self {
                TrainingArgs::default().$field
            }
        }
    )*};
}

group_defaults!(
    RunLengthArgs => length,
    BatchArgs => batch,
    LengthAwareArgs => length_aware,
    LrArgs => lr,
    StepArgs => step,
    OptimArgs => optim,
    DataArgs => data,
    LaunchArgs => launch,
    LogArgs => logging,
    EvalArgs => eval,
    SaveArgs => save,
);
