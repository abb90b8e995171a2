//! When a run evaluates and saves (HF's `eval_strategy` / `save_strategy`), and
//! `--load-best-model-at-end`'s rule: which checkpoint scored best (kept from
//! `--save-total-limit`; the checkpoint module loads it when training ends).

use crate::config::args::{EvalArgs, IntervalStrategy, SaveArgs};
use crate::error::{Error, ModelError, Result, SettingsError};
use crate::report::record::EvalLog;

/// When an evaluation or a checkpoint is due during the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interval {
    Never,
    Steps(usize),
    Epoch,
}

impl Interval {
    /// Evaluations: `--eval-strategy`, else `steps` when `--eval-steps` is set.
    pub(crate) fn of_eval(eval: &EvalArgs, logging_steps: usize) -> Self {
        match (eval.eval_strategy, eval.eval_steps) {
            (Some(IntervalStrategy::No), _) | (None, None) => Interval::Never,
            (Some(IntervalStrategy::Epoch), _) => Interval::Epoch,
            // HF: `eval_steps` defaults to `logging_steps`.
            (Some(IntervalStrategy::Steps), None) => Interval::Steps(logging_steps),
            (_, Some(k)) => Interval::Steps(k),
        }
    }

    /// Checkpoints: `--save-strategy`, else `steps` when `--save-steps` is above 0.
    pub(crate) fn of_save(save: &SaveArgs) -> Result<Self> {
        Ok(match (save.save_strategy, save.save_steps) {
            (Some(IntervalStrategy::No), _) | (None, 0) => Interval::Never,
            (Some(IntervalStrategy::Epoch), _) => Interval::Epoch,
            (Some(IntervalStrategy::Steps), 0) => {
                return Err(Error::Settings(SettingsError::InvalidSetting {
                    name: "save_steps",
                    value: "0".into(),
                    expected: "at least 1 with --save-strategy steps",
                }))
            }
            (_, k) => Interval::Steps(k),
        })
    }

    /// Whether it is due after `step`, which ended an epoch or not.
    pub(crate) fn due(self, step: usize, epoch_ended: bool) -> bool {
        match self {
            Interval::Never => false,
            Interval::Steps(k) => step % k == 0,
            Interval::Epoch => epoch_ended,
        }
    }
}

/// The checkpoint that scored best so far (kept in every later checkpoint, so a
/// resumed run goes on comparing against it).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BestCheckpoint {
    /// Its step (`checkpoint-{step}`).
    pub step: usize,
    /// Its evaluation's value of the metric.
    pub metric: f64,
}

/// `--load-best-model-at-end`'s rule: which metric, which way is better.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BestModel {
    /// The metric as evaluations log it (`eval_loss`, `eval_accuracy`).
    pub(crate) metric: String,
    pub(crate) greater_is_better: bool,
}

impl BestModel {
    /// The rule of `--load-best-model-at-end`, checked against when the run
    /// evaluates and saves.
    pub(crate) fn of(flags: &SaveArgs, eval: Interval, save: Interval) -> Result<Option<Self>> {
        if !flags.load_best_model_at_end {
            return Ok(None);
        }
        let conflict = |second, reason| {
            Error::Settings(SettingsError::ConflictingSettings {
                first: "--load-best-model-at-end",
                second,
                reason,
            })
        };
        match (eval, save) {
            (_, Interval::Never) => {
                return Err(conflict(
                    "a run that saves no checkpoint",
                    "the best model is loaded from a checkpoint: set --save-steps or --save-strategy",
                ))
            }
            (Interval::Steps(e), Interval::Steps(s)) if s % e != 0 => {
                return Err(conflict(
                    "a --save-steps that is not a multiple of --eval-steps",
                    "every checkpoint needs an evaluation at its step to be compared",
                ))
            }
            (Interval::Steps(_), Interval::Steps(_)) | (Interval::Epoch, Interval::Epoch) => {}
            _ => {
                return Err(conflict(
                    "different --eval-strategy and --save-strategy",
                    "every checkpoint needs an evaluation at its step to be compared: use the same strategy",
                ))
            }
        }
        let name = flags.metric_for_best_model.as_deref().unwrap_or("loss");
        let metric = match name.strip_prefix("eval_") {
            Some(_) => name.to_string(),
            None => format!("eval_{name}"),
        };
        let greater_is_better = flags.greater_is_better.unwrap_or(metric != "eval_loss");
        Ok(Some(Self {
            metric,
            greater_is_better,
        }))
    }

    /// After the evaluations up to a checkpoint at `step`: the best checkpoint,
    /// this one if its evaluation (at the same step) beats `best`. A NaN metric
    /// never wins.
    pub(crate) fn consider(
        &self,
        best: Option<BestCheckpoint>,
        step: usize,
        evaluations: &[EvalLog],
    ) -> Result<Option<BestCheckpoint>> {
        let Some(evaluation) = evaluations.last().filter(|e| e.step == step) else {
            return Ok(best);
        };
        let Some(value) = evaluation.get(&self.metric) else {
            let mut known: Vec<&str> = evaluation.metrics.keys().map(String::as_str).collect();
            known.insert(0, "eval_loss");
            return Err(Error::Model(ModelError::EvalMetric {
                detail: format!(
                    "--metric-for-best-model `{}` is not among the evaluation's metrics ({})",
                    self.metric,
                    known.join(", ")
                ),
            }));
        };
        let better = match best {
            None => !value.is_nan(),
            Some(b) if self.greater_is_better => value > b.metric,
            Some(b) => value < b.metric,
        };
        Ok(if better {
            Some(BestCheckpoint {
                step,
                metric: value,
            })
        } else {
            best
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(step: usize, loss: f64, accuracy: f64) -> EvalLog {
        EvalLog {
            event: "eval".into(),
            step,
            epoch: 0.0,
            eval_loss: loss,
            eval_examples: 10,
            train_seconds: None,
            metrics: [("eval_accuracy".to_string(), accuracy)].into(),
        }
    }

    fn args(extra: &[&str]) -> crate::config::args::TrainingArgs {
        use clap::Parser;
        let mut all = vec!["adabatch", "--load-best-model-at-end"];
        all.extend_from_slice(extra);
        crate::config::args::TrainingArgs::parse_from(all)
    }

    fn rule(extra: &[&str]) -> Result<Option<BestModel>> {
        let a = args(extra);
        let eval = Interval::of_eval(&a.eval, a.logging.logging_steps);
        BestModel::of(&a.save, eval, Interval::of_save(&a.save)?)
    }

    #[test]
    fn the_best_is_the_lowest_loss_or_the_highest_other_metric() {
        let by_loss = rule(&["--eval-steps", "2", "--save-steps", "4"])
            .unwrap()
            .unwrap();
        assert_eq!(
            (by_loss.metric.as_str(), by_loss.greater_is_better),
            ("eval_loss", false)
        );
        let evals = [eval(4, 0.5, 0.7), eval(8, 0.6, 0.8)];
        let best = by_loss.consider(None, 4, &evals[..1]).unwrap();
        assert_eq!(
            best,
            Some(BestCheckpoint {
                step: 4,
                metric: 0.5
            })
        );
        assert_eq!(by_loss.consider(best, 8, &evals).unwrap(), best);
        let by_accuracy = rule(&[
            "--eval-steps",
            "2",
            "--save-steps",
            "4",
            "--metric-for-best-model",
            "accuracy",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(by_accuracy.metric, "eval_accuracy");
        assert!(by_accuracy.greater_is_better);
        let best = by_accuracy.consider(None, 4, &evals[..1]).unwrap();
        assert_eq!(
            by_accuracy.consider(best, 8, &evals).unwrap(),
            Some(BestCheckpoint {
                step: 8,
                metric: 0.8
            })
        );
        // No evaluation at the checkpoint's step: nothing to compare.
        assert_eq!(by_loss.consider(None, 6, &evals).unwrap(), None);
        // NaN never wins.
        assert_eq!(
            by_loss
                .consider(None, 4, &[eval(4, f64::NAN, 0.0)])
                .unwrap(),
            None
        );
        let unknown = rule(&[
            "--eval-steps",
            "2",
            "--save-steps",
            "2",
            "--metric-for-best-model",
            "f1",
        ])
        .unwrap()
        .unwrap();
        let err = unknown.consider(None, 4, &evals[..1]).unwrap_err();
        assert!(err.to_string().contains("eval_f1"), "{err}");
        assert!(err.to_string().contains("eval_accuracy"), "{err}");
    }

    #[test]
    fn checkpoints_must_meet_evaluations() {
        for bad in [
            &["--eval-steps", "2"][..],
            &["--eval-steps", "4", "--save-steps", "6"],
            &["--eval-strategy", "epoch", "--save-steps", "4"],
        ] {
            assert!(
                matches!(
                    rule(bad),
                    Err(Error::Settings(SettingsError::ConflictingSettings { .. }))
                ),
                "{bad:?}"
            );
        }
        assert!(
            rule(&["--eval-strategy", "epoch", "--save-strategy", "epoch"])
                .unwrap()
                .is_some()
        );
        assert!(matches!(
            Interval::of_save(&args(&["--save-strategy", "steps"]).save),
            Err(Error::Settings(SettingsError::InvalidSetting {
                name: "save_steps",
                ..
            }))
        ));
    }

    #[test]
    fn intervals_follow_hf_defaults() {
        let a = args(&[]);
        assert_eq!(
            Interval::of_eval(&a.eval, a.logging.logging_steps),
            Interval::Never
        );
        assert_eq!(Interval::of_save(&a.save).unwrap(), Interval::Never);
        let a = args(&["--eval-strategy", "steps", "--logging-steps", "5"]);
        assert_eq!(
            Interval::of_eval(&a.eval, a.logging.logging_steps),
            Interval::Steps(5)
        );
        let a = args(&["--eval-steps", "3", "--save-steps", "6"]);
        assert_eq!(
            Interval::of_eval(&a.eval, a.logging.logging_steps),
            Interval::Steps(3)
        );
        assert_eq!(Interval::of_save(&a.save).unwrap(), Interval::Steps(6));
        let a = args(&["--eval-steps", "3", "--eval-strategy", "no"]);
        assert_eq!(
            Interval::of_eval(&a.eval, a.logging.logging_steps),
            Interval::Never
        );
        assert!(Interval::Epoch.due(7, true) && !Interval::Epoch.due(8, false));
        assert!(Interval::Steps(3).due(6, false) && !Interval::Steps(3).due(7, true));
    }
}
