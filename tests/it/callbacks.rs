//! Callbacks (`#[callback]`, `adabatch::Callback`): when each hook runs, what it
//! sees, and what it can ask — stop, save, evaluate — on one and several ranks,
//! and `EarlyStopping` on a real run whose eval loss turns.

use crate::common;

use std::sync::{Arc, Mutex};

use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;
use adabatch::{Callback, EarlyStopping, EvalLog, StepLog, TrainerControl, TrainerState};
use common::*;

/// What a callback saw, per rank: `(rank, event, step, epoch)`.
type Seen = Arc<Mutex<Vec<(usize, &'static str, usize, f64)>>>;

/// Records every hook; asks to stop after `stop_at` (on `stop_on` only, to show
/// the ranks agree), to save at `save_at` and to evaluate at `evaluate_at`.
struct Recorder {
    seen: Seen,
    stop_at: Option<usize>,
    stop_on: usize,
    save_at: Option<usize>,
    evaluate_at: Option<usize>,
}

impl Recorder {
    fn note(&self, state: &TrainerState, event: &'static str) {
        self.seen
            .lock()
            .unwrap()
            .push((state.rank, event, state.global_step, state.epoch));
    }
}

impl Callback for Recorder {
    fn on_step_end(&mut self, state: &TrainerState, control: &mut TrainerControl) {
        self.note(state, "step");
        assert!(state.loss.is_finite() && state.global_batch > 0);
        let step = Some(state.global_step);
        control.should_training_stop |= step == self.stop_at && state.rank == self.stop_on;
        control.should_save |= step == self.save_at;
        control.should_evaluate |= step == self.evaluate_at;
    }
    fn on_evaluate(&mut self, state: &TrainerState, metrics: &EvalLog, _: &mut TrainerControl) {
        assert_eq!(metrics.step, state.global_step);
        self.note(state, "evaluate");
    }
    fn on_epoch_end(&mut self, state: &TrainerState, _: &mut TrainerControl) {
        self.note(state, "epoch");
    }
    fn on_train_end(&mut self, state: &TrainerState) {
        self.note(state, "end");
    }
}

#[adaptive_trainer(schedule = constant)]
struct Watched {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[callback]
    recorder: Recorder,
}

fn adam(model: &Regression, lr: f64) -> adabatch::Result<AdamW> {
    AdamW::new(
        model.params.all_vars(),
        ParamsAdamW {
            lr,
            ..Default::default()
        },
    )
}

fn watched(
    seen: &Seen,
    recorder: fn(Seen) -> Recorder,
) -> impl Fn(&RankContext) -> adabatch::Result<Watched> + Sync + '_ {
    move |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = adam(&model, 0.05)?;
        Ok(Watched::new(model, opt, recorder(seen.clone())))
    }
}

fn events(seen: &Seen, rank: usize, event: &str) -> Vec<usize> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|s| s.0 == rank && s.1 == event)
        .map(|s| s.2)
        .collect()
}

#[test]
fn hooks_run_at_step_ends_epoch_ends_evaluations_and_the_end() {
    let seen: Seen = Arc::default();
    // 20 examples, global batch 6: epochs end after steps 4 and 8 (tails of 2).
    let a = {
        let mut a = args(2, 3, 2);
        a.eval.eval_steps = Some(3);
        a
    };
    let recorder = |seen| Recorder {
        seen,
        stop_at: None,
        stop_on: 0,
        save_at: None,
        evaluate_at: Some(4),
    };
    let summary = Watched::launch_with_eval(
        &dataset(20, 1),
        &dataset(5, 2),
        &collate,
        &a,
        watched(&seen, recorder),
    )
    .unwrap()
    .summary;
    assert_eq!(summary.global_step, 8);
    for rank in 0..2 {
        assert_eq!(events(&seen, rank, "step"), (1..=8).collect::<Vec<_>>());
        assert_eq!(events(&seen, rank, "epoch"), [4, 8]);
        // Every 3 steps, at step 4 because the callback asked, and at the end.
        assert_eq!(events(&seen, rank, "evaluate"), [3, 4, 6, 8]);
        assert_eq!(events(&seen, rank, "end"), [8]);
    }
    let mut epochs: Vec<f64> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.1 == "epoch")
        .map(|s| s.3)
        .collect();
    epochs.sort_by(f64::total_cmp);
    assert_eq!(epochs, [1.0, 1.0, 2.0, 2.0]);
    assert_eq!(summary.evaluations.len(), 4);
}

#[test]
fn one_rank_asking_to_stop_stops_every_rank_and_saves_on_request() {
    let seen: Seen = Arc::default();
    let out = temp_log("callback-out").with_extension("");
    let a = {
        let mut a = args(3, 2, 3);
        a.save.output_dir = out.clone();
        a
    };
    let recorder = |seen| Recorder {
        seen,
        stop_at: Some(5),
        stop_on: 2,
        save_at: Some(2),
        evaluate_at: None,
    };
    let summary = Watched::launch(&dataset(30, 1), &collate, &a, watched(&seen, recorder))
        .unwrap()
        .summary;
    assert_eq!(summary.global_step, 5, "stopped after the step that asked");
    for rank in 0..3 {
        assert_eq!(events(&seen, rank, "step"), [1, 2, 3, 4, 5]);
        assert_eq!(events(&seen, rank, "end"), [5]);
    }
    // Saved when asked, without --save-steps; none at the end (not asked).
    assert!(out.join("checkpoint-2").is_dir());
    assert!(!out.join("checkpoint-5").exists());
    let _ = std::fs::remove_dir_all(&out);
}

#[adaptive_trainer(schedule = constant)]
struct Patient {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[callback]
    stop: EarlyStopping,
}

#[test]
fn early_stopping_stops_when_the_eval_loss_turns() {
    let (train, eval) = turning_data();
    let a = {
        let mut a = args(2, 4, 10);
        a.eval.eval_steps = Some(2);
        a
    };
    let factory = |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = adam(&model, 0.05)?;
        Ok(Patient::new(model, opt, EarlyStopping::on_eval_loss(3)))
    };
    let Trained { trainer, summary } =
        Patient::launch_with_eval(&train, &eval, &collate, &a, factory).unwrap();
    let losses: Vec<f64> = summary.evaluations.iter().map(|e| e.eval_loss).collect();
    // The best is the first evaluation; three without improvement stop the run.
    assert!(losses.windows(2).all(|w| w[1] > w[0]), "{losses:?}");
    assert_eq!(summary.global_step, 8, "{losses:?}");
    assert_eq!(summary.evaluations.len(), 4);
    assert_eq!(trainer.stop.best(), Some(losses[0]));
}

/// `EarlyStopping` keeps its best value and its count across a resume: resumed
/// from the checkpoint of step 6 (two evaluations without improvement already), on
/// 2 ranks or 3, the run stops at step 8 as the uninterrupted one does (a callback
/// without state would start counting again and train on).
#[test]
fn early_stopping_resumes_where_it_was() {
    let (train, eval) = turning_data();
    let out = temp_log("early-resume").with_extension("");
    let a = {
        let mut a = args(2, 4, 10);
        a.eval.eval_steps = Some(2);
        a.save.save_steps = 2;
        a.save.output_dir = out.clone();
        a.save.load_best_model_at_end = true;
        a
    };
    let factory = |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = common::resumable_adam(&model)?;
        Ok(Patient::new(model, opt, EarlyStopping::on_eval_loss(3)))
    };
    let straight = Patient::launch_with_eval(&train, &eval, &collate, &a, factory).unwrap();
    assert_eq!(straight.summary.global_step, 8);
    for world in [2, 3] {
        let resumed_args = {
            let mut args = a.clone();
            args.save.resume_from_checkpoint = Some(out.join("checkpoint-6"));
            args.save.output_dir = out.join(format!("resumed-{world}"));
            args.launch.nproc_per_node = world;
            args
        };
        let resumed =
            Patient::launch_with_eval(&train, &eval, &collate, &resumed_args, factory).unwrap();
        let (summary, expected) = (&resumed.summary, &straight.summary);
        assert_eq!(summary.global_step, 8, "{world} ranks");
        assert_eq!(resumed.trainer.stop.best(), straight.trainer.stop.best());
        // The best checkpoint (step 2, before the resume) is the same one, found
        // beside the checkpoint resumed from; the whole run's evaluations are there.
        assert_eq!(
            summary.best_model_checkpoint,
            expected.best_model_checkpoint
        );
        assert_eq!(summary.best_metric, expected.best_metric);
        let steps = |s: &TrainSummary| s.evaluations.iter().map(|e| e.step).collect::<Vec<_>>();
        assert_eq!(steps(summary), [2, 4, 6, 8], "{world} ranks");
        assert_eq!(
            summary.evaluations[..3],
            expected.evaluations[..3],
            "{world} ranks"
        );
        assert_eq!(
            summary.evaluations[3].eval_loss,
            expected.evaluations[3].eval_loss
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// Every logged record a callback saw, with its rank; asks to stop at `stop_at`.
struct LogWatcher {
    seen: Arc<Mutex<Vec<(usize, StepLog)>>>,
    stop_at: Option<usize>,
}

impl Callback for LogWatcher {
    fn on_log(&mut self, state: &TrainerState, log: &StepLog, control: &mut TrainerControl) {
        assert_eq!(log.step, state.global_step);
        self.seen.lock().unwrap().push((state.rank, log.clone()));
        control.should_training_stop |= Some(log.step) == self.stop_at;
    }
}

#[adaptive_trainer(schedule = constant)]
struct LogWatched {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[callback]
    watcher: LogWatcher,
}

/// Runs 20 examples on 2 ranks of 3 (8 steps over 2 epochs), logging every 3
/// steps; returns the run's JSONL and what each rank's `on_log` saw.
fn watched_logs(stop_at: Option<usize>) -> (TrainSummary, Vec<StepLog>, Vec<(usize, StepLog)>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = temp_log("on-log");
    let a = {
        let mut a = args(2, 3, 2);
        a.logging.logging_steps = 3;
        a.logging.log_jsonl = Some(log.clone());
        a
    };
    let factory = |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = adam(&model, 0.05)?;
        let watcher = LogWatcher {
            seen: seen.clone(),
            stop_at,
        };
        Ok(LogWatched::new(model, opt, watcher))
    };
    let summary = LogWatched::launch(&dataset(20, 1), &collate, &a, factory)
        .unwrap()
        .summary;
    let seen = seen.lock().unwrap().clone();
    (summary, read_log(&log), seen)
}

#[test]
fn on_log_sees_every_logged_record_on_every_rank() {
    let (summary, written, seen) = watched_logs(None);
    assert_eq!(summary.global_step, 8);
    let steps: Vec<usize> = written.iter().map(|l| l.step).collect();
    assert_eq!(steps, [3, 6, 8], "every 3 steps and the last");
    for rank in 0..2 {
        let mine: Vec<&StepLog> = seen.iter().filter(|s| s.0 == rank).map(|s| &s.1).collect();
        assert_eq!(mine.len(), written.len(), "rank {rank}");
        for (got, log) in mine.iter().zip(&written) {
            // The written record, except what each rank measures for itself.
            let mut expected = log.clone();
            expected.examples_per_s = got.examples_per_s;
            expected.measured_memory = got.measured_memory;
            assert_eq!(**got, expected, "rank {rank}, step {}", log.step);
            assert!(got.loss.is_finite() && got.grad_norm.is_finite());
        }
    }
}

#[test]
fn on_log_can_stop_the_run() {
    let (summary, written, seen) = watched_logs(Some(6));
    assert_eq!(
        summary.global_step, 6,
        "stopped after the logged step that asked"
    );
    assert_eq!(written.iter().map(|l| l.step).collect::<Vec<_>>(), [3, 6]);
    assert_eq!(seen.len(), 4, "steps 3 and 6 on both ranks");
}
