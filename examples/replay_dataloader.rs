//! The replay-dataloader demo: a tiny text classifier trained with a batch size that
//! grows by one every five steps, on one or several CPU ranks.
//!
//! ```text
//! cargo run --release --example replay_dataloader -- \
//!   --nproc-per-node 2 --num-train-epochs 10 --per-device-train-batch-size 1 \
//!   --dataloader-drop-last false --num-train-examples 10 --seed 42 \
//!   --logging-steps 1 --log-jsonl run.jsonl
//! ```

use adabatch::prelude::*;
use clap::{CommandFactory, FromArgMatches, Parser};

#[path = "support/replay_model.rs"]
mod replay_model;

use replay_model::{collate, dataset, factory, ReplayTrainer};

#[derive(Parser)]
#[command(about = "adabatch replay-dataloader demo: a batch size that grows while training runs")]
struct Cli {
    #[command(flatten)]
    train: TrainingArgs,
    /// Number of "Sample text {i}" examples.
    #[arg(long, default_value_t = 10)]
    num_train_examples: usize,
}

/// The demo's defaults reproduce the design's reference setting (N = 10, initial
/// size 1, `interval(5, +1)`, keep the last batch) on one rank.
fn parse_cli() -> Cli {
    let command = Cli::command()
        .mut_arg("per_device_train_batch_size", |a| a.default_value("1"))
        .mut_arg("num_train_epochs", |a| a.default_value("5"))
        .mut_arg("learning_rate", |a| a.default_value("0.01"))
        .mut_arg("weight_decay", |a| a.default_value("0.01"));
    let matches = adabatch::hf_matches(command);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> std::process::ExitCode {
    adabatch::exit_code(run())
}

fn run() -> adabatch::Result<()> {
    let cli = parse_cli();
    let mut args = cli.train;
    args.logging.log_indices = true;
    let seed = args.data.seed.unwrap_or(ReplayTrainer::POLICY.seed);
    let data = dataset(cli.num_train_examples, seed);
    let summary = ReplayTrainer::launch(
        &data,
        &collate,
        &args,
        factory(adabatch::ParamsAdamW::from_args(&args)?),
    )?
    .summary;
    println!("{summary}");
    Ok(())
}
