//! The ramp over tokens consumed (`ramp(.., tokens = n, ..)`, `--rampup-in-tokens`):
//! Megatron's staircase with tokens as its position, on any number of ranks, every
//! example once per epoch, across a resume, and through the engine.

use crate::common;

use adabatch::adapt::schedule::BatchLimits;
use adabatch::data::planner::{PlannerState, RunLength, StepPlanner};
use adabatch::data::sampler::GlobalBatchSampler;
use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;
use adabatch::{Error, GradAccum, Ramp, ScheduleSpec, SettingsError};
use common::*;
use proptest::prelude::*;

/// Megatron-LM's `RampupBatchsizeNumMicroBatchesCalculator.update` with `consumed`
/// read as tokens.
fn megatron(r: &Ramp, consumed: usize) -> usize {
    let per_increment = r.samples as f64 / ((r.global - r.start) / r.increment) as f64;
    if consumed > r.samples {
        r.global
    } else {
        r.start + (consumed as f64 / per_increment) as usize * r.increment
    }
}

#[derive(Debug, Clone)]
struct Case {
    lengths: Vec<usize>,
    ramp: Ramp,
    epochs: usize,
    seed: u64,
    accum: usize,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(1usize..60, 20..150),
        (1usize..9, 1usize..7, 1usize..8, 1usize..5000),
        (1usize..3, any::<u64>(), 1usize..4),
    )
        .prop_map(
            |(lengths, (start, increment, stairs, tokens), (epochs, seed, accum))| Case {
                lengths,
                ramp: Ramp {
                    start,
                    increment,
                    samples: tokens,
                    global: start + stairs * increment,
                },
                epochs,
                seed,
                accum,
            },
        )
}

fn planner(c: &Case, world: usize) -> StepPlanner<ScheduleSpec> {
    let n = c.lengths.len();
    let sampler = GlobalBatchSampler::new(n, world, c.seed, true, false).unwrap();
    StepPlanner::new(
        sampler,
        ScheduleSpec::TokenRamp(c.ramp),
        BatchLimits::new(1, None).unwrap(),
        c.ramp.start.div_ceil(world),
        RunLength::Epochs(c.epochs),
        world,
        false,
    )
    .unwrap()
    .with_grad_accum(GradAccum::Fixed(c.accum))
    .with_lengths(c.lengths.clone().into())
}

/// (examples before, tokens before, global batch, indices) of every step.
type Planned = Vec<(usize, u64, usize, Vec<usize>)>;

fn drain(p: &mut StepPlanner<ScheduleSpec>, out: &mut Planned, max: usize) {
    while out.len() < max {
        let (examples, tokens) = (p.sampler().examples_seen(), p.tokens_seen());
        let Some(step) = p.next_step() else { return };
        out.push((examples, tokens, step.global_size(), step.indices()));
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
    fn follows_megatron_over_tokens_exactly_once_per_epoch(c in cases(), world in 1usize..5) {
        let n = c.lengths.len();
        let world = world.min(n);
        let steps = plan(&c, world);
        let mut tokens = 0u64;
        let mut per_epoch = vec![Vec::new(); c.epochs];
        for (examples, tokens_before, global, indices) in &steps {
            // The planner's count is the lengths of the examples trained so far.
            prop_assert_eq!(*tokens_before, tokens);
            let left_in_epoch = n - examples % n;
            let want = megatron(&c.ramp, tokens as usize);
            prop_assert_eq!(*global, want.min(left_in_epoch), "after {} tokens", tokens);
            tokens += indices.iter().map(|&i| c.lengths[i] as u64).sum::<u64>();
            per_epoch[examples / n].extend(indices.iter().copied());
        }
        for seen in per_epoch {
            let mut sorted = seen;
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "every example once per epoch");
        }
        for k in [2, 3] {
            if world * k <= n {
                prop_assert_eq!(&plan(&c, world * k), &steps, "on {} ranks", world * k);
            }
        }
    }

    #[test]
    fn resume_equals_the_uninterrupted_plan(c in cases(), world in 1usize..4, cut in 1usize..12, other in 1usize..4) {
        let n = c.lengths.len();
        let (world, other) = (world.min(n), other.min(n));
        let straight = plan(&c, world);
        let mut first = planner(&c, world);
        let mut resumed = Vec::new();
        drain(&mut first, &mut resumed, cut);
        let state: PlannerState =
            serde_json::from_str(&serde_json::to_string(&first.state()).unwrap()).unwrap();
        prop_assert!(state.ramp_in_tokens);
        let mut second = planner(&c, other);
        second.restore(&state);
        drain(&mut second, &mut resumed, usize::MAX);
        prop_assert_eq!(&resumed, &straight);
    }
}

/// The DSL form reaches the runtime as a ramp over tokens.
#[adaptive_trainer(schedule = ramp(start = 2, increment = 3, tokens = 200, global = 11))]
struct TokenRamped {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

fn run(a: &TrainingArgs) -> adabatch::Result<Vec<adabatch::StepLog>> {
    let log = temp_log("token-ramp");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let data = dataset(23, 5);
    let lengths: Vec<usize> = data.iter().map(|e| e.tokens).collect();
    let data = WithLengths::new(data, lengths)?;
    TokenRamped::launch(&data, &collate, &a, |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(
            model.params.all_vars(),
            ParamsAdamW {
                lr: 0.05,
                ..Default::default()
            },
        )?;
        Ok(TokenRamped::new(model, opt))
    })?;
    Ok(read_log(&log))
}

#[test]
fn the_engine_climbs_over_the_tokens_of_the_examples_it_trained() {
    let ScheduleSpec::TokenRamp(ramp) = TokenRamped::POLICY.schedule else {
        panic!("the DSL's `tokens = n` is a ramp over tokens")
    };
    let data = dataset(23, 5);
    let mut a = args(3, 1, 4);
    a.length.max_steps = Some(14);
    let logs = run(&a).unwrap();
    assert_eq!(logs.len(), 14);
    let mut tokens = 0;
    for l in &logs {
        let examples = (l.epoch * 23.0).round() as usize - l.global_batch;
        let want = megatron(&ramp, tokens).min(23 - examples % 23);
        assert_eq!(l.global_batch, want, "step {}", l.step);
        tokens += l
            .indices
            .iter()
            .flatten()
            .map(|&i| data[i].tokens)
            .sum::<usize>();
    }
    assert!(logs.iter().any(|l| l.global_batch > 2), "the ramp climbed");

    // The flag form overrides the trainer's schedule the same way.
    let flags = {
        let mut args = a.clone();
        args.batch.rampup_batch_size = Some(vec![2, 3, 200]);
        args.batch.global_batch_size = Some(11);
        args.batch.rampup_in_tokens = true;
        args
    };
    let again = run(&flags).unwrap();
    let steps = |l: &[adabatch::StepLog]| l.iter().map(|s| s.indices.clone()).collect::<Vec<_>>();
    assert_eq!(steps(&again), steps(&logs));

    // `--rampup-in-tokens` alone names the missing flag.
    let alone = {
        let mut args = a;
        args.batch.rampup_in_tokens = true;
        args
    };
    let err = run(&alone).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::InvalidSetting {
                name: "rampup_in_tokens",
                ..
            })
        ),
        "{err}"
    );
}
