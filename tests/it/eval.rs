//! Evaluation (`launch_with_eval`, `--eval-steps`, `--per-device-eval-batch-size`):
//! the eval loss and metrics against an independent computation on the trained
//! model, every eval example once across ranks, the same numbers on 1 and 3 ranks,
//! the JSONL rows, and the typed errors.

use crate::common;

use adabatch::candle_nn::{Linear, Module, Optimizer, SGD};
use adabatch::prelude::*;
use adabatch::{DataError, Error, EvalLog, ModelError, SettingsError};
use candle_core::{DType, Device, Tensor, Var};
use common::{collate, dataset, Example, RegBatch, FEATURES};

/// Linear regression whose eval metrics are the target itself (its mean over the
/// eval set is known without the model) and the absolute error.
struct Scored {
    linear: Linear,
    vars: Vec<Var>,
    /// Breaks the metric's shape, for the error test.
    bad_metric: bool,
}

impl TrainModel for Scored {
    type Batch = RegBatch;
    fn per_example_loss(&self, batch: &RegBatch) -> candle_core::Result<Tensor> {
        let pred = self.linear.forward(&batch.x)?.squeeze(1)?;
        (pred - &batch.y)?.sqr()
    }
    fn named_parameters(&self) -> Vec<(String, Var)> {
        vec![
            ("b".into(), self.vars[1].clone()),
            ("w".into(), self.vars[0].clone()),
        ]
    }
    fn eval_metrics(&self, batch: &RegBatch) -> candle_core::Result<Vec<(&'static str, Tensor)>> {
        let pred = self.linear.forward(&batch.x)?.squeeze(1)?;
        let target = if self.bad_metric {
            batch.y.unsqueeze(1)?
        } else {
            batch.y.clone()
        };
        Ok(vec![
            ("abs_error", (pred - &batch.y)?.abs()?),
            ("target", target),
        ])
    }
}

#[adaptive_trainer(schedule = constant)]
struct Evaluated {
    #[model]
    model: Scored,
    #[optimizer]
    opt: SGD,
}

fn factory(bad_metric: bool) -> impl Fn(&RankContext) -> adabatch::Result<Evaluated> + Sync {
    move |ctx: &RankContext| {
        let w = Var::zeros((1, FEATURES), DType::F32, ctx.device())?;
        let b = Var::zeros(1, DType::F32, ctx.device())?;
        let linear = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
        let opt = SGD::new(vec![w.clone(), b.clone()], 0.05)?;
        Ok(Evaluated::new(
            Scored {
                linear,
                vars: vec![w, b],
                bad_metric,
            },
            opt,
        ))
    }
}

fn args(ranks: usize, eval_steps: Option<usize>) -> TrainingArgs {
    {
        let mut args = TrainingArgs::default();
        args.launch.nproc_per_node = ranks;
        args.batch.per_device_train_batch_size = 4;
        args.length.num_train_epochs = 2;
        args.eval.eval_steps = eval_steps;
        args.eval.per_device_eval_batch_size = 5;
        args.lr.learning_rate = 0.05;
        args.data.seed = Some(3);
        args.logging.quiet = true;
        args
    }
}

/// Mean loss, mean |error| and mean target of `model` over `data`, computed here in
/// one batch (the engine evaluates in chunks over ranks).
fn reference(model: &Scored, data: &[Example]) -> (f64, f64, f64) {
    let batch = collate(data, &Device::Cpu).unwrap();
    let mean = |t: Tensor| {
        t.to_dtype(DType::F64)
            .unwrap()
            .mean_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let pred = model.linear.forward(&batch.x).unwrap().squeeze(1).unwrap();
    let err = (pred - &batch.y).unwrap();
    (
        mean(err.sqr().unwrap()),
        mean(err.abs().unwrap()),
        mean(batch.y.clone()),
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + b.abs())
}

#[test]
fn final_eval_matches_an_independent_computation_on_the_trained_model() {
    let (train, eval) = (dataset(40, 1), dataset(23, 2));
    let Trained { trainer, summary } =
        Evaluated::launch_with_eval(&train, &eval, &collate, &args(1, None), factory(false))
            .unwrap();
    assert_eq!(
        summary.evaluations.len(),
        1,
        "without --eval-steps: once, at the end"
    );
    let last = summary.final_eval().unwrap();
    assert_eq!(last.step, summary.global_step);
    assert_eq!(last.eval_examples, 23);
    let (loss, abs_error, target) = reference(&trainer.model, &eval);
    assert!(close(last.eval_loss, loss), "{} vs {loss}", last.eval_loss);
    assert!(close(last.get("eval_abs_error").unwrap(), abs_error));
    assert!(close(last.get("eval_target").unwrap(), target));
    // The model trained: the error fell from its value at w = 0.
    let untrained: f64 = eval.iter().map(|e| f64::from(e.y).powi(2)).sum::<f64>() / 23.0;
    assert!(
        last.eval_loss < 0.5 * untrained,
        "{} vs {untrained}",
        last.eval_loss
    );
    assert!(summary.to_string().contains("'eval_loss'"), "{summary}");
}

/// `Run::evaluate` and the attribute's `T::evaluate` (HF's `trainer.evaluate()`)
/// evaluate a trained model without training: the run's own last evaluation to
/// the bit, at step 0; a run without an eval set, or with an empty one, is a
/// typed error.
#[test]
fn run_evaluate_gives_the_runs_last_evaluation_without_training() {
    let (train, eval) = (dataset(40, 1), dataset(23, 2));
    let a = args(1, None);
    let Trained {
        mut trainer,
        summary,
    } = Evaluated::launch_with_eval(&train, &eval, &collate, &a, factory(false)).unwrap();
    let last = summary.final_eval().unwrap();
    let run = adabatch::Run::new(&train, &collate, &a);
    let again = run.with_eval(&eval).evaluate(&mut trainer).unwrap();
    assert_eq!((again.step, again.eval_examples), (0, 23));
    assert_eq!(again.eval_loss.to_bits(), last.eval_loss.to_bits());
    assert_eq!(again.metrics, last.metrics);
    let (loss, abs_error, _) = reference(&trainer.model, &eval);
    assert!(close(again.eval_loss, loss) && close(again.get("eval_abs_error").unwrap(), abs_error));
    // Evaluating trains nothing: a second evaluation is the same.
    let third = adabatch::Run::new(&train, &collate, &a)
        .with_eval(&eval)
        .evaluate(&mut trainer)
        .unwrap();
    assert_eq!(third, again);
    // The attribute's glue: the eval set alone.
    assert_eq!(trainer.evaluate(&eval, &collate, &a).unwrap(), again);
    let err = adabatch::Run::new(&train, &collate, &a)
        .evaluate(&mut trainer)
        .unwrap_err();
    assert!(
        matches!(err, Error::Settings(SettingsError::NoEvalSet { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("needs an eval set"), "{err}");
    // An empty eval set: the typed error a run's start gives, not a loss of 0 / 0.
    let empty: Vec<Example> = Vec::new();
    let refused = |err: Error| {
        assert!(
            matches!(
                err,
                Error::Data(DataError::EvalSetTooSmall { examples: 0, .. })
            ),
            "{err}"
        );
    };
    refused(trainer.evaluate(&empty, &collate, &a).unwrap_err());
    let run = adabatch::Run::new(&train, &collate, &a);
    refused(run.with_eval(&empty).evaluate(&mut trainer).unwrap_err());
    let launched = Evaluated::launch_with_eval(&train, &empty, &collate, &a, factory(false));
    refused(launched.err().unwrap());
}

#[test]
fn every_eval_example_counts_once_and_ranks_agree() {
    // 23 eval examples over 3 ranks (8, 8, 7) in chunks of 5; 48 training examples
    // so 1 rank of 12 and 3 ranks of 4 take the same steps.
    let (train, eval) = (dataset(48, 1), dataset(23, 2));
    let one = {
        let mut a = args(1, Some(2));
        a.batch.per_device_train_batch_size = 12;
        a
    };
    let three = args(3, Some(2));
    let a = Evaluated::launch_with_eval(&train, &eval, &collate, &one, factory(false))
        .unwrap()
        .summary;
    let b = Evaluated::launch_with_eval(&train, &eval, &collate, &three, factory(false))
        .unwrap()
        .summary;
    // 4 steps per epoch, 2 epochs: evaluations after steps 2, 4, 6, 8.
    let steps = |s: &TrainSummary| s.evaluations.iter().map(|e| e.step).collect::<Vec<_>>();
    assert_eq!(steps(&a), [2, 4, 6, 8]);
    assert_eq!(steps(&b), steps(&a));
    let exact_target: f64 = eval.iter().map(|e| f64::from(e.y)).sum::<f64>() / 23.0;
    for (x, y) in a.evaluations.iter().zip(&b.evaluations) {
        assert_eq!((x.eval_examples, y.eval_examples), (23, 23));
        assert!(close(x.eval_loss, y.eval_loss), "{x:?} vs {y:?}");
        assert!(close(
            x.get("eval_abs_error").unwrap(),
            y.get("eval_abs_error").unwrap()
        ));
        // A mean that counted any example twice or missed one would be off.
        assert!(close(y.get("eval_target").unwrap(), exact_target));
    }
}

#[test]
fn eval_rows_go_to_the_jsonl_log() {
    let log = common::temp_log("eval-rows");
    let (train, eval) = (dataset(40, 1), dataset(10, 2));
    let a = {
        let mut a = args(2, Some(3));
        a.logging.log_jsonl = Some(log.clone());
        a
    };
    let summary = Evaluated::launch_with_eval(&train, &eval, &collate, &a, factory(false))
        .unwrap()
        .summary;
    let text = std::fs::read_to_string(&log).unwrap();
    let rows: Vec<EvalLog> = text
        .lines()
        .filter(|l| l.contains(r#""event":"eval""#))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // (serde_json's default float parsing may differ in the last bit.)
    assert_eq!(rows.len(), summary.evaluations.len());
    for (row, kept) in rows.iter().zip(&summary.evaluations) {
        assert_eq!(
            (row.step, row.eval_examples),
            (kept.step, kept.eval_examples)
        );
        assert_eq!(
            row.metrics.keys().collect::<Vec<_>>(),
            kept.metrics.keys().collect::<Vec<_>>()
        );
        assert!(close(row.eval_loss, kept.eval_loss));
    }
    // 10 steps: after 3, 6, 9 and at the end.
    assert_eq!(
        rows.iter().map(|r| r.step).collect::<Vec<_>>(),
        [3, 6, 9, 10]
    );
    // Step lines still read as steps.
    assert_eq!(common::read_log(&log).len(), 10);
    let _ = std::fs::remove_file(log);
}

#[test]
fn bad_eval_settings_are_typed_errors() {
    let train = dataset(40, 1);
    let tiny = dataset(2, 2);
    let err = Evaluated::launch_with_eval(&train, &tiny, &collate, &args(3, None), factory(false))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Data(DataError::EvalSetTooSmall {
                world_size: 3,
                examples: 2
            })
        ),
        "{err}"
    );
    let empty: Vec<Example> = Vec::new();
    let err = Evaluated::launch_with_eval(&train, &empty, &collate, &args(1, None), factory(false))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Data(DataError::EvalSetTooSmall { examples: 0, .. })
        ),
        "{err}"
    );
    let zero_batch = {
        let mut a = args(1, None);
        a.eval.per_device_eval_batch_size = 0;
        a
    };
    let err = Evaluated::launch_with_eval(&train, &tiny, &collate, &zero_batch, factory(false))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ZeroBatchSize {
                what: "per_device_eval_batch_size"
            })
        ),
        "{err}"
    );
    let zero_steps = args(1, Some(0));
    let err = Evaluated::launch_with_eval(&train, &tiny, &collate, &zero_steps, factory(false))
        .unwrap_err();
    assert!(err.to_string().contains("eval_steps"), "{err}");
    let err = Evaluated::launch_with_eval(&train, &tiny, &collate, &args(2, None), factory(true))
        .unwrap_err();
    assert!(
        matches!(err, Error::Model(ModelError::EvalMetric { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("target"), "{err}");
}

/// `--eval-on-start` evaluates the untrained model (w = 0, so each prediction is
/// 0) before the first step, at step 0; later evaluations go on as scheduled.
#[test]
fn eval_on_start_evaluates_the_untrained_model() {
    let (train, eval) = (dataset(40, 1), dataset(23, 2));
    for ranks in [1, 2] {
        let a = {
            let mut a = args(ranks, Some(4));
            a.eval.eval_on_start = true;
            a
        };
        let summary = Evaluated::launch_with_eval(&train, &eval, &collate, &a, factory(false))
            .unwrap()
            .summary;
        let steps: Vec<usize> = summary.evaluations.iter().map(|e| e.step).collect();
        assert_eq!(steps[0], 0, "{steps:?}");
        assert_eq!(&steps[1..3], [4, 8], "{steps:?}");
        let first = &summary.evaluations[0];
        let n = eval.len() as f64;
        let loss: f64 = eval.iter().map(|e| f64::from(e.y).powi(2)).sum::<f64>() / n;
        let abs_error: f64 = eval.iter().map(|e| f64::from(e.y).abs()).sum::<f64>() / n;
        assert!(
            close(first.eval_loss, loss),
            "{} vs {loss}",
            first.eval_loss
        );
        assert!(close(first.get("eval_abs_error").unwrap(), abs_error));
        assert_eq!(first.eval_examples, 23);
    }
    // Without an eval dataset there is nothing to evaluate: a typed error.
    let a = {
        let mut a = args(1, None);
        a.eval.eval_on_start = true;
        a
    };
    let err = Evaluated::launch(&train, &collate, &a, factory(false)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ConflictingSettings {
                first: "--eval-on-start",
                ..
            })
        ),
        "{err}"
    );
}
