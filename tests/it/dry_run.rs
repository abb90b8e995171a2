//! `--dry-run` plans exactly what the real run then does: for every kind of
//! schedule, `drop_last` both ways and gradient accumulation, on 1 and 3 ranks, the
//! dry run's steps (indices, sizes, coverage, epoch, learning rate) equal the
//! steps the run logs.

use crate::common;

use adabatch::prelude::*;
use adabatch::{GradAccum, Growth, LrScaling, LrSchedulerType, ScheduleSpec, StepLog};
use candle_nn::AdamW;
use common::{adamw_factory, dataset, read_log, temp_log, Example};

fn shrink_by_step(step: usize, current: usize) -> usize {
    if step % 3 == 0 {
        current + step % 4
    } else {
        current
    }
}

macro_rules! policy_trainer {
    ($name:ident, $($field:ident : $value:expr),* $(,)?) => {
        hand_trainer!(
            $name,
            AdamW,
            adabatch::TrainerPolicy {
                $($field: $value,)*
                ..adabatch::TrainerPolicy::DEFAULT
            }
        );
    };
}

policy_trainer!(Constant, schedule: ScheduleSpec::Constant(None));
policy_trainer!(AddOne, schedule: ScheduleSpec::Interval { every: 3, growth: Growth::Add(1) });
policy_trainer!(
    SubOne,
    schedule: ScheduleSpec::Interval { every: 5, growth: Growth::Add(-1) },
);
policy_trainer!(
    Double,
    schedule: ScheduleSpec::Interval { every: 4, growth: Growth::Mul(2) },
    max_batch: Some(6),
);
policy_trainer!(
    Ramp,
    schedule: ScheduleSpec::Linear { from: 1, to: 5, over: 6 },
    lr_scaling: LrScaling::Sqrt,
);
policy_trainer!(Stepped, schedule: ScheduleSpec::Steps(&[(0, 2), (3, 4), (7, 1)]));
policy_trainer!(Custom, schedule: ScheduleSpec::Custom(shrink_by_step), max_batch: Some(7));
policy_trainer!(
    DropLast,
    schedule: ScheduleSpec::Interval { every: 3, growth: Growth::Add(1) },
    drop_last: true,
);
policy_trainer!(
    Accum,
    schedule: ScheduleSpec::Interval { every: 3, growth: Growth::Add(1) },
    grad_accum: GradAccum::Fixed(2),
    lr_scaling: LrScaling::Linear,
);
policy_trainer!(
    AccumTarget,
    schedule: ScheduleSpec::Interval { every: 2, growth: Growth::Add(1) },
    grad_accum: GradAccum::Target { global: 12 },
);
policy_trainer!(
    Megatron,
    schedule: ScheduleSpec::Ramp(adabatch::Ramp { start: 2, increment: 3, samples: 12, global: 11 }),
);
policy_trainer!(
    MegatronAccum,
    schedule: ScheduleSpec::Ramp(adabatch::Ramp { start: 2, increment: 3, samples: 12, global: 11 }),
    grad_accum: GradAccum::Fixed(2),
    drop_last: true,
);
policy_trainer!(
    Memory,
    schedule: ScheduleSpec::Memory { threshold: 0.9, max_range: 3.0 },
);

fn args(world: usize, per_device: usize, epochs: usize, log: &std::path::Path) -> TrainingArgs {
    {
        let mut args = TrainingArgs::default();
        args.launch.nproc_per_node = world;
        args.batch.per_device_train_batch_size = per_device;
        args.length.num_train_epochs = epochs;
        args.lr.learning_rate = 0.05;
        args.lr.lr_scheduler_type = LrSchedulerType::Cosine;
        args.lr.warmup_ratio = 0.2;
        args.data.seed = Some(11);
        args.logging.quiet = true;
        args.logging.log_jsonl = Some(log.to_path_buf());
        args
    }
}

/// The fields a dry run knows, equal step for step; the loss of a planned step
/// is unknown.
fn assert_same_steps(planned: &[StepLog], trained: &[StepLog], what: &str) {
    assert_eq!(planned.len(), trained.len(), "{what}: number of steps");
    assert!(!planned.is_empty(), "{what}: no step");
    for (p, t) in planned.iter().zip(trained) {
        let at = format!("{what}, step {}", t.step);
        assert_eq!(p.step, t.step, "{at}");
        assert_eq!(p.indices, t.indices, "{at}: indices");
        assert_eq!(p.local_batch_sizes, t.local_batch_sizes, "{at}: sizes");
        assert_eq!(p.global_batch, t.global_batch, "{at}: global batch");
        assert_eq!(p.micro_batches, t.micro_batches, "{at}: micro-batches");
        assert_eq!(p.train_coverage, t.train_coverage, "{at}: coverage");
        assert_eq!(p.epoch, t.epoch, "{at}: epoch");
        assert_eq!(p.learning_rate, t.learning_rate, "{at}: learning rate");
        assert_eq!(p.predicted_memory, t.predicted_memory, "{at}: prediction");
        assert!(p.loss.is_nan(), "{at}: a planned step has no loss");
        assert!(t.loss.is_finite(), "{at}: a trained step has a loss");
    }
}

/// Plans through `launch` with `--dry-run`, then trains, and compares the logs;
/// also checks `adabatch::dry_run` and the summaries.
fn check<T, D>(dataset: &D, wrap: fn(common::Regression, AdamW) -> T, base: TrainingArgs)
where
    T: AdaptiveTrainer<Model = common::Regression> + Send,
    D: Dataset<Item = Example> + ?Sized,
{
    let what = format!(
        "{} on {} rank(s)",
        std::any::type_name::<T>(),
        base.launch.nproc_per_node
    );
    let planned_log = temp_log("planned");
    let dry_args = {
        let mut args = base.clone();
        args.launch.dry_run = true;
        args.logging.log_jsonl = Some(planned_log.clone());
        args
    };
    let dry = adabatch::Run::new(dataset, &common::collate, &dry_args)
        .launch(adamw_factory(wrap))
        .unwrap()
        .summary;
    assert!(dry.is_dry_run(), "{what}: {dry}");
    let planned = read_log(&planned_log);
    let real = adabatch::Run::new(dataset, &common::collate, &base)
        .launch(adamw_factory(wrap))
        .unwrap()
        .summary;
    let trained = read_log(base.logging.log_jsonl.as_ref().unwrap());
    assert_same_steps(&planned, &trained, &what);
    assert_eq!(dry.global_step, real.global_step, "{what}");
    assert_eq!(dry.examples_seen, real.examples_seen, "{what}");
    assert_eq!(dry.epoch, real.epoch, "{what}");
    assert_eq!(
        dry.final_per_device_batch_size, real.final_per_device_batch_size,
        "{what}"
    );
    // The plan as a value: every step, the same.
    let plan = adabatch::dry_run::<T, D>(dataset, &base).unwrap();
    assert_eq!(plan.steps.len(), planned.len(), "{what}");
    for (a, b) in plan.steps.iter().zip(&planned) {
        assert_eq!((a.step, &a.indices), (b.step, &b.indices), "{what}");
    }
    assert_eq!(plan.examples(), real.examples_seen, "{what}");
}

macro_rules! every_schedule {
    ($($test:ident: $trainer:ident, per_device = $b:expr, epochs = $e:expr;)*) => {
        $(
            #[test]
            fn $test() {
                let data = dataset(23, 5);
                for world in [1, 3] {
                    let log = temp_log(stringify!($test));
                    check(
                        &data,
                        |model, opt| $trainer { model, opt },
                        args(world, $b, $e, &log),
                    );
                }
            }
        )*
    };
}

every_schedule! {
    constant: Constant, per_device = 3, epochs = 2;
    interval_add: AddOne, per_device = 1, epochs = 3;
    interval_sub: SubOne, per_device = 4, epochs = 2;
    interval_mul: Double, per_device = 1, epochs = 3;
    linear: Ramp, per_device = 1, epochs = 2;
    steps: Stepped, per_device = 1, epochs = 2;
    custom_fn: Custom, per_device = 1, epochs = 3;
    drop_last_true: DropLast, per_device = 2, epochs = 3;
    grad_accum_fixed: Accum, per_device = 1, epochs = 3;
    grad_accum_target: AccumTarget, per_device = 1, epochs = 2;
    ramp_global: Megatron, per_device = 1, epochs = 2;
    ramp_global_accum_drop_last: MegatronAccum, per_device = 1, epochs = 3;
}

#[test]
fn drop_last_overridden_both_ways_and_max_steps() {
    let data = dataset(23, 5);
    for world in [1, 3] {
        for drop_last in [true, false] {
            let log = temp_log("drop_last");
            let base = {
                let mut a = args(world, 2, 3, &log);
                a.data.dataloader_drop_last = Some(drop_last);
                a
            };
            check(&data, |model, opt| AddOne { model, opt }, base);
        }
        let log = temp_log("max_steps");
        let base = {
            let mut a = args(world, 2, 3, &log);
            a.length.max_steps = Some(7);
            a.lr.lr_scheduler_type = LrSchedulerType::Linear;
            a
        };
        check(&data, |model, opt| AddOne { model, opt }, base);
    }
}

/// Memory-aware batches are planned with the model before any measurement: the
/// first epoch (planned before the real run has measured anything) is exact.
#[test]
fn memory_aware_first_epoch_with_the_prior_model() {
    let data = dataset(40, 9);
    let lengths = (0..data.len()).map(|i| 4 + (i * 7) % 29).collect();
    let data = WithLengths::new(data, lengths).unwrap();
    for world in [1, 3] {
        let log = temp_log("memory");
        check(
            &data,
            |model, opt| Memory { model, opt },
            args(world, 2, 1, &log),
        );
        let plan = adabatch::dry_run::<Memory, _>(&data, &args(world, 2, 1, &log)).unwrap();
        let said = plan.to_string();
        assert!(said.contains("prior memory model"), "{said}");
        assert!(plan.steps.iter().all(|s| s.predicted_memory.is_some()));
    }
}

#[test]
fn train_with_dry_run_trains_nothing_and_says_so() {
    let data = dataset(23, 5);
    let log = temp_log("train");
    let args = {
        let mut a = args(1, 1, 2, &log);
        a.launch.dry_run = true;
        a
    };
    let ctx_model = common::Regression::new(Parameters::new(3), &candle_core::Device::Cpu).unwrap();
    let before = ctx_model.linear.weight().to_vec2::<f32>().unwrap();
    let opt = common::adamw(&ctx_model, 0.05).unwrap();
    let mut trainer = AddOne {
        model: ctx_model,
        opt,
    };
    let summary = adabatch::Run::new(&data, &common::collate, &args)
        .train(&mut trainer)
        .unwrap();
    assert!(summary.is_dry_run());
    assert!(summary.to_string().contains("'dry_run': True"), "{summary}");
    let after = trainer.model.linear.weight().to_vec2::<f32>().unwrap();
    assert_eq!(before, after, "a dry run leaves the weights alone");
    let plan = adabatch::dry_run::<AddOne, _>(&data, &args).unwrap();
    let text = plan.to_string();
    for needed in [
        "dry run: ",
        "examples per epoch: 23 x 2",
        "global batch: ",
        "learning rate: ",
        "step 4: 1 -> 2",
    ] {
        assert!(text.contains(needed), "missing {needed:?} in:\n{text}");
    }
    // The JSONL lines have the step fields and a null loss.
    let first = std::fs::read_to_string(&log).unwrap();
    let line: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    for key in [
        "step",
        "epoch",
        "train_coverage",
        "local_batch_sizes",
        "global_batch",
        "indices",
        "learning_rate",
    ] {
        assert!(line.get(key).is_some(), "{key} missing in {line}");
    }
    assert!(line["loss"].is_null(), "{line}");
}

policy_trainer!(
    NoiseDefault,
    schedule: ScheduleSpec::NoiseScale(adabatch::NoiseScalePolicy::doubling(1.0, 2, 8)),
);
policy_trainer!(
    NoiseTimed,
    schedule: ScheduleSpec::NoiseScale(adabatch::NoiseScalePolicy {
        every: adabatch::MeasureEvery::Auto,
        ..adabatch::NoiseScalePolicy::doubling(1.0, 2, 8)
    }),
);
policy_trainer!(
    GoodputTimed,
    schedule: ScheduleSpec::Goodput(adabatch::GoodputSpec {
        min: 2,
        max: 8,
        max_local: 0,
        max_micro_batches: 8,
        hysteresis: 0.05,
        step_time: None,
    }),
);

/// The plan names every decision that reads the clock: none under the default
/// noise-scale cadence; the timed cadence (`every = auto`) and goodput by name.
/// A trained run's summary carries the same list.
#[test]
fn the_plan_and_the_summary_name_the_decisions_that_read_the_clock() {
    let data = dataset(40, 5);
    let log = temp_log("timed");
    let args = args(1, 2, 1, &log);
    let default = adabatch::dry_run::<NoiseDefault, _>(&data, &args).unwrap();
    assert!(
        default.timed_decisions.is_empty(),
        "{:?}",
        default.timed_decisions
    );
    assert!(default
        .to_string()
        .contains("reproducible: no decision reads the clock"));
    // The optimizer the flags name is in the plan (HF's defaults here).
    assert!(default.to_string().contains(
        "optimizer (as the flags name it): adamw_torch (beta1 0.9, beta2 0.999, epsilon 1e-8, weight decay 0)"
    ));
    let timed = adabatch::dry_run::<NoiseTimed, _>(&data, &args).unwrap();
    assert_eq!(timed.timed_decisions.len(), 1);
    assert!(
        timed.to_string().contains(
            "reads the clock (not reproducible): the noise scale's cadence (`every = auto`)"
        ),
        "{timed}"
    );
    let goodput = adabatch::dry_run::<GoodputTimed, _>(&data, &args).unwrap();
    assert!(
        goodput.timed_decisions[0].starts_with("goodput"),
        "{:?}",
        goodput.timed_decisions
    );
    assert_eq!(goodput.summary().timed_decisions, goodput.timed_decisions);
    let summary = adabatch::Run::new(&data, &common::collate, &args)
        .launch(adamw_factory(|model, opt| NoiseTimed { model, opt }))
        .unwrap()
        .summary;
    assert_eq!(summary.timed_decisions, timed.timed_decisions);
    assert!(
        summary
            .to_string()
            .contains("not reproducible: decisions read the clock"),
        "{summary}"
    );
    let _ = std::fs::remove_file(&log);
}
