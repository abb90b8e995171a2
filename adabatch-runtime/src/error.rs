//! Typed errors of the runtime.

use std::path::PathBuf;

/// Everything that can stop a training run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tensor operation failed inside candle.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The dataset has no examples.
    #[error("the training dataset is empty: nothing to train on")]
    EmptyDataset,
    /// More ranks than examples: some rank could never get an example.
    #[error("{world_size} ranks but only {examples} training examples: every rank needs at least one example")]
    MoreRanksThanExamples {
        /// Number of ranks.
        world_size: usize,
        /// Number of examples.
        examples: usize,
    },
    /// A batch size of zero was configured.
    #[error("{what} must be at least 1, got 0")]
    ZeroBatchSize {
        /// Which setting was zero.
        what: &'static str,
    },
    /// `num_train_epochs = 0` and no `max_steps`.
    #[error(
        "num_train_epochs is 0: the run would not train (set it to at least 1, or set max_steps)"
    )]
    ZeroEpochs,
    /// The schedule answered 0 after a step.
    #[error("the batch-size schedule returned 0 after step {step}: a batch size must be at least 1 (set `min_batch`, or fix the schedule)")]
    ScheduleReturnedZero {
        /// The step after which the schedule was called.
        step: usize,
    },
    /// With `drop_last`, the global batch is larger than the whole dataset.
    #[error("global batch of {global_batch} (per-device {per_device} x {world_size} ranks) exceeds the {examples} examples with drop_last = true: every batch would be dropped{}", step_note(*after_step))]
    GlobalBatchTooLarge {
        /// Per-device size times world size.
        global_batch: usize,
        /// Per-device size.
        per_device: usize,
        /// Number of ranks.
        world_size: usize,
        /// Dataset size.
        examples: usize,
        /// The step after which the schedule chose this size (None: the initial size).
        after_step: Option<usize>,
    },
    /// The loss became NaN or infinite: the run diverged.
    #[error("the loss is not finite ({loss}) at step {step}: the run diverged (a lower --learning-rate, --max-grad-norm or a warm-up may help){}", last_finite(last_checkpoint))]
    NonFiniteLoss {
        /// The step (1-based).
        step: usize,
        /// The loss value.
        loss: f64,
        /// The newest checkpoint of this run, all of whose weights are finite.
        last_checkpoint: Option<PathBuf>,
    },
    /// Weights became NaN or infinite: no checkpoint holds them.
    #[error("{} parameter(s) are not finite after step {step} ({}): the run diverged and this checkpoint is not written{}", names.len(), names.join(", "), last_finite(last_checkpoint))]
    NonFiniteWeights {
        /// The step.
        step: usize,
        /// The parameters with a NaN or infinite value.
        names: Vec<String>,
        /// The newest checkpoint of this run, all of whose weights are finite.
        last_checkpoint: Option<PathBuf>,
    },
    /// `--bf16` / `--fp16` was given but the model never cast anything with
    /// `adabatch::autocast`: it would train in f32 unknowingly.
    #[error("{flag} was given, but the model's per_example_loss never called `adabatch::autocast` (or `autocast_linear`): it computes in f32. Cast its weights and inputs with them, or drop {flag}")]
    AutocastUnused {
        /// The flag given.
        flag: &'static str,
    },
    /// Under `--fp16` the gradients overflowed even at the smallest loss scale.
    #[error("step {step}: the gradients are not finite even at loss scale 2^-24 under --fp16; the model's values exceed float16's range: train with --bf16 or in f32")]
    LossScaleUnderflow {
        /// The step (1-based).
        step: usize,
    },
    /// A run-time setting is out of its range.
    #[error("{name} = {value}: {expected}")]
    InvalidSetting {
        /// The setting (the `TrainingArgs` field or DSL key).
        name: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: &'static str,
    },
    /// `min_batch` is above `max_batch`.
    #[error("min_batch ({min}) is larger than max_batch ({max})")]
    BatchLimitsCrossed {
        /// The lower clamp.
        min: usize,
        /// The upper clamp.
        max: usize,
    },
    /// A schedule's own arguments are invalid (a spec built by hand).
    #[error("schedule {schedule}: {reason}")]
    InvalidSchedule {
        /// The schedule's form, e.g. `interval`.
        schedule: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// `schedule = goodput(..)` cannot rank batch sizes: the step times it
    /// needs are not positive numbers (a broken `step_time` function, or a clock
    /// that measured nothing).
    #[error("goodput cannot measure step times: {detail}")]
    GoodputStepTime {
        /// What was measured or given, and for which step shape.
        detail: String,
    },
    /// This runtime cannot run the trainer's policy.
    #[error("unsupported policy: {reason}")]
    UnsupportedPolicy {
        /// Why.
        reason: &'static str,
    },
    /// Two settings that decide the same thing were both given.
    #[error("{first} and {second} cannot be combined: {reason}")]
    ConflictingSettings {
        /// One setting.
        first: &'static str,
        /// The other.
        second: &'static str,
        /// Why not.
        reason: &'static str,
    },
    /// `WithLengths` got a different number of lengths than examples.
    #[error("{lengths} lengths for a dataset of {examples} examples")]
    LengthsMismatch {
        /// Lengths given.
        lengths: usize,
        /// Examples in the dataset.
        examples: usize,
    },
    /// A collate returned a batch of another size than the items it was given.
    #[error("collate returned a batch of {returned} examples for {items} items")]
    CollateSize {
        /// `Batch::num_examples` of the result.
        returned: usize,
        /// Items passed in.
        items: usize,
    },
    /// The gradient noise scale was asked for without two small batches per step.
    #[error("the gradient noise scale needs at least two small batches per step (each rank's share, or each micro-batch's), found {small_batches}: on one rank, accumulate at least 2 micro-batches (grad_accum = fixed(2)) or run on 2 or more ranks")]
    NoiseScaleNeedsSmallBatches {
        /// Small batches (smaller than the step's global batch) per step.
        small_batches: usize,
    },
    /// `reweight = token_count` and a global batch without tokens.
    #[error("step {step}: the global batch has no tokens to weigh the loss by")]
    NoTokens {
        /// The step.
        step: usize,
    },
    /// `named_parameters` returned a name twice.
    #[error("parameter name `{name}` appears twice in named_parameters")]
    DuplicateParameter {
        /// The repeated name.
        name: String,
    },
    /// A `#[regressor]` planned different batches on different ranks.
    #[error("the #[regressor] planned different batches on different ranks (epoch {epoch}): it must be deterministic")]
    RegressorDisagrees {
        /// The epoch being planned.
        epoch: usize,
    },
    /// `--resume-from-checkpoint` names a directory that does not exist.
    #[error("no checkpoint at {}: the directory does not exist (`--resume-from-checkpoint latest` takes the newest in --output-dir)", path.display())]
    NoSuchCheckpoint {
        /// The path given.
        path: PathBuf,
    },
    /// A flag that names a directory was given a file.
    #[error("{flag} {}: this is a file, not a directory ({})", path.display(), match *flag { "--resume-from-checkpoint" => "give a checkpoint-N directory, or `latest` for the newest in --output-dir", _ => "give a directory for the run's checkpoints and logs" })]
    NotADirectory {
        /// The flag.
        flag: &'static str,
        /// The path given.
        path: PathBuf,
    },
    /// A checkpoint cannot be read (missing or unparsable files).
    #[error("checkpoint {path}: {detail}")]
    CorruptCheckpoint {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A checkpoint does not belong to this run.
    #[error("checkpoint {path}: written with {what} = {checkpoint}, this run has {run}")]
    CheckpointMismatch {
        /// The checkpoint directory.
        path: PathBuf,
        /// What differs (a setting, or a parameter's name or shape).
        what: String,
        /// The checkpoint's value.
        checkpoint: String,
        /// This run's value.
        run: String,
    },
    /// `--resume-from-checkpoint latest` found no complete checkpoint.
    #[error("no complete checkpoint in {output_dir} to resume from")]
    NoCheckpoint {
        /// Where it looked.
        output_dir: PathBuf,
    },
    /// A length-aware run's checkpoint from the middle of an epoch, written before
    /// checkpoints held the epoch's plan.
    #[error("checkpoint {path} is from the middle of a length-aware epoch but does not hold the epoch's plan (an older checkpoint); resume from one written at an epoch boundary")]
    MidEpochLengthAwareCheckpoint {
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// The optimizer cannot restore a saved state (it cannot export one either).
    #[error("this optimizer cannot restore the checkpoint's `{kind}` state: use a checkpointable optimizer (adabatch::AdamW or Sgd), or pass --ignore-optimizer-state to resume with fresh optimizer state")]
    OptimizerStateUnsupported {
        /// Who wrote the state.
        kind: String,
    },
    /// The checkpoint's optimizer state does not fit this run's optimizer.
    #[error("the checkpoint's optimizer state does not fit this optimizer: {detail}")]
    OptimizerStateMismatch {
        /// What differs.
        detail: String,
    },
    /// The checkpoint has no optimizer state and the run did not opt in to fresh state.
    #[error("checkpoint {path} has no optimizer state (its optimizer could not save one): pass --ignore-optimizer-state to resume with fresh optimizer state")]
    OptimizerStateMissing {
        /// The checkpoint directory.
        path: PathBuf,
    },
    /// A `#[mixer]` on a dataset of one source.
    #[error("the trainer mixes sources (`mix = ..` or a `#[mixer]`) but the dataset has one source: mix several with `adabatch::Sources`")]
    MixerWithoutSources,
    /// A dataset of several sources with none.
    #[error("a dataset of several sources needs at least one source")]
    NoSources,
    /// A source without examples.
    #[error("source `{name}` is empty: every source needs at least one example")]
    EmptySource {
        /// The source.
        name: String,
    },
    /// Two sources with one name.
    #[error("two sources are named `{name}`: source names must be unique")]
    DuplicateSource {
        /// The name.
        name: String,
    },
    /// A mixing weight for a source the dataset does not have.
    #[error("unknown source `{name}`: the dataset's sources are {known:?}")]
    UnknownSource {
        /// The name given.
        name: String,
        /// The dataset's sources.
        known: Vec<String>,
    },
    /// Mixing weights that cannot divide a batch.
    #[error("step {step}: invalid mixing weights: {reason}")]
    InvalidMixWeights {
        /// The step the weights were for.
        step: usize,
        /// What is wrong.
        reason: String,
    },
    /// An error raised by the user's own code (a factory, a callback).
    #[error("{0}")]
    Message(String),
    /// The model returned losses of the wrong shape.
    #[error("per_example_loss returned shape {shape:?} for a batch of {examples} examples; expected [{examples}]")]
    LossShape {
        /// Returned shape.
        shape: Vec<usize>,
        /// Examples in the batch.
        examples: usize,
    },
    /// The model has no trainable parameters.
    #[error("the model has no trainable parameters: `named_parameters` returned nothing")]
    NoParameters,
    /// The optimizer's first update changed none of the model's parameters: it
    /// holds other variables (e.g. built from `params.all_vars()` before the model
    /// created its own).
    #[error("the optimizer's first update changed none of the model's {parameters} parameters with a gradient: build it from the model's variables after the model (e.g. `AdamW::new(params.all_vars(), ..)` after `Model::new(params.var_builder(..))`)")]
    OptimizerUpdatesNothing {
        /// Parameters that had a gradient.
        parameters: usize,
    },
    /// The optimizer's first update left some parameters with a gradient unchanged.
    #[error("the optimizer does not update these parameters, though they have gradients: {names:?} (build the optimizer from all of the model's variables)")]
    ParametersNotUpdated {
        /// Their names.
        names: Vec<String>,
    },
    /// After the first step (or the first after a resume), parameters the model
    /// names received no gradient on any rank: their gradient path is cut (a
    /// candle-nn fused op without a backward, a detached tensor, an unused layer).
    #[error("{} of the model's parameters received no gradient on any rank in the first step: {}. Their gradient path is cut: candle-nn's fused `ops::rms_norm`, `ops::layer_norm`, `ops::softmax_last_dim` and `rotary_emb::rope*` (and the `RmsNorm`/`LayerNorm` modules built on them) have no backward; use `adabatch::nn`'s versions (docs/porting.md). Parameters frozen on purpose are declared with `ParamGroups::freeze`", names.len(), names.join(", "))]
    ParametersWithoutGradient {
        /// Their names.
        names: Vec<String>,
    },
    /// The optimizer holds variables the model does not name.
    #[error("the optimizer holds {count} variable(s) the model's `named_parameters` does not name (shapes {shapes:?}): add them to `named_parameters`, or build the optimizer from the model's parameters only")]
    OptimizerParameterNotNamed {
        /// How many.
        count: usize,
        /// Their shapes.
        shapes: Vec<Vec<usize>>,
    },
    /// The model names parameters the optimizer neither holds nor was told are
    /// frozen.
    #[error("the optimizer does not hold these parameters of the model and they are not declared frozen: {}; build the optimizer from all of them, or freeze them with `ParamGroups::freeze`", names.join(", "))]
    ParametersNotInOptimizer {
        /// Their names.
        names: Vec<String>,
    },
    /// A parameter-group pattern is not a valid regular expression, or matches
    /// no parameter.
    #[error("parameter pattern `{pattern}` ({what}): {detail}")]
    ParameterPattern {
        /// The pattern.
        pattern: String,
        /// What it was for (`freeze`, `no_decay`, ...).
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// Another run holds the output directory.
    #[error("another run is using the output directory {} ({holder}): two runs in one directory replace each other's checkpoints; give this run its own --output-dir, or wait for the other to end", path.display())]
    OutputDirBusy {
        /// The directory.
        path: PathBuf,
        /// What the lock file says of its holder.
        holder: String,
    },
    /// A weights file could not be read or written.
    #[error("weights {}: {detail}", path.display())]
    WeightsFile {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// Weights that come in (`--init-from`, `load_pretrained`) hold NaN or
    /// infinite values: training from them would diverge at once.
    #[error("weights {}: {} tensor(s) hold NaN or infinite values ({}); nothing was loaded", path.display(), tensors.len(), tensors.join(", "))]
    NonFiniteInitWeights {
        /// The file or directory.
        path: PathBuf,
        /// Each offending tensor with its count of non-finite values.
        tensors: Vec<String>,
    },
    /// A strict load of weights found names that do not fit the model.
    #[error("weights {} do not fit the model: {}", path.display(), mismatch_text(missing, unexpected, shapes))]
    WeightsMismatch {
        /// The file.
        path: PathBuf,
        /// Parameters of the model the file lacks.
        missing: Vec<String>,
        /// Tensors of the file the model does not have.
        unexpected: Vec<String>,
        /// `(name, file shape, model shape)` of the tensors whose shapes differ.
        shapes: Vec<(String, Vec<usize>, Vec<usize>)>,
    },
    /// The eval dataset cannot give every rank an example.
    #[error("the eval dataset has {examples} examples for {world_size} ranks: every rank evaluates at least one example")]
    EvalSetTooSmall {
        /// Number of ranks.
        world_size: usize,
        /// Number of eval examples.
        examples: usize,
    },
    /// `TrainModel::eval_metrics` answered something the engine cannot average.
    #[error("eval metrics: {detail}")]
    EvalMetric {
        /// What is wrong.
        detail: String,
    },
    /// Ranks disagree on the model's parameters.
    #[error("rank {rank} has different parameters than rank 0: {detail}")]
    ParameterMismatch {
        /// The disagreeing rank.
        rank: usize,
        /// What differs.
        detail: String,
    },
    /// The run cannot continue on one rank because another rank failed.
    #[error("rank {rank} stopped because another rank failed")]
    PeerFailed {
        /// The rank reporting.
        rank: usize,
    },
    /// A rank's share of a step failed (its collate or its model).
    #[error("rank {rank}, step {step}: {source}")]
    OnRank {
        /// The rank.
        rank: usize,
        /// The step (1-based).
        step: usize,
        /// What failed.
        source: Box<Error>,
    },
    /// A rank's thread panicked.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// The device could not be used.
    #[error("device `{spec}`: {reason}")]
    Device {
        /// The device as given (`cpu`, `cuda:1`, ...).
        spec: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The device ran out of memory and the OOM policy is `fail`.
    #[error("out of memory at step {step}: {detail}")]
    OutOfMemory {
        /// The step.
        step: usize,
        /// The underlying error.
        detail: String,
    },
    /// Writing a log or checkpoint failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `train` runs one rank; more were asked for.
    #[error("nproc_per_node = {nproc_per_node} needs one trainer per rank: use `launch` with a factory instead of `train`")]
    TrainNeedsOneRank {
        /// The requested number of ranks.
        nproc_per_node: usize,
    },
    /// `Run::group` was given no rank to run in this process.
    #[error("Run::group needs at least one rank in this process")]
    EmptyGroup,
    /// Reading or writing JSON (a checkpoint's state, a log) failed.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: serde_json::Error,
    },
    /// The multi-node rendezvous failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// A collective operation failed.
    #[error("communicator: {0}")]
    Comm(String),
    /// A token file's size is not a whole number of tokens of its width.
    #[error("{path}: {bytes} bytes is not a whole number of {width}-byte tokens (is the token width right?)")]
    TokenFileSize {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        bytes: u64,
        /// Bytes per token (2 for u16, 4 for u32).
        width: usize,
    },
    /// A token file holds too few tokens for one example.
    #[error("{path}: {tokens} tokens, not enough for {need}")]
    TokenFileTooShort {
        /// The file.
        path: PathBuf,
        /// Tokens in the file.
        tokens: u64,
        /// What one example needs.
        need: String,
    },
    /// A token id at or above the vocabulary size.
    #[error("{path}: token {position} is id {token}, outside the vocabulary of {vocab_size} ids")]
    TokenOutOfVocab {
        /// The file.
        path: PathBuf,
        /// Its position in the file, in tokens.
        position: u64,
        /// The id found.
        token: u32,
        /// The vocabulary size given.
        vocab_size: u32,
    },
    /// A token file that does not match its `tokens.json` (cut short, edited):
    /// refused before anything trains on it.
    #[error("{}: {detail}: the token files were damaged or edited; prepare them again (adabatch tokenize)", path.display())]
    TokenFileMismatch {
        /// The file.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },
    /// A token directory prepared from other inputs than the run asks for: the
    /// run does not overwrite it unless asked to.
    #[error("{}: {detail}; the directory is left as it is: pass --retokenize to prepare it again there, or give another directory", dir.display())]
    TokenDirMismatch {
        /// The directory.
        dir: PathBuf,
        /// The directory's inputs against the run's.
        detail: String,
    },
    /// A signal (SIGTERM, SIGINT, SIGUSR1) stopped the run after a step, which was
    /// saved: run it again with `--resume-from-checkpoint` to go on. Exit code
    /// `adabatch::train::interrupt::INTERRUPTED_EXIT_CODE` (75).
    #[error("stopped by {signal} after step {step}; the run is saved in {}: run again with --resume-from-checkpoint {} (or latest) to go on", checkpoint.display(), checkpoint.display())]
    Interrupted {
        /// The signal's name.
        signal: String,
        /// The last step trained.
        step: usize,
        /// The checkpoint written at it.
        checkpoint: PathBuf,
    },
    /// A token dataset's or collate's setting cannot work.
    #[error("token data: {0}")]
    TokenSetting(String),
    /// A domain (a source of documents) without validation documents: its loss
    /// could not be measured.
    #[error("domain `{domain}` has no validation documents: give it more documents or a larger --validation-fraction")]
    NoValidationDocuments {
        /// The domain.
        domain: String,
    },
    /// Token files of different tokenizers mixed in one run: the same id would
    /// mean different text.
    #[error("domains `{first}` and `{other}` were tokenized by different tokenizers ({detail}): prepare them together (adabatch tokenize --domain NAME=FILE ...)")]
    MixedTokenizers {
        /// The first domain.
        first: String,
        /// The domain that differs.
        other: String,
        /// How they differ.
        detail: String,
    },
    /// A tokenizer or corpus file could not be read, or text could not be encoded.
    #[error("{path}: {detail}")]
    Tokenizer {
        /// The tokenizer, corpus or token-data file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// The end of a `main`: `Ok` exits 0; an error prints as `error: <message>` and
/// its causes (`caused by: ...`, one per line) on stderr, not a Debug dump, and
/// exits 1. `fn main() -> ExitCode { adabatch::exit_code(run()) }`.
pub fn exit_code(result: Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{}", error.report());
            match error {
                // Saved and stopped: a scheduler may run it again.
                Error::Interrupted { .. } => {
                    std::process::ExitCode::from(crate::train::interrupt::INTERRUPTED_EXIT_CODE)
                }
                _ => std::process::ExitCode::FAILURE,
            }
        }
    }
}

/// Where a diverged run can resume from.
fn last_finite(checkpoint: &Option<PathBuf>) -> String {
    match checkpoint {
        Some(dir) => format!(
            "; the last checkpoint with finite weights is {}",
            dir.display()
        ),
        None => String::new(),
    }
}

/// What a strict load found wrong, one clause per kind.
fn mismatch_text(
    missing: &[String],
    unexpected: &[String],
    shapes: &[(String, Vec<usize>, Vec<usize>)],
) -> String {
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!("missing {}", missing.join(", ")));
    }
    if !unexpected.is_empty() {
        parts.push(format!("unexpected {}", unexpected.join(", ")));
    }
    for (name, file, model) in shapes {
        parts.push(format!(
            "`{name}` is {file:?} in the file, {model:?} in the model"
        ));
    }
    parts.push("(load non-strictly to skip what does not fit)".into());
    parts.join("; ")
}

impl Error {
    /// `error: <message>`, then `caused by: <source>` for each underlying cause
    /// that the line before does not already end with.
    pub fn report(&self) -> String {
        let mut last = self.to_string();
        let mut text = format!("error: {last}");
        let mut cause = std::error::Error::source(self);
        while let Some(source) = cause {
            let message = source.to_string();
            if !last.ends_with(&message) {
                text.push_str(&format!("\ncaused by: {message}"));
            }
            last = message;
            cause = source.source();
        }
        text
    }

    /// An error of the user's own code, with its message.
    pub fn msg(message: impl std::fmt::Display) -> Self {
        Self::Message(message.to_string())
    }
}

fn step_note(after_step: Option<usize>) -> String {
    after_step.map_or_else(String::new, |step| {
        format!(" (size chosen by the schedule after step {step})")
    })
}

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a rendezvous failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// Rank 0 waited `waited` and these ranks never arrived.
    #[error("rendezvous timed out after {waited:?}: rank(s) {missing:?} of {world_size} did not arrive at {addr}")]
    Timeout {
        /// Ranks that did not connect.
        missing: Vec<usize>,
        /// World size expected.
        world_size: usize,
        /// The rendezvous address.
        addr: String,
        /// How long rank 0 waited.
        waited: std::time::Duration,
    },
    /// A peer could not reach rank 0 before its deadline.
    #[error(
        "rank {rank}: rank 0 did not answer at {addr} within {waited:?} (last error: {last_error})"
    )]
    MasterUnreachable {
        /// The rank reporting.
        rank: usize,
        /// The rendezvous address.
        addr: String,
        /// How long the peer tried.
        waited: std::time::Duration,
        /// The last connection or read error.
        last_error: String,
    },
    /// Rank 0 gave up and told this peer why.
    #[error("rank {rank}: rank 0 aborted the rendezvous: {message}")]
    Aborted {
        /// The rank reporting.
        rank: usize,
        /// Rank 0's message.
        message: String,
    },
    /// A peer sent something that does not fit the group.
    #[error("rendezvous protocol: {0}")]
    Protocol(String),
    /// The address could not be used.
    #[error("rendezvous address {addr}: {detail}")]
    Address {
        /// The address.
        addr: String,
        /// What went wrong.
        detail: String,
    },
    /// A torchrun variable is missing or malformed.
    #[error("environment variable {var}: {detail}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_names_each_cause_once() {
        let io = Error::Io {
            path: PathBuf::from("out/.checkpoint-3.partial"),
            source: std::io::Error::other("Not a directory"),
        };
        assert_eq!(
            io.report(),
            "error: out/.checkpoint-3.partial: Not a directory"
        );
        let json = Error::Json {
            path: PathBuf::from("trainer_state.json"),
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        };
        assert_eq!(json.report().lines().count(), 1, "{}", json.report());
    }
}
