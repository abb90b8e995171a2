//! PiKE (`adabatch::PikeMixer`, arXiv 2502.06244) in runs: the sources' gradient
//! statistics the engine measures against each half's gradient computed alone,
//! the same run twice, a resume equal to the uninterrupted run, one rank of 8
//! against two of 4, and a replay budget around it.

use crate::common;

use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;
use adabatch::{Mixer, PikeMixer, SourceGradient, SourceStats, Sources, StepLog};
use common::*;
use std::sync::{Arc, Mutex};

/// What the mixers of a run saw: each measuring step's statistics (every rank's).
type Seen = Arc<Mutex<Vec<(usize, Vec<SourceGradient>)>>>;

/// A PiKE mixer that records the statistics it is handed.
struct Recording(PikeMixer, Seen);

impl Mixer for Recording {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        if let Some(g) = stats.source_gradients {
            self.1.lock().unwrap().push((stats.step, g.to_vec()));
        }
        self.0.weights(stats)
    }
    fn wants_source_gradients(&self, step: usize) -> bool {
        self.0.wants_source_gradients(step)
    }
    fn diagnostics(&self) -> Vec<(&'static str, adabatch::Diagnostic)> {
        self.0.diagnostics()
    }
    fn state(&self) -> Option<serde_json::Value> {
        self.0.state()
    }
    fn restore(&mut self, state: &serde_json::Value) -> Result<(), String> {
        self.0.restore(state)
    }
}

#[adaptive_trainer]
struct Piked {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: Recording,
}

fn sources() -> Sources<Vec<Example>> {
    Sources::new([("new", dataset(24, 1)), ("replay", dataset(5, 2))]).unwrap()
}

/// The initial weights and bias of the model (every rank's are the same).
type Initial = Arc<Mutex<Option<(Vec<f32>, f32)>>>;

/// A run of PiKE measuring every `every` steps with a JSONL log: its log, what
/// its mixers saw, and the model's initial weights.
fn run(a: &TrainingArgs, every: usize, name: &str) -> (Vec<StepLog>, Seen, Initial) {
    let (seen, initial): (Seen, Initial) = Default::default();
    let log = temp_log(name);
    let mut a = a.clone();
    a.logging.log_jsonl = Some(log.clone());
    let data = sources();
    Piked::launch(&data, &collate, &a, |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let w = model.linear.weight().flatten_all()?.to_vec1::<f32>()?;
        let b = model.linear.bias().unwrap().to_vec1::<f32>()?[0];
        *initial.lock().unwrap() = Some((w, b));
        let opt = AdamW::new(
            model.params.all_vars(),
            ParamsAdamW {
                lr: 0.05,
                ..Default::default()
            },
        )?;
        let pike = PikeMixer::default().with_t0(every)?;
        Ok(Piked::new(model, opt, Recording(pike, Arc::clone(&seen))))
    })
    .unwrap();
    (read_log(&log), seen, initial)
}

/// One example's gradient of its squared error `(w·x + b − y)²`: `2r·(x, 1)`.
fn gradient(e: &Example, (w, b): &(Vec<f32>, f32)) -> Vec<f64> {
    let pred: f64 =
        e.x.iter()
            .zip(w)
            .map(|(x, w)| f64::from(x * w))
            .sum::<f64>()
            + f64::from(*b);
    let r = pred - f64::from(e.y);
    e.x.iter()
        .map(|&x| 2.0 * r * f64::from(x))
        .chain([2.0 * r])
        .collect()
}

fn mean(gs: &[Vec<f64>]) -> Vec<f64> {
    let n = gs.len() as f64;
    (0..gs[0].len())
        .map(|i| gs.iter().map(|g| g[i]).sum::<f64>() / n)
        .collect()
}

/// A source's half `h` of its examples in the step's order: the first
/// `⌈n/2⌉`, or the others.
fn half_of<'e>(mine: &[&'e Example], h: usize) -> Vec<&'e Example> {
    let (a, b) = mine.split_at(mine.len().div_ceil(2));
    if h == 0 { a } else { b }.to_vec()
}

/// Equal up to rounding (NaN, a source without two examples, equals NaN).
fn close(x: f64, y: f64) -> bool {
    (x.is_nan() && y.is_nan()) || (x - y).abs() <= 1e-4 * (1.0 + x.abs().max(y.abs()))
}

/// Step 1's statistics (measured on 2 ranks, the model still at its start)
/// against each source's halves computed alone: `|g_k|² = ⟨ĝ_a, ĝ_b⟩` and
/// `σ_k² = |ĝ_a − ĝ_b|²/(1/n_a + 1/n_b)` (the estimates of `train::source_grads`
/// for the paper's `|∇L_k|²` and `σ_k²`), the halves each source's first and
/// second in the step's order; the diagnostics log them with the weights they gave.
#[test]
fn the_statistics_are_each_sources_halves_computed_alone() {
    let (logs, seen, initial) = run(&args(2, 4, 1), 2, "pike-stats");
    let initial = initial.lock().unwrap().clone().unwrap();
    let seen = seen.lock().unwrap().clone();
    let (step, measured) = &seen[0];
    assert_eq!(*step, 1);
    let data = [dataset(24, 1), dataset(5, 2)];
    let first = &logs[0];
    let order: Vec<usize> = first.indices.concat();
    for (k, source) in data.iter().enumerate() {
        let mine: Vec<&Example> = (order.iter())
            .filter(|&&i| (i >= 24) == (k == 1))
            .map(|&i| &source[if k == 1 { i - 24 } else { i }])
            .collect();
        let half = |h: usize| -> Vec<Vec<f64>> {
            (half_of(&mine, h).iter())
                .map(|e| gradient(e, &initial))
                .collect()
        };
        let (a, b) = (half(0), half(1));
        let (ga, gb) = (mean(&a), mean(&b));
        let dot: f64 = ga.iter().zip(&gb).map(|(x, y)| x * y).sum();
        let diff: f64 = ga.iter().zip(&gb).map(|(x, y)| (x - y) * (x - y)).sum();
        let var = diff / (1.0 / a.len() as f64 + 1.0 / b.len() as f64);
        let m = &measured[k];
        assert!(close(m.grad_sq, dot), "source {k}: {} vs {dot}", m.grad_sq);
        assert!(
            close(m.grad_var, var),
            "source {k}: {} vs {var}",
            m.grad_var
        );
        assert_eq!(m.size, mine.len() as f64);
    }
    let diagnostics = first.sources.mixer.as_ref().expect("step 1 measured");
    for key in ["grad_sq", "grad_var", "weights"] {
        assert!(diagnostics.get(key).is_some(), "{key}: {diagnostics}");
    }
    // Step 2 measured nothing: its weights still rest on step 1's statistics.
    assert_eq!(logs[1].sources.mixer, first.sources.mixer);
    let steps: Vec<usize> = seen.iter().map(|s| s.0).collect();
    assert!(
        steps.len() >= 4 && steps.iter().all(|s| s % 2 == 1),
        "{steps:?}"
    );
    assert_eq!(&steps[..2], [1, 1], "both ranks' mixers");
}

/// The same seed twice: the same run, bit for bit; one rank of 8: the same
/// statistics, weights and losses as two ranks of 4, up to rounding.
#[test]
fn the_same_seed_repeats_and_one_rank_of_eight_is_two_of_four() {
    let (two, seen_two, _) = run(&args(2, 4, 2), 1, "pike-two");
    let (again, _, _) = run(&args(2, 4, 2), 1, "pike-again");
    assert_eq!(two.len(), again.len());
    for (x, y) in two.iter().zip(&again) {
        assert_eq!(
            (x.loss.to_bits(), &x.sources),
            (y.loss.to_bits(), &y.sources)
        );
    }
    let (one, seen_one, _) = run(&args(1, 8, 2), 1, "pike-one");
    assert_eq!(one.len(), two.len());
    for (x, y) in one.iter().zip(&two) {
        assert_eq!(x.indices.concat(), y.indices.concat(), "step {}", x.step);
        assert!(
            close(x.loss, y.loss),
            "step {}: {} vs {}",
            x.step,
            x.loss,
            y.loss
        );
    }
    let two: Vec<_> = seen_two
        .lock()
        .unwrap()
        .iter()
        .step_by(2)
        .cloned()
        .collect();
    let one = seen_one.lock().unwrap().clone();
    assert_eq!(one.len(), two.len());
    for ((s, x), (t, y)) in one.iter().zip(&two) {
        assert_eq!(s, t);
        for (a, b) in x.iter().zip(y) {
            assert!(
                close(a.grad_sq, b.grad_sq) && close(a.grad_var, b.grad_var),
                "step {s}: {a:?} vs {b:?}"
            );
        }
    }
}

/// A run resumed from its checkpoint at step 3 (measuring every 2 steps: on
/// 1, 3, 5, ...) goes on exactly as the uninterrupted one.
#[test]
fn a_resumed_run_goes_on_as_the_uninterrupted_one() {
    let out = temp_log("pike-out").with_extension("");
    let mut saving = args(2, 4, 2);
    (saving.save.save_steps, saving.save.output_dir) = (3, out.clone());
    let (full, _, _) = run(&saving, 2, "pike-full");
    let mut resumed = args(2, 4, 2);
    resumed.save.resume_from_checkpoint = Some(out.join("checkpoint-3"));
    resumed.save.output_dir = out.clone();
    let (after, _, _) = run(&resumed, 2, "pike-resumed");
    let after: Vec<&StepLog> = after.iter().filter(|l| l.step > 3).collect();
    assert_eq!(after.len(), full.len() - 3);
    for (r, f) in after.iter().zip(&full[3..]) {
        assert_eq!(
            (r.step, &r.sources, r.loss.to_bits()),
            (f.step, &f.sources, f.loss.to_bits())
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[adaptive_trainer]
struct Budgeted {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: adabatch::ReplayBudget<PikeMixer>,
}

/// Under a replay budget PiKE still measures (the budget passes its requests
/// on) and `replay` stays within the budget.
#[test]
fn pike_under_a_replay_budget_measures_and_keeps_the_cap() {
    let log = temp_log("pike-budget");
    let mut a = args(2, 4, 2);
    a.logging.log_jsonl = Some(log.clone());
    let data = sources();
    let trained = Budgeted::launch(&data, &collate, &a, |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
        let pike = PikeMixer::default().with_t0(1)?;
        Ok(Budgeted::new(
            model,
            opt,
            adabatch::ReplayBudget::new(pike, ["new"], 0.3)?,
        ))
    })
    .unwrap();
    let logs = read_log(&log);
    for l in &logs {
        let w = l.sources.mix_weights.as_ref().unwrap();
        assert!(
            w["replay"] / w.values().sum::<f64>() <= 0.3 + 1e-12,
            "{w:?}"
        );
        assert!(l.sources.mixer.is_some(), "step {} measured", l.step);
    }
    let cost = trained.summary.source_gradients.expect("counted");
    assert_eq!(cost.steps, logs.len());
}

/// Equal weights, measured on every step or never.
struct Even(bool);

impl Mixer for Even {
    fn weights(&mut self, stats: &SourceStats<'_>) -> Vec<f64> {
        assert_eq!(stats.source_gradients.is_some(), self.0 && stats.step > 0);
        vec![1.0; stats.names.len()]
    }
    fn wants_source_gradients(&self, _: usize) -> bool {
        self.0
    }
}

#[adaptive_trainer]
struct Evenly {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: Even,
}

/// Measuring leaves the step's update as it is: the same examples, weighted
/// alike, their gradients summed in other pieces (so equal up to rounding).
#[test]
fn measuring_leaves_the_update_as_it_is() {
    let train = |measures: bool| -> (Vec<StepLog>, adabatch::TrainSummary) {
        let log = temp_log(&format!("pike-even-{measures}"));
        let mut a = args(2, 4, 2);
        a.logging.log_jsonl = Some(log.clone());
        let data = sources();
        let trained = Evenly::launch(&data, &collate, &a, |ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
            Ok(Evenly::new(model, opt, Even(measures)))
        })
        .unwrap();
        (read_log(&log), trained.summary)
    };
    let ((measured, summary), (plain, unmeasured)) = (train(true), train(false));
    assert_eq!(measured.len(), plain.len());
    for (x, y) in measured.iter().zip(&plain) {
        assert_eq!(x.indices, y.indices);
        assert!(
            close(x.loss, y.loss),
            "step {}: {} vs {}",
            x.step,
            x.loss,
            y.loss
        );
    }
    let cost = summary.source_gradients.expect("counted");
    assert_eq!(cost.steps, measured.len());
    assert!(cost.seconds > 0.0);
    assert!(unmeasured.source_gradients.is_none());
    assert!(summary
        .to_string()
        .contains("source gradients for the mixer"));
}

#[adaptive_trainer(mix = pike(t0 = 2))]
struct DslPike {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

/// `mix = pike(t0 = 2)` is the engine's `PikeMixer` measuring every 2 steps:
/// the same run as a `#[mixer]` field holding one.
#[test]
fn the_pike_mix_key_is_the_engines_pike_mixer() {
    let log = temp_log("pike-dsl");
    let mut a = args(2, 4, 2);
    a.logging.log_jsonl = Some(log.clone());
    let data = sources();
    let trained = DslPike::launch(&data, &collate, &a, |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(
            model.params.all_vars(),
            ParamsAdamW {
                lr: 0.05,
                ..Default::default()
            },
        )?;
        Ok(DslPike::new(model, opt))
    })
    .unwrap();
    let dsl = read_log(&log);
    let (field, _, _) = run(&args(2, 4, 2), 2, "pike-field");
    assert_eq!(dsl.len(), field.len());
    for (x, y) in dsl.iter().zip(&field) {
        assert_eq!(
            (x.loss.to_bits(), &x.sources),
            (y.loss.to_bits(), &y.sources)
        );
    }
    assert!(trained.summary.source_gradients.is_some());
}

#[adaptive_trainer(reweight = token_count)]
struct PikedTokens {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
    #[mixer]
    mixer: Recording,
}

/// Under `reweight = token_count` (each example's loss summed over its tokens,
/// a different number each) the statistics are per token: each half's mean
/// gradient is its examples' token-weighted gradients over its tokens, and its
/// size its tokens.
#[test]
fn under_token_counts_the_statistics_are_per_token() {
    let (seen, initial): (Seen, Initial) = Default::default();
    let log = temp_log("pike-tokens");
    let mut a = args(2, 4, 1);
    a.logging.log_jsonl = Some(log.clone());
    let data = sources();
    PikedTokens::launch(&data, &collate, &a, |ctx: &RankContext| {
        let mut model = Regression::new(ctx.parameters(), ctx.device())?;
        model.token_sum = true;
        let w = model.linear.weight().flatten_all()?.to_vec1::<f32>()?;
        let b = model.linear.bias().unwrap().to_vec1::<f32>()?[0];
        *initial.lock().unwrap() = Some((w, b));
        let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
        let pike = PikeMixer::default().with_t0(5)?;
        Ok(PikedTokens::new(
            model,
            opt,
            Recording(pike, Arc::clone(&seen)),
        ))
    })
    .unwrap();
    let logs = read_log(&log);
    let initial = initial.lock().unwrap().clone().unwrap();
    let (step, measured) = seen.lock().unwrap()[0].clone();
    assert_eq!(step, 1);
    let data = [dataset(24, 1), dataset(5, 2)];
    let order: Vec<usize> = logs[0].indices.concat();
    for (k, source) in data.iter().enumerate() {
        let mine: Vec<&Example> = (order.iter())
            .filter(|&&i| (i >= 24) == (k == 1))
            .map(|&i| &source[if k == 1 { i - 24 } else { i }])
            .collect();
        // A half's per-token mean gradient and its tokens.
        let half = |h: usize| -> (Vec<f64>, f64) {
            let examples = half_of(&mine, h);
            let tokens: f64 = examples.iter().map(|e| e.tokens as f64).sum();
            let summed: Vec<Vec<f64>> = (examples.iter())
                .map(|e| {
                    gradient(e, &initial)
                        .iter()
                        .map(|g| g * e.tokens as f64)
                        .collect()
                })
                .collect();
            let n = summed.len() as f64;
            (
                mean(&summed).iter().map(|g| g * n / tokens).collect(),
                tokens,
            )
        };
        let ((ga, ta), (gb, tb)) = (half(0), half(1));
        let dot: f64 = ga.iter().zip(&gb).map(|(x, y)| x * y).sum();
        let diff: f64 = ga.iter().zip(&gb).map(|(x, y)| (x - y) * (x - y)).sum();
        let m = &measured[k];
        assert!(close(m.grad_sq, dot), "source {k}: {} vs {dot}", m.grad_sq);
        let var = diff / (1.0 / ta + 1.0 / tb);
        assert!(
            close(m.grad_var, var),
            "source {k}: {} vs {var}",
            m.grad_var
        );
        assert_eq!(m.size, ta + tb);
    }
}

/// A collate whose examples read their batch-mates (as packed documents with
/// cross-document attention do).
struct Attending;

impl Collate<Example> for Attending {
    type Batch = RegBatch;
    fn collate(
        &self,
        items: &[Example],
        device: &candle_core::Device,
    ) -> candle_core::Result<RegBatch> {
        collate(items, device)
    }
    fn examples_independent(&self) -> bool {
        false
    }
}

/// Measuring collates each source's halves apart: with a collate whose
/// examples read each other, that would change the step, so the run stops at
/// its first measuring step, before any update, with a typed error.
#[test]
fn pike_refuses_a_collate_whose_examples_read_each_other() {
    let data = sources();
    let err = Piked::launch(&data, &Attending, &args(2, 4, 1), |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = AdamW::new(model.params.all_vars(), ParamsAdamW::default())?;
        let seen = Seen::default();
        Ok(Piked::new(
            model,
            opt,
            Recording(PikeMixer::default(), seen),
        ))
    })
    .unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains("cross-document attention"), "{shown}");
    assert!(
        shown.contains("collates each source's halves apart"),
        "{shown}"
    );
    // The same run with the independent collate measures and trains.
    assert!(!run(&args(2, 4, 1), 1, "pike-independent").0.is_empty());
}
