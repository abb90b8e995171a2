//! A small real model shared by the integration tests: linear regression with a
//! per-example squared error, built through seeded `Parameters`.
#![allow(dead_code)]

use adabatch::prelude::*;
use adabatch::{Growth, Reweight, ScheduleSpec, TrainerPolicy};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Linear, Module, Optimizer, ParamsAdamW, SGD};
use rand::{Rng, SeedableRng};

pub const FEATURES: usize = 4;

/// One example: features, target, and a token count (for `token_count` tests).
#[derive(Debug, Clone)]
pub struct Example {
    pub x: Vec<f32>,
    pub y: f32,
    pub tokens: usize,
}

pub struct RegBatch {
    pub x: Tensor,
    pub y: Tensor,
    pub tokens: Tensor,
    pub num_tokens: usize,
}

impl Batch for RegBatch {
    fn num_examples(&self) -> usize {
        self.y.dims()[0]
    }
    fn num_tokens(&self) -> usize {
        self.num_tokens
    }
}

pub fn collate(items: &[Example], device: &Device) -> candle_core::Result<RegBatch> {
    let x: Vec<f32> = items.iter().flat_map(|e| e.x.iter().copied()).collect();
    Ok(RegBatch {
        x: Tensor::from_vec(x, (items.len(), FEATURES), device)?,
        y: Tensor::new(items.iter().map(|e| e.y).collect::<Vec<_>>(), device)?,
        tokens: Tensor::new(
            items.iter().map(|e| e.tokens as f32).collect::<Vec<_>>(),
            device,
        )?,
        num_tokens: items.iter().map(|e| e.tokens).sum(),
    })
}

/// `y = w·x + b`; the per-example loss is the squared error, times the example's
/// token count when `token_sum` is set (a per-example sum over its tokens).
pub struct Regression {
    pub linear: Linear,
    pub params: Parameters,
    pub token_sum: bool,
}

impl Regression {
    pub fn new(params: Parameters, device: &Device) -> candle_core::Result<Self> {
        let linear = candle_nn::linear(
            FEATURES,
            1,
            params.var_builder(DType::F32, device).pp("linear"),
        )?;
        Ok(Self {
            linear,
            params,
            token_sum: false,
        })
    }
}

impl TrainModel for Regression {
    type Batch = RegBatch;
    fn per_example_loss(&self, batch: &RegBatch) -> candle_core::Result<Tensor> {
        let pred = self.linear.forward(&batch.x)?.squeeze(1)?;
        let err = (pred - &batch.y)?.sqr()?;
        if self.token_sum {
            err * &batch.tokens
        } else {
            Ok(err)
        }
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
}

/// A seeded regression data set with varied token counts.
pub fn dataset(n: usize, seed: u64) -> Vec<Example> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let x: Vec<f32> = (0..FEATURES).map(|_| rng.random_range(-1.0..1.0)).collect();
            let y = x
                .iter()
                .enumerate()
                .map(|(i, v)| (i as f32 + 1.0) * v)
                .sum::<f32>()
                + 0.5;
            Example {
                x,
                y,
                tokens: rng.random_range(1..9),
            }
        })
        .collect()
}

/// A training set and an eval set whose targets are the negated training
/// targets: as the model learns the training set, the eval loss rises after its
/// first evaluations (for early stopping and the best checkpoint).
pub fn turning_data() -> (Vec<Example>, Vec<Example>) {
    let train = dataset(40, 1);
    let eval = train
        .iter()
        .map(|e| Example {
            y: -e.y,
            ..e.clone()
        })
        .collect();
    (train, eval)
}

/// Declares a hand-written trainer with the given policy (what the macro generates,
/// written out).
#[macro_export]
macro_rules! hand_trainer {
    ($name:ident, $opt:ty, $policy:expr) => {
        hand_trainer!(pub $name, $crate::common::Regression, $opt, $policy);
    };
    // Any model; `$vis` for the struct and its fields.
    ($vis:vis $name:ident, $model:ty, $opt:ty, $policy:expr) => {
        $vis struct $name {
            $vis model: $model,
            $vis opt: $opt,
        }
        impl adabatch::AdaptiveTrainer for $name {
            type Model = $model;
            type Optimizer = $opt;
            const POLICY: adabatch::TrainerPolicy = $policy;
            fn parts(&mut self) -> (&mut $model, &mut $opt) {
                (&mut self.model, &mut self.opt)
            }
        }
    };
}

pub const INTERVAL_POLICY: TrainerPolicy = TrainerPolicy {
    schedule: ScheduleSpec::Interval {
        every: 5,
        growth: Growth::Add(1),
    },
    ..TrainerPolicy::DEFAULT
};

hand_trainer!(IntervalTrainer, AdamW, INTERVAL_POLICY);
hand_trainer!(
    DoublingTrainer,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 4,
            growth: Growth::Mul(2)
        },
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    TokenTrainer,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 3,
            growth: Growth::Mul(2)
        },
        reweight: Reweight::TokenCount,
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    SgdTrainer,
    SGD,
    TrainerPolicy {
        shuffle: false,
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    SgdRankMeanTrainer,
    SGD,
    TrainerPolicy {
        shuffle: false,
        reweight: Reweight::RankMean,
        ..TrainerPolicy::DEFAULT
    }
);

pub fn adamw(model: &Regression, lr: f64) -> candle_core::Result<AdamW> {
    AdamW::new(
        model.params.all_vars(),
        ParamsAdamW {
            lr,
            ..Default::default()
        },
    )
}

/// A factory building `wrap(model, AdamW)` on every rank from seeded parameters.
pub fn adamw_factory<T>(
    wrap: fn(Regression, AdamW) -> T,
) -> impl Fn(&RankContext) -> adabatch::Result<T> + Sync {
    move |ctx| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = adamw(&model, 0.05)?;
        Ok(wrap(model, opt))
    }
}

/// Quiet args for tests.
pub fn args(world: usize, per_device: usize, epochs: usize) -> TrainingArgs {
    {
        let mut args = TrainingArgs::default();
        args.launch.nproc_per_node = world;
        args.batch.per_device_train_batch_size = per_device;
        args.length.num_train_epochs = epochs;
        args.lr.learning_rate = 0.05;
        args.data.seed = Some(3);
        args.logging.quiet = true;
        args
    }
}

/// Every value of `vars`, flattened in order (to compare weights bit for bit).
pub fn flat(vars: impl IntoIterator<Item = Var>) -> Vec<f32> {
    vars.into_iter()
        .flat_map(|v| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

/// Every value of f64 `vars`, flattened in order.
pub fn flat64(vars: impl IntoIterator<Item = Var>) -> Vec<f64> {
    vars.into_iter()
        .flat_map(|v| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
        })
        .collect()
}

/// A fresh JSONL path in the temp dir.
pub fn temp_log(name: &str) -> std::path::PathBuf {
    // Emptied at this process's first call: an earlier, dead process of the same
    // pid may have left logs there (a resume appends to its log) and checkpoints.
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("adabatch-tests-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let unique = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dir.join(format!("{name}-{unique}.jsonl"))
}

pub fn read_log(path: &std::path::Path) -> Vec<adabatch::StepLog> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        // Step lines have no `event` key; a resume mark and an evaluation do.
        .filter(|l| !l.contains(r#""event":"#))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// adabatch's AdamW (it resumes exactly) over the regression at rate 0.05.
pub fn resumable_adam(model: &Regression) -> adabatch::Result<adabatch::AdamW> {
    adabatch::AdamW::new(
        model.params.all_vars(),
        adabatch::ParamsAdamW {
            lr: 0.05,
            ..Default::default()
        },
    )
}
