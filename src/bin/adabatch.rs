//! The `adabatch` command line.
//!
//! ```text
//! adabatch plot RUN.jsonl [MORE.jsonl ...] -o OUT.svg|OUT.png
//! ```
//!
//! draws the global batch size, coverage and epoch, loss and learning rate of each
//! run's JSONL log (`--log-jsonl`) against steps and against examples seen, runs
//! overlaid with a legend.
//!
//! ```text
//! adabatch tokenize CORPUS... -o DIR [--vocab-size N | --tokenizer tokenizer.json] [--text-column NAME]
//! ```
//!
//! writes token files for the language-model datasets (`adabatch::tokenize`):
//! `DIR/train.bin`, `DIR/validation.bin`, `DIR/tokenizer.json`, `DIR/tokens.json`.

use adabatch::ParseHf;
use std::path::PathBuf;
use std::process::ExitCode;

use adabatch::{plot_runs, RunLog};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "adabatch", version, about = "adabatch: see a run")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Draw runs' JSONL logs (batch size, coverage and epoch, loss, learning rate)
    /// against steps and examples seen, to an SVG or PNG file.
    Plot {
        /// JSONL logs written by `--log-jsonl`; several are overlaid.
        #[arg(required = true)]
        logs: Vec<PathBuf>,
        /// Output picture: `.svg` or `.png`.
        #[arg(short, long)]
        output: PathBuf,
        /// Legend labels, one `-l` per log, in order (default: the file names).
        #[arg(short, long)]
        label: Vec<String>,
    },
    /// Tokenize a corpus into token files: DIR/train.bin, DIR/validation.bin (each
    /// document followed by the EOS id), DIR/tokenizer.json and DIR/tokens.json,
    /// streaming (memory does not grow with the corpus). With `--domain NAME=PATH`
    /// (repeated): one tokenizer trained on every domain's training documents, and
    /// a prepared folder per domain, DIR/NAME/.
    #[cfg(feature = "tokenizers")]
    Tokenize {
        /// Corpus files or folders: `.txt` (a document per line) and `.jsonl`, plain,
        /// `.gz` or `.zst`; with the `parquet` feature `.parquet` shards and `.arrow`
        /// files (a `datasets` save_to_disk folder). A folder is its corpus files in
        /// name order.
        #[arg(required_unless_present = "domain", conflicts_with = "domain")]
        corpus: Vec<PathBuf>,
        /// A named domain, `NAME=PATH` (repeat it): its own train and validation
        /// files under the shared tokenizer.
        #[arg(long, value_parser = parse_domain)]
        domain: Vec<(String, PathBuf)>,
        /// Output directory.
        #[arg(short, long)]
        output: PathBuf,
        /// Train a byte-level BPE of this many ids on the training documents.
        #[arg(long, default_value_t = 4096, conflicts_with = "tokenizer")]
        vocab_size: usize,
        /// Use this `tokenizer.json` instead of training one.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// The token that ends every document.
        #[arg(long, default_value = "<|endoftext|>")]
        eos_token: String,
        /// Share of the documents held out for validation (evenly spread).
        #[arg(long, default_value_t = 0.05)]
        validation_fraction: f64,
        /// The column holding the text in JSON lines, Parquet and Arrow files.
        #[arg(long, default_value = "text")]
        text_column: String,
        /// Bytes of text a trained BPE learns from: the first training documents.
        #[arg(long, default_value_t = 256 << 20, conflicts_with = "tokenizer")]
        bpe_sample_bytes: u64,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
    },
}

/// `NAME=FILE`.
#[cfg(feature = "tokenizers")]
fn parse_domain(text: &str) -> Result<(String, PathBuf), String> {
    match text.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("{text:?}: give a domain as NAME=FILE")),
    }
}

/// `adabatch tokenize --domain NAME=FILE ...`: one tokenizer, a folder per domain.
#[cfg(feature = "tokenizers")]
fn tokenize_domains(
    domains: &[(String, PathBuf)],
    output: &std::path::Path,
    options: &adabatch::tokenize::PrepareOptions,
) -> adabatch::Result<()> {
    let (_, infos) = adabatch::prepare_domains(domains, output, options)?;
    for ((name, _), info) in domains.iter().zip(&infos) {
        println!("wrote {}: {}", output.join(name).display(), summary(info));
    }
    Ok(())
}

/// What a preparation wrote, in one line.
#[cfg(feature = "tokenizers")]
fn summary(info: &adabatch::tokenize::CorpusInfo) -> String {
    let mut line = format!(
        "{} training documents ({} tokens), {} validation documents ({} tokens), vocabulary {}, EOS id {}",
        info.train_documents,
        info.train_tokens,
        info.validation_documents,
        info.validation_tokens,
        info.vocab_size,
        info.eos_id
    );
    let skipped = info.skipped;
    if skipped.null + skipped.empty > 0 {
        line += &format!(
            "; skipped {} null and {} empty texts",
            skipped.null, skipped.empty
        );
    }
    if let Some(encoder) = &info.encoder {
        line += &format!("; encoded by {encoder}");
    }
    line
}

fn main() -> ExitCode {
    adabatch::exit_code(run(Cli::parse_hf()))
}

fn run(cli: Cli) -> adabatch::Result<()> {
    match cli.command {
        #[cfg(feature = "tokenizers")]
        Command::Tokenize {
            corpus,
            domain,
            output,
            vocab_size,
            tokenizer,
            eos_token,
            validation_fraction,
            text_column,
            bpe_sample_bytes,
            quiet,
        } => {
            use adabatch::tokenize::{prepare_corpus, PrepareOptions, TokenizerSource};
            let options = PrepareOptions {
                tokenizer: match tokenizer {
                    Some(path) => TokenizerSource::File(path),
                    None => TokenizerSource::TrainBpe { vocab_size },
                },
                eos_token,
                validation_fraction,
                text_column,
                bpe_sample_bytes,
                progress: !quiet,
            };
            if !domain.is_empty() {
                return tokenize_domains(&domain, &output, &options);
            }
            let info = prepare_corpus(&corpus, &output, &options)?;
            if info.validation_documents == 0 {
                eprintln!(
                    "warning: no validation document was held out ({} documents at --validation-fraction {}): a run on these files cannot measure a validation loss",
                    info.train_documents, options.validation_fraction
                );
            }
            println!("wrote {}: {}", output.display(), summary(&info));
            Ok(())
        }
        Command::Plot {
            logs,
            output,
            label,
        } => {
            if !label.is_empty() && label.len() != logs.len() {
                return Err(adabatch::Error::Message(format!(
                    "{} labels for {} logs: give one label per log",
                    label.len(),
                    logs.len()
                )));
            }
            let mut runs = logs
                .iter()
                .map(|path| RunLog::read(path))
                .collect::<adabatch::Result<Vec<_>>>()?;
            for (run, label) in runs.iter_mut().zip(label) {
                run.label = label;
            }
            for (run, path) in runs.iter().zip(&logs) {
                if run.steps.is_empty() {
                    return Err(adabatch::Error::Message(format!(
                        "{}: no logged step in this file",
                        path.display()
                    )));
                }
            }
            plot_runs(&runs, &output)?;
            println!("wrote {}", output.display());
            Ok(())
        }
    }
}
