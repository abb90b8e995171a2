//! The sink of rank 0's records: an HF-style dict per logged step on the console, a
//! progress bar in examples, one JSON object per logged step in a JSONL file, and
//! the TensorBoard and plot outputs.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::args::TrainingArgs;
use crate::error::{Error, FileOp, Result};
use crate::report::plot::{label_of, plot_runs, RunLog};
use crate::report::record::{EvalLog, StepLog};
use crate::report::tensorboard::EventWriter;

/// Cuts a log's last line when it has no newline: a record a kill or a full
/// disk left half written. The resumed run then appends whole lines after whole
/// lines.
fn cut_torn_line(path: &Path) -> Result<()> {
    let io = |source| Error::Io {
        op: FileOp::Write,
        path: path.to_path_buf(),
        source,
    };
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
    };
    let len = file.metadata().map_err(io)?.len();
    let mut end = len;
    let mut block = vec![0u8; 64 * 1024];
    // Back from the end to the last newline, a block at a time.
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - start) as usize];
        file.seek(SeekFrom::Start(start)).map_err(io)?;
        file.read_exact(chunk).map_err(io)?;
        if let Some(at) = chunk.iter().rposition(|&b| b == b'\n') {
            end = start + at as u64 + 1;
            break;
        }
        end = start;
    }
    if end < len {
        file.set_len(end).map_err(io)?;
        super::messages::warning(&format!(
            "{}: removed a torn last line ({} bytes) left by an interrupted run",
            path.display(),
            len - end
        ));
    }
    Ok(())
}

/// Where rank 0 writes its logs.
pub struct Logger {
    /// The JSONL log: each record goes out in one `write` of the whole line, so a
    /// kill or a full disk never leaves half a record followed by the next.
    jsonl: Option<(PathBuf, File)>,
    /// The JSONL file was opened for appending and already had content.
    appended_to_lines: bool,
    progress: ProgressBar,
    print_steps: bool,
    print_indices: bool,
    tensorboard: Option<EventWriter>,
    /// `--plot`: where the picture goes, and the steps logged by this run.
    plot: Option<(PathBuf, Vec<StepLog>)>,
    /// `--plot` without a JSONL log: the evaluations of this run.
    plot_evals: Vec<(usize, f64)>,
}

impl Logger {
    /// A logger; `total_examples` sizes the progress bar (None: no bar).
    pub fn new(
        jsonl: Option<&Path>,
        total_examples: Option<u64>,
        print_steps: bool,
        print_indices: bool,
        append: bool,
    ) -> Result<Self> {
        let mut appended_to_lines = false;
        let jsonl = match jsonl {
            Some(path) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)
                        .map_err(Error::io(FileOp::CreateDir, parent))?;
                }
                if append {
                    cut_torn_line(path)?;
                }
                appended_to_lines = append && std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
                // A resumed run continues its log instead of truncating it.
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .write(true)
                    .append(append)
                    .truncate(!append)
                    .open(path)
                    .map_err(Error::io(FileOp::Write, path))?;
                Some((path.to_path_buf(), file))
            }
            None => None,
        };
        let progress = match total_examples {
            Some(total) => {
                let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
                bar.set_style(
                    ProgressStyle::with_template("{bar:40} {pos}/{len} examples [{elapsed_precise}<{eta_precise}, {per_sec}] {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
                bar
            }
            None => ProgressBar::hidden(),
        };
        Ok(Self {
            jsonl,
            appended_to_lines,
            progress,
            print_steps,
            print_indices,
            tensorboard: None,
            plot: None,
            plot_evals: Vec::new(),
        })
    }

    /// Adds the outputs `args` asks for besides the console and JSONL: TensorBoard
    /// event files (`--report-to tensorboard`, in `--logging-dir`) and a picture of
    /// the run at its end (`--plot`).
    pub fn with_outputs(mut self, args: &TrainingArgs) -> Result<Self> {
        if args.reports_to_tensorboard() {
            self.tensorboard = Some(EventWriter::create(&args.tensorboard_dir())?);
        }
        if let Some(parent) = (args.logging.plot.as_deref())
            .and_then(Path::parent)
            .filter(|p| !p.as_os_str().is_empty())
        {
            // Made now: a plot drawn after training must not find its folder missing.
            std::fs::create_dir_all(parent).map_err(Error::io(FileOp::CreateDir, parent))?;
        }
        self.plot = args.logging.plot.clone().map(|path| (path, Vec::new()));
        Ok(self)
    }

    /// Advances the bar by `examples`.
    pub fn advance(&self, examples: usize, epoch: f64) {
        if self.progress.is_hidden() {
            return;
        }
        self.progress.inc(examples as u64);
        self.progress.set_message(format!("epoch {epoch:.2}"));
    }

    /// Writes one logged step.
    pub fn log(&mut self, entry: &StepLog) -> Result<()> {
        if self.print_steps {
            if self.print_indices {
                for (rank, indices) in entry.indices.iter().enumerate() {
                    self.progress.suspend(|| {
                        println!(
                            "[step {}] rank {rank}: local batch size {}, indices {indices:?}",
                            entry.step,
                            indices.len()
                        )
                    });
                }
            }
            self.progress.suspend(|| println!("{}", entry.hf_dict()));
        }
        self.write_record(entry)?;
        if let Some(tensorboard) = &mut self.tensorboard {
            tensorboard.write_step(entry)?;
        }
        if let Some((_, steps)) = &mut self.plot {
            steps.push(entry.clone());
        }
        Ok(())
    }

    /// Writes one evaluation: console, JSONL (an `"event": "eval"` line) and
    /// TensorBoard (`eval/loss`, `eval/<metric>`).
    pub fn log_eval(&mut self, entry: &EvalLog) -> Result<()> {
        if self.print_steps {
            self.progress.suspend(|| println!("{}", entry.hf_dict()));
        }
        self.write_record(entry)?;
        if self.plot.is_some() {
            self.plot_evals.push((entry.step, entry.eval_loss));
        }
        if let Some(tensorboard) = &mut self.tensorboard {
            let tags: Vec<(String, f64)> =
                std::iter::once(("eval/loss".to_string(), entry.eval_loss))
                    .chain(entry.metrics.iter().map(|(k, v)| {
                        (format!("eval/{}", k.strip_prefix("eval_").unwrap_or(k)), *v)
                    }))
                    .collect();
            let values: Vec<(&str, f64)> = tags.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            tensorboard.write_scalars(entry.step, &values)?;
        }
        Ok(())
    }

    /// Prints a one-off event (an OOM handled, a step skipped, a checkpoint saved)
    /// unless the run is quiet.
    pub fn event(&self, message: &str) {
        if self.print_steps {
            self.progress.suspend(|| super::messages::say(message));
        }
    }

    /// One JSONL record: the line and its newline in a single write.
    fn write_record(&mut self, record: &impl serde::Serialize) -> Result<()> {
        let Some((path, file)) = &mut self.jsonl else {
            return Ok(());
        };
        let mut line = serde_json::to_vec(record).map_err(|source| Error::Json {
            path: path.clone(),
            source,
        })?;
        line.push(b'\n');
        file.write_all(&line)
            .map_err(Error::io(FileOp::Write, path.clone()))
    }

    /// Records in the JSONL log that the run diverged at `step`: one line
    /// `{"event": "diverged", "step": N, "error": ...}`.
    pub fn log_divergence(&mut self, step: usize, error: &str) -> Result<()> {
        self.write_record(&serde_json::json!({
            "event": "diverged",
            "step": step,
            "error": error,
        }))
    }

    /// Marks in the JSONL log that the run resumed here: one line
    /// `{"event": "resume", "checkpoint": ..., "step": N}`; step lines have no
    /// `event` key.
    pub fn mark_resume(&mut self, checkpoint: &Path, step: usize) -> Result<()> {
        self.event(&format!(
            "resuming from {} at step {step}",
            checkpoint.display()
        ));
        // Only a log that already holds lines needs the mark between two runs.
        let continued = self.appended_to_lines;
        if continued {
            self.write_record(&serde_json::json!({
                "event": "resume",
                "checkpoint": checkpoint.display().to_string(),
                "step": step,
            }))?;
        }
        Ok(())
    }

    /// Closes the bar and draws `--plot`: from the whole JSONL log where there is
    /// one (a resumed run's log holds the steps before the resume too), else from
    /// the steps logged by this run. A plot that cannot be drawn is a warning: the
    /// run itself succeeded.
    pub fn finish(&self) {
        self.progress.finish_and_clear();
        if let Err(e) = self.write_plot() {
            super::messages::warning(&e.to_string());
        }
    }

    /// Draws `--plot` now (see [`Logger::finish`]).
    pub fn write_plot(&self) -> Result<()> {
        let Some((out, steps)) = &self.plot else {
            return Ok(());
        };
        let path = self.jsonl.as_ref().map(|(p, _)| p.clone());
        let run = match &path {
            Some(p) => RunLog::read(p)?,
            None => RunLog {
                label: label_of(None),
                steps: steps.clone(),
                evals: self.plot_evals.clone(),
            },
        };
        plot_runs(&[run], out)?;
        if self.print_steps {
            self.progress.suspend(|| {
                super::messages::note(&format!("plot of the run written to {}", out.display()))
            });
        }
        Ok(())
    }
}
