//! OOM policies under injected faults on 1–4 `Local` ranks, gradient accumulation
//! and learning-rate scaling.

use crate::common;

use std::sync::Mutex;

use adabatch::prelude::*;
use adabatch::train::out_of_memory::FaultInjector;
use adabatch::{Error, GradAccum, Growth, LrScaling, OomPolicy, ScheduleSpec, TrainerPolicy};
use adabatch::{Run, TrainingError};
use candle_nn::AdamW;
use common::*;
use proptest::prelude::*;

hand_trainer!(
    GrowingTrainer,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 2,
            growth: Growth::Add(1)
        },
        ..TrainerPolicy::DEFAULT
    }
);

/// Trains and returns the summary, the log and rank 0's final weights.
fn run_with<T: AdaptiveTrainer<Model = Regression> + Send>(
    data: &[Example],
    a: &TrainingArgs,
    wrap: fn(Regression, AdamW) -> T,
) -> (
    adabatch::Result<TrainSummary>,
    Vec<adabatch::StepLog>,
    Vec<f32>,
) {
    run_injected(data, a, FaultInjector::none(), wrap)
}

/// [`run_with`] with faults injected from code.
fn run_injected<T: AdaptiveTrainer<Model = Regression> + Send>(
    data: &[Example],
    a: &TrainingArgs,
    faults: FaultInjector,
    wrap: fn(Regression, AdamW) -> T,
) -> (
    adabatch::Result<TrainSummary>,
    Vec<adabatch::StepLog>,
    Vec<f32>,
) {
    let log = temp_log("oom");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let rank0 = Mutex::new(None);
    let run = Run::new(data, &collate, &a).with_faults(faults);
    let result = run
        .launch(|ctx: &RankContext| {
            let params = ctx.parameters();
            let model = Regression::new(params.clone(), ctx.device())?;
            if ctx.rank() == 0 {
                *rank0.lock().unwrap() = Some(params.clone());
            }
            let opt = adamw(&model, 0.05)?;
            Ok(wrap(model, opt))
        })
        .map(|trained| trained.summary);
    let weights = rank0
        .into_inner()
        .unwrap()
        .map(|p: adabatch::Parameters| flat(p.all_vars()))
        .unwrap_or_default();
    let logs = if log.exists() {
        read_log(&log)
    } else {
        Vec::new()
    };
    (result, logs, weights)
}

fn growing(model: Regression, opt: AdamW) -> GrowingTrainer {
    GrowingTrainer { model, opt }
}

/// Every epoch trains every example exactly once (steps never span epochs, so the
/// trained indices in order split into N-sized permutations).
fn assert_each_epoch_exactly_once(logs: &[adabatch::StepLog], n: usize, epochs: usize) {
    let trained: Vec<usize> = logs.iter().flat_map(|l| l.indices.concat()).collect();
    assert_eq!(trained.len(), n * epochs, "examples trained");
    for (epoch, chunk) in trained.chunks(n).enumerate() {
        let mut sorted = chunk.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "epoch {epoch}");
    }
}

fn max_weight_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The global batch of every step under `halve` with `GrowingTrainer`'s schedule
/// (`interval(2, +1)`), computed independently of the engine: an OOM at step `s`
/// halves the per-device size (not below 1), caps later growth there, and retries
/// the same examples; steps never span epochs.
fn expected_halve_batches(
    n: usize,
    world: usize,
    per_device: usize,
    epochs: usize,
    oom_steps: &std::collections::BTreeSet<usize>,
) -> Vec<usize> {
    let (mut size, mut cap) = (per_device, usize::MAX);
    let mut batches = Vec::new();
    for _ in 0..epochs {
        let mut position = 0;
        while position < n {
            let step = batches.len() + 1;
            if oom_steps.contains(&step) && size > 1 {
                size /= 2;
                cap = size;
            }
            let take = (size * world).min(n - position);
            batches.push(take);
            position += take;
            let grown = if step % 2 == 0 { size + 1 } else { size };
            size = grown.min(cap);
        }
    }
    batches
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Every listed step the run reaches fires exactly once (on a rank that has
    /// examples, see `FaultInjector::at_steps`), and each policy does what it says:
    /// `halve` gives exactly the batches of an independent model of halving,
    /// `split_retry` gives the clean run's steps and weights.
    #[test]
    fn injected_ooms_lose_no_example(
        world in 1usize..5,
        n in 8usize..30,
        per_device in 1usize..4,
        oom_steps in proptest::collection::btree_set(1usize..12, 0..4),
        split in any::<bool>(),
    ) {
        let data = dataset(n, n as u64);
        let mut a = args(world, per_device, 2);
        a.step.oom = Some(if split { OomPolicy::SplitRetry } else { OomPolicy::Halve });
        a.step.inject_oom_at_steps = oom_steps.iter().copied().collect();
        let (result, logs, weights) = run_with(&data, &a, growing);
        let summary = result.unwrap();
        assert_each_epoch_exactly_once(&logs, n, 2);
        let fired = oom_steps.iter().filter(|&&s| s <= summary.global_step).count();
        prop_assert_eq!(summary.oom_events, fired);
        prop_assert_eq!(logs.iter().map(|l| l.oom_events).sum::<usize>(), fired);
        for l in &logs {
            prop_assert_eq!(l.oom_events, usize::from(oom_steps.contains(&l.step)), "step {}", l.step);
        }
        if split {
            // Same samples, same step count, same updates: the weights match a clean run.
            a.step.inject_oom_at_steps.clear();
            let (clean, clean_logs, clean_weights) = run_with(&data, &a, growing);
            prop_assert_eq!(clean.unwrap().global_step, summary.global_step);
            prop_assert_eq!(clean_logs.len(), logs.len());
            prop_assert!(max_weight_diff(&weights, &clean_weights) < 1e-4);
        } else {
            let global: Vec<usize> = logs.iter().map(|l| l.global_batch).collect();
            prop_assert_eq!(global, expected_halve_batches(n, world, per_device, 2, &oom_steps));
        }
    }
}

#[test]
fn halve_follows_a_memory_law_down_to_a_size_that_fits() {
    // Two ranks, 4 per device, and a device that cannot hold more than 1 example:
    // the first step halves twice and then trains on 1 per device.
    let data = dataset(12, 4);
    let mut a = args(2, 4, 1);
    a.step.oom = Some(OomPolicy::Halve);
    let faults = FaultInjector::none().above_local_batch(1);
    let (result, logs, _) = run_faulty(&data, &a, faults);
    let summary = result.unwrap();
    assert_eq!(summary.oom_events, 2);
    assert!(logs
        .iter()
        .all(|l| l.local_batch_sizes.iter().all(|&s| s <= 1)));
    assert_each_epoch_exactly_once(&logs, 12, 1);
}

fn run_faulty(
    data: &[Example],
    a: &TrainingArgs,
    faults: FaultInjector,
) -> (
    adabatch::Result<TrainSummary>,
    Vec<adabatch::StepLog>,
    Vec<f32>,
) {
    run_injected(data, a, faults, growing)
}

#[test]
fn split_retry_gives_up_at_one_example_per_chunk() {
    let data = dataset(6, 4);
    let mut a = args(1, 2, 1);
    a.step.oom = Some(OomPolicy::SplitRetry);
    let (result, _, _) = run_faulty(&data, &a, FaultInjector::none().above_local_batch(0));
    assert!(matches!(
        result.unwrap_err(),
        Error::Training(TrainingError::OutOfMemory { step: 1, .. })
    ));
}

#[test]
fn fail_policy_stops_with_the_step() {
    let data = dataset(10, 4);
    let mut a = args(3, 1, 1);
    a.step.inject_oom_at_steps = vec![2];
    let (result, _, _) = run_with(&data, &a, growing);
    let err = result.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Training(TrainingError::OutOfMemory { step: 2, .. })
        ),
        "{err}"
    );
}

#[test]
fn skip_drops_the_step_and_counts_it() {
    let data = dataset(10, 4);
    let mut a = args(2, 1, 1);
    a.step.oom = Some(OomPolicy::Skip);
    a.step.inject_oom_at_steps = vec![3];
    let (result, logs, _) = run_with(&data, &a, growing);
    let summary = result.unwrap();
    assert_eq!(summary.oom_events, 1);
    let trained: usize = logs.iter().map(|l| l.global_batch).sum();
    // Step 3 (2 per device by then) drew 4 examples that were dropped; the epoch
    // still ends at coverage 1.0.
    assert_eq!(trained, 6);
    assert_eq!(logs.last().unwrap().train_coverage, 1.0);
}

hand_trainer!(
    AccumTrainer,
    AdamW,
    TrainerPolicy {
        grad_accum: GradAccum::Fixed(2),
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    TargetTrainer,
    AdamW,
    TrainerPolicy {
        grad_accum: GradAccum::Target { global: 8 },
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(PlainTrainer, AdamW, TrainerPolicy::DEFAULT);

#[test]
fn accumulation_equals_the_larger_batch() {
    let data = dataset(30, 8);
    // fixed(2) of 2 per device == 4 per device; target(global = 8) on 2 ranks of 2 == 2 ranks of 4.
    let (accum, accum_logs, accum_w) = run_with(&data, &args(1, 2, 2), |m, o| AccumTrainer {
        model: m,
        opt: o,
    });
    let (plain, _, plain_w) = run_with(&data, &args(1, 4, 2), |m, o| PlainTrainer {
        model: m,
        opt: o,
    });
    let (accum, plain) = (accum.unwrap(), plain.unwrap());
    assert_eq!(accum.global_step, plain.global_step);
    assert!(accum_logs
        .iter()
        .take(7)
        .all(|l| l.micro_batches == 2 && l.global_batch == 4));
    assert!(max_weight_diff(&accum_w, &plain_w) < 1e-5);
    let (target, _, target_w) = run_with(&data, &args(2, 2, 2), |m, o| TargetTrainer {
        model: m,
        opt: o,
    });
    let (wide, _, wide_w) = run_with(&data, &args(2, 4, 2), |m, o| PlainTrainer {
        model: m,
        opt: o,
    });
    assert_eq!(
        target.unwrap().step_losses.len(),
        wide.unwrap().step_losses.len()
    );
    assert!(max_weight_diff(&target_w, &wide_w) < 1e-5);
}

hand_trainer!(
    ScaledTrainer,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 2,
            growth: Growth::Mul(2)
        },
        lr_scaling: LrScaling::Linear,
        shuffle: false,
        ..TrainerPolicy::DEFAULT
    }
);

#[test]
fn linear_lr_scaling_follows_the_global_batch() {
    let data = dataset(64, 8);
    let (result, logs, _) = run_with(&data, &args(2, 1, 1), |m, o| ScaledTrainer {
        model: m,
        opt: o,
    });
    result.unwrap();
    for l in &logs {
        let expected = 0.05 * l.global_batch as f64 / 2.0;
        assert!(
            (l.learning_rate - expected).abs() < 1e-12,
            "step {}: {} vs {expected}",
            l.step,
            l.learning_rate
        );
    }
}
