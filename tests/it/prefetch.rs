//! `--dataloader-num-workers`: batches collated ahead on worker threads change
//! nothing a run computes — the same losses, bit for bit, with and without
//! prefetch — while schedules, OOM recovery and memory-aware batching change the
//! course of the run under it.

use crate::common;

use adabatch::prelude::*;
use adabatch::train::out_of_memory::FaultInjector;
use adabatch::Run;
use adabatch::{Growth, OomPolicy, ScheduleSpec, TrainerPolicy, WithLengths};
use candle_core::Device;
use candle_nn::AdamW;
use common::*;

hand_trainer!(
    GrowingTrainer,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 3,
            growth: Growth::Add(1)
        },
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    SplitRetryTrainer,
    AdamW,
    TrainerPolicy {
        oom: OomPolicy::SplitRetry,
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    HalveTrainer,
    AdamW,
    TrainerPolicy {
        oom: OomPolicy::Halve,
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    MemoryTrainer,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Memory {
            threshold: 0.9,
            max_range: 4.0,
        },
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    NoiseScaleTrainer,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::NoiseScale(adabatch::NoiseScalePolicy {
            factor: 1,
            hysteresis: 0.0,
            shrink: true,
            // Every step measures: the automatic cadence follows measured times,
            // and the two runs compared must take the same steps.
            every: adabatch::MeasureEvery::Steps(1),
            ..adabatch::NoiseScalePolicy::doubling(1.0, 4, 40)
        }),
        ..TrainerPolicy::DEFAULT
    }
);

/// The same run with `workers` collate threads and without.
fn both<D, T>(
    data: &D,
    a: &TrainingArgs,
    faults: FaultInjector,
    wrap: fn(Regression, AdamW) -> T,
    workers: usize,
) -> (TrainSummary, TrainSummary)
where
    D: Dataset<Item = Example> + ?Sized,
    T: AdaptiveTrainer<Model = Regression> + Send,
{
    let run = |workers: usize| {
        let a = {
            let mut args = a.clone();
            args.data.dataloader_num_workers = workers;
            args
        };
        Run::new(data, &collate, &a)
            .with_faults(faults.clone())
            .launch(adamw_factory(wrap))
            .unwrap()
            .summary
    };
    let (plain, prefetched) = (run(0), run(workers));
    assert_eq!(plain.step_losses, prefetched.step_losses);
    assert_eq!(plain.examples_seen, prefetched.examples_seen);
    assert_eq!((plain.prefetched_steps, plain.prefetch_discarded), (0, 0));
    (plain, prefetched)
}

#[test]
fn a_fixed_schedule_is_predicted_every_step() {
    let data = dataset(61, 4);
    for (world, workers) in [(1, 1), (3, 2), (2, 4)] {
        let a = args(world, 2, 3);
        let (plain, prefetched) = both(
            &data,
            &a,
            FaultInjector::none(),
            |model, opt| GrowingTrainer { model, opt },
            workers,
        );
        // Every step but the first was collated ahead, epoch boundaries included,
        // and no prediction was wrong.
        assert_eq!(prefetched.prefetched_steps, plain.global_step - 1);
        assert_eq!(prefetched.prefetch_discarded, 0);
    }
}

#[test]
fn an_oom_discards_only_the_prefetch() {
    let data = dataset(40, 5);
    for world in [1, 2] {
        let a = args(world, 4, 2);
        let faults = FaultInjector::at_steps([2, 5]);
        let (_, split) = both(
            &data,
            &a,
            faults.clone(),
            |model, opt| SplitRetryTrainer { model, opt },
            2,
        );
        assert!(split.oom_events > 0 && split.prefetch_discarded > 0);
        let (_, halved) = both(
            &data,
            &a,
            faults,
            |model, opt| HalveTrainer { model, opt },
            2,
        );
        assert!(halved.oom_events > 0 && halved.prefetch_discarded > 0);
        assert!(halved.prefetched_steps > 0);
    }
}

#[test]
fn memory_aware_epochs_are_prefetched_within_each_epoch() {
    let n = 90;
    let lengths = (0..n).map(|i| 8 + (i * 53) % 120).collect();
    let data = WithLengths::new(dataset(n, 21), lengths).unwrap();
    for world in [1, 3] {
        let epochs = 2;
        let a = args(world, 2, epochs);
        let (plain, prefetched) = both(
            &data,
            &a,
            FaultInjector::none(),
            |model, opt| MemoryTrainer { model, opt },
            2,
        );
        // An epoch's batches are planned (collectively) when it starts: its first
        // step is collated in place, every other one ahead.
        assert_eq!(prefetched.prefetched_steps, plain.global_step - epochs);
        assert_eq!(prefetched.prefetch_discarded, 0);
    }
}

#[test]
fn noise_scale_resizing_keeps_the_losses() {
    let data = dataset(200, 6);
    let (plain, prefetched) = both(
        &data,
        &args(2, 2, 2),
        FaultInjector::none(),
        |model, opt| NoiseScaleTrainer { model, opt },
        2,
    );
    assert!(prefetched.prefetched_steps > 0);
    // The batch did change course, and each change cost its prefetch.
    assert_ne!(plain.final_per_device_batch_size, 2);
    assert!(prefetched.prefetch_discarded > 0);
}

/// A collate that fails on one example, as an error or as a panic.
fn failing_collate(
    panic: bool,
) -> impl Fn(&[Example], &Device) -> candle_core::Result<RegBatch> + Sync {
    move |items, device| {
        if items.iter().any(|e| e.tokens == 99) {
            if panic {
                panic!("example with 99 tokens");
            }
            candle_core::bail!("example with 99 tokens");
        }
        collate(items, device)
    }
}

#[test]
fn a_failing_collate_fails_the_same_step_either_way() {
    let mut data = dataset(30, 7);
    data[17].tokens = 99;
    for panic in [false, true] {
        let errors: Vec<String> = [0, 2]
            .into_iter()
            .map(|workers| {
                let log = temp_log("prefetch-fail");
                let a = {
                    let mut a = args(2, 2, 1);
                    a.data.dataloader_num_workers = workers;
                    a.logging.log_jsonl = Some(log.clone());
                    a
                };
                let collate = failing_collate(panic);
                let Err(error) = adabatch::Run::new(&data, &collate, &a)
                    .launch(adamw_factory(|model, opt| GrowingTrainer { model, opt }))
                else {
                    panic!("the collate fails");
                };
                let steps = read_log(&log).len();
                // Each cause's first line: candle appends a backtrace when
                // RUST_BACKTRACE is set.
                let report = error.report();
                let causes: Vec<&str> = report
                    .split("\ncaused by: ")
                    .map(|cause| cause.lines().next().unwrap_or(""))
                    .collect();
                format!("{} after {steps} steps", causes.join(": "))
            })
            .collect();
        assert!(errors[0].contains("99 tokens"), "{}", errors[0]);
        assert_eq!(errors[0], errors[1]);
    }
}
