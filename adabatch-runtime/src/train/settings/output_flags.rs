//! What the run writes and when: the logging, evaluation and checkpoint flags
//! (`LogArgs`, `EvalArgs`, `SaveArgs`) check and resolve themselves into
//! `LogRules`, `EvalRules` and `SaveRules`.

use std::path::PathBuf;

use crate::config::args::{EvalArgs, LogArgs, SaveArgs};
use crate::error::{Error, Result, SettingsError};

use super::require;
use super::strategy::{BestModel, Interval};

/// When a step is logged: every `every` steps (and the last), the first too
/// with `--logging-first-step`.
#[derive(Debug, Clone)]
pub(crate) struct LogRules {
    pub(crate) every: usize,
    pub(crate) first_step: bool,
}

/// When the run evaluates (with an eval dataset; always at the end too): at
/// the start with `--eval-on-start`, every `every`, in chunks of `batch_size`.
#[derive(Debug, Clone)]
pub(crate) struct EvalRules {
    pub(crate) on_start: bool,
    pub(crate) every: Interval,
    pub(crate) batch_size: usize,
    /// `--mixer-eval-examples`: the held-out set's examples per source.
    pub(crate) held_out: Option<usize>,
}

/// Where checkpoints go and when (a run that saves also saves at its end), how
/// many are kept, the best model's rule, and the checkpoint resumed.
#[derive(Debug, Clone)]
pub(crate) struct SaveRules {
    pub(crate) output_dir: PathBuf,
    pub(crate) every: Interval,
    /// `--load-best-model-at-end`.
    pub(crate) best_model: Option<BestModel>,
    pub(crate) resume: Option<PathBuf>,
    pub(crate) total_limit: Option<usize>,
    pub(crate) ignore_optimizer_state: bool,
    /// `--init-from`: weights to start a fresh run from, and whether strictly.
    pub(crate) init_from: Option<(PathBuf, bool)>,
}

impl LogArgs {
    /// A logging interval of at least one step, and a picture format the plot
    /// can draw (it is drawn after training: said now, not then).
    pub(super) fn check(&self) -> Result<()> {
        require(self.logging_steps > 0, "logging_steps", 0, "at least 1")?;
        if let Some(plot) = &self.plot {
            let extension = plot.extension().and_then(|e| e.to_str());
            require(
                matches!(extension, Some("svg" | "png")),
                "plot",
                plot.display(),
                "a path ending in .svg or .png",
            )?;
        }
        Ok(())
    }

    pub(super) fn rules(&self) -> LogRules {
        LogRules {
            every: self.logging_steps,
            first_step: self.logging_first_step,
        }
    }
}

impl EvalArgs {
    /// Intervals and batches of at least one.
    pub(super) fn check(&self) -> Result<()> {
        require(self.eval_steps != Some(0), "eval_steps", 0, "at least 1")?;
        require(
            self.mixer_eval_examples != Some(0),
            "mixer_eval_examples",
            0,
            "at least 1 example of each source",
        )?;
        if self.per_device_eval_batch_size == 0 {
            return Err(Error::Settings(SettingsError::ZeroBatchSize {
                what: "per_device_eval_batch_size",
            }));
        }
        Ok(())
    }

    /// The rules; `--eval-strategy steps` without `--eval-steps` evaluates every
    /// `logging_steps`, as in HF.
    pub(super) fn rules(&self, logging_steps: usize) -> EvalRules {
        EvalRules {
            on_start: self.eval_on_start,
            every: Interval::of_eval(self, logging_steps),
            batch_size: self.per_device_eval_batch_size,
            held_out: self.mixer_eval_examples,
        }
    }
}

impl SaveArgs {
    /// A limit of at least one checkpoint, an interval the strategy can use.
    pub(super) fn check(&self) -> Result<()> {
        require(
            self.save_total_limit != Some(0),
            "save_total_limit",
            0,
            "at least 1 (or unset to keep every checkpoint)",
        )?;
        Interval::of_save(self).map(|_| ())
    }

    /// The rules of a run that evaluates `eval_every` and resumes `resume`: the
    /// best model's rule needs a checkpoint at every evaluation's step.
    pub(super) fn rules(&self, eval_every: Interval, resume: Option<PathBuf>) -> Result<SaveRules> {
        let every = Interval::of_save(self)?;
        Ok(SaveRules {
            output_dir: self.output_dir.clone(),
            every,
            best_model: BestModel::of(self, eval_every, every)?,
            resume,
            total_limit: self.save_total_limit,
            ignore_optimizer_state: self.ignore_optimizer_state,
            init_from: (self.init_from.clone()).map(|path| (path, self.init_from_strict)),
        })
    }
}
