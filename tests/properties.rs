//! Property tests of the batch planning: sampler, schedule, drop_last and coverage
//! accounting over random configurations.

use adabatch::adapt::schedule::{BatchLimits, Schedule};
use adabatch::data::planner::{RunLength, StepBatches, StepPlanner};
use adabatch::data::sampler::GlobalBatchSampler;
use adabatch::{GradAccum, Growth, ScheduleSpec};
use proptest::prelude::*;

static STEP_TABLE: [(usize, usize); 3] = [(0, 2), (4, 5), (9, 1)];

fn schedules() -> impl Strategy<Value = ScheduleSpec> {
    prop_oneof![
        Just(ScheduleSpec::Constant(None)),
        (1usize..7).prop_map(|n| ScheduleSpec::Constant(Some(n))),
        (1usize..6, prop_oneof![1i64..4, -2i64..0]).prop_map(|(every, k)| ScheduleSpec::Interval {
            every,
            growth: Growth::Add(k)
        }),
        (1usize..6, 2usize..4).prop_map(|(every, k)| ScheduleSpec::Interval {
            every,
            growth: Growth::Mul(k)
        }),
        (1usize..9, 1usize..9, 1usize..12).prop_map(|(from, to, over)| ScheduleSpec::Linear {
            from,
            to,
            over
        }),
        Just(ScheduleSpec::Steps(&STEP_TABLE)),
    ]
}

#[derive(Debug, Clone)]
struct Config {
    n: usize,
    world: usize,
    initial: usize,
    schedule: ScheduleSpec,
    min: usize,
    max: Option<usize>,
    drop_last: bool,
    epochs: usize,
    seed: u64,
    accum: GradAccum,
}

fn accums() -> impl Strategy<Value = GradAccum> {
    prop_oneof![
        3 => Just(GradAccum::Fixed(1)),
        1 => (2usize..4).prop_map(GradAccum::Fixed),
        1 => (1usize..30).prop_map(|global| GradAccum::Target { global }),
    ]
}

fn configs() -> impl Strategy<Value = Config> {
    (
        1usize..80,
        1usize..6,
        1usize..8,
        schedules(),
        1usize..3,
        proptest::option::of(3usize..12),
        any::<bool>(),
        (1usize..4, any::<u64>(), accums()),
    )
        .prop_filter("at least one example per rank", |c| c.1 <= c.0)
        .prop_map(
            |(n, world, initial, schedule, min, max, drop_last, (epochs, seed, accum))| Config {
                n,
                world,
                initial,
                schedule,
                min,
                max,
                drop_last,
                epochs,
                seed,
                accum,
            },
        )
}

/// One rank's view of a run: every plan with the sampler's epoch index and
/// accounting after it, or the typed error that ended it.
#[derive(Debug, PartialEq)]
struct Trace {
    steps: Vec<(StepBatches, usize, f64, f64, usize)>,
    error: Option<String>,
}

fn plan_run(c: &Config) -> Trace {
    let limits = BatchLimits::new(c.min, c.max).unwrap();
    let sampler = GlobalBatchSampler::new(c.n, c.world, c.seed, true, c.drop_last).unwrap();
    let initial = match limits.apply(0, Schedule::initial(&c.schedule, c.initial)) {
        Ok(size) => size,
        Err(e) => {
            return Trace {
                steps: vec![],
                error: Some(e.to_string()),
            }
        }
    };
    let mut planner = match StepPlanner::new(
        sampler,
        c.schedule,
        limits,
        initial,
        RunLength::Epochs(c.epochs),
        c.world,
        c.drop_last,
    ) {
        Ok(p) => p.with_grad_accum(c.accum),
        Err(e) => {
            return Trace {
                steps: vec![],
                error: Some(e.to_string()),
            }
        }
    };
    let mut steps = Vec::new();
    while let Some(plan) = planner.next_step() {
        let s = planner.sampler();
        steps.push((
            plan,
            s.epoch_index(),
            s.train_coverage(),
            s.epoch(),
            s.examples_seen(),
        ));
        if let Err(e) = planner.finish_step() {
            return Trace {
                steps,
                error: Some(e.to_string()),
            };
        }
    }
    Trace { steps, error: None }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_rank_plans_the_same_steps(c in configs()) {
        // Each rank runs its own planner: same seed, same schedule, same plans.
        let reference = plan_run(&c);
        for _ in 1..c.world {
            prop_assert_eq!(&plan_run(&c), &reference);
        }
    }

    #[test]
    fn coverage_and_epoch_accounting(c in configs()) {
        let trace = plan_run(&c);
        if let Some(error) = &trace.error {
            // Only the typed, documented stops may end a run early.
            prop_assert!(error.contains("returned 0") || error.contains("drop_last = true"), "{}", error);
        }
        let mut per_epoch: Vec<Vec<usize>> = vec![Vec::new(); c.epochs];
        for (plan, epoch_index, coverage, epoch, seen) in &trace.steps {
            // The split: sizes differ by at most one, larger ones first, sum = global.
            for micro in &plan.micro {
                let sizes = micro.local_sizes();
                prop_assert_eq!(sizes.iter().sum::<usize>(), micro.global_size());
                prop_assert!(sizes.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
                if c.drop_last {
                    prop_assert_eq!(micro.global_size() % c.world, 0, "drop_last only runs full global batches");
                }
            }
            if let GradAccum::Fixed(n) = c.accum {
                prop_assert!(plan.micro.len() <= n);
            }
            prop_assert_eq!(plan.local_sizes().iter().sum::<usize>(), plan.global_size());
            prop_assert!((epoch - *seen as f64 / c.n as f64).abs() < 1e-12);
            let bucket = &mut per_epoch[*epoch_index];
            bucket.extend(plan.indices());
            prop_assert!((coverage - bucket.len() as f64 / c.n as f64).abs() < 1e-12);
        }
        let finished = if trace.error.is_some() { trace.steps.last().map_or(0, |s| s.1) } else { c.epochs };
        for (epoch, seen) in per_epoch.iter().enumerate() {
            let mut sorted = seen.clone();
            sorted.sort_unstable();
            let before = sorted.len();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), before, "an example twice in epoch {}", epoch);
            if !c.drop_last && epoch < finished {
                prop_assert_eq!(sorted, (0..c.n).collect::<Vec<_>>(), "epoch {} misses examples", epoch);
            }
        }
        if !c.drop_last && trace.error.is_none() {
            let last = trace.steps.last().unwrap();
            prop_assert!((last.2 - 1.0).abs() < 1e-12, "coverage ends at 1.0");
            prop_assert!((last.3 - c.epochs as f64).abs() < 1e-9, "epoch ends at num_train_epochs");
        }
    }
}
