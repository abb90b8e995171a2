//! Continual learning with a replay memory, on the UCI 8×8 digits shipped in
//! `data/`: a seeded 70/30 train/test split; task A = digits 0–4, task B = 5–9.
//! Phase 1 trains on A. Phase 2 trains on B (source `new`) mixed, in every global
//! batch, with a replay memory of `--replay-memory N` training examples of A
//! (source `replay`; 0 = no replay) at `--replay-fraction F` of each batch
//! (`--mix fixed`), or with weights from the per-source losses (`--mix online`).
//! Without replay the network forgets A; a small memory keeps most of it.
//!
//! An MLP 64-64-10 trained with SGD, a global batch of 32 (`--global-batch-size`),
//! `--epochs-per-task` passes over each task's training examples (phase 2: over
//! `new`; the replay memory cycles). Phase 2's JSONL rows (`--log-jsonl`) carry the
//! per-source fields: `source_counts`, `source_indices`, `source_coverage`,
//! `source_epoch`, `mix_weights`. The mixing flags (`--mix-weights`,
//! `--stopping-strategy`) apply to phase 2; each phase saves into its own folder of
//! `--output-dir` (`phase-1/`, `phase-2/`), and `--resume-from-checkpoint latest`
//! resumes whichever phase has checkpoints.
//!
//! ```text
//! cargo run --release --example continual_replay -- --replay-memory 0
//! cargo run --release --example continual_replay -- --replay-memory 50 --replay-fraction 0.25 \
//!     --nproc-per-node 2 --summary-json replay.json
//! ```

#[path = "support/continual.rs"]
mod continual;
#[path = "support/digits.rs"]
mod digits;

use std::path::PathBuf;

use adabatch::clap::{self, CommandFactory, FromArgMatches, Parser, ValueEnum};
use adabatch::prelude::*;
use continual::Protocol;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mix {
    /// `--replay-fraction` of every global batch from the replay memory.
    Fixed,
    /// Weights from the per-source losses (`mix = online(temperature = 1.0,
    /// warmup = 0)`: a softmax of the smoothed losses with a 5 % floor).
    Online,
}

#[derive(Parser)]
#[command(about = "class-incremental digits: task A (0-4) then task B (5-9), with a replay memory")]
// SGD on this MLP wants a learning rate far above `TrainingArgs`' AdamW-style default.
#[command(mut_arg("learning_rate", |a| a.default_value("0.1")))]
struct Cli {
    /// The data set (CSV, or gzipped CSV); default: the repository's copy.
    #[arg(long)]
    digits: Option<PathBuf>,
    /// Training examples of task A kept for replay in phase 2 (0 = no replay).
    #[arg(long, default_value_t = 50)]
    replay_memory: usize,
    /// How phase 2 mixes `new` and `replay`.
    #[arg(long, value_enum, default_value = "fixed")]
    mix: Mix,
    /// With `--mix fixed`: the share of every global batch taken from the memory.
    #[arg(long, default_value_t = 0.25)]
    replay_fraction: f64,
    /// Passes over each task's training examples.
    #[arg(long, default_value_t = 20)]
    epochs_per_task: usize,
    /// Write the accuracies and the source sizes here as JSON.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    #[command(flatten)]
    train: TrainingArgs,
}

fn main() -> std::process::ExitCode {
    let matches = adabatch::hf_matches(Cli::command());
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let refused = adabatch::OptimArgs::given(&matches);
    if !refused.is_empty() {
        return adabatch::exit_code(Err(adabatch::Error::msg(format!(
            "this example trains with SGD at --learning-rate: {} do not apply",
            refused.join(", ")
        ))));
    }
    adabatch::exit_code(run(cli))
}

fn run(cli: Cli) -> adabatch::Result<()> {
    let path = cli.digits.clone().unwrap_or_else(digits::default_path);
    let all = digits::read_digits(&path)?;
    let mut args = cli.train.clone();
    args.data.seed = Some(args.data.seed.unwrap_or(0));
    args.length.num_train_epochs = cli.epochs_per_task;
    args.batch.global_batch_size = args.batch.global_batch_size.or(Some(32));
    let mix = match cli.mix {
        Mix::Fixed => continual::Mix::Fixed(cli.replay_fraction),
        Mix::Online => continual::Mix::Online,
    };
    let protocol = Protocol {
        replay_memory: cli.replay_memory,
        mix,
        args,
    };
    let outcome = continual::run(all, &protocol)?;
    println!(
        "phase 1 (task A): test accuracy A {:.3}",
        outcome.task_a_after_phase_1
    );
    println!("{}", outcome.phase_2);
    let (new, replay) = outcome.source_sizes;
    println!(
        "phase 2 (task B; replay memory {replay}, {mix:?}): test accuracy A {:.3}, B {:.3}",
        outcome.task_a, outcome.task_b
    );
    if let Some(path) = &cli.summary_json {
        let summary = serde_json::json!({
            "task_a_accuracy": outcome.task_a,
            "task_b_accuracy": outcome.task_b,
            "task_a_accuracy_after_phase_1": outcome.task_a_after_phase_1,
            "source_sizes": { "new": new, "replay": replay },
            "replay_examples_used": outcome.replay_examples_used(),
            "steps": outcome.phase_2.global_step,
        });
        std::fs::write(
            path,
            serde_json::to_string_pretty(&summary).expect("plain JSON") + "\n",
        )
        .map_err(adabatch::Error::io(adabatch::FileOp::Write, path))?;
    }
    Ok(())
}
