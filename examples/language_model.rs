//! Pretrain a small Llama decoder on the English corpus in `data/`: tokenized by a
//! byte-level BPE trained on first run, documents packed into rows without padding
//! (positions restart per document, attention stays inside it), the batch doubled
//! as the gradient noise scale grows, validation perplexity every `--eval-steps`,
//! TensorBoard events and a plot, and a few lines of sampled text at the end.
//!
//! ```text
//! cargo run --release --example language_model -- --nproc-per-node 2
//! ```
//!
//! Defaults: 4,096 BPE ids, rows of 128 positions, a 4-layer decoder (hidden 128,
//! 4 heads sharing 2 key/value heads, tied embeddings), one epoch, AdamW at 3e-3
//! at a global batch of 32 documents, scaled by √(batch / 32) at every batch
//! (betas 0.9, 0.95, 2 % warm-up, cosine), the global batch doubled from 8 up to
//! 512 documents whenever half the measured gradient noise scale clears the next
//! size by 10 % (`--schedule noise-scale`: `schedule = noise_scale(fraction = 0.5,
//! min = 8, max = 512, factor = 2, hysteresis = 0.1)`, the policy that won the
//! frontier in BENCHMARKS.md; `--schedule ramp` for the token ramp, `--schedule
//! goodput`, or `--global-batch-size N` with `--schedule ramp` for a fixed batch),
//! the loss the mean over every target token of a step (`reweight = token_count`). `--output-dir` (default `adabatch_output/language_model`) gets
//! `log.jsonl`, `loss.svg`, TensorBoard events under `runs/`, checkpoints, and at
//! the end `model.safetensors`, `config.json` and `tokenizer.json`, which
//! transformers' `LlamaForCausalLM.from_pretrained` and `PreTrainedTokenizerFast` load.
//! `--init-from DIR` continues from such a directory or a checkpoint.

use std::path::PathBuf;

use adabatch::prelude::*;
use adabatch::{PackedCollate, TokenDocuments};
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

#[path = "support/decoder.rs"]
mod decoder;

use decoder::{BudgetTrainer, GoodputTrainer, ModelArgs, NoiseScaleTrainer, RampTrainer};

#[derive(Parser)]
#[command(
    about = "Pretrain a small Llama decoder on packed documents with a batch ramped in tokens"
)]
struct Cli {
    #[command(flatten)]
    train: TrainingArgs,
    #[command(flatten)]
    model: ModelArgs,
    /// Corpus file or folder, as `adabatch tokenize` reads them (`.txt`, `.jsonl`
    /// with "text", plain, `.gz` or `.zst`; `.parquet` and `.arrow` with `parquet`).
    /// Repeat it for several corpora: one tokenizer is trained over all of their
    /// training documents, and the run sees them in their natural proportions.
    #[arg(long, default_value = "data/en_sentences_15k.txt.gz")]
    corpus: Vec<PathBuf>,
    /// Where the token files go: reused when prepared from these corpora with this
    /// vocabulary; a directory prepared from anything else is refused.
    #[arg(long, default_value = "adabatch_output/lm-tokens")]
    tokens_dir: PathBuf,
    #[command(flatten)]
    tokens: decoder::TokenArgs,
    /// Give every document (or piece) a padded row of its own instead of packing.
    #[arg(long)]
    no_packing: bool,
    /// Let packed documents attend to the earlier documents of their row.
    #[arg(long)]
    cross_document_attention: bool,
    /// How the batch size changes: the token ramp (or the schedule that
    /// `--global-batch-size` / `--rampup-batch-size` give: a fixed batch with
    /// `--global-batch-size N` alone), the gradient noise scale, or goodput. Every
    /// policy trains at `--learning-rate` scaled by √(batch / --lr-reference-batch).
    #[arg(long, value_enum, default_value_t = Schedule::NoiseScale)]
    schedule: Schedule,
    /// Sampled lines printed at the end (0: none).
    #[arg(long, default_value_t = 3)]
    samples: usize,
    /// Tokens per sampled line, at most.
    #[arg(long, default_value_t = 40)]
    sample_tokens: usize,
    /// Temperature of the sampled lines (beside the greedy ones).
    #[arg(long, default_value_t = 0.8)]
    temperature: f64,
    /// Write the run's figures (evaluations, steps, tokens/s) here as JSON.
    #[arg(long)]
    summary_json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Schedule {
    /// `ramp(start = 8, increment = 8, tokens = 200_000, global = 64)`, the flags'
    /// schedule (`--global-batch-size N` alone: a fixed batch), or with
    /// `--max-tokens-per-batch` the token budget.
    Ramp,
    /// `noise_scale(fraction = 0.5, min = 8, max = 512, factor = 2, hysteresis =
    /// 0.1)`, measured on a cadence that reads no clock (`--noise-scale-every`).
    NoiseScale,
    /// `goodput(min = 8, max = 512)`: measured step times and the noise scale
    /// (reads the clock: not reproducible).
    Goodput,
}

fn parse_cli() -> (Cli, clap::ArgMatches) {
    let command = decoder::llama_optimizer_defaults(Cli::command())
        .mut_arg("learning_rate", |a| a.default_value("3e-3"))
        .mut_arg("lr_reference_batch", |a| a.default_value("32"))
        .mut_arg("num_train_epochs", |a| a.default_value("1"))
        .mut_arg("warmup_ratio", |a| a.default_value("0.02"))
        .mut_arg("lr_scheduler_type", |a| a.default_value("cosine"))
        .mut_arg("logging_steps", |a| a.default_value("20"))
        .mut_arg("eval_steps", |a| a.default_value("100"))
        .mut_arg("per_device_eval_batch_size", |a| a.default_value("64"))
        .mut_arg("save_steps", |a| a.default_value("500"))
        .mut_arg("save_total_limit", |a| a.default_value("2"))
        .mut_arg("output_dir", |a| {
            a.default_value("adabatch_output/language_model")
        });
    let matches = adabatch::hf_matches(command);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    (cli, matches)
}

/// The example's defaults that depend on other flags: the schedule the batch flags
/// imply, the logs under the output directory, and the per-device size of the ramp's first step when none was given
/// (so that the run does not warn about a flag nobody set).
fn complete_args(cli: &mut Cli, matches: &clap::ArgMatches) -> TrainingArgs {
    let from_command_line =
        |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    // Batch flags without `--schedule` mean the flags' schedule (a fixed batch, a
    // ramp, a token budget), not the default noise scale.
    let batch_flags = [
        "global_batch_size",
        "rampup_batch_size",
        "max_tokens_per_batch",
    ];
    if !from_command_line("schedule") && batch_flags.iter().any(|id| from_command_line(id)) {
        cli.schedule = Schedule::Ramp;
    }
    let mut args = cli.train.clone();
    if !from_command_line("per_device_train_batch_size") {
        args.batch.per_device_train_batch_size = match cli.schedule {
            Schedule::Ramp => 8usize.div_ceil(args.launch.nproc_per_node.max(1)),
            Schedule::NoiseScale | Schedule::Goodput => 8,
        };
    }
    decoder::log_into_output_dir(&mut args);
    if args.logging.report_to.is_empty() {
        args.logging.report_to = vec![adabatch::ReportTo::Tensorboard];
    }
    args
}

fn main() -> std::process::ExitCode {
    adabatch::exit_code(run())
}

fn run() -> adabatch::Result<()> {
    let (mut cli, matches) = parse_cli();
    let args = complete_args(&mut cli, &matches);
    let corpora: Vec<PathBuf> = cli
        .corpus
        .iter()
        .cloned()
        .map(decoder::in_repository)
        .collect();
    let (info, train, validation) = decoder::corpus(
        &corpora,
        &cli.tokens_dir,
        (cli.tokens.vocab_size, cli.tokens.validation_fraction),
        cli.tokens.retokenize,
    )?;
    let (train, validation) = (
        train.with_max_len(cli.tokens.max_document_tokens)?,
        validation.with_max_len(cli.tokens.max_document_tokens)?,
    );
    let given = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    let config = decoder::model_config(&cli.model, &info, args.save.init_from.as_deref(), &given)?;
    config.validate()?;
    let collate = PackedCollate::new(cli.model.seq_len, info.eos_id)
        .with_cross_document_attention(cli.cross_document_attention)
        .with_packing(!cli.no_packing);
    let data = (&train, &validation);
    let (summary, llama) = match cli.schedule {
        Schedule::Ramp if args.length_aware.max_tokens_per_batch.is_some() => {
            decoder::train(data, &collate, &args, &config, BudgetTrainer::new)?
        }
        Schedule::Ramp => decoder::train(data, &collate, &args, &config, RampTrainer::new)?,
        Schedule::NoiseScale => {
            decoder::train(data, &collate, &args, &config, NoiseScaleTrainer::new)?
        }
        Schedule::Goodput => decoder::train(data, &collate, &args, &config, GoodputTrainer::new)?,
    };
    report(&cli, &args, &info, (&train, &validation), &summary, &llama)
}

/// Perplexities against the unigram baseline, sampled text, the tokenizer beside the
/// saved model, and `--summary-json`.
fn report(
    cli: &Cli,
    args: &TrainingArgs,
    info: &adabatch::tokenize::CorpusInfo,
    (train, validation): (&TokenDocuments, &TokenDocuments),
    summary: &adabatch::TrainSummary,
    llama: &adabatch::models::llama::Llama,
) -> adabatch::Result<()> {
    println!("{summary}");
    let unigram = decoder::unigram_loss(train, validation, info.vocab_size as usize);
    for eval in &summary.evaluations {
        println!(
            "step {:>5}  epoch {:.2}  validation loss {:.4}  perplexity {:.1}",
            eval.step,
            eval.epoch,
            eval.eval_loss,
            eval.eval_loss.exp()
        );
    }
    if let Some(last) = summary.final_eval() {
        println!(
            "validation perplexity {:.1}; the unigram baseline's is {:.1}",
            last.eval_loss.exp(),
            unigram.exp()
        );
    }
    let tokenizer_json = cli.tokens_dir.join("tokenizer.json");
    if cli.samples > 0 {
        let tokenizer = adabatch::tokenize::load_tokenizer(&tokenizer_json)?;
        let prompts: Vec<Vec<u32>> = (0..cli.samples.min(validation.len()))
            .map(|i| validation.document(i).into_iter().take(3).collect())
            .collect();
        let settings = (cli.sample_tokens, cli.temperature, info.eos_id);
        decoder::print_samples(llama, &tokenizer, &prompts, settings)?;
    }
    if args.save.save_steps > 0 && args.save.output_dir.join("model.safetensors").exists() {
        let to = args.save.output_dir.join("tokenizer.json");
        std::fs::copy(&tokenizer_json, &to)
            .map_err(adabatch::Error::io(adabatch::FileOp::CopyTo, to))?;
    }
    if let Some(path) = &cli.summary_json {
        write_summary(path, info, summary, unigram)?;
    }
    Ok(())
}

/// The figures the adaptation table reads.
fn write_summary(
    path: &std::path::Path,
    info: &adabatch::tokenize::CorpusInfo,
    summary: &adabatch::TrainSummary,
    unigram: f64,
) -> adabatch::Result<()> {
    let tokens_per_epoch = info.train_tokens as f64;
    let evals: Vec<_> = summary
        .evaluations
        .iter()
        .map(|e| serde_json::json!({"step": e.step, "epoch": e.epoch, "tokens": e.epoch * tokens_per_epoch, "eval_loss": e.eval_loss, "train_seconds": e.train_seconds}))
        .collect();
    let value = serde_json::json!({
        "steps": summary.global_step,
        "epoch": summary.epoch,
        "train_runtime": summary.train_runtime,
        "tokens_per_second": summary.epoch * tokens_per_epoch / summary.train_runtime,
        "final_eval_loss": summary.final_eval().map(|e| e.eval_loss),
        "unigram_loss": unigram,
        "evaluations": evals,
    });
    let text = serde_json::to_string_pretty(&value).expect("plain JSON") + "\n";
    std::fs::write(path, text).map_err(adabatch::Error::io(
        adabatch::FileOp::Write,
        path.to_path_buf(),
    ))
}
