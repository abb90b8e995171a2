//! The experiments' driver of `benches/compare/lm_mixing/`: the mixture example's
//! run (`examples/mixture.rs`, every flag of it) with the levers only the
//! experiments pull: `--summary-json`, the per-domain figures the scripts read,
//! and `--mix-unit`, shares of documents instead of tokens.
//!
//! ```text
//! cargo build --release -p adabatch-benches --example mixture_compare
//! target/release/examples/mixture_compare --mixer odm --summary-json odm.json
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use adabatch::MixUnit;
use clap::{Parser, ValueEnum};

#[path = "../../../examples/support/mixture/mod.rs"]
mod mixture;

use mixture::outcome::{FinalLosses, Outcome};

#[derive(Parser)]
#[command(about = "The mixture example with the mixing experiments' flags")]
struct Cli {
    #[command(flatten)]
    mixture: mixture::MixtureArgs,
    /// What the shares are of.
    #[arg(long, value_enum, default_value_t = Unit::Tokens)]
    mix_unit: Unit,
    /// Write the run's figures (per-domain losses, steps, tokens) here as JSON.
    #[arg(long)]
    summary_json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Unit {
    /// Shares of the tokens.
    Tokens,
    /// Shares of the documents.
    Documents,
}

fn main() -> std::process::ExitCode {
    adabatch::exit_code(run())
}

fn run() -> adabatch::Result<()> {
    let (cli, matches) = mixture::parse::<Cli>();
    let unit = match cli.mix_unit {
        Unit::Tokens => MixUnit::Tokens,
        Unit::Documents => MixUnit::Examples,
    };
    let mixer = format!("{:?}", cli.mixture.mixer).to_lowercase();
    let outcome = mixture::run(cli.mixture, &matches, unit)?;
    match (outcome.report(), &cli.summary_json) {
        (Some(last), Some(path)) => write_summary(path, &mixer, &outcome, &last),
        _ => Ok(()),
    }
}

/// `--summary-json`: the mixer, the steps and time, each domain's last validation
/// loss with their mean and worst, and every evaluation's losses.
fn write_summary(
    path: &Path,
    mixer: &str,
    outcome: &Outcome,
    last: &FinalLosses,
) -> adabatch::Result<()> {
    let names = &outcome.names;
    let evaluations: Vec<_> = (outcome.summary.evaluations.iter())
        .map(|e| {
            let per_domain: serde_json::Map<String, serde_json::Value> = names
                .iter()
                .map(|n| (n.clone(), e.get(&format!("eval_{n}_loss")).into()))
                .collect();
            serde_json::json!({"step": e.step, "eval_loss": e.eval_loss, "domains": per_domain})
        })
        .collect();
    let final_losses: BTreeMap<_, _> = names
        .iter()
        .cloned()
        .zip(last.losses.iter().copied())
        .collect();
    let value = serde_json::json!({
        "mixer": mixer,
        "steps": outcome.summary.global_step,
        "train_runtime": outcome.summary.train_runtime,
        "final": final_losses,
        "mean": last.mean,
        "worst": last.worst,
        "eval_loss": last.eval_loss,
        "evaluations": evaluations,
        // A bounded replay's closing: steps and tokens after the planned end.
        "closing": outcome.summary.closing,
    });
    let text = serde_json::to_string_pretty(&value).expect("plain JSON") + "\n";
    std::fs::write(path, text).map_err(adabatch::Error::io(
        adabatch::FileOp::Write,
        path.to_path_buf(),
    ))
}
