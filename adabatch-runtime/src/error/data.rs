//! The data: the dataset, its sources, batches, token files and tokenizers.

use std::path::PathBuf;

use super::Cause;

/// The data: the dataset, its sources, batches, token files and tokenizers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
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
    /// `reweight = token_count` and a global batch without tokens.
    #[error("step {step}: the global batch has no tokens to weigh the loss by")]
    NoTokens {
        /// The step.
        step: usize,
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
    /// The eval dataset cannot give every rank an example.
    #[error("the eval dataset has {examples} examples for {world_size} ranks: every rank evaluates at least one example")]
    EvalSetTooSmall {
        /// Number of ranks.
        world_size: usize,
        /// Number of eval examples.
        examples: usize,
    },
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
    /// A setting of token data (a token file, its documents, a tokenizer, a
    /// domain) that cannot work.
    #[error("token data: {name} = {value}: {expected}")]
    InvalidTokenSetting {
        /// The setting.
        name: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        expected: String,
    },
    /// The tokenizers crate failed to train the byte-level BPE; its error is the
    /// source.
    #[error("training the byte-level BPE failed")]
    TokenizerTraining {
        /// The tokenizers crate's error.
        source: Cause,
    },
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
    /// A corpus file has no column of the text's name.
    #[error("{}: no column {column:?}; its columns: {columns} (choose one with --text-column)", path.display())]
    CorpusColumnMissing {
        /// The corpus file.
        path: PathBuf,
        /// The text column asked for.
        column: String,
        /// The columns the file has, comma-separated.
        columns: String,
    },
    /// A corpus file's text column does not hold text.
    #[error("{}: the column {column:?} is {data_type}, not text (a string column, or a dictionary of strings)", path.display())]
    CorpusColumnNotText {
        /// The corpus file.
        path: PathBuf,
        /// The text column asked for.
        column: String,
        /// Its type, as Arrow names it.
        data_type: String,
    },
    /// A corpus file's format needs a cargo feature this build does not have.
    #[error("{}: reading {format} files needs adabatch's `{feature}` feature (cargo build --release --bin adabatch --features {feature})", path.display())]
    CorpusFormatNeedsFeature {
        /// The corpus file.
        path: PathBuf,
        /// Its format.
        format: &'static str,
        /// The feature that reads it.
        feature: &'static str,
    },
    /// A tokenizer or corpus file could not be read, or text could not be
    /// encoded; the error that stopped it (tokenizers, JSON), if any, is the
    /// source.
    #[error("{}: {detail}", path.display())]
    Tokenizer {
        /// The tokenizer, corpus or token-data file.
        path: PathBuf,
        /// What went wrong, or what could not be done.
        detail: String,
        /// The underlying error.
        #[source]
        source: Option<Cause>,
    },
}

fn step_note(after_step: Option<usize>) -> String {
    after_step.map_or_else(String::new, |step| {
        format!(" (size chosen by the schedule after step {step})")
    })
}
