//! Callbacks in the spirit of Hugging Face's `TrainerCallback`: code of the user's
//! that runs at the end of every step, on every logged step's record, after every
//! evaluation and at the end of every epoch, sees where training stands, and may ask the engine to stop, save a
//! checkpoint or evaluate.
//!
//! Every rank runs its own callback (the trainer's `#[callback]` field, built by the
//! rank's factory) on the same numbers — the step's loss and the evaluations are
//! all-reduced — so deterministic callbacks decide alike. The engine still combines
//! the ranks' requests (any rank asking is enough) in one scalar all-reduce per
//! step when training on several ranks, so a callback that decides differently on
//! some rank cannot leave the others waiting.

use crate::report::record::{EvalLog, StepLog};

/// Where training stands (HF `TrainerState`).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainerState {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Optimisation steps taken.
    pub global_step: usize,
    /// Examples seen / N.
    pub epoch: f64,
    /// Examples seen in total.
    pub examples_seen: usize,
    /// The last step's global batch (0 before the first step).
    pub global_batch: usize,
    /// The last step's loss, the global mean over its examples (NaN before the
    /// first step).
    pub loss: f64,
    /// The last step's learning rate.
    pub learning_rate: f64,
    /// The evaluations so far, in order.
    pub evaluations: Vec<EvalLog>,
}

impl TrainerState {
    /// Whether this is rank 0 (the rank that writes logs): where a callback with a
    /// side effect, such as printing, should act.
    pub fn is_world_process_zero(&self) -> bool {
        self.rank == 0
    }
}

/// What callbacks ask of the engine after the current event (HF `TrainerControl`).
/// The engine resets it after acting on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrainerControl {
    /// Stop after this step (the end-of-training evaluation and checkpoint still
    /// happen).
    pub should_training_stop: bool,
    /// Save a checkpoint now (to `--output-dir`).
    pub should_save: bool,
    /// Evaluate now (with an eval dataset).
    pub should_evaluate: bool,
}

impl TrainerControl {
    pub(crate) fn as_flags(self) -> [f64; 3] {
        [
            f64::from(u8::from(self.should_training_stop)),
            f64::from(u8::from(self.should_save)),
            f64::from(u8::from(self.should_evaluate)),
        ]
    }

    pub(crate) fn from_flags(flags: [f64; 3]) -> Self {
        Self {
            should_training_stop: flags[0] > 0.0,
            should_save: flags[1] > 0.0,
            should_evaluate: flags[2] > 0.0,
        }
    }
}

/// Code that runs during training; every method has a default that does nothing.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an adabatch callback",
    label = "the `#[callback]` field must implement `adabatch::Callback`",
    note = "implement `adabatch::Callback for {Self}` (`on_step_end`, `on_log`, `on_evaluate`, `on_epoch_end`, `on_train_end`, all optional); several callbacks go in a `Vec<Box<dyn Callback>>`"
)]
pub trait Callback: Send {
    /// After every optimisation step, once it is logged; before the step's
    /// scheduled evaluation and checkpoint (which `control` may also ask for).
    fn on_step_end(&mut self, state: &TrainerState, control: &mut TrainerControl) {
        let _ = (state, control);
    }
    /// After a logged step (every `--logging-steps` and the last), with the record
    /// the logs get (HF `on_log`), after [`Callback::on_step_end`]. The loss (the
    /// mean since the last logged step), learning rate, gradient norm, batches and
    /// estimates are the same on every rank; `examples_per_s` and
    /// `measured_memory` are the rank's own. A rank other than 0 writes no log but
    /// sees the same record.
    fn on_log(&mut self, state: &TrainerState, log: &StepLog, control: &mut TrainerControl) {
        let _ = (state, log, control);
    }
    /// After every evaluation; `metrics` is the evaluation just made.
    fn on_evaluate(
        &mut self,
        state: &TrainerState,
        metrics: &EvalLog,
        control: &mut TrainerControl,
    ) {
        let _ = (state, metrics, control);
    }
    /// When a pass over the training set ends.
    fn on_epoch_end(&mut self, state: &TrainerState, control: &mut TrainerControl) {
        let _ = (state, control);
    }
    /// Once, after the last step.
    fn on_train_end(&mut self, state: &TrainerState) {
        let _ = state;
    }
    /// What the callback must carry across a resume (HF's `ExportableState`),
    /// saved in every checkpoint; `None` (the default): nothing.
    fn state(&self) -> Option<serde_json::Value> {
        None
    }
    /// Continues from a checkpoint's [`Callback::state`]; a state it cannot read
    /// is an error (the run refuses the checkpoint, naming the entry).
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        let _ = state;
        Ok(())
    }
}

impl Callback for Vec<Box<dyn Callback>> {
    /// Each callback's state, in order (`null` for one without).
    fn state(&self) -> Option<serde_json::Value> {
        let states: Vec<serde_json::Value> =
            self.iter().map(|c| c.state().unwrap_or_default()).collect();
        states.iter().any(|s| !s.is_null()).then(|| states.into())
    }
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        let states = state
            .as_array()
            .ok_or_else(|| format!("expected one state per callback, found {state}"))?;
        for (c, s) in self.iter_mut().zip(states).filter(|(_, s)| !s.is_null()) {
            c.restore(s)?;
        }
        Ok(())
    }
    fn on_step_end(&mut self, state: &TrainerState, control: &mut TrainerControl) {
        for c in self {
            c.on_step_end(state, control);
        }
    }
    fn on_log(&mut self, state: &TrainerState, log: &StepLog, control: &mut TrainerControl) {
        for c in self {
            c.on_log(state, log, control);
        }
    }
    fn on_evaluate(
        &mut self,
        state: &TrainerState,
        metrics: &EvalLog,
        control: &mut TrainerControl,
    ) {
        for c in self {
            c.on_evaluate(state, metrics, control);
        }
    }
    fn on_epoch_end(&mut self, state: &TrainerState, control: &mut TrainerControl) {
        for c in self {
            c.on_epoch_end(state, control);
        }
    }
    fn on_train_end(&mut self, state: &TrainerState) {
        for c in self {
            c.on_train_end(state);
        }
    }
}

/// Stops training when an eval metric has not improved for `patience`
/// evaluations (HF `EarlyStoppingCallback`). Needs an eval dataset.
#[derive(Debug, Clone)]
pub struct EarlyStopping {
    metric: String,
    greater_is_better: bool,
    patience: usize,
    threshold: f64,
    best: Option<f64>,
    without_improvement: usize,
}

impl EarlyStopping {
    /// Watches `eval_loss` (lower is better) with the given patience.
    pub fn on_eval_loss(patience: usize) -> Self {
        Self::new("eval_loss", false, patience)
    }

    /// Watches `metric` (e.g. `eval_accuracy`, `greater_is_better = true`).
    pub fn new(metric: &str, greater_is_better: bool, patience: usize) -> Self {
        Self {
            metric: metric.to_string(),
            greater_is_better,
            patience: patience.max(1),
            threshold: 0.0,
            best: None,
            without_improvement: 0,
        }
    }

    /// An improvement must beat the best value by more than this.
    pub fn with_threshold(mut self, threshold: f64) -> Self {
        self.threshold = threshold;
        self
    }

    /// The best value seen so far.
    pub fn best(&self) -> Option<f64> {
        self.best
    }
}

impl Callback for EarlyStopping {
    fn on_evaluate(&mut self, _: &TrainerState, metrics: &EvalLog, control: &mut TrainerControl) {
        let Some(value) = metrics.get(&self.metric).filter(|v| !v.is_nan()) else {
            return;
        };
        let improved = match self.best {
            None => true,
            Some(best) if self.greater_is_better => value > best + self.threshold,
            Some(best) => value < best - self.threshold,
        };
        if improved {
            self.best = Some(value);
            self.without_improvement = 0;
        } else {
            self.without_improvement += 1;
            if self.without_improvement >= self.patience {
                control.should_training_stop = true;
            }
        }
    }

    /// The best value and the evaluations since it: a resumed run stops where the
    /// uninterrupted one would.
    fn state(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({
            "metric": self.metric,
            "best": self.best,
            "without_improvement": self.without_improvement,
        }))
    }

    /// Restores the state saved for the same metric (another metric's is left).
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        if state.get("metric").and_then(|m| m.as_str()) != Some(self.metric.as_str()) {
            return Ok(());
        }
        // `best` is null before the first evaluation (and for a NaN metric).
        self.best = state.get("best").and_then(serde_json::Value::as_f64);
        let patience_used = state.get("without_improvement");
        self.without_improvement = patience_used
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| format!("`without_improvement` is {patience_used:?}, not a count"))?
            as usize;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start_state() -> TrainerState {
        TrainerState {
            rank: 0,
            world_size: 1,
            global_step: 0,
            epoch: 0.0,
            examples_seen: 0,
            global_batch: 0,
            loss: f64::NAN,
            learning_rate: 0.0,
            evaluations: Vec::new(),
        }
    }

    fn eval(step: usize, loss: f64) -> EvalLog {
        EvalLog {
            event: "eval".into(),
            step,
            epoch: 0.0,
            eval_loss: loss,
            eval_examples: 1,
            train_seconds: None,
            metrics: Default::default(),
        }
    }

    #[test]
    fn early_stopping_waits_patience_evaluations_without_improvement() {
        let state = start_state();
        let mut stop = EarlyStopping::on_eval_loss(2).with_threshold(0.01);
        let mut asked = Vec::new();
        for (step, loss) in [(1, 1.0), (2, 0.8), (3, 0.795), (4, 0.9), (5, 0.5)] {
            let mut control = TrainerControl::default();
            stop.on_evaluate(&state, &eval(step, loss), &mut control);
            asked.push(control.should_training_stop);
        }
        // 0.795 is within the threshold of 0.8: no improvement, then 0.9: stop.
        assert_eq!(asked, [false, false, false, true, false]);
        assert_eq!(stop.best(), Some(0.5));
    }

    #[test]
    fn early_stoppings_state_round_trips_alone_and_in_a_list() {
        let state = start_state();
        let mut stop = EarlyStopping::on_eval_loss(3);
        for (step, loss) in [(1, 1.0), (2, 1.5)] {
            stop.on_evaluate(&state, &eval(step, loss), &mut TrainerControl::default());
        }
        let mut fresh = EarlyStopping::on_eval_loss(3);
        fresh.restore(&stop.state().unwrap()).unwrap();
        assert_eq!((fresh.best(), fresh.without_improvement), (Some(1.0), 1));
        // Another metric's state is not taken.
        let mut other = EarlyStopping::new("eval_accuracy", true, 3);
        other.restore(&stop.state().unwrap()).unwrap();
        assert_eq!(other.best(), None);
        // A list keeps each member's state in order.
        let list: Vec<Box<dyn Callback>> = vec![Box::new(stop.clone()), Box::new(fresh)];
        let mut restored: Vec<Box<dyn Callback>> = vec![
            Box::new(EarlyStopping::on_eval_loss(3)),
            Box::new(EarlyStopping::on_eval_loss(3)),
        ];
        restored.restore(&list.state().unwrap()).unwrap();
        assert_eq!(restored.state(), list.state());
        // A state that does not read is an error, not a silent reset.
        let bad =
            serde_json::json!({"metric": "eval_loss", "best": 1.0, "without_improvement": "two"});
        let err = EarlyStopping::on_eval_loss(3).restore(&bad).unwrap_err();
        assert!(err.contains("without_improvement"), "{err}");
        assert!(restored.restore(&serde_json::json!({"best": 1.0})).is_err());
    }

    #[test]
    fn flags_round_trip() {
        let c = TrainerControl {
            should_training_stop: true,
            should_save: false,
            should_evaluate: true,
        };
        assert_eq!(TrainerControl::from_flags(c.as_flags()), c);
    }
}
