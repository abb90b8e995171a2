//! A model's parameters: the gradient-coverage guard after the first step,
//! parameter groups (frozen, no weight decay), the optimizer's parameters checked
//! against the model's, and weights in (`--init-from`) and out (the saved model).

use crate::common;

use adabatch::prelude::*;
use adabatch::{AdamW, Error, ModelError, ParamGroups, ParamsAdamW, TrainOptimizer};
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::Linear;
use common::*;

/// Which RMS norm the model uses: candle-nn's fused one (no backward) or
/// adabatch's.
#[derive(Clone, Copy)]
enum Norm {
    Candle,
    Adabatch,
}

/// `head(rms_norm(proj(x)))`, squared error: the norm sits between two layers, so
/// a norm without a backward cuts `proj` and the norm's own weight off.
struct Normed {
    proj: Linear,
    norm_weight: Tensor,
    head: Linear,
    kind: Norm,
    params: Parameters,
    config: Option<String>,
}

impl Normed {
    fn new(params: Parameters, device: &Device, kind: Norm) -> candle_core::Result<Self> {
        let vb = params.var_builder(DType::F32, device);
        Ok(Self {
            proj: candle_nn::linear(FEATURES, 8, vb.pp("proj"))?,
            norm_weight: vb.get_with_hints(8, "norm.weight", candle_nn::Init::Const(1.0))?,
            head: candle_nn::linear(8, 1, vb.pp("head"))?,
            kind,
            params,
            config: None,
        })
    }
}

impl TrainModel for Normed {
    type Batch = RegBatch;
    fn per_example_loss(&self, batch: &RegBatch) -> candle_core::Result<Tensor> {
        let h = self.proj.forward(&batch.x)?;
        let h = match self.kind {
            Norm::Candle => candle_nn::ops::rms_norm(&h, &self.norm_weight, 1e-6)?,
            Norm::Adabatch => adabatch::nn::rms_norm(&h, &self.norm_weight, 1e-6)?,
        };
        let pred = self.head.forward(&h)?.squeeze(1)?;
        (pred - &batch.y)?.sqr()
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        self.params.named_parameters()
    }
    fn pretrained_config(&self) -> Option<String> {
        self.config.clone()
    }
}

struct NormedTrainer {
    model: Normed,
    opt: AdamW,
}

impl AdaptiveTrainer for NormedTrainer {
    type Model = Normed;
    type Optimizer = AdamW;
    const POLICY: adabatch::TrainerPolicy = adabatch::TrainerPolicy::DEFAULT;
    fn parts(&mut self) -> (&mut Normed, &mut AdamW) {
        (&mut self.model, &mut self.opt)
    }
}

fn adamw_params() -> ParamsAdamW {
    ParamsAdamW {
        lr: 0.05,
        weight_decay: 0.1,
        ..Default::default()
    }
}

/// A run's result, and rank 0's weights by name before and after.
type Trial = (
    adabatch::Result<TrainSummary>,
    Vec<(String, Vec<f32>)>,
    Vec<(String, Vec<f32>)>,
);

/// Trains `Normed` with the optimizer `build` makes; returns the result and rank
/// 0's weights before and after.
fn train_normed(
    kind: Norm,
    args: &TrainingArgs,
    build: impl Fn(&Normed) -> adabatch::Result<AdamW> + Sync,
) -> Trial {
    let values = |params: &Parameters| -> Vec<(String, Vec<f32>)> {
        params
            .named_parameters()
            .into_iter()
            .map(|(n, v)| (n, flat([v])))
            .collect()
    };
    let before = std::sync::Mutex::new(Vec::new());
    let result = adabatch::Run::new(&dataset(24, 5), &collate, args).launch(|ctx: &RankContext| {
        let model = Normed::new(ctx.parameters(), ctx.device(), kind)?;
        if ctx.rank() == 0 {
            *before.lock().unwrap() = values(&model.params);
        }
        let opt = build(&model)?;
        Ok(NormedTrainer { model, opt })
    });
    match result {
        Ok(trained) => {
            let after = values(&trained.trainer.model.params);
            (Ok(trained.summary), before.into_inner().unwrap(), after)
        }
        Err(e) => (Err(e), before.into_inner().unwrap(), Vec::new()),
    }
}

fn all_vars(model: &Normed) -> adabatch::Result<AdamW> {
    AdamW::new(model.params.all_vars(), adamw_params())
}

#[test]
fn candle_nn_rms_norm_trips_the_guard_and_adabatch_nn_passes_it() {
    for world in [1, 2] {
        let (result, _, _) = train_normed(Norm::Candle, &args(world, 2, 1), all_vars);
        match result {
            Err(Error::Model(ModelError::ParametersWithoutGradient { names })) => {
                assert_eq!(
                    names,
                    ["norm.weight", "proj.bias", "proj.weight"],
                    "{world} ranks"
                )
            }
            other => panic!("expected the coverage guard on {world} ranks, got {other:?}"),
        }
        let (result, before, after) = train_normed(Norm::Adabatch, &args(world, 2, 1), all_vars);
        result.unwrap();
        for ((name, b), (_, a)) in before.iter().zip(&after) {
            assert_ne!(b, a, "{name} did not train on {world} ranks");
        }
    }
    let err = train_normed(Norm::Candle, &args(1, 2, 1), all_vars)
        .0
        .unwrap_err();
    assert!(err.to_string().contains("received no gradient on any rank in the first step: norm.weight, proj.bias, proj.weight"), "{err}");
}

#[test]
fn frozen_parameters_stay_and_no_decay_follows_hugging_face() -> adabatch::Result<()> {
    let grouped = |model: &Normed| {
        let named = model.params.named_parameters();
        let groups = ParamGroups::new(&named).freeze(r"^proj\.")?;
        AdamW::with_groups(&named, &groups, adamw_params())
    };
    let (result, before, after) = train_normed(Norm::Adabatch, &args(2, 2, 2), grouped);
    result?;
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        assert_eq!(name.starts_with("proj."), b == a, "{name}");
    }
    // The default groups: biases and norm weights have no weight decay.
    let named = Normed::new(Parameters::new(1), &Device::Cpu, Norm::Adabatch)?
        .params
        .named_parameters();
    let groups = ParamGroups::new(&named);
    let no_decay: Vec<&str> = groups.no_decay_names().collect();
    assert_eq!(no_decay, ["head.bias", "norm.weight", "proj.bias"]);
    Ok(())
}

#[test]
fn no_decay_is_an_update_without_weight_decay() -> adabatch::Result<()> {
    // One step on a zero gradient: only weight decay moves a parameter.
    let named = vec![
        ("w".to_string(), Var::new(&[1.0f32, 2.0], &Device::Cpu)?),
        (
            "b.bias".to_string(),
            Var::new(&[1.0f32, 2.0], &Device::Cpu)?,
        ),
    ];
    let groups = ParamGroups::new(&named);
    let mut opt = AdamW::with_groups(&named, &groups, adamw_params())?;
    let mut grads = candle_core::backprop::GradStore::default();
    for (_, v) in &named {
        grads.insert(v.as_tensor(), v.as_tensor().zeros_like()?);
    }
    candle_nn::Optimizer::step(&mut opt, &grads)?;
    assert_eq!(flat([named[1].1.clone()]), [1.0, 2.0]);
    assert_eq!(
        flat([named[0].1.clone()]),
        [1.0 * (1.0 - 0.05 * 0.1), 2.0 * (1.0 - 0.05 * 0.1)]
    );
    Ok(())
}

#[test]
fn groups_are_checkpointed_and_a_different_freeze_is_refused() {
    let dir = std::env::temp_dir().join(format!("adabatch-groups-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let freeze = |pattern: &'static str| {
        move |model: &Normed| {
            let named = model.params.named_parameters();
            let groups = ParamGroups::new(&named).freeze(pattern)?;
            AdamW::with_groups(&named, &groups, adamw_params())
        }
    };
    let mut a = args(1, 2, 2);
    a.save.output_dir = dir.clone();
    a.save.save_steps = 6;
    let (result, _, _) = train_normed(Norm::Adabatch, &a, freeze(r"^proj\."));
    result.unwrap();
    let state = adabatch::optim::OptimizerState::load(
        &dir.join("checkpoint-6").join("optimizer.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let groups = state.groups.expect("the groups are saved");
    assert!(groups.is_frozen("proj.weight") && groups.is_no_decay("head.bias"));
    let mut resume = a.clone();
    resume.save.resume_from_checkpoint = Some(dir.join("checkpoint-6"));
    train_normed(Norm::Adabatch, &resume, freeze(r"^proj\."))
        .0
        .unwrap();
    let err = train_normed(Norm::Adabatch, &resume, freeze(r"^head\."))
        .0
        .unwrap_err();
    assert!(err.to_string().contains("froze"), "{err}");
}

#[test]
fn the_optimizer_must_hold_exactly_the_models_trainable_parameters() {
    let stranger = |model: &Normed| {
        let mut vars = model.params.all_vars();
        vars.push(Var::zeros((3, 2), DType::F32, &Device::Cpu)?);
        AdamW::new(vars, adamw_params())
    };
    let err = train_normed(Norm::Adabatch, &args(1, 2, 1), stranger)
        .0
        .unwrap_err();
    assert!(
        matches!(&err, Error::Model(ModelError::OptimizerParameterNotNamed { count: 1, shapes }) if shapes == &[vec![3, 2]]),
        "{err}"
    );
    let partial = |model: &Normed| {
        let vars = (model.params.named_parameters().into_iter())
            .filter(|(n, _)| !n.starts_with("head."))
            .map(|(_, v)| v)
            .collect();
        AdamW::new(vars, adamw_params())
    };
    let err = train_normed(Norm::Adabatch, &args(1, 2, 1), partial)
        .0
        .unwrap_err();
    assert!(
        matches!(&err, Error::Model(ModelError::ParametersNotInOptimizer { names }) if names == &["head.bias", "head.weight"]),
        "{err}"
    );
    // What the held set says, for an optimizer of one's own.
    let model = Normed::new(Parameters::new(1), &Device::Cpu, Norm::Adabatch).unwrap();
    let held = all_vars(&model).unwrap().held_parameters().unwrap();
    assert_eq!(held.vars.len(), 5);
}

#[test]
fn freeze_patterns_that_match_nothing_are_errors() {
    let model = Normed::new(Parameters::new(1), &Device::Cpu, Norm::Adabatch).unwrap();
    let named = model.params.named_parameters();
    let err = ParamGroups::new(&named).freeze(r"^embed").unwrap_err();
    assert!(
        matches!(err, Error::Model(ModelError::ParameterPattern { .. })),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("matches none of the model's 5 parameters"),
        "{err}"
    );
}

#[test]
fn a_run_saves_its_model_and_another_starts_from_it() {
    let dir = std::env::temp_dir().join(format!("adabatch-init-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut a = args(1, 4, 1);
    a.save.output_dir = dir.clone();
    a.save.save_steps = 3;
    let config = r#"{"model_type": "normed"}"#;
    let trained = adabatch::Run::new(&dataset(24, 5), &collate, &a)
        .launch(|ctx: &RankContext| {
            let mut model = Normed::new(ctx.parameters(), ctx.device(), Norm::Adabatch)?;
            model.config = Some(config.into());
            let opt = all_vars(&model)?;
            Ok(NormedTrainer { model, opt })
        })
        .unwrap();
    // The saved model and each checkpoint carry the weights and config.json.
    for saved in [dir.clone(), dir.join("checkpoint-3")] {
        assert_eq!(
            std::fs::read_to_string(saved.join("config.json")).unwrap(),
            config
        );
        assert!(saved.join("model.safetensors").is_file());
    }
    let final_weights = flat(trained.trainer.model.params.all_vars());
    // A fresh model of another seed, loaded from the saved directory.
    let fresh = Normed::new(Parameters::new(99), &Device::Cpu, Norm::Adabatch).unwrap();
    assert_ne!(flat(fresh.params.all_vars()), final_weights);
    let report = fresh.params.load_pretrained(&dir, true).unwrap();
    assert_eq!(report.loaded.len(), 5);
    assert_eq!(flat(fresh.params.all_vars()), final_weights);
    // --init-from: a run of another seed starts from those weights (its first
    // step's loss is that of the trained model on its first batch, not of a
    // fresh one), and strict loading names what does not fit.
    let mut b = args(1, 24, 1);
    b.data.seed = Some(11);
    b.length.max_steps = Some(1);
    b.lr.learning_rate = 0.0;
    let first_loss = |init: Option<std::path::PathBuf>| {
        let mut b = b.clone();
        b.save.init_from = init;
        train_normed(Norm::Adabatch, &b, all_vars)
            .0
            .unwrap()
            .step_losses[0]
    };
    let trained_loss = first_loss(Some(dir.clone()));
    assert_ne!(trained_loss, first_loss(None));
    let mut c = b.clone();
    c.data.seed = Some(3);
    c.save.init_from = Some(dir.join("checkpoint-3"));
    let from_checkpoint = train_normed(Norm::Adabatch, &c, all_vars)
        .0
        .unwrap()
        .step_losses[0];
    assert!(from_checkpoint.is_finite());
    // A checkpoint whose weights changed after it was saved is refused by its
    // manifest, whether the directory or its weights file is named.
    let damaged = dir.join("checkpoint-3").join("model.safetensors");
    let mut bytes = std::fs::read(&damaged).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&damaged, bytes).unwrap();
    for init in [dir.join("checkpoint-3"), damaged.clone()] {
        let mut d = c.clone();
        d.save.init_from = Some(init);
        let err = train_normed(Norm::Adabatch, &d, all_vars).0.unwrap_err();
        assert!(err.to_string().contains("manifest"), "{err}");
    }
    let mut bad = b.clone();
    bad.save.init_from = Some(dir.join("missing"));
    let err = train_normed(Norm::Adabatch, &bad, all_vars).0.unwrap_err();
    assert!(
        matches!(err, Error::Model(ModelError::WeightsFile { .. })),
        "{err}"
    );
}

#[test]
fn init_from_strict_and_not() {
    let dir = std::env::temp_dir().join(format!("adabatch-init-strict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // A file with the head only, and a stray tensor.
    let head = vec![
        (
            "head.weight".to_string(),
            Var::ones((1, 8), DType::F32, &Device::Cpu).unwrap(),
        ),
        (
            "stray".to_string(),
            Var::ones(2, DType::F32, &Device::Cpu).unwrap(),
        ),
    ];
    adabatch::save_pretrained(&head, None, &dir).unwrap();
    let mut a = args(1, 4, 1);
    a.length.max_steps = Some(1);
    a.save.init_from = Some(dir.join("model.safetensors"));
    let err = train_normed(Norm::Adabatch, &a, all_vars).0.unwrap_err();
    match &err {
        Error::Model(ModelError::WeightsMismatch {
            missing,
            unexpected,
            ..
        }) => {
            assert_eq!(
                missing,
                &["head.bias", "norm.weight", "proj.bias", "proj.weight"]
            );
            assert_eq!(unexpected, &["stray"]);
        }
        other => panic!("expected a strict-load error, got {other:?}"),
    }
    a.save.init_from_strict = false;
    let (result, before, _) = train_normed(Norm::Adabatch, &a, all_vars);
    result.unwrap();
    // `before` is read when the model is built, before --init-from loads.
    assert_ne!(
        before.iter().find(|(n, _)| n == "head.weight").unwrap().1,
        vec![1.0; 8]
    );
}

#[test]
fn init_from_weights_with_nan_or_inf_is_refused_naming_the_tensors() {
    let dir = std::env::temp_dir().join(format!("adabatch-init-nan-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut head = vec![1.0f32; 8];
    head[3] = f32::NAN;
    head[5] = f32::INFINITY;
    let tensors = vec![
        (
            "head.weight".to_string(),
            Var::from_tensor(&Tensor::from_vec(head, (1, 8), &Device::Cpu).unwrap()).unwrap(),
        ),
        (
            "head.bias".to_string(),
            Var::ones(1, DType::F32, &Device::Cpu).unwrap(),
        ),
    ];
    adabatch::save_pretrained(&tensors, None, &dir).unwrap();
    let mut a = args(1, 4, 1);
    a.length.max_steps = Some(1);
    a.save.init_from = Some(dir.join("model.safetensors"));
    a.save.init_from_strict = false;
    let (result, _, _) = train_normed(Norm::Adabatch, &a, all_vars);
    let err = result.unwrap_err();
    match &err {
        Error::Model(ModelError::NonFiniteInitWeights { tensors, .. }) => {
            assert_eq!(tensors, &["`head.weight`: 2 of 8"]);
        }
        other => panic!("expected non-finite weights to be refused, got {other:?}"),
    }
    assert!(err.to_string().contains("NaN or infinite"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
