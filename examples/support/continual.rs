//! The continual-learning protocol of `examples/continual_replay.rs`, shared with
//! its test (tests/it/continual.rs): a seeded 70/30 split of the digits; phase 1
//! trains on task A (digits 0–4); phase 2 trains on task B (5–9, source `new`)
//! mixed with a replay memory of task A's training examples (source `replay`).

use std::collections::HashMap;

use adabatch::candle_core::{Device, Tensor};
use adabatch::prelude::*;
use adabatch::Sgd;
use adabatch::Sources;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::digits::{collate, split, Digit, Mlp};

/// How phase 2 divides its batches between `new` and `replay`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mix {
    /// This share of every global batch from the memory.
    Fixed(f64),
    /// `mix = online(temperature = 1.0, warmup = 0)` from the per-source losses.
    Online,
}

/// What a run of the protocol does.
#[derive(Clone)]
pub struct Protocol {
    /// Training examples of task A kept for replay (0 = no replay).
    pub replay_memory: usize,
    /// How phase 2 mixes.
    pub mix: Mix,
    /// Both phases' settings: `num_train_epochs` passes over each task (phase 2:
    /// over `new`), `--log-jsonl` for phase 2 only, the seed of split and memory.
    pub args: TrainingArgs,
}

/// What it measured.
pub struct Outcome {
    /// Test accuracy on task A after phase 1.
    pub task_a_after_phase_1: f64,
    /// Test accuracy on task A after phase 2.
    pub task_a: f64,
    /// Test accuracy on task B after phase 2.
    pub task_b: f64,
    /// Examples of `new` (task B's training split) and of `replay`.
    pub source_sizes: (usize, usize),
    /// Phase 2's summary.
    pub phase_2: TrainSummary,
}

impl Outcome {
    /// Replay examples phase 2 trained on (every example beyond `new`'s).
    pub fn replay_examples_used(&self) -> usize {
        let new = (self.phase_2.epoch * self.source_sizes.0 as f64).round() as usize;
        self.phase_2.examples_seen.saturating_sub(new)
    }
}

#[adaptive_trainer(schedule = constant)]
pub struct Learner {
    #[model]
    pub model: Mlp,
    #[optimizer]
    opt: Sgd,
}

/// The same, with the weights of phase 2 from the engine's online mixer at 1 nat
/// and no warm-up: the settings BENCHMARKS.md's digits rows measured (before the
/// library's default became 1.5 nats after 40 % of the run, which the language
/// model's mixing chose).
#[adaptive_trainer(schedule = constant, mix = online(temperature = 1.0, warmup = 0))]
pub struct OnlineLearner {
    #[model]
    pub model: Mlp,
    #[optimizer]
    opt: Sgd,
}

/// Accuracy of `model` on `data`, in one batch on the CPU.
pub fn accuracy(model: &Mlp, data: &[Digit]) -> adabatch::Result<f64> {
    let batch = collate(data, &Device::Cpu)?;
    let (_, correct) = model
        .eval_metrics(&batch)?
        .into_iter()
        .next()
        .ok_or_else(|| adabatch::Error::msg("the model reports no accuracy"))?;
    Ok(f64::from(correct.mean_all()?.to_scalar::<f32>()?))
}

/// The trained weights by name, to start phase 2 from.
fn weights(model: &Mlp) -> HashMap<String, Tensor> {
    model
        .named_parameters()
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().clone()))
        .collect()
}

/// Runs both phases on `digits`.
/// A phase's args: its own folder of `--output-dir` (the phases' checkpoints must
/// not replace each other), and with `--resume-from-checkpoint` the phase's own
/// checkpoint: the path given when it lies in the phase's folder, else the
/// phase's newest, if it has one (a finished phase 1 then trains nothing).
fn phase_args(args: &TrainingArgs, phase: &str) -> TrainingArgs {
    let output_dir = args.save.output_dir.join(phase);
    let resume = args.save.resume_from_checkpoint.as_ref().and_then(|asked| {
        if asked.starts_with(&output_dir) {
            return Some(asked.clone());
        }
        let saved = adabatch::train::checkpoint::complete_checkpoints(&output_dir);
        saved.is_ok_and(|s| !s.is_empty()).then(|| "latest".into())
    });
    {
        let mut a = args.clone();
        a.save.output_dir = output_dir;
        a.save.resume_from_checkpoint = resume;
        a
    }
}

/// Phase 1 trains task A alone: the JSONL log and the mixing flags are phase 2's.
fn phase_one_args(args: &TrainingArgs) -> TrainingArgs {
    {
        let mut a = phase_args(args, "phase-1");
        a.logging.log_jsonl = None;
        a.data.mix_weights = Vec::new();
        a.data.stopping_strategy = None;
        a
    }
}

pub fn run(digits: Vec<Digit>, protocol: &Protocol) -> adabatch::Result<Outcome> {
    if let Mix::Fixed(f) = protocol.mix {
        if !(0.0..1.0).contains(&f) {
            return Err(adabatch::Error::msg(format!(
                "the replay fraction {f} must be in [0, 1)"
            )));
        }
    }
    let args = &protocol.args;
    let seed = args.data.seed.unwrap_or(0);
    let (train, test) = split(digits, 0.7, seed);
    let task = |data: &[Digit], a: bool| -> Vec<Digit> {
        data.iter()
            .filter(|d| (d.label < 5) == a)
            .cloned()
            .collect()
    };
    let (train_a, train_b) = (task(&train, true), task(&train, false));
    let (test_a, test_b) = (task(&test, true), task(&test, false));

    let parts = |ctx: &RankContext,
                 start: Option<&HashMap<String, Tensor>>|
     -> adabatch::Result<(Mlp, Sgd)> {
        let model = Mlp::new(ctx.parameters(), 64, ctx.device())?;
        if let Some(start) = start {
            for (name, var) in model.named_parameters() {
                var.set(&start[&name].to_device(ctx.device())?)?;
            }
        }
        let opt = Sgd::new(model.params.all_vars(), args.lr.learning_rate);
        Ok((model, opt))
    };
    let build = |ctx: &RankContext, start: Option<&HashMap<String, Tensor>>| {
        let (model, opt) = parts(ctx, start)?;
        adabatch::Result::Ok(Learner::new(model, opt))
    };

    let (phase_1, args) = (phase_one_args(args), &phase_args(args, "phase-2"));
    let first = Learner::launch(&train_a, &collate, &phase_1, |ctx: &RankContext| {
        build(ctx, None)
    })?;
    let after_a = weights(&first.trainer.model);

    // Phase 2: task B, mixed with the replay memory.
    let mut memory = train_a.clone();
    memory.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed));
    memory.truncate(protocol.replay_memory);
    let (model, phase_2) = match protocol.mix {
        Mix::Fixed(_) | Mix::Online if memory.is_empty() => {
            let sources = Sources::new([("new", train_b.clone())])?;
            let second = Learner::launch(&sources, &collate, args, |ctx: &RankContext| {
                build(ctx, Some(&after_a))
            })?;
            (second.trainer.model, second.summary)
        }
        Mix::Fixed(f) => {
            let sources = Sources::new([("new", train_b.clone()), ("replay", memory.clone())])?
                .with_weights(&[("new", 1.0 - f), ("replay", f)])?;
            let second = Learner::launch(&sources, &collate, args, |ctx: &RankContext| {
                build(ctx, Some(&after_a))
            })?;
            (second.trainer.model, second.summary)
        }
        Mix::Online => {
            let sources = Sources::new([("new", train_b.clone()), ("replay", memory.clone())])?;
            let second = OnlineLearner::launch(&sources, &collate, args, |ctx: &RankContext| {
                let (model, opt) = parts(ctx, Some(&after_a))?;
                Ok(OnlineLearner::new(model, opt))
            })?;
            (second.trainer.model, second.summary)
        }
    };
    Ok(Outcome {
        task_a_after_phase_1: accuracy(&first.trainer.model, &test_a)?,
        task_a: accuracy(&model, &test_a)?,
        task_b: accuracy(&model, &test_b)?,
        source_sizes: (train_b.len(), memory.len()),
        phase_2,
    })
}
