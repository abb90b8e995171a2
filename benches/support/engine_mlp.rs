//! The engine-overhead MLP, its data and the engine-vs-hand-loop equivalence
//! check, shared by `benches/engine_overhead.rs` (timed) and
//! `tests/it/equivalence.rs` (run by `cargo test`). The including file defines the
//! sizes: `FEATURES`, `HIDDEN`, `CLASSES`, `EXAMPLES`, `SEED`, `LEARNING_RATE`.
#![allow(dead_code)]

use adabatch::data::sampler::GlobalBatchSampler;
use adabatch::{
    AdaptiveTrainer, Batch, Parameters, ScheduleSpec, TrainModel, TrainSummary, TrainerPolicy,
    TrainingArgs,
};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Linear, Module, Optimizer, ParamsAdamW};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{CLASSES, EXAMPLES, FEATURES, HIDDEN, LEARNING_RATE, SEED};

/// One synthetic example.
#[derive(Clone)]
pub struct Example {
    pub features: [f32; FEATURES],
    pub label: u32,
}

/// `EXAMPLES` uniform feature vectors; the label is the argmax of a fixed seeded
/// linear projection of the features.
pub fn dataset() -> Vec<Example> {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let projection: Vec<[f32; CLASSES]> = (0..FEATURES)
        .map(|_| std::array::from_fn(|_| rng.random_range(-1.0f32..1.0)))
        .collect();
    (0..EXAMPLES)
        .map(|_| {
            let features: [f32; FEATURES] = std::array::from_fn(|_| rng.random_range(-1.0..1.0));
            let scores: [f32; CLASSES] = std::array::from_fn(|class| {
                features
                    .iter()
                    .zip(&projection)
                    .map(|(x, row)| x * row[class])
                    .sum()
            });
            let label = (0..CLASSES)
                .max_by(|&a, &b| scores[a].total_cmp(&scores[b]))
                .unwrap_or(0) as u32;
            Example { features, label }
        })
        .collect()
}

pub struct MlpBatch {
    inputs: Tensor,
    labels: Tensor,
}

impl Batch for MlpBatch {
    fn num_examples(&self) -> usize {
        self.labels.dims()[0]
    }
}

pub fn collate(items: &[Example], device: &Device) -> candle_core::Result<MlpBatch> {
    let inputs: Vec<f32> = items.iter().flat_map(|e| e.features).collect();
    let labels: Vec<u32> = items.iter().map(|e| e.label).collect();
    Ok(MlpBatch {
        inputs: Tensor::from_vec(inputs, (items.len(), FEATURES), device)?,
        labels: Tensor::from_vec(labels, items.len(), device)?,
    })
}

pub struct Mlp {
    pub layers: [Linear; 3],
    pub params: Parameters,
}

impl Mlp {
    pub fn new(device: &Device) -> candle_core::Result<Self> {
        let params = Parameters::new(SEED);
        let vb = params.var_builder(DType::F32, device);
        let layers = [
            candle_nn::linear(FEATURES, HIDDEN, vb.pp("fc1"))?,
            candle_nn::linear(HIDDEN, HIDDEN, vb.pp("fc2"))?,
            candle_nn::linear(HIDDEN, CLASSES, vb.pp("fc3"))?,
        ];
        Ok(Self { layers, params })
    }
}

impl TrainModel for Mlp {
    type Batch = MlpBatch;

    fn per_example_loss(&self, batch: &MlpBatch) -> candle_core::Result<Tensor> {
        let [fc1, fc2, fc3] = &self.layers;
        let hidden = fc1.forward(&batch.inputs)?.relu()?;
        let hidden = fc2.forward(&hidden)?.relu()?;
        adabatch::per_example_cross_entropy(&fc3.forward(&hidden)?, &batch.labels)
    }

    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

pub struct MlpTrainer {
    pub model: Mlp,
    pub opt: AdamW,
}

impl AdaptiveTrainer for MlpTrainer {
    type Model = Mlp;
    type Optimizer = AdamW;
    const POLICY: TrainerPolicy = TrainerPolicy {
        schedule: ScheduleSpec::Constant(None),
        seed: SEED,
        ..TrainerPolicy::DEFAULT
    };
    fn parts(&mut self) -> (&mut Mlp, &mut AdamW) {
        (&mut self.model, &mut self.opt)
    }
}

/// A trainer with freshly seeded weights and a fresh optimizer state.
pub fn fresh_trainer() -> MlpTrainer {
    let model = Mlp::new(&Device::Cpu).expect("build the MLP");
    let opt = AdamW::new(
        model.params.all_vars(),
        ParamsAdamW {
            lr: LEARNING_RATE,
            ..Default::default()
        },
    )
    .expect("build AdamW");
    MlpTrainer { model, opt }
}

/// One epoch the way a candle user writes it; returns every step's loss.
pub fn hand_epoch(
    trainer: &mut MlpTrainer,
    data: &[Example],
    batch_size: usize,
) -> candle_core::Result<Vec<f32>> {
    let device = Device::Cpu;
    let (model, opt) = (&trainer.model, &mut trainer.opt);
    let mut sampler =
        GlobalBatchSampler::new(data.len(), 1, SEED, true, false).expect("non-empty data");
    let mut losses = Vec::with_capacity(data.len().div_ceil(batch_size));
    while let Some(step) = sampler.next_step(batch_size) {
        let items: Vec<Example> = step.indices.iter().map(|&i| data[i].clone()).collect();
        let batch = collate(&items, &device)?;
        let loss = model.per_example_loss(&batch)?.mean_all()?;
        let grads = loss.backward()?;
        opt.step(&grads)?;
        losses.push(loss.to_scalar::<f32>()?);
    }
    Ok(losses)
}

pub fn engine_args(batch_size: usize) -> TrainingArgs {
    let mut args = TrainingArgs::default();
    args.length.num_train_epochs = 1;
    args.batch.per_device_train_batch_size = batch_size;
    args.lr.learning_rate = LEARNING_RATE;
    args.data.seed = Some(SEED);
    args.logging.quiet = true;
    args.logging.logging_steps = usize::MAX;
    // `ENGINE_OVERHEAD_RELEASE_FREED=1`: glibc's default heap, to measure what
    // keeping freed memory (the engine's default) gains.
    args.data.release_freed_memory = std::env::var_os("ENGINE_OVERHEAD_RELEASE_FREED").is_some();
    args
}

/// One epoch through the engine.
pub fn engine_epoch(
    mut trainer: MlpTrainer,
    data: &[Example],
    args: &TrainingArgs,
) -> adabatch::Result<TrainSummary> {
    adabatch::Run::new(data, &collate, args).train(&mut trainer)
}

/// Flattened values of every parameter, in name order.
pub fn weights(params: &Parameters) -> Vec<f32> {
    params
        .named_parameters()
        .iter()
        .flat_map(|(_, var)| {
            var.as_tensor()
                .flatten_all()
                .and_then(|t| t.to_vec1::<f32>())
                .expect("read a parameter")
        })
        .collect()
}

/// Not timed: both sides must take the same steps with the same losses and end
/// with the same weights, or the comparison would be meaningless.
pub fn check_equivalence(data: &[Example], batch_size: usize) {
    let mut hand = fresh_trainer();
    let hand_losses = hand_epoch(&mut hand, data, batch_size).expect("hand-written epoch");
    let engine = fresh_trainer();
    let engine_params = engine.model.params.clone();
    let summary = engine_epoch(engine, data, &engine_args(batch_size)).expect("engine epoch");

    let steps = data.len().div_ceil(batch_size);
    assert!(
        hand_losses.len() == steps && summary.step_losses.len() == steps,
        "batch size {batch_size}: expected {steps} steps, hand loop took {}, engine took {}",
        hand_losses.len(),
        summary.step_losses.len()
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1.0);
    for (step, (&h, &e)) in hand_losses.iter().zip(&summary.step_losses).enumerate() {
        assert!(
            close(f64::from(h), e),
            "batch size {batch_size}: step {} loss differs: hand loop {h}, engine {e} \
             (the two sides are not doing the same batches or the same math)",
            step + 1
        );
    }
    let (hand_w, engine_w) = (weights(&hand.model.params), weights(&engine_params));
    let max_diff = hand_w
        .iter()
        .zip(&engine_w)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        hand_w.len() == engine_w.len() && max_diff <= 1e-5,
        "batch size {batch_size}: final weights differ by up to {max_diff} \
         (the two sides are not doing the same updates)"
    );
    let (first, last) = (hand_losses[0], hand_losses[steps - 1]);
    println!(
        "batch size {batch_size}: hand loop and engine agree over {steps} steps \
         (loss {first:.4} -> {last:.4}, engine final {:.4}, max weight diff {max_diff:e})",
        summary.step_losses[steps - 1]
    );
}
