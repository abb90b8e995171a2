//! The entry points: one rank ([`train`]), ranks as threads ([`launch`]), the ranks
//! of a group that may span processes ([`launch_group`]), and NCCL ranks
//! (`launch_nccl`, feature `nccl`). Each builds the run's settings once, then runs
//! the rank loop of [`crate::train::engine`] on every rank.

use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_core::Device;

use crate::config::args::TrainingArgs;
use crate::dist::communicator::{Communicator, Local, Single};
use crate::error::{Error, Result};
use crate::report::logging::Logger;
use crate::report::summary::{TrainSummary, Trained};
use crate::train::collate::panic_message;
use crate::train::dry_run::{dry_run_launch, dry_run_trainer};
use crate::train::oom::FaultInjector;
use crate::train::run::{RankRun, RunData};
use crate::train::settings::RunSettings;
use crate::user::data::Dataset;
use crate::user::trainer::{AdaptiveTrainer, CollateFor, RankContext};

/// Trains `trainer` on one rank (`args.nproc_per_node` must be 1; use [`launch`]
/// to build one trainer per rank). The trainer keeps its trained weights.
pub fn train<T, D, C>(
    trainer: &mut T,
    dataset: &D,
    collate: &C,
    args: &TrainingArgs,
) -> Result<TrainSummary>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
{
    if args.nproc_per_node != 1 {
        return Err(Error::TrainNeedsOneRank {
            nproc_per_node: args.nproc_per_node,
        });
    }
    let settings = RunSettings::new(&T::POLICY, dataset, args, 1)?;
    if args.dry_run {
        return dry_run_trainer(trainer, dataset, args, &settings);
    }
    let device = settings.device.open(0)?;
    let mut logger = settings.logger(args)?;
    let data = RunData {
        train: dataset,
        eval: None,
        collate,
    };
    rank_run(
        trainer,
        &Single,
        data,
        &settings,
        &device,
        Some(&mut logger),
    )
}

/// Trains on `args.nproc_per_node` ranks; `factory` builds each rank's trainer on
/// the rank's device (weights are then made identical from rank 0). Returns rank
/// 0's trained trainer with the summary.
pub fn launch<T, D, C, F>(
    dataset: &D,
    collate: &C,
    args: &TrainingArgs,
    factory: F,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer + Send,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    F: Fn(&RankContext) -> Result<T> + Sync,
{
    launch_with_faults(dataset, collate, args, FaultInjector::none(), factory)
}

/// [`launch`] with an eval dataset (HF's `eval_dataset`): the model is evaluated
/// every `--eval-steps` steps and at the end, each eval example once across the
/// ranks; `eval_loss` and the model's `TrainModel::eval_metrics` go to the logs
/// and to [`TrainSummary::evaluations`].
pub fn launch_with_eval<T, D, C, F>(
    dataset: &D,
    eval_dataset: &D,
    collate: &C,
    args: &TrainingArgs,
    factory: F,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer + Send,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    F: Fn(&RankContext) -> Result<T> + Sync,
{
    let data = RunData {
        train: dataset,
        eval: Some(eval_dataset),
        collate,
    };
    launch_data(data, args, FaultInjector::none(), factory)
}

/// [`launch`] with out-of-memory faults injected from code (a test hook; the CLI
/// has `--inject-oom-at-steps`). Unstable.
#[doc(hidden)]
pub fn launch_with_faults<T, D, C, F>(
    dataset: &D,
    collate: &C,
    args: &TrainingArgs,
    faults: FaultInjector,
    factory: F,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer + Send,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    F: Fn(&RankContext) -> Result<T> + Sync,
{
    let data = RunData {
        train: dataset,
        eval: None,
        collate,
    };
    launch_data(data, args, faults, factory)
}

/// The ranks of [`launch`] (threads, or NCCL GPUs), on `data`.
fn launch_data<T, D, C, F>(
    data: RunData<'_, D, C>,
    args: &TrainingArgs,
    faults: FaultInjector,
    factory: F,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer + Send,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    F: Fn(&RankContext) -> Result<T> + Sync,
{
    let dataset = data.train;
    let mut settings = RunSettings::new(&T::POLICY, dataset, args, args.nproc_per_node)?;
    settings.faults = faults.and_steps(settings.faults.steps());
    if args.dry_run {
        let device = settings.device.open(0)?;
        return dry_run_launch(dataset, args, &settings, (0, device), factory);
    }
    // Several GPUs with NCCL: device-side all-reduce, one thread per GPU. Without
    // the `nccl` feature, CUDA ranks use the host-staged `Local` communicator below.
    #[cfg(feature = "nccl")]
    if settings.device.is_cuda() && settings.world_size > 1 {
        let ordinals = settings.device.cuda_ordinals(settings.world_size)?;
        let members = crate::dist::nccl::Nccl::group_on(&ordinals)?;
        return run_group(members, data, args, &settings, factory);
    }
    if settings.world_size == 1 {
        let mut logger = settings.logger(args)?;
        let device = settings.device.open(0)?;
        let mut trainer = factory(&RankContext::new(0, 1, device.clone(), settings.seed))?;
        let summary = rank_run(
            &mut trainer,
            &Single,
            data,
            &settings,
            &device,
            Some(&mut logger),
        )?;
        return Ok(Trained { trainer, summary });
    }
    let members = Local::group(settings.world_size)
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| Ok((comm, settings.device.open(rank)?)))
        .collect::<Result<Vec<_>>>()?;
    run_group(members, data, args, &settings, factory)
}

/// Trains on the ranks this process hosts, one thread per `(communicator, device)`.
/// The group may span processes and machines (e.g. NCCL across nodes): each
/// process calls this with its own members, and `comm.world_size()` is the whole
/// group. `args.nproc_per_node` is ignored here. Returns the trainer of the lowest
/// rank this process hosts (rank 0's where this process has it).
pub fn launch_group<T, D, C, F, M>(
    members: Vec<(M, Device)>,
    dataset: &D,
    collate: &C,
    args: &TrainingArgs,
    factory: F,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer + Send,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    F: Fn(&RankContext) -> Result<T> + Sync,
    M: Communicator,
{
    let Some((first, _)) = members.first() else {
        return Err(Error::EmptyGroup);
    };
    let settings = RunSettings::new(&T::POLICY, dataset, args, first.world_size())?;
    if args.dry_run {
        let (comm, device) = members
            .iter()
            .min_by_key(|(c, _)| c.rank())
            .unwrap_or(&members[0]);
        return dry_run_launch(
            dataset,
            args,
            &settings,
            (comm.rank(), device.clone()),
            factory,
        );
    }
    let data = RunData {
        train: dataset,
        eval: None,
        collate,
    };
    run_group(members, data, args, &settings, factory)
}

/// Trains on NCCL ranks: under torchrun (`WORLD_SIZE` set) one rank per process on
/// GPU `LOCAL_RANK`; otherwise `args.nproc_per_node` GPUs of this node from
/// `args.device` (`cuda` = from GPU 0, `cuda:N` = from GPU N), one thread each.
#[cfg(feature = "nccl")]
pub fn launch_nccl<T, D, C, F>(
    dataset: &D,
    collate: &C,
    args: &TrainingArgs,
    factory: F,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer + Send,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    F: Fn(&RankContext) -> Result<T> + Sync,
{
    use crate::dist::device::DeviceSpec;
    use crate::dist::nccl::Nccl;
    let members = if std::env::var_os("WORLD_SIZE").is_some() {
        Nccl::from_env()?
    } else {
        let ordinals = DeviceSpec::parse(&args.device)?.cuda_ordinals(args.nproc_per_node)?;
        Nccl::group_on(&ordinals)?
    };
    launch_group(members, dataset, collate, args, factory)
}

/// One thread per `(communicator, device)` of this process; rank 0 (wherever it
/// lives) writes the logs.
fn run_group<T, D, C, F, M>(
    members: Vec<(M, Device)>,
    data: RunData<'_, D, C>,
    args: &TrainingArgs,
    settings: &RunSettings,
    factory: F,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer + Send,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    F: Fn(&RankContext) -> Result<T> + Sync,
    M: Communicator,
{
    let mut logger = if members.iter().any(|(c, _)| c.rank() == 0) {
        Some(settings.logger(args)?)
    } else {
        None
    };
    let results: Vec<(usize, Result<Trained<T>>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .iter()
            .map(|(comm, device)| {
                let logger = if comm.rank() == 0 {
                    logger.take()
                } else {
                    None
                };
                let factory = &factory;
                let rank = comm.rank();
                let handle = scope.spawn(move || {
                    let mut logger = logger;
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        let built = factory(&RankContext::new(
                            rank,
                            settings.world_size,
                            device.clone(),
                            settings.seed,
                        ));
                        // Every rank learns whether every factory succeeded before training.
                        match (comm.any(built.is_err())?, built) {
                            (false, Ok(mut trainer)) => {
                                let summary = rank_run(
                                    &mut trainer,
                                    comm,
                                    data,
                                    settings,
                                    device,
                                    logger.as_mut(),
                                )?;
                                Ok(Trained { trainer, summary })
                            }
                            (_, Err(e)) => Err(e),
                            (true, Ok(_)) => Err(Error::PeerFailed { rank }),
                        }
                    }));
                    let result = outcome.unwrap_or_else(|payload| {
                        Err(Error::RankPanicked {
                            rank,
                            message: panic_message(&*payload),
                        })
                    });
                    if result.is_err() {
                        comm.abort();
                    }
                    result
                });
                (rank, handle)
            })
            .collect();
        handles
            .into_iter()
            .map(|(rank, h)| {
                let result = h.join().unwrap_or_else(|p| {
                    Err(Error::RankPanicked {
                        rank,
                        message: panic_message(&*p),
                    })
                });
                (rank, result)
            })
            .collect()
    });
    pick_result(results)
}

/// The lowest rank's trainer if every rank succeeded; otherwise the root cause (the
/// first error that is not a peer merely reporting another rank's failure).
fn pick_result<T>(mut results: Vec<(usize, Result<Trained<T>>)>) -> Result<Trained<T>> {
    results.sort_by_key(|(rank, _)| *rank);
    let mut errors: Vec<Error> = Vec::new();
    let mut first = None;
    for (_, result) in results {
        match result {
            Ok(t) => first = first.or(Some(t)),
            Err(e) => errors.push(e),
        }
    }
    if let Some(root) = errors
        .iter()
        .position(|e| !matches!(e, Error::PeerFailed { .. }))
    {
        return Err(errors.swap_remove(root));
    }
    match (errors.pop(), first) {
        (Some(e), _) => Err(e),
        (None, Some(t)) => Ok(t),
        (None, None) => Err(Error::EmptyGroup),
    }
}

/// One rank's run, started and trained to its end.
fn rank_run<T, D, C, M>(
    trainer: &mut T,
    comm: &M,
    data: RunData<'_, D, C>,
    settings: &RunSettings,
    device: &Device,
    logger: Option<&mut Logger>,
) -> Result<TrainSummary>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    M: Communicator,
{
    RankRun::start(trainer, comm, data, settings, device, logger)?.run()
}
