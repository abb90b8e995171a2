//! `ramp(start, increment, samples, global)` / `--rampup-batch-size` with
//! `--global-batch-size`: Megatron-LM's staircase in global units, step for step,
//! on any number of ranks, across a resume, and from the command line.

use crate::common;

use adabatch::adapt::schedule::BatchLimits;
use adabatch::data::planner::{RunLength, StepPlanner};
use adabatch::data::sampler::GlobalBatchSampler;
use adabatch::optim::AdamW;
use adabatch::prelude::*;
use adabatch::{GradAccum, Growth, Ramp, ScheduleSpec, StepLog, TrainerPolicy};
use clap::Parser;
use common::*;
use proptest::prelude::*;

/// Megatron-LM's `RampupBatchsizeNumMicroBatchesCalculator.update`, transcribed:
/// Python floats are IEEE doubles, `int()` truncates.
fn megatron(start: usize, incr: usize, samples: usize, global: usize, consumed: usize) -> usize {
    let diff_batch_size = global - start;
    let num_increments = diff_batch_size / incr;
    let rampup_samples_per_increment = samples as f64 / num_increments as f64;
    if consumed > samples {
        global
    } else {
        let steps = (consumed as f64 / rampup_samples_per_increment) as usize;
        start + steps * incr
    }
}

#[derive(Debug, Clone)]
struct Case {
    n: usize,
    start: usize,
    incr: usize,
    stairs: usize,
    samples: usize,
    epochs: usize,
    seed: u64,
    accum: usize,
}

impl Case {
    fn ramp(&self) -> Ramp {
        Ramp {
            start: self.start,
            increment: self.incr,
            samples: self.samples,
            global: self.start + self.stairs * self.incr,
        }
    }
}

fn cases() -> impl Strategy<Value = Case> {
    (
        (20usize..200, 1usize..9, 1usize..7, 1usize..8),
        (1usize..400, 1usize..3, any::<u64>(), 1usize..4),
    )
        .prop_map(
            |((n, start, incr, stairs), (samples, epochs, seed, accum))| Case {
                n,
                start,
                incr,
                stairs,
                samples,
                epochs,
                seed,
                accum,
            },
        )
}

/// The planned steps: (examples consumed before, step's global batch, per-rank
/// sizes, indices).
type Planned = Vec<(usize, usize, Vec<usize>, Vec<usize>)>;

fn planner(c: &Case, world: usize) -> StepPlanner<ScheduleSpec> {
    let sampler = GlobalBatchSampler::new(c.n, world, c.seed, true, false).unwrap();
    StepPlanner::new(
        sampler,
        ScheduleSpec::Ramp(c.ramp()),
        BatchLimits::new(1, None).unwrap(),
        c.start.div_ceil(world),
        RunLength::Epochs(c.epochs),
        world,
        false,
    )
    .unwrap()
    .with_grad_accum(GradAccum::Fixed(c.accum))
}

fn drain(p: &mut StepPlanner<ScheduleSpec>, out: &mut Planned, max: usize) {
    while out.len() < max {
        let before = p.sampler().examples_seen();
        let Some(step) = p.next_step() else { return };
        out.push((
            before,
            step.global_size(),
            step.local_sizes(),
            step.indices(),
        ));
        p.finish_step().unwrap();
    }
}

fn plan(c: &Case, world: usize) -> Planned {
    let mut out = Vec::new();
    drain(&mut planner(c, world), &mut out, usize::MAX);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn follows_megatron_exactly_once_per_epoch_on_any_ranks(c in cases(), world in 1usize..5) {
        let world = world.min(c.n);
        let r = c.ramp();
        let steps = plan(&c, world);
        let mut per_epoch = vec![Vec::new(); c.epochs];
        for (before, global, local, indices) in &steps {
            let epoch = before / c.n;
            let left_in_epoch = (epoch + 1) * c.n - before;
            // Megatron's size, or the epoch's tail.
            let want = megatron(r.start, r.increment, r.samples, r.global, *before);
            prop_assert_eq!(*global, want.min(left_in_epoch), "after {} examples", before);
            // Split unevenly when it does not divide: sizes differ by at most one.
            prop_assert_eq!(local.len(), world);
            prop_assert!(local.iter().max().unwrap() - local.iter().min().unwrap() <= c.accum);
            prop_assert_eq!(local.iter().sum::<usize>(), *global);
            per_epoch[epoch].extend(indices.iter().copied());
        }
        for seen in per_epoch {
            let mut sorted = seen;
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..c.n).collect::<Vec<_>>(), "every example once per epoch");
        }
        // World-size invariance: 1×, 2×, 3× the ranks give the same global batches.
        for k in [2, 3] {
            if world * k <= c.n {
                let other = plan(&c, world * k);
                let globals = |p: &Planned| p.iter().map(|s| (s.0, s.1, s.3.clone())).collect::<Vec<_>>();
                prop_assert_eq!(globals(&other), globals(&steps), "on {} ranks", world * k);
            }
        }
    }

    #[test]
    fn resume_mid_ramp_equals_the_uninterrupted_plan(c in cases(), world in 1usize..4, cut in 1usize..12, other in 1usize..4) {
        let world = world.min(c.n);
        let straight = plan(&c, world);
        let mut first = planner(&c, world);
        let mut resumed = Vec::new();
        drain(&mut first, &mut resumed, cut);
        // Through the checkpoint's JSON; the resumed run may even have another ramp
        // configured: the checkpoint's wins.
        let state: adabatch::data::planner::PlannerState =
            serde_json::from_str(&serde_json::to_string(&first.state()).unwrap()).unwrap();
        prop_assert_eq!(state.ramp, Some(c.ramp()));
        let mut second = planner(&Case { start: c.start + 1, ..c.clone() }, world);
        second.restore(&state);
        drain(&mut second, &mut resumed, usize::MAX);
        prop_assert_eq!(&resumed, &straight);
        // Resumed on another number of ranks: the same global batches.
        let other = other.min(c.n);
        let mut third = planner(&c, other);
        third.restore(&state);
        let mut rest = resumed[..resumed.len().min(cut)].to_vec();
        drain(&mut third, &mut rest, usize::MAX);
        let globals = |p: &Planned| p.iter().map(|s| (s.0, s.1, s.3.clone())).collect::<Vec<_>>();
        prop_assert_eq!(globals(&rest), globals(&straight));
    }
}

#[test]
fn megatron_doc_example_boundaries() {
    let r = Ramp {
        start: 16,
        increment: 16,
        samples: 10_000,
        global: 256,
    };
    for consumed in (0..12_000).step_by(7) {
        assert_eq!(
            r.global_batch(consumed),
            megatron(16, 16, 10_000, 256, consumed)
        );
    }
}

const INTERVAL: TrainerPolicy = TrainerPolicy {
    schedule: ScheduleSpec::Interval {
        every: 2,
        growth: Growth::Add(1),
    },
    ..TrainerPolicy::DEFAULT
};
const RAMPED: TrainerPolicy = TrainerPolicy {
    schedule: ScheduleSpec::Ramp(Ramp {
        start: 2,
        increment: 3,
        samples: 30,
        global: 11,
    }),
    ..TrainerPolicy::DEFAULT
};
hand_trainer!(Growing, AdamW, INTERVAL);
hand_trainer!(Ramped, AdamW, RAMPED);

fn run_ramped(a: &TrainingArgs) -> adabatch::Result<(TrainSummary, Vec<StepLog>)> {
    let log = temp_log("ramp");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let trained =
        adabatch::Run::new(&dataset(23, 5), &collate, &a).launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = resumable_adam(&model)?;
            Ok(Ramped { model, opt })
        })?;
    Ok((trained.summary, read_log(&log)))
}

#[test]
fn engine_runs_the_ramp_and_resumes_mid_ramp_bit_for_bit() {
    let r = RAMPED.schedule;
    let ScheduleSpec::Ramp(r) = r else {
        unreachable!()
    };
    let mut a = args(3, 1, 3);
    a.length.max_steps = Some(10);
    let (straight, logs) = run_ramped(&a).unwrap();
    let mut consumed = 0;
    for log in &logs {
        let left = 23 - consumed % 23;
        assert_eq!(log.global_batch, r.global_batch(consumed).min(left));
        consumed += log.global_batch;
    }
    assert!(
        logs.iter().any(|l| l.global_batch % 3 != 0),
        "an uneven split"
    );

    let out = temp_log("ramp-dir").with_extension("");
    let mut first = a.clone();
    first.length.max_steps = Some(3);
    first.save.save_steps = 3;
    first.save.output_dir = out.clone();
    run_ramped(&first).unwrap();
    let mut second = a.clone();
    second.save.output_dir = out.clone();
    second.save.resume_from_checkpoint = Some("latest".into());
    let (resumed, resumed_logs) = run_ramped(&second).unwrap();
    assert_eq!(resumed.global_step, straight.global_step);
    assert_eq!(resumed_logs.len(), logs.len() - 3);
    for (r, s) in resumed_logs.iter().zip(&logs[3..]) {
        assert_eq!((r.step, &r.indices), (s.step, &s.indices));
        assert_eq!(r.loss.to_bits(), s.loss.to_bits(), "step {}", r.step);
    }
    // Resuming with another ramp is a change of policy: refused.
    let other = {
        let mut args = second.clone();
        args.batch.rampup_batch_size = Some(vec![2, 3, 60]);
        args.batch.global_batch_size = Some(11);
        args
    };
    let err = run_ramped(&other).err().map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("schedule")),
        "{err:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn flags_parse_and_override_the_trainers_schedule() {
    let a = TrainingArgs::try_parse_from([
        "train",
        "--rampup-batch-size",
        "2",
        "2",
        "20",
        "--global-batch-size",
        "8",
        "--nproc-per-node",
        "2",
        "--num-train-epochs",
        "2",
        "--quiet",
    ])
    .unwrap();
    assert_eq!(a.batch.rampup_batch_size, Some(vec![2, 2, 20]));
    assert_eq!(a.batch.global_batch_size, Some(8));
    assert!(TrainingArgs::try_parse_from(["train", "--rampup-batch-size", "2", "2"]).is_err());

    let log = temp_log("ramp-flags");
    let run = |a: &TrainingArgs| {
        adabatch::Run::new(&dataset(23, 5), &collate, a).launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = resumable_adam(&model)?;
            Ok(Growing { model, opt })
        })
    };
    let mut with_log = a.clone();
    with_log.logging.log_jsonl = Some(log.clone());
    run(&with_log).unwrap();
    let logs = read_log(&log);
    let r = Ramp {
        start: 2,
        increment: 2,
        samples: 20,
        global: 8,
    };
    let mut consumed = 0;
    for l in &logs {
        assert_eq!(
            l.global_batch,
            r.global_batch(consumed).min(23 - consumed % 23)
        );
        consumed += l.global_batch;
    }
    assert_eq!(consumed, 46);

    // `--global-batch-size` alone: a constant global batch, split unevenly.
    let constant = {
        let mut args = a.clone();
        args.batch.rampup_batch_size = None;
        args.batch.global_batch_size = Some(5);
        args.logging.log_jsonl = Some(temp_log("ramp-constant"));
        args
    };
    run(&constant).unwrap();
    let logs = read_log(constant.logging.log_jsonl.as_ref().unwrap());
    assert!(logs
        .iter()
        .all(|l| l.global_batch == 5 || l.global_batch == 3));
    assert_eq!(logs[0].local_batch_sizes, vec![3, 2]);

    // The ramp without its end, and a ramp that does not reach G in whole stairs.
    let no_end = {
        let mut args = a.clone();
        args.batch.global_batch_size = None;
        args
    };
    assert!(matches!(
        run(&no_end),
        Err(adabatch::Error::Settings(
            adabatch::SettingsError::InvalidSetting {
                name: "rampup_batch_size",
                ..
            }
        ))
    ));
    let uneven = {
        let mut args = a.clone();
        args.batch.rampup_batch_size = Some(vec![2, 4, 20]);
        args
    };
    assert!(matches!(
        run(&uneven),
        Err(adabatch::Error::Settings(
            adabatch::SettingsError::InvalidSchedule {
                schedule: "ramp",
                ..
            }
        ))
    ));
}
