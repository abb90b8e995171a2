//! Several sources in one run (`adabatch::Sources`): every source exactly once per
//! source epoch, per-step counts that sum to the global batch and track the
//! weights within one example, the same global batches on any number of ranks,
//! resume equal to the uninterrupted run, and the engine's per-source logs.

use crate::common;

use adabatch::adapt::schedule::BatchLimits;
use adabatch::data::planner::{PlannerState, RunLength, StepPlanner};
use adabatch::data::sampler::GlobalBatchSampler;
use adabatch::data::source_spec::{MixUnit, SourceSpec};
use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;
use adabatch::{AdaptiveTrainer, CheckpointError, DataError, SettingsError};
use adabatch::{
    CurriculumMixer, Error, Mixer, OnlineMixer, ScheduleSpec, SourceStats, Sources, StepLog,
    StoppingStrategy,
};
use common::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    spec: SourceSpec,
    per_device: usize,
    epochs: usize,
    seed: u64,
    drop_last: bool,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((1usize..50, 0u32..5), 1..4),
        (10usize..80, 1u32..5),
        (1usize..9, 1usize..3, any::<u64>(), any::<bool>()),
    )
        .prop_map(
            |(others, (primary, w0), (per_device, epochs, seed, drop_last))| {
                let mut sizes = vec![primary];
                let mut weights = vec![f64::from(w0)];
                for (size, w) in others {
                    sizes.push(size);
                    weights.push(f64::from(w));
                }
                Case {
                    spec: SourceSpec {
                        names: (0..sizes.len()).map(|s| format!("s{s}")).collect(),
                        tokens: sizes.iter().map(|&n| n as u64).collect(),
                        sizes,
                        weights,
                        stopping: StoppingStrategy::Primary,
                        unit: MixUnit::Examples,
                    },
                    per_device,
                    epochs,
                    seed,
                    drop_last,
                }
            },
        )
}

/// A planner on `world` ranks whose per-device sizes count `units` ranks (a run
/// resumed on another number of ranks keeps the checkpoint's global batches).
fn planner_on(c: &Case, world: usize, units: usize) -> StepPlanner<ScheduleSpec> {
    try_planner(c, world, units).unwrap()
}

/// With `drop_last`, a global batch larger than the primary source is refused.
fn try_planner(
    c: &Case,
    world: usize,
    units: usize,
) -> adabatch::Result<StepPlanner<ScheduleSpec>> {
    let sampler = GlobalBatchSampler::over_sources(&c.spec, world, c.seed, true, c.drop_last)?;
    StepPlanner::new(
        sampler,
        ScheduleSpec::Constant(None),
        BatchLimits::new(1, None).unwrap(),
        c.per_device,
        RunLength::Epochs(c.epochs),
        units,
        c.drop_last,
    )
}

fn planner(c: &Case, world: usize) -> StepPlanner<ScheduleSpec> {
    planner_on(c, world, world)
}

/// The global batches of a run with the primary source's epoch of each, at most
/// `max` steps.
fn drain(p: &mut StepPlanner<ScheduleSpec>, out: &mut Vec<(usize, Vec<usize>)>, max: usize) {
    while out.len() < max {
        let Some(step) = p.next_step() else { return };
        out.push((p.sampler().epoch_index(), step.indices()));
        p.finish_step().unwrap();
    }
}

fn plan(c: &Case, world: usize) -> Vec<(usize, Vec<usize>)> {
    let mut out = Vec::new();
    drain(&mut planner(c, world), &mut out, 2_000);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_source_exactly_once_per_source_epoch(c in cases(), world in 1usize..4) {
        prop_assume!(c.spec.weights[0] > 0.0);
        if c.drop_last && c.per_device * world > c.spec.sizes[0] {
            let refused = matches!(try_planner(&c, world, world), Err(Error::Data(DataError::GlobalBatchTooLarge { .. })));
            prop_assert!(refused, "a global batch larger than the primary source with drop_last");
            return Ok(());
        }
        let steps = plan(&c, world);
        let global = c.per_device * world;
        let offsets: Vec<usize> = (0..c.spec.sizes.len()).map(|s| c.spec.offset(s)).collect();
        let mut drawn: Vec<Vec<usize>> = vec![Vec::new(); c.spec.sizes.len()];
        let mut primary_epochs: Vec<Vec<usize>> = vec![Vec::new(); c.epochs];
        for (epoch, indices) in &steps {
            prop_assert!(indices.len() <= global);
            for &i in indices {
                let (s, local) = c.spec.locate(i);
                prop_assert_eq!(offsets[s] + local, i);
                drawn[s].push(local);
                if s == 0 {
                    primary_epochs[*epoch].push(local);
                }
            }
        }
        // The primary source's epochs (a `drop_last` tail shortens them).
        let n = c.spec.sizes[0];
        for seen in &primary_epochs {
            let mut sorted = seen.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), seen.len(), "the primary repeats within an epoch");
            prop_assert!(c.drop_last || seen.len() == n);
            prop_assert!(n - seen.len() < global);
        }
        // The others cycle whole epochs.
        for (s, seq) in drawn.iter().enumerate().skip(1) {
            let n = c.spec.sizes[s];
            for chunk in seq.chunks(n) {
                let mut sorted = chunk.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), chunk.len(), "source {} repeats within an epoch", s);
                if chunk.len() == n {
                    prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
                }
            }
            if c.spec.weights[s] == 0.0 {
                prop_assert!(seq.is_empty(), "a zero-weight source gets nothing");
            }
        }
        // The primary source: exactly `epochs` passes, less a dropped tail.
        let primary = drawn[0].len();
        prop_assert!(primary <= c.epochs * c.spec.sizes[0]);
        if !c.drop_last {
            prop_assert_eq!(primary, c.epochs * c.spec.sizes[0]);
        }
        // Full steps are the global batch; only an epoch's last step is shorter.
        let short = steps.iter().filter(|s| s.1.len() < global).count();
        prop_assert!(short <= c.epochs);
        // The same global batches on one rank of the whole global batch.
        let one = plan(&Case { per_device: global, ..c.clone() }, 1);
        prop_assert_eq!(&one, &steps);
    }

    #[test]
    fn counts_track_the_weights_within_one_example(c in cases()) {
        prop_assume!(c.spec.weights[0] > 0.0);
        prop_assume!(!c.drop_last || c.per_device <= c.spec.sizes[0]);
        let total: f64 = c.spec.weights.iter().sum();
        let mut p = planner(&c, 1);
        let mut taken = vec![0usize; c.spec.sizes.len()];
        let mut wanted = 0usize;
        // Up to the primary source's first epoch end (where a batch may be cut short).
        while let Some(step) = p.next_step() {
            if step.global_size() < c.per_device || p.sampler().epoch_index() > 0 || p.epoch_complete() {
                break;
            }
            wanted += step.global_size();
            for i in step.indices() {
                taken[c.spec.locate(i).0] += 1;
            }
            for (s, &t) in taken.iter().enumerate() {
                let target = c.spec.weights[s] / total * wanted as f64;
                prop_assert!((t as f64 - target).abs() <= 1.0 + 1e-9, "source {} took {} for a target of {}", s, t, target);
            }
            p.finish_step().unwrap();
        }
    }

    #[test]
    fn resume_equals_the_uninterrupted_run_on_any_ranks(c in cases(), world in 1usize..4, cut in 1usize..15, other in 1usize..4) {
        prop_assume!(c.spec.weights[0] > 0.0);
        prop_assume!(!c.drop_last || c.per_device * world <= c.spec.sizes[0]);
        let straight = plan(&c, world);
        let mut first = planner(&c, world);
        let mut resumed = Vec::new();
        drain(&mut first, &mut resumed, cut);
        let state: PlannerState =
            serde_json::from_str(&serde_json::to_string(&first.state()).unwrap()).unwrap();
        prop_assert!(state.sources.is_some());
        // Resumed on `other` ranks: the checkpoint's global batches.
        let mut second = planner_on(&c, other, world);
        second.restore(&state);
        drain(&mut second, &mut resumed, 2_000);
        prop_assert_eq!(&resumed, &straight);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// `first_exhausted`: an epoch's only step in which a source finishes a pass is
    /// its last. `all_exhausted`: by an epoch's last step every source has finished a
    /// pass in it, and not before. Either way every source is drawn exactly once
    /// per pass, ranks agree, and resume equals the uninterrupted run.
    #[test]
    fn stopping_strategies_end_epochs_as_named(
        c in cases(),
        all in any::<bool>(),
        world in 1usize..4,
        cut in 1usize..12,
    ) {
        let mut c = c;
        c.drop_last = false;
        c.spec.stopping = if all {
            StoppingStrategy::AllExhausted
        } else {
            StoppingStrategy::FirstExhausted
        };
        if all {
            // A zero weight would never finish its pass: refused (tested below).
            c.spec.weights.iter_mut().for_each(|w| *w = w.max(1.0));
        }
        prop_assume!(c.spec.weights.iter().sum::<f64>() > 0.0);
        let steps = plan(&c, world);
        prop_assert!(steps.len() < 2_000, "the run ends");
        let n = c.spec.sizes.len();
        let mut taken = vec![0usize; n];
        let mut epoch_start = vec![0usize; n];
        for (k, (epoch, indices)) in steps.iter().enumerate() {
            let before = taken.clone();
            for &i in indices {
                taken[c.spec.locate(i).0] += 1;
            }
            let finished: Vec<bool> = (0..n)
                .map(|s| taken[s] / c.spec.sizes[s] > before[s] / c.spec.sizes[s])
                .collect();
            let last_of_epoch = match <[_]>::get(&steps, k + 1) {
                Some(next) => next.0 != *epoch,
                None => true,
            };
            if all {
                // Passes finished since the epoch began.
                let done = |s: usize| taken[s] / c.spec.sizes[s] > epoch_start[s] / c.spec.sizes[s]
                    || taken[s] - epoch_start[s] >= c.spec.sizes[s];
                prop_assert_eq!((0..n).all(done), last_of_epoch, "step {}", k + 1);
            } else {
                prop_assert_eq!(finished.iter().any(|&f| f), last_of_epoch, "step {}", k + 1);
            }
            if last_of_epoch {
                epoch_start = taken.clone();
            }
        }
        prop_assert_eq!(steps.last().map(|s| s.0 + 1), Some(c.epochs));
        // Every source: each pass a permutation of its examples.
        let mut drawn: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (_, indices) in &steps {
            for &i in indices {
                let (s, local) = c.spec.locate(i);
                drawn[s].push(local);
            }
        }
        for (s, seq) in drawn.iter().enumerate() {
            let size = c.spec.sizes[s];
            for chunk in seq.chunks(size) {
                let mut sorted = chunk.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), chunk.len(), "source {} repeats within a pass", s);
            }
        }
        let global = c.per_device * world;
        let one = plan(&Case { per_device: global, ..c.clone() }, 1);
        prop_assert_eq!(&one, &steps);
        // Resume mid-run, exhausted flags and all.
        let mut first = planner(&c, world);
        let mut resumed = Vec::new();
        drain(&mut first, &mut resumed, cut);
        let state: PlannerState =
            serde_json::from_str(&serde_json::to_string(&first.state()).unwrap()).unwrap();
        let mut second = planner(&c, world);
        second.restore(&state);
        drain(&mut second, &mut resumed, 2_000);
        prop_assert_eq!(&resumed, &steps);
    }
}

#[test]
fn stopping_strategies_refuse_what_would_never_end() {
    let spec = |stopping, weights: Vec<f64>| SourceSpec {
        names: vec!["a".into(), "b".into()],
        sizes: vec![10, 3],
        weights,
        stopping,
        unit: MixUnit::Examples,
        tokens: vec![10, 3],
    };
    let case = |spec| Case {
        spec,
        per_device: 2,
        epochs: 1,
        seed: 1,
        drop_last: false,
    };
    // `all_exhausted` with a paused source, `primary` with a paused primary.
    for (stopping, weights, paused) in [
        (StoppingStrategy::AllExhausted, vec![1.0, 0.0], "`b`"),
        (StoppingStrategy::Primary, vec![0.0, 1.0], "`a`"),
    ] {
        let err = try_planner(&case(spec(stopping, weights)), 1, 1)
            .err()
            .unwrap();
        assert!(
            matches!(&err, Error::Data(DataError::InvalidMixWeights { step: 0, reason }) if reason.contains(paused)),
            "{err}"
        );
    }
    // `first_exhausted` ends on the paused-free source: `b` (3) runs out first.
    let steps = plan(
        &case(spec(StoppingStrategy::FirstExhausted, vec![1.0, 1.0])),
        1,
    );
    assert_eq!(steps.len(), 3);
    // With drop_last, `first_exhausted` drops the short tail and restarts `b` only.
    let c = Case {
        drop_last: true,
        epochs: 2,
        per_device: 4,
        ..case(spec(StoppingStrategy::FirstExhausted, vec![1.0, 1.0]))
    };
    let steps = plan(&c, 1);
    assert!(steps.iter().all(|(_, i)| i.len() == 4));
    let a_taken: usize = steps
        .iter()
        .flat_map(|(_, i)| i.iter())
        .filter(|&&i| i < 10)
        .count();
    // `a` is not restarted at the epoch end: its pass continues into epoch 2.
    assert_eq!(a_taken, 2 * steps.len());
}

fn sources(weights: &[(&str, f64)]) -> Sources<Vec<Example>> {
    Sources::new([("new", dataset(24, 1)), ("replay", dataset(5, 2))])
        .unwrap()
        .with_weights(weights)
        .unwrap()
}

#[adaptive_trainer]
struct Mixed {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

/// Trains `T` (built from a fresh model and AdamW at 0.05) with a JSONL log, and
/// reads the log back.
fn run_as<T: AdaptiveTrainer<Model = Regression> + Send>(
    data: &Sources<Vec<Example>>,
    a: &TrainingArgs,
    build: fn(Regression, AdamW) -> T,
) -> adabatch::Result<(TrainSummary, Vec<StepLog>)> {
    let log = temp_log("mixing");
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let trained = adabatch::Run::new(data, &collate, &a).launch(|ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(build(model, opt))
    })?;
    Ok((trained.summary, read_log(&log)))
}

fn run(
    data: &Sources<Vec<Example>>,
    a: &TrainingArgs,
) -> adabatch::Result<(TrainSummary, Vec<StepLog>)> {
    run_as(data, a, Mixed::new)
}

#[test]
fn the_engine_mixes_logs_and_resumes_per_source() {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    // 2 ranks of 4: a global batch of 8, 6 from `new` and 2 from `replay`.
    let a = args(2, 4, 2);
    let (summary, logs) = run(&data, &a).unwrap();
    assert_eq!(
        summary.global_step, 8,
        "2 passes over the 24 `new` examples, 6 a step"
    );
    for l in &logs {
        let counts = l.sources.source_counts.as_ref().unwrap();
        assert_eq!((counts["new"], counts["replay"]), (6, 2), "step {}", l.step);
        let indices = l.sources.source_indices.as_ref().unwrap();
        // The sources' parts spread over the batch: each rank gets 3 `new`, 1 `replay`.
        for rank in &l.indices {
            let new: Vec<usize> = rank.iter().copied().filter(|&i| i < 24).collect();
            let replay: Vec<usize> = rank.iter().filter(|&&i| i >= 24).map(|i| i - 24).collect();
            assert_eq!((new.len(), replay.len()), (3, 1), "step {}", l.step);
        }
        let flat: Vec<usize> = l.indices.concat();
        let new: Vec<usize> = flat.iter().copied().filter(|&i| i < 24).collect();
        let replay: Vec<usize> = flat.iter().filter(|&&i| i >= 24).map(|i| i - 24).collect();
        assert_eq!(new, indices["new"]);
        assert_eq!(replay, indices["replay"]);
        assert_eq!(l.sources.mix_weights.as_ref().unwrap()["new"], 0.75);
        // The step's loss is the count-weighted mean of the sources' losses.
        let by_source = l.sources.source_loss.as_ref().unwrap();
        let (new, replay) = (by_source["new"].unwrap(), by_source["replay"].unwrap());
        let mixed = (6.0 * new + 2.0 * replay) / 8.0;
        assert!(
            (mixed - l.loss).abs() < 1e-5 * (1.0 + l.loss.abs()),
            "{mixed} vs {}",
            l.loss
        );
    }
    let last = logs.last().unwrap();
    assert_eq!(last.epoch, 2.0);
    // `replay` (5 examples) cycled: 16 taken, 3.2 passes.
    assert!((last.sources.source_epoch.as_ref().unwrap()["replay"] - 3.2).abs() < 1e-12);

    // One rank of 8: the same global batches, the same losses up to rounding.
    let (_, one) = run(&data, &args(1, 8, 2)).unwrap();
    assert_eq!(one.len(), logs.len());
    for (x, y) in one.iter().zip(&logs) {
        assert_eq!(x.indices.concat(), y.indices.concat());
        assert!(
            (x.loss - y.loss).abs() < 1e-5 * (1.0 + y.loss.abs()),
            "{} vs {}",
            x.loss,
            y.loss
        );
    }

    // Resume from step 3 on 2 ranks: the rest bit for bit.
    let out = temp_log("mixing-out").with_extension("");
    let saving = {
        let mut args = a.clone();
        args.save.save_steps = 3;
        args.save.output_dir = out.clone();
        args
    };
    run(&data, &saving).unwrap();
    let resumed_args = {
        let mut args = a.clone();
        args.save.resume_from_checkpoint = Some(out.join("checkpoint-3"));
        args.save.output_dir = out.clone();
        args
    };
    let (_, resumed) = run(&data, &resumed_args).unwrap();
    assert_eq!(resumed.len(), logs.len() - 3);
    for (r, s) in resumed.iter().zip(&logs[3..]) {
        assert_eq!((&r.indices, &r.sources), (&s.indices, &s.sources));
        assert_eq!(r.loss.to_bits(), s.loss.to_bits(), "step {}", r.step);
    }
    // Other weights on resume: refused, naming them.
    let other = {
        let mut args = resumed_args;
        args.data.mix_weights = vec!["new=0.5".into(), "replay=0.5".into()];
        args
    };
    let err = run(&data, &other).unwrap_err();
    assert!(err.to_string().contains("mixing weights"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn mix_weights_flag_and_mistakes() {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    // `--mix-weights` replaces the dataset's weights; a zero-weight source gets nothing.
    let only_new = {
        let mut a = args(1, 4, 1);
        a.data.mix_weights = vec!["new=1".into()];
        a
    };
    let (_, logs) = run(&data, &only_new).unwrap();
    assert!(logs
        .iter()
        .all(|l| l.sources.source_counts.as_ref().unwrap()["replay"] == 0));
    for (weights, needle) in [
        (vec!["old=1".to_string()], "unknown source `old`"),
        (vec!["new=nan".to_string()], "not a finite number"),
        (vec!["new".to_string()], "source=weight"),
        (vec!["new=0".to_string()], "all weights are 0"),
    ] {
        let a = {
            let mut a = args(1, 4, 1);
            a.data.mix_weights = weights;
            a
        };
        let err = run(&data, &a).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
    // Mixing and length-aware batching divide the batch two ways.
    let a = {
        let mut a = args(1, 4, 1);
        a.length_aware.max_tokens_per_batch = Some(40);
        a
    };
    let err = run(&data, &a).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ConflictingSettings { .. })
        ),
        "{err}"
    );
}

#[adaptive_trainer]
struct Online {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: OnlineMixer,
}

fn run_online(
    data: &Sources<Vec<Example>>,
    a: &TrainingArgs,
) -> adabatch::Result<(TrainSummary, Vec<StepLog>)> {
    run_as(data, a, |model, opt| {
        // No warm-up: the tilt from the first step (the default waits 40 % of the run).
        Online::new(
            model,
            opt,
            OnlineMixer::new(1.0, 0.1, 0.5).unwrap().with_warmup(0),
        )
    })
}

/// The online mixer moves the batch towards the source whose loss stays high,
/// never below its floor, the same on every rank and across a resume.
#[test]
fn the_online_mixer_follows_the_per_source_loss() {
    // `hard`: the same inputs with targets 3 times larger, so a larger loss.
    let easy = dataset(40, 1);
    let hard: Vec<Example> = dataset(40, 2)
        .into_iter()
        .map(|e| Example { y: 3.0 * e.y, ..e })
        .collect();
    let data = Sources::new([("easy", easy), ("hard", hard)]).unwrap();
    let a = args(2, 4, 3);
    let (_, logs) = run_online(&data, &a).unwrap();
    let weight = |l: &StepLog| l.sources.mix_weights.as_ref().unwrap()["hard"];
    assert_eq!(weight(&logs[0]), 0.5, "sized alike: equal weights at first");
    // Within the floor (0.1 over 2 sources: 0.05 each) on every step, and mostly
    // towards `hard`, whose loss stays higher until it is learned.
    let weights: Vec<f64> = logs.iter().map(weight).collect();
    assert!(
        weights
            .iter()
            .all(|&w| (0.05 - 1e-9..=0.95 + 1e-9).contains(&w)),
        "{weights:?}"
    );
    assert!(weights[1] > 0.9, "after one step: {weights:?}");
    assert!(weights.iter().sum::<f64>() / weights.len() as f64 > 0.5);
    // The counts follow the weights: `hard` got more of the run.
    let taken = |name: &str| -> usize {
        logs.iter()
            .map(|l| l.sources.source_counts.as_ref().unwrap()[name])
            .sum()
    };
    assert!(taken("hard") > taken("easy"));

    // The mixer shows its reasoning: each step's record holds the smoothed losses
    // it decided the next weights from, the average (smoothing 0.5) of the
    // logged per-source losses, read back from the JSONL log.
    let mut smoothed: [Option<f64>; 2] = [None, None];
    for log in &logs {
        let losses = log.sources.source_loss.as_ref().unwrap();
        let diagnostics = &log.sources.mixer.as_ref().expect("the mixer's record")["smoothed_loss"];
        for (slot, name) in smoothed.iter_mut().zip(["easy", "hard"]) {
            if let Some(loss) = losses[name] {
                *slot = Some(slot.map_or(loss, |avg| 0.5 * avg + 0.5 * loss));
            }
            match *slot {
                Some(want) => {
                    let got = diagnostics[name].as_f64().unwrap();
                    assert!(
                        (got - want).abs() <= 1e-12 * want.abs(),
                        "step {}: {got} vs {want}",
                        log.step
                    );
                }
                None => assert!(diagnostics[name].is_null(), "step {}", log.step),
            }
        }
    }

    // One rank of 8: the same weights and batches.
    let (_, one) = run_online(&data, &args(1, 8, 3)).unwrap();
    assert_eq!(one.len(), logs.len());
    for (x, y) in one.iter().zip(&logs) {
        assert_eq!(x.indices.concat(), y.indices.concat(), "step {}", x.step);
    }

    // Resume: the mixer's state travels in the checkpoint.
    let out = temp_log("mixing-online-out").with_extension("");
    let saving = {
        let mut args = a.clone();
        args.save.save_steps = 4;
        args.save.output_dir = out.clone();
        args
    };
    run_online(&data, &saving).unwrap();
    let resumed_args = {
        let mut args = a;
        args.save.resume_from_checkpoint = Some(out.join("checkpoint-4"));
        args.save.output_dir = out.clone();
        args
    };
    let (_, resumed) = run_online(&data, &resumed_args).unwrap();
    assert_eq!(resumed.len(), logs.len() - 4);
    for (r, s) in resumed.iter().zip(&logs[4..]) {
        assert_eq!((&r.indices, &r.sources), (&s.indices, &s.sources));
        assert_eq!(r.loss.to_bits(), s.loss.to_bits(), "step {}", r.step);
    }

    // The checkpoint keeps each controller's entry by name, versioned.
    let dir = out.join("checkpoint-4");
    let path = dir.join("adabatch_state.json");
    let written = std::fs::read_to_string(&path).unwrap();
    let state: serde_json::Value = serde_json::from_str(&written).unwrap();
    let mixer = &state["controllers"]["mixer"];
    assert_eq!(mixer["version"], 1, "{state}");
    assert!(mixer["state"]["smoothed"].is_array(), "{mixer}");
    // Written as an older adabatch wrote it (flat keys, the mixer's bare list):
    // it resumes alike.
    let mut legacy = state.clone();
    let object = legacy.as_object_mut().unwrap();
    let controllers = object.remove("controllers").unwrap();
    for (name, entry) in controllers.as_object().unwrap() {
        let key = if name == "oom" {
            "oom_events"
        } else {
            name.as_str()
        };
        let value = match name.as_str() {
            "mixer" => entry["state"]["smoothed"].clone(),
            _ => entry["state"].clone(),
        };
        object.insert(key.to_string(), value);
    }
    let edit = |json: &serde_json::Value| {
        std::fs::write(&path, json.to_string()).unwrap();
        adabatch::train::checkpoint::write_manifest(&dir).unwrap();
    };
    edit(&legacy);
    let (_, from_legacy) = run_online(&data, &resumed_args).unwrap();
    assert_eq!(from_legacy.len(), resumed.len());
    for (r, s) in from_legacy.iter().zip(&resumed) {
        assert_eq!((&r.indices, &r.sources), (&s.indices, &s.sources));
        assert_eq!(r.loss.to_bits(), s.loss.to_bits(), "step {}", r.step);
    }
    // An entry of a version this adabatch does not know is refused, named.
    let mut future = state.clone();
    future["controllers"]["mixer"]["version"] = 7.into();
    edit(&future);
    let err = run_online(&data, &resumed_args).unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(CheckpointError::ControllerState { name, .. }) if name == "mixer"),
        "{err}"
    );
    assert!(err.to_string().contains("version 7"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

/// A mixer returning NaN.
struct Broken;

impl Mixer for Broken {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        let mut w = stats.weights.to_vec();
        if stats.step == 3 {
            w[0] = f64::NAN;
        }
        w
    }
}

#[adaptive_trainer]
struct BrokenMix {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: Broken,
}

#[test]
fn bad_mixer_weights_name_the_step_and_a_mixer_needs_sources() {
    let factory = |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
        Ok(BrokenMix::new(model, opt, Broken))
    };
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let err = BrokenMix::launch(&data, &collate, &args(2, 4, 2), factory).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Data(DataError::InvalidMixWeights { step: 3, .. })
        ),
        "{err}"
    );
    let err = BrokenMix::launch(&dataset(10, 1), &collate, &args(1, 4, 1), factory).unwrap_err();
    assert!(
        matches!(err, Error::Data(DataError::MixerWithoutSources)),
        "{err}"
    );
}

#[adaptive_trainer]
struct Budgeted {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: adabatch::ReplayBudget<OnlineMixer>,
}

/// A replay budget caps the old sources' share of every step on every rank; one
/// whose new source is not among the run's is refused before the first step
/// (it would take every source for old and cap the whole mixture).
#[test]
fn a_replay_budget_caps_the_old_sources_and_refuses_unknown_names() {
    let data = sources(&[("new", 0.5), ("replay", 0.5)]);
    // The online mixer wants more of the harder source; the budget caps `replay`.
    fn budgeted(model: Regression, opt: AdamW, new: &str) -> Budgeted {
        let mixer = adabatch::ReplayBudget::new(
            OnlineMixer::new(0.1, 0.0, 0.0).unwrap().with_warmup(0),
            [new],
            0.2,
        );
        Budgeted::new(model, opt, mixer.expect("a budget in range"))
    }
    let out = temp_log("mixing-budget-out").with_extension("");
    let mut saving = args(2, 4, 2);
    (saving.save.save_steps, saving.save.output_dir) = (3, out.clone());
    let (_, logs) = run_as(&data, &saving, |m, o| budgeted(m, o, "new")).unwrap();
    for log in &logs {
        let weights = log.sources.mix_weights.as_ref().unwrap();
        let total: f64 = weights.values().sum();
        assert!(
            weights["replay"] / total <= 0.2 + 1e-12,
            "step {}: {weights:?}",
            log.step
        );
    }
    let err = run_as(&data, &args(2, 4, 2), |m, o| budgeted(m, o, "nwe")).unwrap_err();
    assert!(
        matches!(&err, Error::Settings(SettingsError::MixerSources { reason, .. }) if reason.contains("nwe")),
        "{err}"
    );
    // A resumed run checks them too, before its first step.
    let mut resumed = args(2, 4, 2);
    resumed.save.resume_from_checkpoint = Some(out.join("checkpoint-3"));
    resumed.save.output_dir = out.clone();
    let err = run_as(&data, &resumed, |m, o| budgeted(m, o, "nwe")).unwrap_err();
    assert!(
        matches!(&err, Error::Settings(SettingsError::MixerSources { .. })),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// An eval set of several sources reports each source's loss beside the whole.
#[test]
fn eval_reports_each_sources_loss() {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let eval = Sources::new([("new", dataset(7, 8)), ("replay", dataset(3, 9))]).unwrap();
    let summary = Mixed::launch_with_eval(
        &data,
        &eval,
        &collate,
        &args(2, 4, 1),
        |ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
            Ok(Mixed::new(model, opt))
        },
    )
    .unwrap()
    .summary;
    let last = summary.final_eval().unwrap();
    let (new, replay) = (
        last.get("eval_new_loss").unwrap(),
        last.get("eval_replay_loss").unwrap(),
    );
    let whole = (7.0 * new + 3.0 * replay) / 10.0;
    assert!(
        (whole - last.eval_loss).abs() < 1e-9 * (1.0 + whole),
        "{whole} vs {}",
        last.eval_loss
    );
    assert_eq!(last.eval_examples, 10);
}

#[adaptive_trainer(mix = fixed(new = 0.5, replay = 0.5))]
struct Halves {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

#[adaptive_trainer(mix = fixed(new = 1, old = 1))]
struct Misnamed {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

#[adaptive_trainer(mix = online(temperature = 1.0, floor = 0.1, smoothing = 0.5, warmup = 0))]
struct DslOnline {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

fn adam(ctx: &RankContext) -> adabatch::Result<(Regression, AdamW)> {
    let model = Regression::new(ctx.parameters(), ctx.device())?;
    let opt = AdamW::new(
        model.params.all_vars(),
        ParamsAdamW {
            lr: 0.05,
            ..Default::default()
        },
    )?;
    Ok((model, opt))
}

/// `mix = fixed(..)` replaces the dataset's weights, names checked before the first
/// step; `mix = online(..)` is the engine's `OnlineMixer`, the same as a `#[mixer]`.
#[test]
fn the_mix_key() {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let log = temp_log("mix-key");
    let a = {
        let mut a = args(2, 4, 1);
        a.logging.log_jsonl = Some(log.clone());
        a
    };
    Halves::launch(&data, &collate, &a, |ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(Halves::new(model, opt))
    })
    .unwrap();
    for l in read_log(&log) {
        let counts = l.sources.source_counts.unwrap();
        assert_eq!((counts["new"], counts["replay"]), (4, 4), "step {}", l.step);
    }

    let err = Misnamed::launch(&data, &collate, &a, |ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(Misnamed::new(model, opt))
    })
    .map(|t| t.summary)
    .unwrap_err();
    assert!(
        matches!(&err, Error::Data(DataError::UnknownSource { name, .. }) if name == "old"),
        "{err}"
    );
    assert!(err.to_string().contains(r#"["new", "replay"]"#), "{err}");

    // The DSL's online mixer and a `#[mixer]` with the same settings agree.
    let hard = easy_and_hard();
    let log = temp_log("mix-online-key");
    let b = {
        let mut a = args(2, 4, 3);
        a.logging.log_jsonl = Some(log.clone());
        a
    };
    DslOnline::launch(&hard, &collate, &b, |ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(DslOnline::new(model, opt))
    })
    .unwrap();
    let (_, by_field) = run_online(&hard, &args(2, 4, 3)).unwrap();
    let by_key = read_log(&log);
    assert_eq!(by_key.len(), by_field.len());
    for (k, f) in by_key.iter().zip(&by_field) {
        assert_eq!((&k.indices, &k.sources), (&f.indices, &f.sources));
    }

    // A mix on a dataset of one source.
    let err = Halves::launch(
        &dataset(10, 1),
        &collate,
        &args(1, 2, 1),
        |ctx: &RankContext| {
            let (model, opt) = adam(ctx)?;
            Ok(Halves::new(model, opt))
        },
    )
    .map(|t| t.summary)
    .unwrap_err();
    assert!(
        matches!(err, Error::Data(DataError::MixerWithoutSources)),
        "{err}"
    );
}

/// Two sources alike but for `hard`'s targets, 3 times larger: a larger loss.
fn easy_and_hard() -> Sources<Vec<Example>> {
    Sources::new([
        ("easy", dataset(40, 1)),
        (
            "hard",
            dataset(40, 2)
                .into_iter()
                .map(|e| Example { y: 3.0 * e.y, ..e })
                .collect(),
        ),
    ])
    .unwrap()
}

#[adaptive_trainer(mix = online(temperature = 1.0, floor = 0.1, smoothing = 0.5, warmup = 4))]
struct WarmOnline {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

#[adaptive_trainer(mix = fixed(easy = 1, hard = 1))]
struct EvenMix {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

/// `mix = online(warmup = 4)`: the first 4 steps at equal shares, drawing exactly
/// the batches a run at fixed equal weights draws; from step 5 the same weights
/// as a `#[mixer]` of `OnlineMixer::with_warmup(4)`, whose losses were averaged
/// through the warm-up.
#[test]
fn an_online_warm_up_trains_at_equal_shares_first() {
    let hard = easy_and_hard();
    let log = temp_log("mix-online-warmup");
    let mut a = args(2, 4, 3);
    a.logging.log_jsonl = Some(log.clone());
    WarmOnline::launch(&hard, &collate, &a, |ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(WarmOnline::new(model, opt))
    })
    .unwrap();
    let by_key = read_log(&log);
    let (_, cold) = run_online(&hard, &args(2, 4, 3)).unwrap();
    let (_, by_field) = run_as(&hard, &args(2, 4, 3), |model, opt| {
        Online::new(
            model,
            opt,
            OnlineMixer::new(1.0, 0.1, 0.5).unwrap().with_warmup(4),
        )
    })
    .unwrap();
    let even_log = temp_log("mix-even");
    let mut even = args(2, 4, 3);
    even.logging.log_jsonl = Some(even_log.clone());
    EvenMix::launch(&hard, &collate, &even, |ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(EvenMix::new(model, opt))
    })
    .unwrap();
    let even = read_log(&even_log);
    assert!(by_key.len() > 8, "{} steps", by_key.len());
    for (k, e) in by_key[..4].iter().zip(&even) {
        assert_eq!(
            (&k.indices, k.loss),
            (&e.indices, e.loss),
            "step {}",
            k.step
        );
    }
    assert_ne!(by_key[5].indices, even[5].indices, "then it tilts");
    let hard_weight = |l: &StepLog| l.sources.mix_weights.as_ref().unwrap()["hard"];
    for l in &by_key[..4] {
        assert_eq!(hard_weight(l), 0.5, "step {}", l.step);
    }
    assert!(
        hard_weight(&by_key[4]) > 0.5,
        "step 5 tilts to the harder source"
    );
    // Without the warm-up the mixer has tilted by step 2.
    assert!(hard_weight(&cold[1]) > 0.5);
    for (k, f) in by_key.iter().zip(&by_field) {
        assert_eq!((&k.indices, &k.sources), (&f.indices, &f.sources));
    }
}

#[adaptive_trainer(mix = online)]
struct TwoMixers {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: OnlineMixer,
}

#[test]
fn a_mix_key_and_a_mixer_field_conflict() {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let err = TwoMixers::launch(&data, &collate, &args(1, 4, 1), |ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(TwoMixers::new(model, opt, OnlineMixer::default()))
    })
    .map(|t| t.summary)
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ConflictingSettings {
                second: "#[mixer]",
                ..
            })
        ),
        "{err}"
    );
}

/// (step, step of the last evaluation) of every call.
type Calls = std::sync::Arc<std::sync::Mutex<Vec<(usize, Option<usize>)>>>;

/// Records the evaluation each call saw.
struct Watching(Calls);

impl Mixer for Watching {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        assert!(stats.positions.iter().zip(stats.sizes).all(|(p, n)| p <= n));
        self.0
            .lock()
            .unwrap()
            .push((stats.step, stats.last_eval.map(|e| e.step)));
        stats.weights.to_vec()
    }
}

#[adaptive_trainer]
struct Watched {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: Watching,
}

#[test]
fn a_mixer_sees_the_last_evaluation() {
    let seen: Calls = std::sync::Arc::default();
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let eval = Sources::new([("new", dataset(4, 8)), ("replay", dataset(2, 9))]).unwrap();
    let a = {
        let mut a = args(1, 8, 1);
        a.eval.eval_steps = Some(2);
        a
    };
    Watched::launch_with_eval(&data, &eval, &collate, &a, |ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(Watched::new(
            model,
            opt,
            Watching(std::sync::Arc::clone(&seen)),
        ))
    })
    .unwrap();
    // Asked before step 1, then after every step; 24 `new` examples, 6 a step: 4
    // steps; evaluations after steps 2 and 4.
    assert_eq!(
        *seen.lock().unwrap(),
        [(0, None), (1, None), (2, None), (3, Some(2)), (4, Some(2))]
    );
}

#[adaptive_trainer]
struct Bounded {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: adabatch::BoundedReplay,
}

/// A bounded replay's run over `new` and `replay`, evaluated every 2 steps, whose
/// evaluations find `replay` far past its bound (its reference loss is tiny):
/// `replay`'s share at each step of the uninterrupted run, after checking that
/// the run resumed from its checkpoint at step 5 (between evaluations) goes on
/// exactly as the uninterrupted one.
fn bounded_shares_resumed_exactly(
    name: &str,
    (resume_at, max_steps): (usize, Option<usize>),
    mixer: impl Fn() -> adabatch::Result<adabatch::BoundedReplay> + Sync,
) -> (Vec<(usize, f64, f64)>, Option<adabatch::ClosingSummary>) {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let eval = Sources::new([("new", dataset(4, 8)), ("replay", dataset(2, 9))]).unwrap();
    let out = temp_log(&format!("{name}-out")).with_extension("");
    let run = |a: &TrainingArgs| -> (Vec<StepLog>, adabatch::TrainSummary) {
        let log = temp_log(name);
        let mut a = a.clone();
        a.logging.log_jsonl = Some(log.clone());
        a.eval.eval_steps = Some(2);
        // For a rule that reads a held-out set (the others never ask).
        a.eval.mixer_eval_examples = Some(3);
        a.save.output_dir = out.clone();
        let trained = Bounded::launch_with_eval(&data, &eval, &collate, &a, |ctx: &RankContext| {
            let (model, opt) = adam(ctx)?;
            Ok(Bounded::new(model, opt, mixer()?))
        })
        .unwrap();
        (read_log(&log), trained.summary)
    };
    let mut saving = args(2, 4, 3);
    saving.length.max_steps = max_steps;
    if max_steps.is_some() {
        saving.lr.lr_scheduler_type = adabatch::LrSchedulerType::Linear;
    }
    saving.save.save_steps = resume_at;
    let (full, summary) = run(&saving);
    let mut resumed = saving.clone();
    resumed.save.save_steps = args(2, 4, 3).save.save_steps;
    resumed.save.resume_from_checkpoint = Some(out.join(format!("checkpoint-{resume_at}")));
    let after: Vec<StepLog> = (run(&resumed).0.into_iter())
        .filter(|l| l.step > resume_at)
        .collect();
    assert_eq!(after.len(), full.len() - resume_at);
    for (r, f) in after.iter().zip(&full[resume_at..]) {
        assert_eq!(
            (r.step, &r.sources.mix_weights, r.loss),
            (f.step, &f.sources.mix_weights, f.loss)
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    let share = |l: &StepLog| {
        let w = l.sources.mix_weights.as_ref().unwrap();
        w["replay"] / w.values().sum::<f64>()
    };
    let steps = (full.iter())
        .map(|l| (l.step, share(l), l.learning_rate))
        .collect();
    (steps, summary.closing)
}

/// The doubling: `replay`'s share doubles once per evaluation read, and a run
/// resumed between evaluations goes on exactly as the uninterrupted one (its
/// state: the share and the last evaluation read).
#[test]
fn a_bounded_replay_doubles_once_per_evaluation_and_resumes_exactly() {
    let (steps, _) = bounded_shares_resumed_exactly("mixing-bounded", (5, None), || {
        adabatch::BoundedReplay::new(["new"], [("replay".to_string(), 1e-9)], 0.05, 0.5)?
            .with_doubling()
            .with_closing(0.0, 1)
    });
    let shares: Vec<f64> = steps.iter().map(|s| s.1).collect();
    assert!(
        (shares[0] - adabatch::BoundedReplay::FIRST_REPLAY).abs() < 1e-12,
        "{shares:?}"
    );
    for pair in shares.windows(2) {
        let ratio = pair[1] / pair[0];
        assert!(
            (ratio - 1.0).abs() < 1e-9 || (ratio - 2.0).abs() < 1e-9 || pair[1] == 0.5,
            "{shares:?}"
        );
    }
    let doublings = shares.windows(2).filter(|p| p[1] > p[0]).count();
    let evaluations = shares.len() / 2;
    assert!(
        doublings >= 2 && doublings <= evaluations,
        "{doublings} doublings over {} steps: {shares:?}",
        shares.len()
    );
}

/// The drift-following rule with a start and a finish, through the engine: 20 %
/// replayed for the first 2 steps, then `replay`'s own share from its drift (0
/// before an evaluation is read; far past the bound: the cap, 0.5), none from
/// step 8 on; resumed exactly (the rule's per-domain shares are in the checkpoint).
#[test]
fn a_drift_following_replay_with_a_start_and_a_finish_resumes_exactly() {
    let (steps, _) = bounded_shares_resumed_exactly("mixing-following", (5, None), || {
        adabatch::BoundedReplay::new(["new"], [("replay".to_string(), 1e-9)], 0.05, 0.5)?
            .with_gain(0.04)?
            .with_closing(0.0, 1)?
            .with_start(0.2, 2)?
            .with_finish(0.0, 8)
    });
    assert!(steps.len() >= 9, "{} steps", steps.len());
    // Step 3's weights are decided before the evaluation after step 2: the rule
    // has read none yet, and its share starts at 0.
    let expected = |step: usize| match step {
        1 | 2 => 0.2,
        4..=7 => 0.5,
        _ => 0.0,
    };
    for &(step, share, _) in &steps {
        assert!(
            (share - expected(step)).abs() < 1e-12,
            "step {step}: {steps:?}"
        );
    }
}

/// The drift-following rule on a held-out set read after every 3 steps: no
/// replay until the first reading (after step 3, read with that step's
/// statistics: step 4's weights follow it), then the cap; evaluations, every 2
/// steps, are not read; resumed exactly.
#[test]
fn a_bounded_replay_on_a_held_out_set_reads_it_every_few_steps_and_resumes_exactly() {
    let (steps, _) = bounded_shares_resumed_exactly("mixing-held-out", (5, None), || {
        adabatch::BoundedReplay::new(["new"], [("replay".to_string(), 1e-9)], 0.05, 0.5)?
            .with_gain(0.04)?
            .with_closing(0.0, 1)?
            .with_start(0.0, 0)?
            .with_held_out(3)
    });
    assert!(steps.len() >= 9, "{} steps", steps.len());
    for &(step, share, _) in &steps {
        let expected = if step <= 3 { 0.0 } else { 0.5 };
        assert!((share - expected).abs() < 1e-12, "step {step}: {steps:?}");
    }
}

/// The default rule with its closing, its cap all of the 9 planned steps, in
/// rounds of 2: `replay` stays far past its bound, so the run goes on with
/// `replay` alone for 9 more steps (rounds of 2, 2, 2, 2, 1) and ends at its
/// cap; resumed from step 12, in the middle of the second round, it goes on
/// exactly as the uninterrupted run.
#[test]
fn a_bounded_replays_closing_replays_alone_up_to_its_cap_and_resumes_exactly() {
    let (steps, closing) = bounded_shares_resumed_exactly("mixing-closing", (12, Some(9)), || {
        adabatch::BoundedReplay::new(["new"], [("replay".to_string(), 1e-9)], 0.05, 0.5)?
            .with_closing(1.0, 2)
    });
    assert_eq!(steps.len(), 18, "9 planned steps and 9 closing: {steps:?}");
    assert!(
        (steps[..9].iter()).all(|&(_, share, _)| share < 1.0),
        "{steps:?}"
    );
    assert!(
        (steps[9..].iter()).all(|&(_, share, _)| share == 1.0),
        "{steps:?}"
    );
    // Each round at the rates of the schedule's last steps again, at the
    // planned run's mean step: the linear decay from 0.05 two and one ninths of
    // the run before its end (the last round, of 1: one ninth).
    let rate = |step: usize| steps[step - 1].2;
    let (two, one) = (0.05 * 2.0 / 9.0, 0.05 / 9.0);
    for round in [10, 12, 14, 16] {
        assert!((rate(round) - two).abs() < 1e-12, "{steps:?}");
        assert!((rate(round + 1) - one).abs() < 1e-12, "{steps:?}");
    }
    assert!((rate(18) - one).abs() < 1e-12, "{steps:?}");
    // The summary counts the closing and says that its cap ended it.
    let closing = closing.unwrap();
    // (A run in examples counts no tokens.)
    assert_eq!(
        (closing.steps, closing.tokens, closing.capped),
        (9, 0, true)
    );
}

#[adaptive_trainer]
struct Curriculum {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: CurriculumMixer,
}

/// A curriculum: all `new` at first, half and half after 48 examples; the logged
/// weights follow it from the first step on.
#[test]
fn a_curriculum_mixer_follows_its_schedule() {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let curriculum =
        || CurriculumMixer::new(vec![(0, vec![1.0, 0.0]), (48, vec![0.5, 0.5])]).unwrap();
    let (_, logs) = run_as(&data, &args(1, 8, 2), |model, opt| Curriculum {
        model,
        opt,
        mixer: CurriculumMixer::new(vec![(0, vec![1.0, 0.0]), (48, vec![0.5, 0.5])])
            .expect("a valid curriculum"),
    })
    .unwrap();
    let mut consumed = 0;
    for l in &logs {
        let expected = curriculum().at(consumed);
        let logged = l.sources.mix_weights.as_ref().unwrap();
        assert!(
            (logged["new"] - expected[0] / (expected[0] + expected[1])).abs() < 1e-12,
            "step {}",
            l.step
        );
        consumed += l.global_batch;
    }
    assert_eq!(logs[0].sources.source_counts.as_ref().unwrap()["replay"], 0);
    assert!(logs.last().unwrap().sources.source_counts.as_ref().unwrap()["replay"] >= 3);
}

/// All of the batch from `replay` for the first three steps, then all from `new`
/// (the mixer sees the step just taken; step 0 decides the first step).
fn switch_after_three(stats: &adabatch::SourceStats) -> Vec<f64> {
    assert_eq!(stats.names, ["new", "replay"]);
    if stats.step < 3 {
        vec![1e-9, 1.0]
    } else {
        vec![1.0, 0.0]
    }
}

/// Pauses the primary source for good: a run in epochs would never end.
fn starve_the_primary(stats: &adabatch::SourceStats) -> Vec<f64> {
    if stats.step < 2 {
        vec![1.0, 1.0]
    } else {
        vec![0.0, 1.0]
    }
}

#[adaptive_trainer(mix = custom(starve_the_primary))]
struct Starving {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

#[adaptive_trainer(mix = custom(switch_after_three))]
struct Switching {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

/// `mix = custom(path)`: the function decides every step's weights, on any number
/// of ranks alike, and resumes (it has no state of its own).
#[test]
fn a_custom_mix_function_decides_the_weights() {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let mut logs = Vec::new();
    for world in [1, 2] {
        let (_, log) = run_as(&data, &args(world, 4 / world, 1), Switching::new).unwrap();
        for l in &log {
            let counts = l.sources.source_counts.clone().unwrap();
            let expected = if l.step <= 3 { (0, 4) } else { (4, 0) };
            assert_eq!(
                (counts["new"], counts["replay"]),
                expected,
                "step {}",
                l.step
            );
        }
        logs.push(log);
    }
    assert_eq!(logs[0].len(), logs[1].len());
    for (one, two) in logs[0].iter().zip(&logs[1]) {
        assert_eq!(one.sources.source_indices, two.sources.source_indices);
    }
    // A zero weight on the primary stops a run in epochs with a typed error at
    // the step that set it; bounded by --max-steps the primary may pause.
    let err = run_as(&data, &args(1, 4, 1), Starving::new)
        .map(|(s, _)| s)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Data(DataError::InvalidMixWeights { step: 2, reason }) if reason.contains("`new`")),
        "{err}"
    );
    let bounded = {
        let mut a = args(1, 4, 1);
        a.length.max_steps = Some(6);
        a
    };
    let (summary, log) = run_as(&data, &bounded, Starving::new).unwrap();
    assert_eq!(summary.global_step, 6);
    assert_eq!(log[5].sources.source_counts.clone().unwrap()["new"], 0);
    // Together with a `#[mixer]` field it is refused: two mixers, one weight.
    let err = run_as(&data, &args(1, 4, 1), |model, opt| TwoMixers {
        model,
        opt,
        mixer: OnlineMixer::new(1.0, 0.1, 0.5).unwrap().with_warmup(0),
    })
    .map(|(s, _)| s)
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ConflictingSettings { .. })
        ),
        "{err}"
    );
}

/// `--stopping-strategy` through the engine: `all_exhausted` trains until the
/// larger source has finished its pass (oversampling the smaller), and the flag on
/// a dataset of one source is a typed error.
#[test]
fn the_stopping_strategy_flag() {
    let data = sources(&[("new", 0.5), ("replay", 0.5)]);
    let a = |stopping| {
        let mut a = args(2, 2, 1);
        a.data.stopping_strategy = Some(stopping);
        a
    };
    let (primary, _) = run(&data, &args(2, 2, 1)).unwrap();
    let (all, log) = run(&data, &a(StoppingStrategy::AllExhausted)).unwrap();
    let (first, _) = run(&data, &a(StoppingStrategy::FirstExhausted)).unwrap();
    // new: 24 examples, replay: 5, half each of a global batch of 4.
    assert_eq!(primary.global_step, 12);
    assert_eq!(all.global_step, 12);
    assert_eq!(first.global_step, 3);
    let last = log.last().unwrap();
    assert_eq!(last.epoch, 1.0);
    assert_eq!(last.sources.source_epoch.as_ref().unwrap()["new"], 1.0);
    let err = adabatch::Run::new(
        &dataset(10, 1),
        &collate,
        &a(StoppingStrategy::AllExhausted),
    )
    .launch(|ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        Ok(Mixed::new(model, opt))
    })
    .map(|t| t.summary)
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::InvalidSetting {
                name: "stopping_strategy",
                ..
            })
        ),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// The allocator under random batch sizes and random weight changes: counts sum
    /// to the batch; a zero weight takes nothing; after a change the cumulative
    /// counts converge back to within one example of the targets (a source ahead
    /// pauses until its target catches up), and stay there while the weights hold.
    #[test]
    fn counts_converge_back_after_weight_changes(
        phases in prop::collection::vec(
            (prop::collection::vec(0u32..5, 3), 1usize..10),
            1..4,
        ),
        last in prop::collection::vec(1u32..5, 3),
        sizes in prop::collection::vec(1usize..40, 1000),
    ) {
        use adabatch::data::mixture::Mixture;
        let mut mixture = Mixture::new(3);
        let mut step = 0;
        let mut sizes = sizes.into_iter();
        let within_one = |m: &Mixture| {
            m.seen().iter().zip(m.targets()).all(|(&s, &t)| (s as f64 - t).abs() <= 1.0 + 1e-9)
        };
        // Earlier phases: any weights (not all zero), a few steps each.
        let mut history = 0;
        for (weights, steps) in &phases {
            let weights: Vec<f64> = weights.iter().map(|&w| f64::from(w)).collect();
            prop_assume!(weights.iter().sum::<f64>() > 0.0);
            for _ in 0..*steps {
                step += 1;
                let global = sizes.next().unwrap();
                history += global;
                let counts = mixture.allocate(step, global, &weights).unwrap();
                prop_assert_eq!(counts.iter().sum::<usize>(), global);
                for (c, w) in counts.iter().zip(&weights) {
                    prop_assert!(*w > 0.0 || *c == 0, "a zero weight took {}", c);
                }
            }
        }
        // The last phase holds positive weights (each at least 1/9 of the total)
        // long enough to catch up with everything the earlier phases took.
        let weights: Vec<f64> = last.iter().map(|&w| f64::from(w)).collect();
        let mut converged_at = None;
        let mut taken_last = 0;
        for global in sizes.by_ref() {
            step += 1;
            taken_last += global;
            let counts = mixture.allocate(step, global, &weights).unwrap();
            prop_assert_eq!(counts.iter().sum::<usize>(), global);
            match converged_at {
                Some(at) => prop_assert!(within_one(&mixture), "diverged again after step {}", at),
                None if within_one(&mixture) => converged_at = Some(step),
                None => {}
            }
            if taken_last > 9 * history + 40 {
                break;
            }
        }
        prop_assert!(converged_at.is_some(), "never converged: {:?} vs {:?}", mixture.seen(), mixture.targets());
    }
}

/// Random lengths (1 to 39 tokens) for every example of `c`, seeded, and `c`'s
/// weights made shares of those tokens.
fn in_tokens(c: &mut Case, seed: u64) -> std::sync::Arc<[usize]> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let lengths: Vec<usize> = (0..c.spec.sizes.iter().sum::<usize>())
        .map(|_| rng.random_range(1..40))
        .collect();
    c.spec.unit = MixUnit::Tokens;
    c.spec.tokens = (0..c.spec.sizes.len())
        .map(|s| {
            let start = c.spec.offset(s);
            lengths[start..start + c.spec.sizes[s]]
                .iter()
                .map(|&l| l as u64)
                .sum()
        })
        .collect();
    lengths.into()
}

/// Weights as shares of tokens and a run length in tokens: `cases()` with a random
/// length per example, and a budget of `tenths / 10` of all the tokens.
fn token_planner(
    c: &Case,
    lengths: &std::sync::Arc<[usize]>,
    budget: u64,
    (world, units): (usize, usize),
) -> StepPlanner<ScheduleSpec> {
    let sampler = GlobalBatchSampler::over_sources(&c.spec, world, c.seed, true, false).unwrap();
    StepPlanner::new(
        sampler,
        ScheduleSpec::Constant(None),
        BatchLimits::new(1, None).unwrap(),
        c.per_device,
        RunLength::Tokens(budget),
        units,
        false,
    )
    .unwrap()
    .with_lengths(lengths.clone())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn token_shares_and_a_token_budget_keep_every_document_once(
        c in cases(),
        length_seed in any::<u64>(),
        tenths in 1u64..30,
        world in 1usize..4,
        cut in 1usize..10,
        other in 1usize..4,
    ) {
        let mut c = c;
        c.drop_last = false;
        c.spec.weights.iter_mut().for_each(|w| *w = w.max(1.0));
        let lengths = in_tokens(&mut c, length_seed);
        let budget = lengths.iter().sum::<usize>() as u64 * tenths / 10;
        let mut steps = Vec::new();
        drain(&mut token_planner(&c, &lengths, budget, (world, world)), &mut steps, 5_000);
        // The step that reaches the budget is the last.
        let tokens: Vec<u64> = steps
            .iter()
            .map(|(_, step)| step.iter().map(|&i| lengths[i] as u64).sum())
            .collect();
        let trained: u64 = tokens.iter().sum();
        prop_assert!(trained >= budget);
        prop_assert!(trained - tokens.last().copied().unwrap_or(0) < budget);
        // Every source's passes are permutations of it.
        let mut drawn: Vec<Vec<usize>> = vec![Vec::new(); c.spec.sizes.len()];
        for (_, indices) in &steps {
            for &i in indices {
                let (s, local) = c.spec.locate(i);
                drawn[s].push(local);
            }
        }
        for (s, seq) in drawn.iter().enumerate() {
            for pass in seq.chunks(c.spec.sizes[s]) {
                let mut sorted = pass.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), pass.len(), "source {} repeats within a pass", s);
            }
        }
        // One rank of the whole global batch draws the same.
        let global = c.per_device * world;
        let mut one = Vec::new();
        let single = Case { per_device: global, ..c.clone() };
        drain(&mut token_planner(&single, &lengths, budget, (1, 1)), &mut one, 5_000);
        prop_assert_eq!(&one, &steps);
        // Resumed on `other` ranks mid-run: the same batches and budget.
        let mut first = token_planner(&c, &lengths, budget, (world, world));
        let mut resumed = Vec::new();
        drain(&mut first, &mut resumed, cut);
        let state: PlannerState =
            serde_json::from_str(&serde_json::to_string(&first.state()).unwrap()).unwrap();
        let mut second = token_planner(&c, &lengths, budget, (other, world));
        second.restore(&state);
        drain(&mut second, &mut resumed, 5_000);
        prop_assert_eq!(&resumed, &steps);
    }
}

/// A mixed planner whose every step holds as many examples as fit in
/// `max_tokens` tokens summed (`--max-tokens-per-batch N --packed-token-budget`
/// over sources).
fn mixed_in_tokens(
    c: &Case,
    lengths: &std::sync::Arc<[usize]>,
    max_tokens: usize,
    world: usize,
) -> StepPlanner<ScheduleSpec> {
    let sampler =
        GlobalBatchSampler::over_sources(&c.spec, world, c.seed, true, c.drop_last).unwrap();
    StepPlanner::new(
        sampler,
        ScheduleSpec::Constant(None),
        BatchLimits::new(1, None).unwrap(),
        1,
        RunLength::Epochs(c.epochs),
        world,
        c.drop_last,
    )
    .unwrap()
    .with_lengths(lengths.clone())
    .with_mixed_token_budget(max_tokens)
}

/// The steps of `planner` up to `max`, the weights moved after every step by
/// `reweight` (a mixer's part), as `drain` gives them.
fn drain_reweighted(
    p: &mut StepPlanner<ScheduleSpec>,
    out: &mut Vec<(usize, Vec<usize>)>,
    max: usize,
    reweight: &dyn Fn(usize) -> Option<Vec<f64>>,
) {
    while out.len() < max {
        let Some(step) = p.next_step() else { return };
        out.push((p.sampler().epoch_index(), step.indices()));
        p.finish_step().unwrap();
        if let Some(weights) = reweight(p.step()) {
            p.set_mix_weights(p.step(), &weights).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Every step at most the budget (or one longer example) and more than the
    /// budget less its longest example (it is filled); every source's passes
    /// permutations of it; every primary epoch whole (under a token budget no
    /// batch is short of a count, so `drop_last` drops nothing); the same steps on
    /// any number of ranks; resume on other ranks equal to the uninterrupted run;
    /// all with weights that move while it runs.
    #[test]
    fn a_mixed_batch_in_tokens_keeps_every_document_once(
        c in cases(),
        length_seed in any::<u64>(),
        max_tokens in 1usize..300,
        stopping in 0usize..3,
        world in 1usize..4,
        cut in 1usize..10,
        other in 1usize..4,
    ) {
        let mut c = c;
        c.spec.stopping = [StoppingStrategy::Primary, StoppingStrategy::FirstExhausted, StoppingStrategy::AllExhausted][stopping];
        c.spec.weights.iter_mut().for_each(|w| *w = w.max(1.0));
        let lengths = in_tokens(&mut c, length_seed);
        let longest = lengths.iter().copied().max().unwrap_or(1);
        let sources = c.spec.sizes.len();
        let reweight = move |step: usize| -> Option<Vec<f64>> {
            (step % 3 == 0).then(|| (0..sources).map(|s| 1.0 + ((step + s * 7) % 5) as f64).collect())
        };
        let mut steps = Vec::new();
        drain_reweighted(&mut mixed_in_tokens(&c, &lengths, max_tokens, world), &mut steps, 5_000, &reweight);
        prop_assert!(steps.len() < 5_000, "the run ends");
        let mut drawn: Vec<Vec<usize>> = vec![Vec::new(); sources];
        for (k, (epoch, indices)) in steps.iter().enumerate() {
            let tokens: usize = indices.iter().map(|&i| lengths[i]).sum();
            prop_assert!(tokens <= max_tokens || indices.len() == 1, "step {}: {} tokens", k, tokens);
            let last_of_epoch = <[_]>::get(&steps, k + 1).is_none_or(|next| next.0 != *epoch);
            prop_assert!(last_of_epoch || tokens + longest > max_tokens, "step {} holds {} tokens of {}", k, tokens, max_tokens);
            for &i in indices {
                let (s, local) = c.spec.locate(i);
                drawn[s].push(local);
            }
        }
        for (s, seq) in drawn.iter().enumerate() {
            for pass in seq.chunks(c.spec.sizes[s]) {
                let mut sorted = pass.to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                prop_assert_eq!(sorted.len(), pass.len(), "source {} repeats within a pass", s);
            }
        }
        if c.spec.stopping == StoppingStrategy::Primary {
            prop_assert_eq!(drawn[0].len(), c.epochs * c.spec.sizes[0]);
        }
        let mut one = Vec::new();
        drain_reweighted(&mut mixed_in_tokens(&c, &lengths, max_tokens, 1), &mut one, 5_000, &reweight);
        prop_assert_eq!(&one, &steps);
        let mut first = mixed_in_tokens(&c, &lengths, max_tokens, world);
        let mut resumed = Vec::new();
        drain_reweighted(&mut first, &mut resumed, cut, &reweight);
        let state: PlannerState =
            serde_json::from_str(&serde_json::to_string(&first.state()).unwrap()).unwrap();
        prop_assert_eq!(state.mixed_token_budget, Some(max_tokens));
        let mut second = mixed_in_tokens(&c, &lengths, max_tokens, other);
        second.restore(&state);
        drain_reweighted(&mut second, &mut resumed, 5_000, &reweight);
        prop_assert_eq!(&resumed, &steps);
    }
}

/// The held-out losses a mixer got, with their steps.
type HeldOutSeen = Vec<(usize, Vec<f64>)>;

/// Asks for the held-out losses after every `every`-th step and keeps what it
/// got (shared, so that the test reads it after the run).
struct AskingMixer {
    every: usize,
    got: std::sync::Arc<std::sync::Mutex<HeldOutSeen>>,
}

impl Mixer for AskingMixer {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        assert_eq!(
            stats.held_out.is_some(),
            stats.step > 0 && self.wants_held_out(stats.step),
            "held-out losses exactly when asked, step {}",
            stats.step
        );
        if let Some(losses) = stats.held_out {
            self.got.lock().unwrap().push((stats.step, losses.to_vec()));
        }
        vec![3.0, 1.0]
    }

    fn wants_held_out(&self, step: usize) -> bool {
        step % self.every == 0
    }
}

#[adaptive_trainer]
struct Asking {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: AskingMixer,
}

type HeldOutRun = (HeldOutSeen, Vec<StepLog>, adabatch::TrainSummary);

/// A run whose mixer asks after every third step, with `args` (whose
/// `--mixer-eval-examples` sizes the held-out set).
fn asking_run(args: &TrainingArgs, eval: &Sources<Vec<Example>>) -> adabatch::Result<HeldOutRun> {
    asking_run_every(args, eval, 3)
}

/// A run whose mixer asks after every `every`-th step.
fn asking_run_every(
    args: &TrainingArgs,
    eval: &Sources<Vec<Example>>,
    every: usize,
) -> adabatch::Result<HeldOutRun> {
    let data = sources(&[("new", 0.75), ("replay", 0.25)]);
    let log = temp_log("mixing-held-out");
    let mut a = args.clone();
    a.logging.log_jsonl = Some(log.clone());
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let shared = got.clone();
    let trained = Asking::launch_with_eval(&data, eval, &collate, &a, move |ctx: &RankContext| {
        let (model, opt) = adam(ctx)?;
        let mixer = AskingMixer {
            every,
            got: shared.clone(),
        };
        Ok(Asking::new(model, opt, mixer))
    })?;
    // Every rank's mixer pushes what it got: rank 0's are the first of each step.
    let mut got = got.lock().unwrap().clone();
    got.dedup_by_key(|(step, _)| *step);
    Ok((got, read_log(&log), trained.summary))
}

fn held_out_eval() -> Sources<Vec<Example>> {
    Sources::new([("new", dataset(4, 8)), ("replay", dataset(2, 9))]).unwrap()
}

/// The held-out losses a mixer asks for come after exactly the steps it asks
/// (every third), once each: the same losses on 1, 2 and 3 ranks of the same
/// global batch, and the tokens of the set once per request in the logs and
/// the summary.
#[test]
fn held_out_losses_come_once_per_request_on_any_number_of_ranks() {
    let eval = held_out_eval();
    let set_tokens: usize = (eval.get(0).tokens + eval.get(1).tokens + eval.get(2).tokens)
        + (eval.get(4).tokens + eval.get(5).tokens);
    let mut runs = Vec::new();
    for (world, per_device) in [(1, 6), (2, 3), (3, 2)] {
        let mut a = args(world, per_device, 2);
        a.eval.mixer_eval_examples = Some(3);
        runs.push(asking_run(&a, &eval).unwrap());
    }
    let (got, logs, summary) = &runs[0];
    let steps: Vec<usize> = got.iter().map(|(step, _)| *step).collect();
    let expected: Vec<usize> = (3..=logs.len()).step_by(3).collect();
    assert!(!expected.is_empty());
    assert_eq!(steps, expected);
    let cost = summary.held_out.unwrap();
    assert_eq!(cost.evaluations, expected.len());
    assert_eq!(cost.tokens, (expected.len() * set_tokens) as f64);
    let last = logs.last().unwrap().held_out.unwrap();
    assert_eq!(
        (last.evaluations, last.tokens),
        (cost.evaluations, cost.tokens)
    );
    assert!(logs[0].held_out.is_none(), "nothing asked before step 3");
    for (other, _, _) in &runs[1..] {
        assert_eq!(other.len(), got.len());
        for ((s1, l1), (s2, l2)) in got.iter().zip(other) {
            assert_eq!(s1, s2);
            for (a, b) in l1.iter().zip(l2) {
                assert!(
                    (a - b).abs() < 1e-5 * a.abs().max(1.0),
                    "step {s1}: {l1:?} {l2:?}"
                );
            }
        }
    }
}

/// A run resumed between requests asks and gets what the uninterrupted run did
/// after the checkpoint, and its cost counts the requests before it too; on
/// three ranks instead of two, the same requests and the same losses (to the
/// sums' rounding).
#[test]
fn held_out_requests_resume_exactly() {
    let eval = held_out_eval();
    let out = temp_log("mixing-held-out-out").with_extension("");
    let mut saving = args(2, 3, 2);
    saving.eval.mixer_eval_examples = Some(3);
    saving.save.output_dir = out.clone();
    saving.save.save_steps = 4;
    let (full, full_logs, full_summary) = asking_run(&saving, &eval).unwrap();
    let mut resumed = saving.clone();
    resumed.save.resume_from_checkpoint = Some(out.join("checkpoint-4"));
    let (after, logs, summary) = asking_run(&resumed, &eval).unwrap();
    let tail: Vec<_> = full.into_iter().filter(|(step, _)| *step > 4).collect();
    assert_eq!(after, tail);
    let cost = |l: &StepLog| l.held_out.map(|c| (c.evaluations, c.tokens));
    let resumed_costs: Vec<_> = logs.iter().map(cost).collect();
    let full_costs: Vec<_> = full_logs[4..].iter().map(cost).collect();
    assert_eq!(resumed_costs, full_costs);
    let totals = |s: &adabatch::TrainSummary| s.held_out.map(|c| (c.evaluations, c.tokens));
    assert_eq!(totals(&summary), totals(&full_summary));
    let mut elsewhere = resumed.clone();
    (
        elsewhere.launch.nproc_per_node,
        elsewhere.batch.per_device_train_batch_size,
    ) = (3, 2);
    let (on_three, _, summary) = asking_run(&elsewhere, &eval).unwrap();
    assert_eq!(totals(&summary), totals(&full_summary));
    assert_eq!(on_three.len(), after.len());
    for ((s3, l3), (s2, l2)) in on_three.iter().zip(&after) {
        assert_eq!(s3, s2);
        for (a, b) in l3.iter().zip(l2) {
            assert!(
                (a - b).abs() < 1e-5 * a.abs().max(1.0),
                "step {s3}: {l3:?} {l2:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A mixer that asks in a run without a held-out set, and a held-out set the
/// eval set cannot give, are typed errors.
#[test]
fn held_out_requests_need_a_held_out_set_of_the_training_sources() {
    let eval = held_out_eval();
    let err = asking_run(&args(1, 6, 1), &eval).unwrap_err();
    assert!(
        matches!(&err, Error::Settings(SettingsError::HeldOutSet { reason }) if reason.contains("after step 3")),
        "{err}"
    );
    let mut a = args(1, 6, 1);
    a.eval.mixer_eval_examples = Some(3);
    let other = Sources::new([("replay", dataset(2, 9)), ("new", dataset(4, 8))]).unwrap();
    let err = asking_run(&a, &other).unwrap_err();
    assert!(
        matches!(&err, Error::Settings(SettingsError::HeldOutSet { reason }) if reason.contains("not the training sources")),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Requests at any interval, on 1 to 3 ranks of any size: answered after
    /// exactly the steps asked, once each (the mixer checks it at every step),
    /// and the cost counts each once.
    #[test]
    fn held_out_requests_are_answered_exactly_once(
        every in 1usize..5,
        world in 1usize..4,
        per_device in 1usize..4,
    ) {
        let mut a = args(world, per_device, 1);
        a.eval.mixer_eval_examples = Some(2);
        let (got, logs, summary) = asking_run_every(&a, &held_out_eval(), every).unwrap();
        let steps: Vec<usize> = got.iter().map(|(step, _)| *step).collect();
        prop_assert!(logs.len() >= 3, "{} steps", logs.len());
        let expected: Vec<usize> = (1..=logs.len()).filter(|s| s % every == 0).collect();
        prop_assert_eq!(&steps, &expected);
        prop_assert_eq!(summary.held_out.map_or(0, |c| c.evaluations), expected.len());
        prop_assert!(got.iter().all(|(_, losses)| losses.len() == 2 && losses.iter().all(|l| l.is_finite())));
    }
}

/// `OnlineMixer::default()` (and `mix = online`) warms up for 40 % of the run's
/// expected steps, which the engine tells it before the first step: a run of 10
/// steps is the same run as one with `with_warmup(4)`, step for step, and not
/// the one without a warm-up. (The default was temperature 1 with no warm-up,
/// the setting the mixing benchmarks found worse than 1.5 nats after 40 %.)
#[test]
fn the_default_online_warm_up_is_four_tenths_of_the_expected_steps() {
    let data = sources(&[("new", 0.5), ("replay", 0.5)]);
    let ten = {
        let mut a = args(1, 4, 3);
        a.length.max_steps = Some(10);
        a
    };
    let (_, default) = run_as(&data, &ten, |model, opt| {
        Online::new(model, opt, OnlineMixer::default())
    })
    .unwrap();
    let (_, four) = run_as(&data, &ten, |model, opt| {
        Online::new(model, opt, OnlineMixer::default().with_warmup(4))
    })
    .unwrap();
    let (_, none) = run_as(&data, &ten, |model, opt| {
        Online::new(model, opt, OnlineMixer::default().with_warmup(0))
    })
    .unwrap();
    assert_eq!((default.len(), four.len(), none.len()), (10, 10, 10));
    let draws = |logs: &[StepLog]| -> Vec<Vec<Vec<usize>>> {
        logs.iter().map(|l| l.indices.clone()).collect()
    };
    assert_eq!(draws(&default), draws(&four));
    assert_ne!(draws(&default), draws(&none), "the warm-up changed nothing");
}
