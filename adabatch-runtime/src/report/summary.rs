//! What a finished run reports.

use crate::report::record::EvalLog;

/// What a finished run reports (rank 0's view; every rank computes the same).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TrainSummary {
    /// Optimisation steps taken.
    pub global_step: usize,
    /// Examples seen / N.
    pub epoch: f64,
    /// Examples seen in total.
    pub examples_seen: usize,
    /// Mean of this run's step losses (NaN when it trained no step).
    pub train_loss: f64,
    /// Loss of every step, in order.
    pub step_losses: Vec<f64>,
    /// Out-of-memory events handled by the OOM policy.
    pub oom_events: usize,
    /// Per-device batch size the schedule had reached at the end.
    pub final_per_device_batch_size: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Wall time of the loop, seconds.
    pub train_runtime: f64,
    /// Examples per second trained by this run (a resumed run counts only its own).
    pub train_samples_per_second: f64,
    /// The checkpoint's step this run resumed from, if it did.
    pub resumed_from_step: Option<usize>,
    /// Every evaluation of this run, in order (empty without an eval dataset).
    pub evaluations: Vec<EvalLog>,
    /// Steps that trained on batches collated ahead (`--dataloader-num-workers`).
    pub prefetched_steps: usize,
    /// Steps collated ahead and thrown away because the run changed course (an
    /// adaptive batch size, a mixer, an OOM).
    pub prefetch_discarded: usize,
    /// `--fp16`: steps whose gradients overflowed and were skipped (in the whole
    /// run, a resumed one included).
    pub skipped_steps: usize,
    /// Steps whose gradient noise scale was not positive once warm, so that the
    /// rate (`lr_scaling = adamscale`) and goodput ran on the last positive
    /// estimate, held (the whole run, a resumed one included; each such step's
    /// log says `noise_scale_held`).
    pub noise_scale_held_steps: usize,
    /// `--load-best-model-at-end`: the checkpoint whose weights the model holds
    /// at the end, and its metric (HF `best_model_checkpoint`, `best_metric`).
    pub best_model_checkpoint: Option<std::path::PathBuf>,
    /// The best checkpoint's value of `--metric-for-best-model`.
    pub best_metric: Option<f64>,
    /// The run's decisions that read the wall clock (goodput, `every = auto`):
    /// empty when the same seed and settings give the same run.
    pub timed_decisions: Vec<String>,
    /// What the held-out losses a mixer asked for cost (the whole run); `None`
    /// when it asked for none.
    pub held_out: Option<crate::report::record::HeldOutCost>,
    /// What measuring the sources' gradients for a mixer cost (the whole run);
    /// `None` when it asked for none.
    pub source_gradients: Option<crate::report::record::SourceGradientCost>,
    /// The steps a mixer added after the planned end ([`crate::Mixer::close`]);
    /// `None` when it added none and wanted none.
    pub closing: Option<ClosingSummary>,
}

/// What a mixer's closing cost ([`crate::Mixer::close`]): the steps it added after
/// the planned end and their tokens, and whether it ended short of what it wanted.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ClosingSummary {
    /// Steps trained after the planned end.
    pub steps: usize,
    /// Their tokens (0 where the run does not count tokens).
    pub tokens: u64,
    /// The mixer's cap ended the run before its condition held (logged as a warning).
    pub capped: bool,
}

impl TrainSummary {
    /// The last evaluation (at the end of training), if the run had an eval dataset.
    pub fn final_eval(&self) -> Option<&EvalLog> {
        self.evaluations.last()
    }

    /// Whether this run trained no step (e.g. resumed from a finished run).
    pub fn trained_nothing(&self) -> bool {
        self.step_losses.is_empty()
    }

    /// Whether this is the summary of a dry run (`--dry-run`): steps planned, none
    /// trained, no checkpoint resumed.
    pub fn is_dry_run(&self) -> bool {
        self.trained_nothing() && self.global_step > 0 && self.resumed_from_step.is_none()
    }
}

impl TrainSummary {
    /// What a mixer's extra readings cost: held-out losses, source gradients.
    fn write_mixer_costs(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(cost) = self.held_out {
            write!(
                f,
                "\nheld-out losses for the mixer: {} evaluations, {} tokens, {:.1} s",
                cost.evaluations, cost.tokens, cost.seconds
            )?;
        }
        if let Some(cost) = self.source_gradients {
            write!(
                f,
                "\nsource gradients for the mixer: {} measuring steps, {:.1} s",
                cost.steps, cost.seconds
            )?;
        }
        Ok(())
    }
}

impl std::fmt::Display for TrainSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_dry_run() {
            return write!(
                f,
                "{{'dry_run': True, 'global_step': {}, 'examples_seen': {}, 'epoch': {:.2}, 'final_per_device_batch_size': {}, 'world_size': {}}}",
                self.global_step,
                self.examples_seen,
                self.epoch,
                self.final_per_device_batch_size,
                self.world_size
            );
        }
        if self.trained_nothing() {
            return match self.resumed_from_step {
                Some(step) => write!(
                    f,
                    "nothing left to train: the checkpoint of step {step} had already finished the run ({} examples, epoch {:.2})",
                    self.examples_seen, self.epoch
                ),
                None => write!(f, "the run trained no step"),
            };
        }
        write!(
            f,
            "{{'train_runtime': {:.3}, 'train_samples_per_second': {:.1}, 'train_loss': {:.4}, 'epoch': {:.2}, 'global_step': {}, 'examples_seen': {}, 'final_per_device_batch_size': {}, 'world_size': {}, 'oom_events': {}}}",
            self.train_runtime,
            self.train_samples_per_second,
            self.train_loss,
            self.epoch,
            self.global_step,
            self.examples_seen,
            self.final_per_device_batch_size,
            self.world_size,
            self.oom_events
        )?;
        if let Some(eval) = self.final_eval() {
            let dict = eval.hf_dict();
            write!(f, " {dict}")?;
        }
        self.write_mixer_costs(f)?;
        if let Some(closing) = self.closing {
            write!(
                f,
                "\nthe mixer's closing: {} step(s), {} tokens after the planned end{}",
                closing.steps,
                closing.tokens,
                if closing.capped {
                    "; its cap ended the run before its condition held (see the warning)"
                } else {
                    ""
                }
            )?;
        }
        if self.noise_scale_held_steps > 0 {
            write!(
                f,
                "\nthe gradient noise scale was not positive at {} step(s): the rate and the batch held its last positive estimate there (`noise_scale_held` in those steps' logs)",
                self.noise_scale_held_steps
            )?;
        }
        if !self.timed_decisions.is_empty() {
            write!(
                f,
                "\nnot reproducible: decisions read the clock ({})",
                self.timed_decisions.join("; ")
            )?;
        }
        Ok(())
    }
}

/// What `launch` hands back: rank 0's trainer, its model and optimizer as trained
/// (every rank holds the same weights), and the run's summary.
pub struct Trained<T> {
    /// Rank 0's trainer after the last step.
    pub trainer: T,
    /// What the run reports.
    pub summary: TrainSummary,
}

impl<T> std::fmt::Debug for Trained<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trained")
            .field("trainer", &std::any::type_name::<T>())
            .field("summary", &self.summary)
            .finish()
    }
}
