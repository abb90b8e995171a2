//! The `adabatch` command line.
//!
//! ```text
//! adabatch plot RUN.jsonl [MORE.jsonl ...] -o OUT.svg|OUT.png
//! ```
//!
//! draws the global batch size, coverage and epoch, loss and learning rate of each
//! run's JSONL log (`--log-jsonl`) against steps and against examples seen, runs
//! overlaid with a legend.

use std::path::PathBuf;
use std::process::ExitCode;

use adabatch::report::plot::{plot_runs, RunLog};
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
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> adabatch::Result<()> {
    match cli.command {
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
