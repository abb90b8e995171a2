//! Every bad input gets a typed error, never a panic or a hang. Each variant of
//! `adabatch::Error` and of its area enums (`SettingsError`, `DataError`,
//! `CheckpointError`, `ModelError`, `TrainingError`, `DistributedError`)
//! reachable from the public API has a test matching the variant and its fields;
//! `assert_sentence` checks its message reads as a sentence.
//!
//! | variant                         | test                                                 |
//! |---------------------------------|------------------------------------------------------|
//! | `Candle`                        | `candle_errors_keep_their_type`                      |
//! | `DataError::EmptyDataset`                  | `empty_dataset`                                      |
//! | `DataError::MoreRanksThanExamples`         | `more_ranks_than_examples`                           |
//! | `SettingsError::ZeroBatchSize`                 | `zero_batch_size`, `invalid_settings_name_the_setting` |
//! | `SettingsError::ZeroEpochs`                    | `zero_epochs_and_zero_ranks`                         |
//! | `TrainingError::ScheduleReturnedZero`          | `schedule_returning_zero_names_the_step`             |
//! | `DataError::GlobalBatchTooLarge`           | `drop_last_with_a_global_batch_larger_than_the_data` |
//! | `TrainingError::NonFiniteLoss`                 | `non_finite_loss_names_the_step`                     |
//! | `SettingsError::InvalidSetting`                | `invalid_settings_name_the_setting`, `zero_epochs_and_zero_ranks`, `batch_limits_crossed` |
//! | `SettingsError::BatchLimitsCrossed`            | `batch_limits_crossed`                               |
//! | `SettingsError::InvalidSchedule`               | `invalid_schedule`                                   |
//! | `SettingsError::InvalidMixer`                  | `invalid_mixer`                                      |
//! | `SettingsError::UnsupportedPolicy`             | `unsupported_policy`                                 |
//! | `SettingsError::ConflictingSettings`           | `conflicting_settings`                               |
//! | `DataError::LengthsMismatch`               | `lengths_mismatch`                                   |
//! | `DataError::CollateSize`                   | `collate_size`                                       |
//! | `DataError::NoTokens`                      | `no_tokens`                                          |
//! | `ModelError::DuplicateParameter`            | `duplicate_parameter`                                |
//! | `TrainingError::RegressorDisagrees`            | `regressor_disagrees`                                |
//! | `CheckpointError::CorruptCheckpoint`             | `checkpoint_errors` (+ checkpoint.rs)                |
//! | `CheckpointError::CheckpointMismatch`            | `checkpoint_errors` (+ checkpoint.rs)                |
//! | `CheckpointError::MidEpochLengthAwareCheckpoint` | `mid_epoch_length_aware_checkpoint`                  |
//! | `Message`                       | `message_from_user_code`, `a_failing_factory_on_one_rank_is_reported` |
//! | `ModelError::LossShape`                     | `wrong_loss_shape_is_a_typed_error`                  |
//! | `ModelError::NoParameters`                  | `no_parameters`                                      |
//! | `DataError::EvalSetTooSmall`               | eval.rs `bad_eval_settings_are_typed_errors`         |
//! | `ModelError::EvalMetric`                    | eval.rs `bad_eval_settings_are_typed_errors`         |
//! | `DataError::NoSources`, `DataError::EmptySource`, `DataError::DuplicateSource`, `DataError::UnknownSource` | user::sources unit tests, mixing.rs `mix_weights_flag_and_mistakes` |
//! | `DataError::InvalidMixWeights`             | mixing.rs (flag and mixer), data::mixture unit tests |
//! | `DataError::MixerWithoutSources`           | mixing.rs `bad_mixer_weights_name_the_step_and_a_mixer_needs_sources` |
//! | `ModelError::AutocastUnused`                | precision.rs `a_model_that_never_casts_is_refused`  |
//! | `TrainingError::LossScaleUnderflow`            | optim::precision unit test `the_scale_backs_off_grows_and_gives_up` |
//! | `DistributedError::ParameterMismatch`             | `parameter_mismatch`                                 |
//! | `DistributedError::PeerFailed`                    | `peer_failed_on_the_rank_that_did_not_fail`          |
//! | `DistributedError::RankPanicked`                  | `a_panicking_model_is_reported_not_propagated`       |
//! | `DistributedError::Device`                        | `train_refuses_several_ranks_and_bad_devices`, `displays_of_fielded_variants_are_sentences` |
//! | `TrainingError::OutOfMemory`                   | `out_of_memory_with_fail` (+ oom.rs)                 |
//! | `Io`                            | `io_error_names_the_file`                            |
//! | `SettingsError::TrainNeedsOneRank`             | `train_needs_one_rank_and_empty_group`               |
//! | `SettingsError::EmptyGroup`                    | `train_needs_one_rank_and_empty_group`               |
//! | `DistributedError::AllReduceSizeMismatch`                          | `comm_error_on_mismatched_all_reduce`                |
//! | `DistributedError::Rendezvous`                    | rendezvous.rs unit tests (reachable only through `Nccl::from_env`, feature `nccl`) |
//! | `Json`                          | not reachable: serialising a checkpoint's own state cannot fail |
//! | `Plot`                          | plot.rs |
//! | `DataError::InvalidTokenSetting` | domains.rs `domain_mistakes_are_typed_errors_before_the_first_step`, data::token_files unit tests |
//! | `DataError::TokenizerTraining`  | not reachable from a test: the tokenizers crate's BPE trainer fails only on its own internal errors |
//! | `ModelError::Config`            | error unit tests (a bad config.json, still typed) |
//! | `DistributedError::Library`, `PeersTimedOut`, `CollectiveInput` | train::out_of_memory unit test; the NCCL rows of examples/gpu_check (feature `nccl`) |
//! | `DataError::NoValidationDocuments`, `DataError::MixedTokenizers` | domains.rs `domain_mistakes_are_typed_errors_before_the_first_step` |
//! | `DataError::TokenFileMismatch`             | language_model.rs `damaged_token_files_are_refused_naming_the_file` |
//! | `DataError::TokenDirMismatch`              | language_model.rs `a_tokenized_corpus_trains_the_decoder_and_saves_a_loadable_model` |
//! | `TrainingError::Interrupted`                   | resume.rs `a_signal_stops_every_rank_with_a_checkpoint` |
//!
//! A file named alone is a module of this binary (`tests/it/`), except where the
//! row says unit tests. Flags and their tests are tabled in tests/it/flags.rs.

use crate::common;

use adabatch::prelude::*;
use adabatch::{
    BatchFeatures, CheckpointError, DataError, DistributedError, Error, GradAccum, Growth,
    MemoryModel, ModelError, Reweight, ScheduleSpec, SettingsError, TrainerPolicy, TrainingError,
};
use candle_core::{Device, Tensor};
use candle_nn::AdamW;
use common::*;

fn factory(ctx: &RankContext) -> adabatch::Result<IntervalTrainer> {
    adamw_factory(|model, opt| IntervalTrainer { model, opt })(ctx)
}

fn run(data: &[Example], a: &TrainingArgs) -> adabatch::Result<TrainSummary> {
    adabatch::Run::new(data, &collate, a)
        .launch(factory)
        .map(|trained| trained.summary)
}

#[test]
fn empty_dataset() {
    let err = run(&[], &args(1, 2, 1)).unwrap_err();
    assert!(matches!(err, Error::Data(DataError::EmptyDataset)), "{err}");
}

#[test]
fn zero_batch_size() {
    let err = run(&dataset(4, 0), &args(1, 0, 1)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ZeroBatchSize {
                what: "per_device_train_batch_size"
            })
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
            Error::Data(DataError::MoreRanksThanExamples {
                world_size: 4,
                examples: 3
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("4 ranks but only 3"));
}

#[test]
fn zero_epochs_and_zero_ranks() {
    assert!(matches!(
        run(&dataset(4, 0), &args(1, 1, 0)).unwrap_err(),
        Error::Settings(SettingsError::ZeroEpochs)
    ));
    assert!(matches!(
        run(&dataset(4, 0), &args(0, 1, 1)).unwrap_err(),
        Error::Settings(SettingsError::InvalidSetting {
            name: "nproc_per_node",
            ..
        })
    ));
    let mut a = args(1, 1, 1);
    a.length.max_steps = Some(0);
    assert!(matches!(
        run(&dataset(4, 0), &a).unwrap_err(),
        Error::Settings(SettingsError::InvalidSetting {
            name: "max_steps",
            ..
        })
    ));
}

#[test]
fn drop_last_with_a_global_batch_larger_than_the_data() {
    let mut a = args(2, 3, 1);
    a.data.dataloader_drop_last = Some(true);
    let err = run(&dataset(5, 0), &a).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Data(DataError::GlobalBatchTooLarge {
                global_batch: 6,
                after_step: None,
                ..
            })
        ),
        "{err}"
    );
    // Growing past N later names the step that chose the size.
    let mut a = args(1, 4, 3);
    a.length.max_steps = Some(100);
    a.data.dataloader_drop_last = Some(true);
    let err = run(&dataset(9, 0), &a).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Data(DataError::GlobalBatchTooLarge {
                global_batch: 10,
                after_step: Some(30),
                ..
            })
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
    let err = adabatch::Run::new(&dataset(40, 0), &collate, &args(2, 1, 1))
        .launch(adamw_factory(|model, opt| ZeroTrainer { model, opt }))
        .map(|trained| trained.summary)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Training(TrainingError::ScheduleReturnedZero { step: 3 })
        ),
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
    let err = adabatch::Run::new(&data, &collate, &args(1, 1, 1))
        .launch(adamw_factory(|model, opt| Ordered { model, opt }))
        .map(|trained| trained.summary)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Training(TrainingError::NonFiniteLoss { step: 6, .. })
        ),
        "{err}"
    );
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
    let err = adabatch::Run::new(&poisoned, &collate_fails_on_rank_1, &args(2, 2, 1))
        .launch(adamw_factory(|model, opt| Ordered { model, opt }))
        .map(|trained| trained.summary)
        .unwrap_err();
    assert!(err.report().contains("poisoned"), "{}", err.report());
}

#[test]
fn a_panicking_model_is_reported_not_propagated() {
    let data = dataset(8, 0);
    let panicking_collate = |items: &[Example], device: &Device| {
        assert!(items.len() < 2, "collate refuses batches of two");
        collate(items, device)
    };
    let err = adabatch::Run::new(&data, &panicking_collate, &args(2, 2, 1))
        .launch(factory)
        .map(|trained| trained.summary)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Distributed(DistributedError::RankPanicked { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("refuses batches of two"));
}

#[test]
fn a_failing_factory_on_one_rank_is_reported() {
    let err = adabatch::Run::new(&dataset(8, 0), &collate, &args(3, 1, 1))
        .launch(|ctx: &RankContext| {
            if ctx.rank() == 2 {
                return Err(Error::msg("rank 2 has no model"));
            }
            factory(ctx)
        })
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
    let err = adabatch::Run::new(&dataset(8, 0), &collate, &args(1, 4, 1))
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = adamw(&model, 0.05)?;
            Ok(T(Scalar(model), opt))
        })
        .map(|trained| trained.summary)
        .unwrap_err();
    assert!(
        matches!(err, Error::Model(ModelError::LossShape { examples: 4, .. })),
        "{err}"
    );
}

#[test]
fn train_refuses_several_ranks_and_bad_devices() {
    let model = Regression::new(adabatch::Parameters::new(1), &Device::Cpu).unwrap();
    let opt = adamw(&model, 0.05).unwrap();
    let err = adabatch::Run::new(&dataset(8, 0), &collate, &args(2, 1, 1))
        .train(&mut IntervalTrainer { model, opt })
        .unwrap_err();
    assert!(err.to_string().contains("launch"), "{err}");
    let mut a = args(1, 1, 1);
    a.launch.device = "tpu".into();
    assert!(matches!(
        run(&dataset(8, 0), &a).unwrap_err(),
        Error::Distributed(DistributedError::Device { .. })
    ));
}

// ---------------------------------------------------------------------------
// Every other variant reachable from the public API, matched with its fields, and
// its message checked to be a sentence.

/// The Display form is a sentence for a person, not a Debug dump of the variant.
fn assert_sentence(err: &Error) {
    let text = err.to_string();
    let debug = format!("{err:?}");
    let variant: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
    assert!(text.len() >= 20, "too short: {text:?}");
    assert!(!text.contains(&format!("{variant} {{")), "{text}");
    assert!(!text.contains(&format!("{variant}(")), "{text}");
    assert!(
        !text.contains("Some(") && !text.contains(": None"),
        "{text}"
    );
    assert!(!text.contains('\n'), "one line: {text:?}");
    assert!(
        text.contains(' ') && text.chars().filter(|c| c.is_alphabetic()).count() >= 10,
        "{text}"
    );
}

fn policy_run<T: AdaptiveTrainer<Model = Regression, Optimizer = AdamW> + Send>(
    data: &[Example],
    a: &TrainingArgs,
    wrap: fn(Regression, AdamW) -> T,
) -> Error {
    adabatch::Run::new(data, &collate, a)
        .launch(adamw_factory(wrap))
        .map(|trained| trained.summary)
        .unwrap_err()
}

#[test]
fn displays_of_the_older_tests_are_sentences() {
    for err in [
        run(&[], &args(1, 2, 1)).unwrap_err(),
        run(&dataset(4, 0), &args(1, 0, 1)).unwrap_err(),
        run(&dataset(3, 0), &args(4, 1, 1)).unwrap_err(),
        run(&dataset(4, 0), &args(1, 1, 0)).unwrap_err(),
        run(&dataset(4, 0), &args(0, 1, 1)).unwrap_err(),
    ] {
        assert_sentence(&err);
    }
}

#[test]
fn invalid_settings_name_the_setting() {
    type Case = (&'static str, fn(&mut TrainingArgs));
    let cases: [Case; 7] = [
        ("logging_steps", |a| a.logging.logging_steps = 0),
        ("learning_rate", |a| a.lr.learning_rate = f64::NAN),
        ("learning_rate", |a| a.lr.learning_rate = -1.0),
        ("warmup_ratio", |a| a.lr.warmup_ratio = 1.5),
        ("max_grad_norm", |a| a.step.max_grad_norm = -0.5),
        ("memory_margin", |a| {
            a.length_aware.memory_margin = f64::INFINITY
        }),
        ("max_batch_growth", |a| {
            a.length_aware.max_tokens_per_batch = Some(100);
            a.length_aware.max_batch_growth = Some(0.0);
        }),
    ];
    for (setting, set) in cases {
        let mut a = args(1, 1, 1);
        set(&mut a);
        let err = run(&dataset(4, 0), &a).unwrap_err();
        assert!(
            matches!(err, Error::Settings(SettingsError::InvalidSetting { name, .. }) if name == setting),
            "{setting}: {err}"
        );
        assert!(err.to_string().starts_with(setting), "{err}");
        assert_sentence(&err);
    }
    let err = run(&dataset(4, 0), &{
        let mut a = args(1, 1, 1);
        a.length_aware.max_tokens_per_batch = Some(0);
        a
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ZeroBatchSize {
                what: "max_tokens_per_batch"
            })
        ),
        "{err}"
    );
}

hand_trainer!(
    Crossed,
    AdamW,
    TrainerPolicy {
        min_batch: 5,
        max_batch: Some(2),
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    ZeroMin,
    AdamW,
    TrainerPolicy {
        min_batch: 0,
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    ZeroAccum,
    AdamW,
    TrainerPolicy {
        grad_accum: GradAccum::Fixed(0),
        ..TrainerPolicy::DEFAULT
    }
);

#[test]
fn batch_limits_crossed() {
    let err = policy_run(&dataset(8, 0), &args(1, 1, 1), |model, opt| Crossed {
        model,
        opt,
    });
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::BatchLimitsCrossed { min: 5, max: 2 })
        ),
        "{err}"
    );
    assert_sentence(&err);
    let err = policy_run(&dataset(8, 0), &args(1, 1, 1), |model, opt| ZeroMin {
        model,
        opt,
    });
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::InvalidSetting {
                name: "min_batch",
                ..
            })
        ),
        "{err}"
    );
    let err = policy_run(&dataset(8, 0), &args(1, 1, 1), |model, opt| ZeroAccum {
        model,
        opt,
    });
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::InvalidGradAccum { ref reason })
                if reason.contains("fixed(0)")
        ),
        "{err}"
    );
    assert_sentence(&err);
}

hand_trainer!(
    EveryZero,
    AdamW,
    TrainerPolicy {
        schedule: ScheduleSpec::Interval {
            every: 0,
            growth: Growth::Add(1)
        },
        ..TrainerPolicy::DEFAULT
    }
);

#[test]
fn invalid_schedule() {
    let err = policy_run(&dataset(8, 0), &args(1, 1, 1), |model, opt| EveryZero {
        model,
        opt,
    });
    assert!(
        matches!(&err, Error::Settings(SettingsError::InvalidSchedule { schedule: "interval", reason }) if reason.contains("every")),
        "{err}"
    );
    assert_sentence(&err);
}

/// The online mixer's rules are the attribute's (`adabatch-rules`): a mixer built
/// by hand that breaks one is refused, not clamped.
#[test]
fn invalid_mixer() {
    for (args, arg) in [
        ((0.0, 0.05, 0.9), "temperature"),
        ((1.0, 1.5, 0.9), "floor"),
        ((1.0, 0.05, 1.0), "smoothing"),
    ] {
        let err = adabatch::OnlineMixer::new(args.0, args.1, args.2).unwrap_err();
        assert!(
            matches!(&err, Error::Settings(SettingsError::InvalidMixer { mixer: "online", reason }) if reason.contains(arg)),
            "{err}"
        );
        assert_sentence(&err);
    }
}

const MEMORY: ScheduleSpec = ScheduleSpec::Memory {
    threshold: 0.9,
    max_range: 2.0,
};
hand_trainer!(
    MemoryAccum,
    AdamW,
    TrainerPolicy {
        schedule: MEMORY,
        grad_accum: GradAccum::Fixed(2),
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    Memory,
    AdamW,
    TrainerPolicy {
        schedule: MEMORY,
        ..TrainerPolicy::DEFAULT
    }
);
hand_trainer!(
    Accum,
    AdamW,
    TrainerPolicy {
        grad_accum: GradAccum::Fixed(2),
        ..TrainerPolicy::DEFAULT
    }
);

fn with_lengths(n: usize) -> WithLengths<Vec<Example>> {
    WithLengths::new(dataset(n, 0), (0..n).map(|i| 4 + i % 7).collect()).unwrap()
}

#[test]
fn unsupported_policy() {
    let err = adabatch::Run::new(&with_lengths(8), &collate, &args(1, 1, 1))
        .launch(adamw_factory(|model, opt| MemoryAccum { model, opt }))
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Settings(SettingsError::UnsupportedPolicy { reason }) if reason.contains("grad_accum")),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn conflicting_settings() {
    let mut a = args(1, 1, 1);
    a.length_aware.max_tokens_per_batch = Some(64);
    let err = adabatch::Run::new(&with_lengths(8), &collate, &a)
        .launch(adamw_factory(|model, opt| Memory { model, opt }))
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ConflictingSettings {
                first: "--max-tokens-per-batch",
                second: "schedule = memory(..)",
                ..
            })
        ),
        "{err}"
    );
    assert_sentence(&err);
    let err = adabatch::Run::new(&with_lengths(8), &collate, &a)
        .launch(adamw_factory(|model, opt| Accum { model, opt }))
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::ConflictingSettings {
                second: "grad_accum",
                ..
            })
        ),
        "{err}"
    );
}

#[test]
fn lengths_mismatch() {
    let err = WithLengths::new(dataset(4, 0), vec![3, 4, 5]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Data(DataError::LengthsMismatch {
                lengths: 3,
                examples: 4
            })
        ),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn collate_size() {
    let drops_one = |items: &[Example], device: &Device| collate(&items[1..], device);
    let err = adabatch::Run::new(&dataset(8, 0), &drops_one, &args(2, 2, 1))
        .launch(factory)
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Data(DataError::CollateSize {
                returned: 1,
                items: 2
            })
        ),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn candle_errors_keep_their_type() {
    let fails = |_: &[Example], _: &Device| -> candle_core::Result<RegBatch> {
        candle_core::bail!("the collate cannot build this batch")
    };
    let err = adabatch::Run::new(&dataset(4, 0), &fails, &args(1, 2, 1))
        .launch(factory)
        .map(|t| t.summary)
        .unwrap_err();
    // The failing rank and step are named; the candle error is kept whole.
    let Error::OnRank { rank, step, source } = &err else {
        panic!("expected the rank and step named: {err:?}")
    };
    assert_eq!((*rank, *step), (0, 1));
    assert!(matches!(**source, Error::Candle(_)), "{source:?}");
    // Each cause once, in order: the rank and step, candle, candle's message
    // (candle appends its backtrace when RUST_BACKTRACE is set: first lines only).
    let report = err.report();
    let firsts: Vec<&str> = report
        .split("\ncaused by: ")
        .map(|cause| cause.lines().next().unwrap())
        .collect();
    assert_eq!(
        firsts,
        [
            "error: rank 0 failed at step 1",
            "a tensor operation failed (candle)",
            "the collate cannot build this batch"
        ]
    );
}

/// What `anyhow`'s `{:#}` and `eyre`'s reports print: the message, then each
/// `source()` in turn.
fn chain(err: &dyn std::error::Error) -> Vec<String> {
    let mut causes = vec![err.to_string()];
    let mut cause = err.source();
    while let Some(source) = cause {
        causes.push(source.to_string());
        cause = source.source();
    }
    causes
}

#[test]
fn a_report_of_a_nested_error_names_each_cause_once() {
    let nested = Error::OnRank {
        rank: 1,
        step: 4,
        source: Box::new(Error::Io {
            op: adabatch::FileOp::Write,
            path: "out/loss.jsonl".into(),
            source: std::io::Error::other("disk full"),
        }),
    };
    let causes = chain(&nested);
    assert_eq!(
        causes,
        [
            "rank 1 failed at step 4",
            "could not write out/loss.jsonl",
            "disk full"
        ]
    );
    // No message repeats another's text: each cause is named once.
    for (i, cause) in causes.iter().enumerate() {
        for other in &causes[i + 1..] {
            assert!(
                !cause.contains(other.as_str()),
                "{cause:?} repeats {other:?}"
            );
        }
    }
    assert_eq!(
        nested.report(),
        "error: rank 1 failed at step 4\ncaused by: could not write out/loss.jsonl\ncaused by: disk full"
    );
    // A bad model config stays typed and shows its JSON error once.
    let config = adabatch::models::llama::LlamaConfig::from_json_str("{").unwrap_err();
    let causes = chain(&Error::from(config));
    assert_eq!(causes.len(), 2, "{causes:?}");
    assert!(!causes[0].contains(&causes[1]), "{causes:?}");
}

/// A user's own error type, as a program would have one.
#[derive(Debug)]
struct NoGpuLeft {
    asked: usize,
}

impl std::fmt::Display for NoGpuLeft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no GPU left for rank {}", self.asked)
    }
}

impl std::error::Error for NoGpuLeft {}

#[test]
fn a_users_own_error_type_comes_back_out_of_source() {
    let err = adabatch::Run::new(&dataset(8, 0), &collate, &args(1, 1, 1))
        .launch(|ctx: &RankContext| -> adabatch::Result<IntervalTrainer> {
            Err(Error::user(NoGpuLeft { asked: ctx.rank() }))
        })
        .map(|t| t.summary)
        .unwrap_err();
    let source = std::error::Error::source(&err).expect("the user's error is the source");
    let mine = source
        .downcast_ref::<NoGpuLeft>()
        .expect("downcasts to the user's type");
    assert_eq!(mine.asked, 0);
    assert_eq!(
        err.report(),
        "error: the program's own code failed\ncaused by: no GPU left for rank 0"
    );
}

#[test]
fn a_failure_on_one_rank_names_that_rank_and_its_step() {
    // Example 7 cannot be collated; with 2 ranks it lands on one of them.
    let fails = |items: &[Example], device: &Device| -> candle_core::Result<RegBatch> {
        if items.iter().any(|e| e.x == dataset(12, 0)[7].x) {
            candle_core::bail!("example 7 cannot be collated")
        }
        collate(items, device)
    };
    let err = adabatch::Run::new(&dataset(12, 0), &fails, &args(2, 2, 1))
        .launch(factory)
        .map(|t| t.summary)
        .unwrap_err();
    let Error::OnRank { rank, step, source } = &err else {
        panic!("expected the failing rank named, not a peer's report: {err:?}")
    };
    assert!(*rank < 2 && (1..=3).contains(step), "{err}");
    assert!(matches!(**source, Error::Candle(_)), "{source:?}");
    assert_eq!(
        err.to_string(),
        format!("rank {rank} failed at step {step}")
    );
    let report = err.report();
    assert!(
        report.contains("\ncaused by: example 7 cannot be collated"),
        "{report}"
    );
}

hand_trainer!(
    Tokens,
    AdamW,
    TrainerPolicy {
        reweight: Reweight::TokenCount,
        shuffle: false,
        ..TrainerPolicy::DEFAULT
    }
);

#[test]
fn no_tokens() {
    // Examples 2 and 3 have no tokens: the second step (size 2, no shuffle) has
    // nothing to weigh its loss by.
    let mut data = dataset(6, 0);
    data[2].tokens = 0;
    data[3].tokens = 0;
    let err = policy_run(&data, &args(1, 2, 1), |model, opt| Tokens { model, opt });
    assert!(
        matches!(err, Error::Data(DataError::NoTokens { step: 2 })),
        "{err}"
    );
    assert_sentence(&err);
}

/// A model whose parameter list is given by the test.
struct Params(
    Regression,
    fn(&Regression) -> Vec<(String, candle_core::Var)>,
);
impl TrainModel for Params {
    type Batch = RegBatch;
    fn per_example_loss(&self, batch: &RegBatch) -> candle_core::Result<Tensor> {
        self.0.per_example_loss(batch)
    }
    fn named_parameters(&self) -> Vec<(String, candle_core::Var)> {
        (self.1)(&self.0)
    }
}
struct ParamsTrainer(Params, AdamW);
impl AdaptiveTrainer for ParamsTrainer {
    type Model = Params;
    type Optimizer = AdamW;
    const POLICY: TrainerPolicy = TrainerPolicy::DEFAULT;
    fn parts(&mut self) -> (&mut Params, &mut AdamW) {
        (&mut self.0, &mut self.1)
    }
}

fn params_run(
    world: usize,
    names: impl Fn(usize) -> fn(&Regression) -> Vec<(String, candle_core::Var)> + Sync,
) -> Error {
    adabatch::Run::new(&dataset(8, 0), &collate, &args(world, 1, 1))
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = adamw(&model, 0.05)?;
            Ok(ParamsTrainer(Params(model, names(ctx.rank())), opt))
        })
        .map(|t| t.summary)
        .unwrap_err()
}

#[test]
fn no_parameters() {
    let err = params_run(1, |_| |_| Vec::new());
    assert!(
        matches!(err, Error::Model(ModelError::NoParameters)),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn duplicate_parameter() {
    let err = params_run(1, |_| {
        |m| {
            let mut p = m.named_parameters();
            p.push(p[0].clone());
            p
        }
    });
    assert!(
        matches!(&err, Error::Model(ModelError::DuplicateParameter { name }) if name == "linear.bias"),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn parameter_mismatch() {
    // Rank 1 trains one tensor fewer than rank 0.
    let err = params_run(2, |rank| {
        if rank == 1 {
            |m| m.named_parameters()[..1].to_vec()
        } else {
            |m| m.named_parameters()
        }
    });
    assert!(
        matches!(
            err,
            Error::Distributed(DistributedError::ParameterMismatch { .. })
        ),
        "{err}"
    );
    assert_sentence(&err);
}

/// Predicts by rank: rank 1 is far more cautious, so the ranks plan differently.
struct ByRank(usize);
impl MemoryModel for ByRank {
    fn predict(&self, c: &BatchFeatures, b: &BatchFeatures) -> f64 {
        (1 + 4 * self.0) as f64 * c.padded_tokens as f64 / b.padded_tokens as f64
    }
}
struct ByRankTrainer(Regression, AdamW, ByRank);
impl AdaptiveTrainer for ByRankTrainer {
    type Model = Regression;
    type Optimizer = AdamW;
    const POLICY: TrainerPolicy = TrainerPolicy {
        schedule: ScheduleSpec::Memory {
            threshold: 0.9,
            max_range: 4.0,
        },
        ..TrainerPolicy::DEFAULT
    };
    fn parts(&mut self) -> (&mut Regression, &mut AdamW) {
        (&mut self.0, &mut self.1)
    }
    fn regressor(&mut self) -> Option<&mut dyn MemoryModel> {
        Some(&mut self.2)
    }
}

#[test]
fn regressor_disagrees() {
    let data =
        WithLengths::new(dataset(40, 0), (0..40).map(|i| 10 + (i * 7) % 50).collect()).unwrap();
    let err = adabatch::Run::new(&data, &collate, &args(2, 1, 1))
        .launch(|ctx: &RankContext| {
            let model = Regression::new(ctx.parameters(), ctx.device())?;
            let opt = adamw(&model, 0.05)?;
            Ok(ByRankTrainer(model, opt, ByRank(ctx.rank())))
        })
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Training(TrainingError::RegressorDisagrees { epoch: 0 })
        ),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn checkpoint_errors() {
    let dir = temp_log("ckpt-errors").with_extension("");
    // Nothing at the path.
    let mut a = args(1, 1, 1);
    a.save.resume_from_checkpoint = Some(dir.join("checkpoint-404"));
    let err = run(&dataset(8, 0), &a).unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(CheckpointError::NoSuchCheckpoint { path }) if path.ends_with("checkpoint-404")),
        "{err}"
    );
    assert_sentence(&err);
    // A checkpoint of another policy (the schedule differs).
    let mut a = args(1, 1, 2);
    a.length.max_steps = Some(3);
    a.save.save_steps = 3;
    a.save.output_dir = dir.clone();
    run(&dataset(8, 0), &a).unwrap();
    let mut b = args(1, 1, 2);
    b.save.resume_from_checkpoint = Some(dir.join("checkpoint-3"));
    let err = adabatch::Run::new(&dataset(8, 0), &collate, &b)
        .launch(adamw_factory(|model, opt| Ordered { model, opt }))
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(CheckpointError::CheckpointMismatch { what, checkpoint, run, .. })
            if what.contains("schedule") && checkpoint.starts_with("Interval") && run == "Constant(None)"),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn mid_epoch_length_aware_checkpoint() {
    let dir = temp_log("ckpt-length").with_extension("");
    let mut a = args(1, 1, 1);
    a.length_aware.max_tokens_per_batch = Some(20);
    a.length.max_steps = Some(2);
    a.save.save_steps = 2;
    a.save.output_dir = dir.clone();
    adabatch::Run::new(&with_lengths(30), &collate, &a)
        .launch(factory)
        .unwrap();
    // A checkpoint written before checkpoints held the epoch's plan.
    let state = dir.join("checkpoint-2/adabatch_state.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert!(json
        .as_object_mut()
        .unwrap()
        .remove("planned_epoch")
        .is_some());
    std::fs::write(&state, json.to_string()).unwrap();
    adabatch::train::checkpoint::write_manifest(&dir.join("checkpoint-2")).unwrap();
    let mut b = args(1, 1, 1);
    b.length_aware.max_tokens_per_batch = Some(20);
    b.save.resume_from_checkpoint = Some(dir.join("checkpoint-2"));
    let err = adabatch::Run::new(&with_lengths(30), &collate, &b)
        .launch(factory)
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Checkpoint(CheckpointError::MidEpochLengthAwareCheckpoint { path }) if path.ends_with("checkpoint-2")),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn message_from_user_code() {
    let err = adabatch::Run::new(&dataset(8, 0), &collate, &args(1, 1, 1))
        .launch(|_: &RankContext| -> adabatch::Result<IntervalTrainer> {
            Err(Error::msg("no model for you"))
        })
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(&err, Error::Message(m) if m == "no model for you"),
        "{err}"
    );
}

#[test]
fn peer_failed_on_the_rank_that_did_not_fail() {
    // Two `Run::group` calls share one group: rank 0's factory fails, rank 1
    // reports that a peer failed.
    let data = dataset(8, 0);
    let mut members = adabatch::Local::group(2).into_iter();
    let (m0, m1) = (members.next().unwrap(), members.next().unwrap());
    let (r0, r1) = std::thread::scope(|s| {
        let data = &data;
        let r0 = s.spawn(move || {
            adabatch::Run::new(data, &collate, &args(2, 1, 1))
                .group(
                    vec![(m0, Device::Cpu)],
                    |_: &RankContext| -> adabatch::Result<IntervalTrainer> {
                        Err(Error::msg("rank 0 cannot build"))
                    },
                )
                .map(|t| t.summary)
        });
        let r1 = s.spawn(move || {
            adabatch::Run::new(data, &collate, &args(2, 1, 1))
                .group(vec![(m1, Device::Cpu)], factory)
                .map(|t| t.summary)
        });
        (r0.join().unwrap(), r1.join().unwrap())
    });
    assert!(matches!(r0, Err(Error::Message(_))), "{r0:?}");
    let err = r1.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Distributed(DistributedError::PeerFailed { rank: 1 })
        ),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn out_of_memory_with_fail() {
    let mut a = args(1, 2, 1);
    a.step.inject_oom_at_steps = vec![2];
    let err = run(&dataset(8, 0), &a).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Training(TrainingError::OutOfMemory { step: 2, .. })
        ),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn io_error_names_the_file() {
    // A log file below a regular file cannot be created.
    let file = temp_log("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    let mut a = args(1, 1, 1);
    a.logging.log_jsonl = Some(file.join("run.jsonl"));
    let err = run(&dataset(4, 0), &a).unwrap_err();
    assert!(
        matches!(&err, Error::Io { path, .. } if path.starts_with(&file)),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn train_needs_one_rank_and_empty_group() {
    let model = Regression::new(adabatch::Parameters::new(1), &Device::Cpu).unwrap();
    let opt = adamw(&model, 0.05).unwrap();
    let err = adabatch::Run::new(&dataset(8, 0), &collate, &args(3, 1, 1))
        .train(&mut IntervalTrainer { model, opt })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Settings(SettingsError::TrainNeedsOneRank { nproc_per_node: 3 })
        ),
        "{err}"
    );
    assert_sentence(&err);
    let err = adabatch::Run::new(&dataset(8, 0), &collate, &args(1, 1, 1))
        .group(Vec::<(adabatch::Local, Device)>::new(), factory)
        .map(|t| t.summary)
        .unwrap_err();
    assert!(
        matches!(err, Error::Settings(SettingsError::EmptyGroup)),
        "{err}"
    );
    assert_sentence(&err);
}

#[test]
fn comm_error_on_mismatched_all_reduce() {
    use adabatch::Communicator;
    let group = adabatch::Local::group(2);
    let results: Vec<adabatch::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut scalars = vec![1.0; 1 + c.rank()];
                    c.all_reduce_sum(&mut [], &mut scalars)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        let err = r.unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Distributed(DistributedError::AllReduceSizeMismatch {
                    expected: 1,
                    rank: 1,
                    sent: 2
                })
            ),
            "{err}"
        );
        assert_sentence(&err);
    }
}

#[test]
fn displays_of_fielded_variants_are_sentences() {
    // Variants the tests above reach with their fields, shown here as text.
    let err = run(&dataset(4, 0), &{
        let mut a = args(1, 1, 1);
        a.launch.device = "tpu".into();
        a
    })
    .unwrap_err();
    assert!(
        matches!(&err, Error::Distributed(DistributedError::Device { spec, .. }) if spec == "tpu"),
        "{err}"
    );
    assert_sentence(&err);
    let mut a = args(2, 3, 1);
    a.data.dataloader_drop_last = Some(true);
    let err = run(&dataset(5, 0), &a).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Data(DataError::GlobalBatchTooLarge {
                global_batch: 6,
                per_device: 3,
                world_size: 2,
                examples: 5,
                after_step: None
            })
        ),
        "{err}"
    );
    assert_sentence(&err);
}
