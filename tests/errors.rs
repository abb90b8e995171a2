//! Every bad input gets a typed error, never a panic or a hang.

mod common;

use adabatch::prelude::*;
use adabatch::{Error, ScheduleSpec, TrainerPolicy};
use candle_core::{Device, Tensor};
use candle_nn::AdamW;
use common::*;

fn factory(ctx: &RankContext) -> adabatch::Result<IntervalTrainer> {
    adamw_factory(|model, opt| IntervalTrainer { model, opt })(ctx)
}

fn run(data: &[Example], a: &TrainingArgs) -> adabatch::Result<TrainSummary> {
    adabatch::launch(data, &collate, a, factory).map(|trained| trained.summary)
}

#[test]
fn empty_dataset() {
    let err = run(&[], &args(1, 2, 1)).unwrap_err();
    assert!(matches!(err, Error::EmptyDataset), "{err}");
}

#[test]
fn zero_batch_size() {
    let err = run(&dataset(4, 0), &args(1, 0, 1)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ZeroBatchSize {
                what: "per_device_train_batch_size"
            }
        ),
        "{err}"
    );
}

#[test]
fn more_ranks_than_examples() {
    let err = run(&dataset(3, 0), &args(4, 1, 1)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::MoreRanksThanExamples {
                world_size: 4,
                examples: 3
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("4 ranks but only 3"));
}

#[test]
fn zero_epochs_and_zero_ranks() {
    assert!(matches!(
        run(&dataset(4, 0), &args(1, 1, 0)).unwrap_err(),
        Error::ZeroEpochs
    ));
    assert!(matches!(
        run(&dataset(4, 0), &args(0, 1, 1)).unwrap_err(),
        Error::InvalidSetting {
            name: "nproc_per_node",
            ..
        }
    ));
    let mut a = args(1, 1, 1);
    a.max_steps = Some(0);
    assert!(matches!(
        run(&dataset(4, 0), &a).unwrap_err(),
        Error::InvalidSetting {
            name: "max_steps",
            ..
        }
    ));
}

#[test]
fn drop_last_with_a_global_batch_larger_than_the_data() {
    let mut a = args(2, 3, 1);
    a.dataloader_drop_last = Some(true);
    let err = run(&dataset(5, 0), &a).unwrap_err();
    assert!(
        matches!(
            err,
            Error::GlobalBatchTooLarge {
                global_batch: 6,
                after_step: None,
                ..
            }
        ),
        "{err}"
    );
    // Growing past N later names the step that chose the size.
    let mut a = args(1, 4, 3);
    a.max_steps = Some(100);
    a.dataloader_drop_last = Some(true);
    let err = run(&dataset(9, 0), &a).unwrap_err();
    assert!(
        matches!(
            err,
            Error::GlobalBatchTooLarge {
                global_batch: 10,
                after_step: Some(30),
                ..
            }
        ),
        "{err}"
    );
}

fn zero_after_three(step: usize, current: usize) -> usize {
    if step >= 3 {
        0
    } else {
        current
    }
}

hand_trainer!(
    ZeroTrainer,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Custom(zero_after_three),
        ..TrainerPolicy::DEFAULT
    }
);

#[test]
fn schedule_returning_zero_names_the_step() {
    let err = adabatch::launch(
        &dataset(40, 0),
        &collate,
        &args(2, 1, 1),
        adamw_factory(|model, opt| ZeroTrainer { model, opt }),
    )
    .map(|trained| trained.summary)
    .unwrap_err();
    assert!(
        matches!(err, Error::ScheduleReturnedZero { step: 3 }),
        "{err}"
    );
    assert!(err.to_string().contains("after step 3"));
}

// No shuffle: example `i` is trained at a known step.
hand_trainer!(
    Ordered,
    AdamW,
    TrainerPolicy {
        shuffle: false,
        ..TrainerPolicy::DEFAULT
    }
);

#[test]
fn non_finite_loss_names_the_step() {
    // The NaN example sits at index 5; no shuffle puts it in step 6 at size 1.
    let mut data = dataset(10, 0);
    data[5].y = f32::NAN;
    let err = adabatch::launch(
        &data,
        &collate,
        &args(1, 1, 1),
        adamw_factory(|model, opt| Ordered { model, opt }),
    )
    .map(|trained| trained.summary)
    .unwrap_err();
    assert!(matches!(err, Error::NonFiniteLoss { step: 6, .. }), "{err}");
}

#[test]
fn a_failing_collate_on_one_rank_stops_every_rank() {
    let data = dataset(8, 0);
    let collate_fails_on_rank_1 = |items: &[Example], device: &Device| {
        if items.iter().any(|e| e.tokens == usize::MAX) {
            candle_core::bail!("cannot collate the poisoned example")
        }
        collate(items, device)
    };
    let mut poisoned = data.clone();
    poisoned[7].tokens = usize::MAX;
    let err = adabatch::launch(
        &poisoned,
        &collate_fails_on_rank_1,
        &args(2, 2, 1),
        adamw_factory(|model, opt| Ordered { model, opt }),
    )
    .map(|trained| trained.summary)
    .unwrap_err();
    assert!(err.to_string().contains("poisoned"), "{err}");
}

#[test]
fn a_panicking_model_is_reported_not_propagated() {
    let data = dataset(8, 0);
    let panicking_collate = |items: &[Example], device: &Device| {
        assert!(items.len() < 2, "collate refuses batches of two");
        collate(items, device)
    };
    let err = adabatch::launch(&data, &panicking_collate, &args(2, 2, 1), factory)
        .map(|trained| trained.summary)
        .unwrap_err();
    assert!(matches!(err, Error::RankPanicked { .. }), "{err}");
    assert!(err.to_string().contains("refuses batches of two"));
}

#[test]
fn a_failing_factory_on_one_rank_is_reported() {
    let err = adabatch::launch(
        &dataset(8, 0),
        &collate,
        &args(3, 1, 1),
        |ctx: &RankContext| {
            if ctx.rank() == 2 {
                return Err(Error::msg("rank 2 has no model"));
            }
            factory(ctx)
        },
    )
    .map(|trained| trained.summary)
    .unwrap_err();
    assert!(err.to_string().contains("rank 2 has no model"), "{err}");
}

#[test]
fn wrong_loss_shape_is_a_typed_error() {
    struct Scalar(Regression);
    impl TrainModel for Scalar {
        type Batch = RegBatch;
        fn per_example_loss(&self, batch: &RegBatch) -> candle_core::Result<Tensor> {
            self.0.per_example_loss(batch)?.mean_all()
        }
        fn named_parameters(&self) -> Vec<(String, candle_core::Var)> {
            self.0.named_parameters()
        }
    }
    struct T(Scalar, AdamW);
    impl AdaptiveTrainer for T {
        type Model = Scalar;
        type Optimizer = AdamW;
        const POLICY: TrainerPolicy = TrainerPolicy::DEFAULT;
        fn parts(&mut self) -> (&mut Scalar, &mut AdamW) {
            (&mut self.0, &mut self.1)
        }
    }
    let err = adabatch::launch(
        &dataset(8, 0),
        &collate,
        &args(1, 4, 1),
        |ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = adamw(&model, 0.05)?;
            Ok(T(Scalar(model), opt))
        },
    )
    .map(|trained| trained.summary)
    .unwrap_err();
    assert!(matches!(err, Error::LossShape { examples: 4, .. }), "{err}");
}

#[test]
fn train_refuses_several_ranks_and_bad_devices() {
    let model = Regression::new(adabatch::Parameters::new(1), &Device::Cpu).unwrap();
    let opt = adamw(&model, 0.05).unwrap();
    let err = adabatch::train(
        &mut IntervalTrainer { model, opt },
        &dataset(8, 0),
        &collate,
        &args(2, 1, 1),
    )
    .unwrap_err();
    assert!(err.to_string().contains("launch"), "{err}");
    let mut a = args(1, 1, 1);
    a.device = "tpu".into();
    assert!(matches!(
        run(&dataset(8, 0), &a).unwrap_err(),
        Error::Device { .. }
    ));
}
