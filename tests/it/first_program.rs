//! What a user's first program relies on: the trained model comes back from
//! `launch` and `train`, training nothing is refused, and conflicts are loud
//! (a checkpoint of another policy is refused; a resumed log is continued, marked).

use crate::common;

use adabatch::optim::Sgd;
use adabatch::prelude::*;
use adabatch::{CheckpointError, Error, Growth, ModelError, ScheduleSpec, TrainerPolicy};
use candle_core::{DType, Device, Var};
use common::*;

hand_trainer!(SgdTrainer, Sgd, TrainerPolicy::DEFAULT);
hand_trainer!(
    CappedTrainer,
    Sgd,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 1,
            growth: Growth::Add(1)
        },
        max_batch: Some(3),
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    UncappedTrainer,
    Sgd,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 1,
            growth: Growth::Add(1)
        },
        ..TrainerPolicy::DEFAULT
    }
);

fn values(params: &[(String, Var)]) -> Vec<Vec<f32>> {
    params
        .iter()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

/// `launch` returns rank 0's trained trainer on 1 and 2 ranks: its weights are the
/// last checkpoint's, and `train(&mut trainer)` leaves the trained weights in place.
#[test]
fn the_trained_model_comes_back() {
    for world in [1, 2] {
        let out = temp_log("first-program").with_extension("");
        let mut a = args(world, 2, 2);
        a.save.save_steps = 1000; // only the final checkpoint
        a.save.output_dir = out.clone();
        let mut trained = adabatch::Run::new(&dataset(24, 3), &collate, &a)
            .launch(|ctx: &RankContext| {
                let model = Regression::new(ctx.parameters(), ctx.device())?;
                let opt = Sgd::new(model.params.all_vars(), 0.05);
                Ok(SgdTrainer { model, opt })
            })
            .unwrap();
        let params = trained.trainer.parts().0.named_parameters();
        let checkpoint = adabatch::train::checkpoint::latest(&out).unwrap();
        let saved =
            candle_core::safetensors::load(checkpoint.join("model.safetensors"), &Device::Cpu)
                .unwrap();
        for (name, var) in &params {
            let from_file = saved[name].flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let in_memory = var
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(from_file, in_memory, "{world} rank(s): `{name}`");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
    // One rank: the same trainer, trained in place, differs from its initial weights.
    let model = Regression::new(adabatch::Parameters::new(3), &Device::Cpu).unwrap();
    let before = values(&model.named_parameters());
    let opt = Sgd::new(model.params.all_vars(), 0.05);
    let mut trainer = SgdTrainer { model, opt };
    adabatch::Run::new(&dataset(24, 3), &collate, &args(1, 2, 1))
        .train(&mut trainer)
        .unwrap();
    assert_ne!(values(&trainer.model.named_parameters()), before);
}

hand_trainer!(CandleSgdTrainer, candle_nn::SGD, TrainerPolicy::DEFAULT);

/// An optimizer holding a variable the model does not name, or only some of the
/// model's parameters, is refused before the first step when it says what it
/// holds (adabatch's); one that cannot say (candle's) is caught at the first
/// update.
#[test]
fn training_nothing_is_refused() {
    let data = dataset(12, 1);
    let weight_only = |model: &Regression| -> Vec<Var> {
        model
            .named_parameters()
            .into_iter()
            .filter(|(name, _)| name.ends_with("weight"))
            .map(|(_, v)| v)
            .collect()
    };
    let err = adabatch::Run::new(&data, &collate, &args(2, 2, 1))
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let stranger = Var::zeros(3, DType::F32, ctx.device())?;
            Ok(SgdTrainer {
                model,
                opt: Sgd::new(vec![stranger], 0.1),
            })
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Model(ModelError::OptimizerParameterNotNamed { count: 1, .. })
        ),
        "{err}"
    );
    let err = adabatch::Run::new(&data, &collate, &args(1, 2, 1))
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = Sgd::new(weight_only(&model), 0.1);
            Ok(SgdTrainer { model, opt })
        })
        .unwrap_err();
    match err {
        Error::Model(ModelError::ParametersNotInOptimizer { names }) => {
            assert_eq!(names, vec!["linear.bias"])
        }
        other => panic!("expected ParametersNotInOptimizer, got {other}"),
    }
    let err = adabatch::Run::new(&data, &collate, &args(2, 2, 1))
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let stranger = Var::zeros(3, DType::F32, ctx.device())?;
            let opt = <candle_nn::SGD as candle_nn::Optimizer>::new(vec![stranger], 0.1)?;
            Ok(CandleSgdTrainer { model, opt })
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Model(ModelError::OptimizerUpdatesNothing { parameters: 2 })
        ),
        "{err}"
    );
    let err = adabatch::Run::new(&data, &collate, &args(1, 2, 1))
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = <candle_nn::SGD as candle_nn::Optimizer>::new(weight_only(&model), 0.1)?;
            Ok(CandleSgdTrainer { model, opt })
        })
        .unwrap_err();
    match err {
        Error::Model(ModelError::ParametersNotUpdated { names }) => {
            assert_eq!(names, vec!["linear.bias"])
        }
        other => panic!("expected ParametersNotUpdated, got {other}"),
    }
}

/// An optimizer that says what it holds is checked by that before the first
/// step, not by its first update: a first rate too small to change any weight
/// in f32 (a long warm-up's first step) is not taken for an optimizer that
/// trains nothing.
#[test]
fn a_first_update_below_the_weights_precision_is_not_refused() {
    let data = dataset(12, 1);
    let mut tiny = args(1, 2, 1);
    tiny.lr.learning_rate = 1e-30;
    let trained = adabatch::Run::new(&data, &collate, &tiny).launch(|ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = Sgd::new(model.params.all_vars(), 1e-30);
        Ok(SgdTrainer { model, opt })
    });
    assert!(
        trained.is_ok(),
        "{}",
        trained.err().map(|e| e.to_string()).unwrap_or_default()
    );
}

/// A checkpoint written without `max_batch` does not silently run a trainer with
/// `max_batch = 3` (or the other way): the resume names the key.
#[test]
fn a_checkpoint_of_another_policy_is_refused() {
    let out = temp_log("first-program-policy").with_extension("");
    let mut a = args(1, 1, 1);
    a.length.max_steps = Some(2);
    a.save.save_steps = 2;
    a.save.output_dir = out.clone();
    adabatch::Run::new(&dataset(20, 2), &collate, &a)
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = Sgd::new(model.params.all_vars(), 0.05);
            Ok(UncappedTrainer { model, opt })
        })
        .unwrap();
    a.length.max_steps = Some(4);
    a.save.resume_from_checkpoint = Some(out.join("checkpoint-2"));
    let err = adabatch::Run::new(&dataset(20, 2), &collate, &a)
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = Sgd::new(model.params.all_vars(), 0.05);
            Ok(CappedTrainer { model, opt })
        })
        .unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(CheckpointError::CheckpointMismatch { what, .. }) if what == "policy key `max_batch`"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// A resumed run appends to its JSONL log after a resume mark, instead of
/// truncating it.
#[test]
fn a_resumed_log_is_continued_and_marked() {
    let out = temp_log("first-program-log").with_extension("");
    let log = temp_log("first-program-jsonl");
    let mut a = args(1, 1, 1);
    a.length.max_steps = Some(3);
    a.save.save_steps = 3;
    a.save.output_dir = out.clone();
    a.logging.log_jsonl = Some(log.clone());
    let build = |ctx: &RankContext| {
        let model = Regression::new(ctx.parameters(), ctx.device())?;
        let opt = Sgd::new(model.params.all_vars(), 0.05);
        Ok(SgdTrainer { model, opt })
    };
    adabatch::Run::new(&dataset(20, 2), &collate, &a)
        .launch(build)
        .unwrap();
    a.length.max_steps = Some(5);
    a.save.resume_from_checkpoint = Some("latest".into());
    adabatch::Run::new(&dataset(20, 2), &collate, &a)
        .launch(build)
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3 + 1 + 2, "{text}");
    assert!(lines[3].contains(r#""event":"resume""#) && lines[3].contains(r#""step":3"#));
    let steps: Vec<usize> = read_log(&log).iter().map(|l| l.step).collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 5]);
    let _ = std::fs::remove_dir_all(&out);
}
