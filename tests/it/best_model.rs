//! `--eval-strategy` / `--save-strategy` and `--load-best-model-at-end` (HF): when
//! a run evaluates and saves, which checkpoint is the best, that
//! `--save-total-limit` keeps it, that the model ends with its weights on every
//! rank, and that a resumed run goes on comparing against it.

use crate::common;

use adabatch::optim::{AdamW, ParamsAdamW};
use adabatch::prelude::*;
use adabatch::IntervalStrategy;
use candle_core::Device;
use common::*;

#[adaptive_trainer(schedule = constant)]
struct Plain {
    #[model]
    model: Regression,
    #[optimizer]
    opt: AdamW,
}

fn factory(ctx: &RankContext) -> adabatch::Result<Plain> {
    let model = Regression::new(ctx.parameters(), ctx.device())?;
    let opt = AdamW::new(
        model.params.all_vars(),
        ParamsAdamW {
            lr: 0.05,
            ..Default::default()
        },
    )?;
    Ok(Plain::new(model, opt))
}

fn weights(model: &Regression) -> Vec<f32> {
    flat(model.params.named_parameters().into_iter().map(|(_, v)| v))
}

fn checkpoint_weights(dir: &std::path::Path) -> Vec<f32> {
    let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
        .expect("checkpoint weights");
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    names
        .into_iter()
        .flat_map(|n| tensors[n].flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect()
}

fn steps_of(out: &std::path::Path) -> Vec<usize> {
    adabatch::train::checkpoint::complete_checkpoints(out)
        .unwrap()
        .into_iter()
        .map(|(step, _)| step)
        .collect()
}

fn best_args(out: &std::path::Path, world: usize) -> TrainingArgs {
    {
        let mut a = args(world, 2, 2);
        a.eval.eval_steps = Some(2);
        a.save.save_steps = 2;
        a.save.save_total_limit = Some(1);
        a.save.load_best_model_at_end = true;
        a.save.output_dir = out.to_path_buf();
        a
    }
}

#[test]
fn the_model_ends_with_the_best_checkpoints_weights() {
    let (train, eval) = turning_data();
    for world in [1, 2] {
        let out = temp_log("best").with_extension("");
        let a = best_args(&out, world);
        let Trained { trainer, summary } =
            Plain::launch_with_eval(&train, &eval, &collate, &a, factory).unwrap();
        let losses: Vec<(usize, f64)> = summary
            .evaluations
            .iter()
            .map(|e| (e.step, e.eval_loss))
            .collect();
        // The best evaluation, computed here from the log.
        let &(best_step, best_loss) = losses.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
        assert!(best_step < summary.global_step, "{losses:?}");
        let best_dir = out.join(format!("checkpoint-{best_step}"));
        assert_eq!(
            summary.best_model_checkpoint.as_deref(),
            Some(best_dir.as_path())
        );
        assert_eq!(summary.best_metric, Some(best_loss));
        // --save-total-limit 1 keeps the best and the newest.
        assert_eq!(steps_of(&out), [best_step, summary.global_step]);
        // The returned trainer (rank 0) holds the best weights, not the last ones.
        let last = checkpoint_weights(&out.join(format!("checkpoint-{}", summary.global_step)));
        assert_eq!(weights(&trainer.model), checkpoint_weights(&best_dir));
        assert_ne!(weights(&trainer.model), last);
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn a_larger_metric_can_be_the_better_one() {
    // With greater_is_better, the highest eval loss wins: the last evaluation.
    let (train, eval) = turning_data();
    let out = temp_log("best-greater").with_extension("");
    let a = {
        let mut args = best_args(&out, 1);
        args.save.greater_is_better = Some(true);
        args
    };
    let summary = Plain::launch_with_eval(&train, &eval, &collate, &a, factory)
        .unwrap()
        .summary;
    let highest = summary
        .evaluations
        .iter()
        .max_by(|a, b| a.eval_loss.total_cmp(&b.eval_loss))
        .unwrap();
    assert_eq!(summary.best_metric, Some(highest.eval_loss));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn epoch_strategies_evaluate_and_save_at_epoch_ends() {
    // 20 examples, global batch 6: epochs end after steps 4 and 8.
    let (train, eval) = (dataset(20, 1), dataset(6, 2));
    let out = temp_log("epoch-strategy").with_extension("");
    let a = {
        let mut a = args(2, 3, 2);
        a.eval.eval_strategy = Some(IntervalStrategy::Epoch);
        a.save.save_strategy = Some(IntervalStrategy::Epoch);
        a.save.output_dir = out.clone();
        a
    };
    let summary = Plain::launch_with_eval(&train, &eval, &collate, &a, factory)
        .unwrap()
        .summary;
    assert_eq!(summary.global_step, 8);
    let evaluated: Vec<usize> = summary.evaluations.iter().map(|e| e.step).collect();
    assert_eq!(evaluated, [4, 8]);
    assert_eq!(steps_of(&out), [4, 8]);
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_resumed_run_keeps_the_best_checkpoint() {
    let (train, eval) = turning_data();
    let out = temp_log("best-resume").with_extension("");
    let a = {
        let mut args = best_args(&out, 2);
        args.save.save_total_limit = None;
        args
    };
    let straight = Plain::launch_with_eval(&train, &eval, &collate, &a, factory)
        .unwrap()
        .summary;
    let best_step = straight.best_model_checkpoint.clone().unwrap();
    // Resume from a checkpoint after the best one: the best is remembered.
    let cut = straight.evaluations[straight.evaluations.len() / 2].step;
    let best_eval = straight
        .evaluations
        .iter()
        .min_by(|a, b| a.eval_loss.total_cmp(&b.eval_loss))
        .unwrap();
    assert!(best_eval.step < cut, "the best comes before the cut");
    let resumed_args = {
        let mut args = a.clone();
        args.save.resume_from_checkpoint = Some(out.join(format!("checkpoint-{cut}")));
        args
    };
    let Trained { trainer, summary } =
        Plain::launch_with_eval(&train, &eval, &collate, &resumed_args, factory).unwrap();
    assert_eq!(summary.best_model_checkpoint, Some(best_step.clone()));
    assert_eq!(summary.best_metric, straight.best_metric);
    assert_eq!(weights(&trainer.model), checkpoint_weights(&best_step));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn load_best_model_needs_an_eval_dataset() {
    let out = temp_log("best-no-eval").with_extension("");
    let err = Plain::launch(&dataset(20, 1), &collate, &best_args(&out, 1), factory).unwrap_err();
    assert!(
        matches!(
            err,
            adabatch::Error::Settings(adabatch::SettingsError::ConflictingSettings {
                first: "--load-best-model-at-end",
                ..
            })
        ),
        "{err}"
    );
}
