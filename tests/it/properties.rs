//! Property tests of the batch planning: sampler, schedule, drop_last and coverage
//! accounting over random configurations, and real multi-rank runs (`Local` ranks
//! as threads) that record what every rank trained on.

use crate::common;

use std::sync::{Arc, Mutex};

use adabatch::adapt::schedule::{BatchLimits, Schedule};
use adabatch::data::planner::{RunLength, StepBatches, StepPlanner};
use adabatch::data::sampler::GlobalBatchSampler;
use adabatch::prelude::*;
use adabatch::{GradAccum, Growth, ScheduleSpec, TrainerPolicy};
use candle_core::{Tensor, Var};
use candle_nn::{Optimizer, SGD};
use common::{collate, Example, RegBatch, Regression};
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
    /// Plan, epoch index, coverage, epoch, examples seen, per-device size after the step.
    steps: Vec<(StepBatches, usize, f64, f64, usize, usize)>,
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
        let accounting = (
            s.epoch_index(),
            s.train_coverage(),
            s.epoch(),
            s.examples_seen(),
        );
        if let Err(e) = planner.finish_step() {
            steps.push((
                plan,
                accounting.0,
                accounting.1,
                accounting.2,
                accounting.3,
                0,
            ));
            return Trace {
                steps,
                error: Some(e.to_string()),
            };
        }
        let next = planner.per_device();
        steps.push((
            plan,
            accounting.0,
            accounting.1,
            accounting.2,
            accounting.3,
            next,
        ));
    }
    Trace { steps, error: None }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn coverage_and_epoch_accounting(c in configs()) {
        let trace = plan_run(&c);
        if let Some(error) = &trace.error {
            // Only the typed, documented stops may end a run early.
            prop_assert!(error.contains("returned 0") || error.contains("drop_last = true"), "{}", error);
        }
        let mut per_epoch: Vec<Vec<usize>> = vec![Vec::new(); c.epochs];
        for (plan, epoch_index, coverage, epoch, seen, _) in &trace.steps {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn drop_last_drops_at_most_one_short_batch_per_epoch(c in configs()) {
        let c = Config { drop_last: true, accum: GradAccum::Fixed(1), ..c };
        let trace = plan_run(&c);
        prop_assume!(trace.error.is_none());
        let sampler = GlobalBatchSampler::new(c.n, c.world, c.seed, true, true).unwrap();
        for epoch in 0..c.epochs {
            let steps: Vec<_> = trace.steps.iter().filter(|s| s.1 == epoch).collect();
            let trained: Vec<usize> = steps.iter().flat_map(|s| s.0.indices()).collect();
            // What an epoch trains is a prefix of its permutation, in order ...
            let permutation = sampler.permutation_of(epoch);
            prop_assert_eq!(&trained[..], &permutation[..trained.len()]);
            // ... and what it drops is less than the one global batch it would
            // have taken next (the size the schedule chose after its last step).
            let next_global = match steps.last() {
                Some(last) => last.5 * c.world,
                None => Schedule::initial(&c.schedule, c.initial) * c.world,
            };
            let dropped = c.n - trained.len();
            prop_assert!(
                dropped < next_global,
                "epoch {}: dropped {} examples, the next global batch is {}",
                epoch, dropped, next_global
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Real multi-rank runs: every rank records the examples it trained on.

/// Each rank's model records `(rank, example ids)` of every batch it computes a
/// loss for; an example's id is its token count minus one (see `id_dataset`).
struct Recording {
    inner: Regression,
    rank: usize,
    seen: Seen,
}

/// `(rank, example ids)` of every batch, in the order the ranks computed them.
type Seen = Arc<Mutex<Vec<(usize, Vec<usize>)>>>;

impl TrainModel for Recording {
    type Batch = RegBatch;
    fn per_example_loss(&self, batch: &RegBatch) -> candle_core::Result<Tensor> {
        let ids = batch
            .tokens
            .to_vec1::<f32>()?
            .into_iter()
            .map(|t| t as usize - 1)
            .collect();
        self.seen.lock().unwrap().push((self.rank, ids));
        self.inner.per_example_loss(batch)
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.inner.named_parameters()
    }
}

fn id_dataset(n: usize) -> Vec<Example> {
    let mut data = common::dataset(n, 17);
    for (i, e) in data.iter_mut().enumerate() {
        e.tokens = i + 1;
    }
    data
}

macro_rules! recording_trainer {
    ($name:ident, $schedule:expr) => {
        struct $name(Recording, SGD);
        impl AdaptiveTrainer for $name {
            type Model = Recording;
            type Optimizer = SGD;
            const POLICY: TrainerPolicy = TrainerPolicy {
                schedule: $schedule,
                ..TrainerPolicy::DEFAULT
            };
            fn parts(&mut self) -> (&mut Recording, &mut SGD) {
                (&mut self.0, &mut self.1)
            }
        }
        impl From<(Recording, SGD)> for $name {
            fn from((m, o): (Recording, SGD)) -> Self {
                Self(m, o)
            }
        }
    };
}

static RAMP_TABLE: [(usize, usize); 2] = [(0, 1), (3, 3)];
recording_trainer!(ConstantRec, ScheduleSpec::Constant(None));
recording_trainer!(
    GrowingRec,
    ScheduleSpec::Interval {
        every: 2,
        growth: Growth::Add(1)
    }
);
recording_trainer!(
    DoublingRec,
    ScheduleSpec::Interval {
        every: 3,
        growth: Growth::Mul(2)
    }
);
recording_trainer!(
    LinearRec,
    ScheduleSpec::Linear {
        from: 3,
        to: 1,
        over: 4
    }
);
recording_trainer!(StepsRec, ScheduleSpec::Steps(&RAMP_TABLE));

#[derive(Debug)]
struct Recorded {
    logs: Vec<adabatch::StepLog>,
    seen: Vec<(usize, Vec<usize>)>,
    summary: TrainSummary,
}

fn recorded_run<T>(
    n: usize,
    world: usize,
    per_device: usize,
    drop_last: bool,
) -> adabatch::Result<Recorded>
where
    T: AdaptiveTrainer<Model = Recording, Optimizer = SGD> + From<(Recording, SGD)> + Send,
{
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = common::temp_log("multi-rank");
    let mut a = common::args(world, per_device, 2);
    a.data.dataloader_drop_last = Some(drop_last);
    a.logging.log_jsonl = Some(log.clone());
    let summary = adabatch::Run::new(&id_dataset(n), &collate, &a)
        .launch(|ctx: &RankContext| {
            let inner = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = SGD::new(inner.params.all_vars(), 0.01)?;
            let model = Recording {
                inner,
                rank: ctx.rank(),
                seen: Arc::clone(&seen),
            };
            Ok(T::from((model, opt)))
        })?
        .summary;
    let logs = common::read_log(&log);
    let _ = std::fs::remove_file(&log);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    Ok(Recorded {
        logs,
        seen,
        summary,
    })
}

fn check_recorded(r: &Recorded, world: usize) -> Result<(), TestCaseError> {
    // Steps 1..=n are all logged, and the summary agrees.
    prop_assert_eq!(r.summary.global_step, r.logs.len());
    for (k, l) in r.logs.iter().enumerate() {
        prop_assert_eq!(l.step, k + 1);
        prop_assert_eq!(l.indices.len(), world);
        prop_assert_eq!(
            l.indices.iter().map(Vec::len).sum::<usize>(),
            l.global_batch
        );
        // The split: sizes differ by at most one, larger ones first.
        let sizes = &l.local_batch_sizes;
        prop_assert!(sizes.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
    }
    for rank in 0..world {
        // What the rank's model computed, in order, is the log's slice of that
        // rank at every step where it had examples (and nothing else).
        let computed: Vec<&Vec<usize>> = r
            .seen
            .iter()
            .filter(|(r, _)| *r == rank)
            .map(|(_, ids)| ids)
            .collect();
        let logged: Vec<&Vec<usize>> = r
            .logs
            .iter()
            .map(|l| &l.indices[rank])
            .filter(|ids| !ids.is_empty())
            .collect();
        prop_assert_eq!(computed, logged, "rank {}", rank);
    }
    // The union over ranks at each step is the logged global batch: the model
    // records of one step, sorted, equal the step's indices, sorted.
    let mut cursor = vec![0usize; world];
    for l in &r.logs {
        let mut union: Vec<usize> = Vec::new();
        for (rank, ids) in l.indices.iter().enumerate() {
            if ids.is_empty() {
                continue;
            }
            let per_rank: Vec<&(usize, Vec<usize>)> =
                r.seen.iter().filter(|(r, _)| *r == rank).collect();
            union.extend(&per_rank[cursor[rank]].1);
            cursor[rank] += 1;
        }
        union.sort_unstable();
        let mut expected = l.indices.concat();
        expected.sort_unstable();
        prop_assert_eq!(union.len(), l.global_batch);
        prop_assert_eq!(union, expected, "step {}", l.step);
    }
    Ok(())
}

proptest! {
    // Each case trains for real on up to 4 threads: few cases, tiny data.
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn every_rank_trains_the_logged_batches(
        schedule in 0usize..5,
        world in 1usize..5,
        extra in 0usize..12,
        per_device in 1usize..4,
        drop_last in any::<bool>(),
    ) {
        let n = world + extra;
        let result = match schedule {
            0 => recorded_run::<ConstantRec>(n, world, per_device, drop_last),
            1 => recorded_run::<GrowingRec>(n, world, per_device, drop_last),
            2 => recorded_run::<DoublingRec>(n, world, per_device, drop_last),
            3 => recorded_run::<LinearRec>(n, world, per_device, drop_last),
            _ => recorded_run::<StepsRec>(n, world, per_device, drop_last),
        };
        let r = match result {
            // With drop_last a global batch larger than the data is the documented,
            // typed stop (the schedule may start or grow there).
            Err(adabatch::Error::Data(adabatch::DataError::GlobalBatchTooLarge { global_batch, examples, .. })) if drop_last => {
                prop_assert!(global_batch > examples);
                return Ok(());
            }
            other => other.unwrap(),
        };
        check_recorded(&r, world)?;
    }
}

/// One `launch_group` per rank, each on its own thread with one `Local` member:
/// every rank returns its own summary, so step counts and (all-reduced) losses of
/// every rank can be compared.
fn per_rank_summaries(n: usize, world: usize, per_device: usize) -> Vec<TrainSummary> {
    let data = id_dataset(n);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let a = common::args(world, per_device, 2);
    std::thread::scope(|s| {
        let handles: Vec<_> = adabatch::Local::group(world)
            .into_iter()
            .map(|member| {
                let (data, a, seen) = (&data, &a, &seen);
                s.spawn(move || {
                    adabatch::Run::new(data, &collate, a)
                        .group(
                            vec![(member, candle_core::Device::Cpu)],
                            |ctx: &RankContext| {
                                let inner = Regression::new(ctx.parameters(), ctx.device())?;
                                let opt = SGD::new(inner.params.all_vars(), 0.01)?;
                                let model = Recording {
                                    inner,
                                    rank: ctx.rank(),
                                    seen: Arc::clone(seen),
                                };
                                Ok(GrowingRec(model, opt))
                            },
                        )
                        .map(|t| t.summary)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn every_rank_runs_the_same_steps(world in 2usize..5, extra in 0usize..10, per_device in 1usize..3) {
        let summaries = per_rank_summaries(world + extra, world, per_device);
        let first = &summaries[0];
        prop_assert!(first.global_step > 0);
        for (rank, s) in summaries.iter().enumerate() {
            prop_assert_eq!(s.global_step, first.global_step, "rank {}", rank);
            prop_assert_eq!(s.examples_seen, first.examples_seen, "rank {}", rank);
            prop_assert_eq!(&s.step_losses, &first.step_losses, "rank {}", rank);
            prop_assert_eq!(s.world_size, world);
        }
    }
}
