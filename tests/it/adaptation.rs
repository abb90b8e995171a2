//! Adapting the batch: the learning-rate rule at every batch change (and across
//! a resume on another number of ranks), and `goodput(..)` with a step-time
//! model given as a function: its choices, a kill and resume equal to the
//! uninterrupted run, and a typed error for step times it cannot use.

use crate::common;

use adabatch::optim::AdamW;
use adabatch::prelude::*;
use adabatch::{
    Error, GoodputSpec, LrScaling, LrSchedulerType, Ramp, ScheduleSpec, StepLog, StepShape,
    TrainerPolicy, TrainingError,
};
use common::*;

const RAMPED: TrainerPolicy = TrainerPolicy {
    schedule: ScheduleSpec::Ramp(Ramp {
        start: 2,
        increment: 3,
        samples: 30,
        global: 11,
    }),
    lr_scaling: LrScaling::Sqrt,
    ..TrainerPolicy::DEFAULT
};
hand_trainer!(Ramped, AdamW, RAMPED);

/// 40 ms a step plus 2 ms an example on the busiest rank, plus 5 ms a micro-batch.
fn step_time(shape: StepShape) -> f64 {
    0.04 + 0.002 * shape.per_rank() as f64 + 0.005 * shape.micro_batches as f64
}

fn broken_step_time(_: StepShape) -> f64 {
    -1.0
}

const GOODPUT: GoodputSpec = GoodputSpec {
    min: 2,
    max: 48,
    max_local: 10,
    max_micro_batches: 4,
    hysteresis: 0.0,
    step_time: Some(step_time),
};
hand_trainer!(
    Goodput,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Goodput(GOODPUT),
        lr_scaling: LrScaling::Sqrt,
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    BrokenGoodput,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Goodput(GoodputSpec {
            step_time: Some(broken_step_time),
            ..GOODPUT
        }),
        ..TrainerPolicy::DEFAULT
    }
);

/// Runs `T` on 97 regression examples; returns the summary and every step's log.
fn run<T>(
    a: &TrainingArgs,
    wrap: fn(Regression, AdamW) -> T,
) -> adabatch::Result<(TrainSummary, Vec<StepLog>)>
where
    T: AdaptiveTrainer<Model = Regression, Optimizer = AdamW> + Send,
{
    let log = temp_log("adapt");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let trained =
        adabatch::Run::new(&dataset(97, 5), &collate, &a).launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = resumable_adam(&model)?;
            Ok(wrap(model, opt))
        })?;
    Ok((trained.summary, read_log(&log)))
}

/// Checkpoints at `cut`, resumes on `resume_world` ranks; returns the resumed
/// steps' logs.
fn cut_and_resume<T>(
    a: &TrainingArgs,
    cut: usize,
    resume_world: usize,
    wrap: fn(Regression, AdamW) -> T,
) -> Vec<StepLog>
where
    T: AdaptiveTrainer<Model = Regression, Optimizer = AdamW> + Send,
{
    let out = temp_log("adapt-dir").with_extension("");
    let first = {
        let mut args = a.clone();
        args.length.max_steps = Some(cut);
        args.save.save_steps = cut;
        args.save.output_dir = out.clone();
        args
    };
    run(&first, wrap).unwrap();
    let second = {
        let mut args = a.clone();
        args.launch.nproc_per_node = resume_world;
        args.save.output_dir = out.clone();
        args.save.resume_from_checkpoint = Some("latest".into());
        args
    };
    let logs = run(&second, wrap).unwrap().1;
    let _ = std::fs::remove_dir_all(&out);
    logs
}

fn lr_args() -> TrainingArgs {
    {
        let mut a = args(2, 1, 2);
        a.lr.lr_scheduler_type = LrSchedulerType::Linear;
        a.lr.lr_reference_batch = Some(5);
        a.lr.learning_rate = 0.01;
        a
    }
}

#[test]
fn the_rate_follows_every_batch_change_from_the_reference_batch() {
    let a = lr_args();
    let (summary, logs) = run(&a, |model, opt| Ramped { model, opt }).unwrap();
    let total = 2.0 * 97.0;
    let mut consumed = 0usize;
    let mut batches = std::collections::BTreeSet::new();
    for log in &logs {
        let shape = 1.0 - consumed as f64 / total;
        let expected = 0.01 * shape * (log.global_batch as f64 / 5.0).sqrt();
        assert!(
            (log.learning_rate - expected).abs() < 1e-15,
            "step {}: {} vs {expected}",
            log.step,
            log.learning_rate
        );
        batches.insert(log.global_batch);
        consumed += log.global_batch;
    }
    assert!(
        batches.len() >= 4,
        "the ramp changes the batch: {batches:?}"
    );
    assert_eq!(logs.len(), summary.global_step);

    // `--lr-scaling linear` overrides the trainer's √.
    let linear = {
        let mut args = a.clone();
        args.lr.lr_scaling = Some(LrScaling::Linear);
        args.length.max_steps = Some(6);
        args
    };
    let logs = run(&linear, |model, opt| Ramped { model, opt }).unwrap().1;
    let mut consumed = 0usize;
    for log in &logs {
        // The horizon of a run cut by --max-steps is what it consumes.
        let horizon: usize = logs.iter().map(|l| l.global_batch).sum();
        let shape = 1.0 - consumed as f64 / horizon as f64;
        let expected = 0.01 * shape * log.global_batch as f64 / 5.0;
        assert!(
            (log.learning_rate - expected).abs() < 1e-15,
            "step {}",
            log.step
        );
        consumed += log.global_batch;
    }
}

#[test]
fn a_resume_on_another_number_of_ranks_keeps_the_rates() {
    let a = lr_args();
    let (_, straight) = run(&a, |model, opt| Ramped { model, opt }).unwrap();
    let resumed = cut_and_resume(&a, 5, 3, |model, opt| Ramped { model, opt });
    assert_eq!(resumed.len(), straight.len() - 5);
    for (r, s) in resumed.iter().zip(&straight[5..]) {
        assert_eq!((r.step, r.global_batch), (s.step, s.global_batch));
        assert_eq!(
            r.learning_rate.to_bits(),
            s.learning_rate.to_bits(),
            "step {}",
            r.step
        );
    }
    // Another reference batch is another rule: refused on resume.
    let out = temp_log("adapt-ref").with_extension("");
    let first = {
        let mut args = a.clone();
        args.length.max_steps = Some(3);
        args.save.save_steps = 3;
        args.save.output_dir = out.clone();
        args
    };
    run(&first, |model, opt| Ramped { model, opt }).unwrap();
    let other = {
        let mut args = a.clone();
        args.lr.lr_reference_batch = Some(8);
        args.save.output_dir = out.clone();
        args.save.resume_from_checkpoint = Some("latest".into());
        args
    };
    let err = run(&other, |model, opt| Ramped { model, opt }).unwrap_err();
    assert!(err.to_string().contains("lr_scaling"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

fn goodput_args() -> TrainingArgs {
    {
        let mut a = args(2, 1, 4);
        a.length.max_steps = Some(40);
        // Every step measures (split in two on these two ranks): at a global batch
        // of 2 one measurement is so noisy that a sparser cadence leaves the noise
        // scale unknown for most of these 40 steps.
        a.step.noise_scale_every = Some(adabatch::MeasureEvery::Steps(1));
        a
    }
}

#[test]
fn goodput_chooses_by_the_given_step_time_and_logs_why() {
    let (_, logs) = run(&goodput_args(), |model, opt| Goodput { model, opt }).unwrap();
    // The noise scale warms up over 20 steps at the smallest batch.
    assert!(
        logs[..19].iter().all(|l| l.global_batch == 2),
        "{:?}",
        logs[..19]
            .iter()
            .map(|l| l.global_batch)
            .collect::<Vec<_>>()
    );
    let later: Vec<&StepLog> = logs[20..].iter().collect();
    assert!(
        later.iter().any(|l| l.global_batch > 2),
        "goodput grows the batch"
    );
    for pair in logs.windows(2) {
        let decision = pair[0].goodput.expect("every step logs its decision");
        // The next step runs the shape decided (unless the epoch's tail cuts it),
        // split in two when it measures the noise scale.
        assert!(pair[1].global_batch <= decision.next_global_batch);
        assert!(pair[1].micro_batches <= decision.next_micro_batches.max(2));
        assert!(
            decision
                .next_global_batch
                .div_ceil(decision.next_micro_batches)
                .div_ceil(2)
                <= 10,
            "max_local"
        );
        // Goodput ranks shapes once φ is known and warmed up (20 steps).
        let phi = pair[0].gradient_noise_scale;
        if let (Some(g), Some(phi), true) = (decision.goodput, phi, pair[0].step >= 20) {
            // The decision is the best shape for this φ under the step-time model,
            // among the batches up to one noise scale.
            let cap = adabatch::adapt::goodput::noise_cap(&GOODPUT, phi);
            for global in GOODPUT.min..=cap {
                let Some(shape) = GOODPUT.shape_for(global, 2) else {
                    continue;
                };
                let other =
                    adabatch::adapt::goodput::goodput(&GOODPUT, phi, shape, step_time(shape));
                assert!(
                    other <= g * (1.0 + 1e-12),
                    "step {}: {global} beats the choice",
                    pair[0].step
                );
            }
        }
    }
}

#[test]
fn a_goodput_run_killed_and_resumed_equals_the_uninterrupted_run() {
    let a = goodput_args();
    let (_, straight) = run(&a, |model, opt| Goodput { model, opt }).unwrap();
    let resumed = cut_and_resume(&a, 27, 2, |model, opt| Goodput { model, opt });
    assert_eq!(resumed.len(), straight.len() - 27);
    for (r, s) in resumed.iter().zip(&straight[27..]) {
        assert_eq!(
            (r.step, &r.indices, r.micro_batches),
            (s.step, &s.indices, s.micro_batches)
        );
        assert_eq!(r.loss.to_bits(), s.loss.to_bits(), "step {}", r.step);
        assert_eq!(r.learning_rate.to_bits(), s.learning_rate.to_bits());
        assert_eq!(r.goodput, s.goodput, "step {}", r.step);
    }
}

#[test]
fn a_step_time_that_is_not_a_positive_number_is_a_typed_error() {
    let err = run(&goodput_args(), |model, opt| BrokenGoodput { model, opt }).unwrap_err();
    assert!(
        matches!(err, Error::Training(TrainingError::GoodputStepTime { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("-1 s"), "{err}");
}
