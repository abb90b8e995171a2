//! The entry point: a [`Run`] (its data, flags and, optionally, an eval set)
//! trains one trainer on one rank ([`Run::train`]), ranks as threads or NCCL GPUs
//! ([`Run::launch`]), or the ranks of a group that may span processes
//! ([`Run::group`]). Each builds the run's settings once, then runs a
//! `RankRun` on every rank; [`Run::evaluate`] evaluates a trainer without
//! training. It is the one way in besides the methods the attribute generates
//! (`T::train`, `T::launch`, `T::launch_with_eval`, `T::evaluate`), which call
//! it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_core::Device;

use crate::config::args::TrainingArgs;
use crate::dist::communicator::{Communicator, Local, Single};
use crate::error::{DataError, DistributedError, Error, Result, SettingsError};
use crate::report::logging::Logger;
use crate::report::record::EvalLog;
use crate::report::summary::{TrainSummary, Trained};
use crate::train::checkpoint::resume_point;
use crate::train::collate::panic_message;
use crate::train::dry_run::{dry_run_launch, dry_run_trainer};
use crate::train::eval::{evaluate, EvalInput};
use crate::train::out_of_memory::FaultInjector;
use crate::train::run::{RankRun, RunData};
use crate::train::settings::RunSettings;
use crate::user::data::Dataset;
use crate::user::trainer::{AdaptiveTrainer, CollateFor, RankContext};

/// What builds each rank's trainer, on the rank's device: a closure
/// `|ctx: &RankContext| -> adabatch::Result<MyTrainer>`, called on every rank's
/// thread. Implemented for every such closure.
pub trait RankFactory<T>: Fn(&RankContext) -> Result<T> + Sync {}

impl<T, F: Fn(&RankContext) -> Result<T> + Sync> RankFactory<T> for F {}

/// A run to start: the training set, the collate, the flags, and optionally an
/// eval set (HF's `eval_dataset`: evaluated every `--eval-steps` steps and at the
/// end, each eval example once across the ranks).
///
/// ```ignore
/// let trained = Run::new(&train_set, &collate, &args).with_eval(&eval_set).launch(factory)?;
/// ```
///
/// NCCL ranks across processes (under torchrun, feature `nccl`):
/// `Run::new(&data, &collate, &args).group(Nccl::from_env()?, factory)`.
pub struct Run<'a, D: ?Sized, C> {
    data: RunData<'a, D, C>,
    args: &'a TrainingArgs,
    faults: FaultInjector,
}

impl<'a, D: Dataset + ?Sized, C> Run<'a, D, C> {
    /// A run of `dataset`, collated by `collate`, as `args` say.
    pub fn new(dataset: &'a D, collate: &'a C, args: &'a TrainingArgs) -> Self {
        Self {
            data: RunData {
                train: dataset,
                eval: None,
                collate,
            },
            args,
            faults: FaultInjector::none(),
        }
    }

    /// Evaluates on `eval` (the same item type, collated alike): `eval_loss` and
    /// the model's `TrainModel::eval_metrics` go to the logs and to
    /// [`TrainSummary::evaluations`].
    pub fn with_eval(mut self, eval: &'a D) -> Self {
        self.data.eval = Some(eval);
        self
    }

    /// Out-of-memory faults injected from code: a test hook, only under the
    /// `internals` feature the workspace's tests enable (the command line has the
    /// hidden `--inject-oom-at-steps`).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn with_faults(mut self, faults: FaultInjector) -> Self {
        self.faults = faults;
        self
    }

    /// The run's settings on `world_size` ranks, with the injected faults.
    fn settings<T: AdaptiveTrainer>(&self, world_size: usize) -> Result<RunSettings> {
        let resume = resume_point(self.args, world_size)?;
        let mut settings =
            RunSettings::new(&T::POLICY, self.data.train, self.args, world_size, resume)?;
        settings.step.faults = self.faults.clone().and_steps(settings.step.faults.steps());
        Ok(settings)
    }

    /// Trains `trainer` on one rank (`--nproc-per-node` must be 1; [`Run::launch`]
    /// builds one trainer per rank). The trainer keeps its trained weights.
    pub fn train<T>(self, trainer: &mut T) -> Result<TrainSummary>
    where
        T: AdaptiveTrainer,
        C: CollateFor<T, D>,
    {
        if self.args.launch.nproc_per_node != 1 {
            return Err(Error::Settings(SettingsError::TrainNeedsOneRank {
                nproc_per_node: self.args.launch.nproc_per_node,
            }));
        }
        let settings = self.settings::<T>(1)?;
        if self.args.launch.dry_run {
            return dry_run_trainer(trainer, self.data.train, self.args, &settings);
        }
        let device = settings.device.open(0)?;
        let mut logger = settings.logger(self.args)?;
        let logger = Some(&mut logger);
        rank_run(trainer, &Single, self.data, &settings, &device, logger)
    }

    /// Evaluates `trainer`'s model on the eval set without training (HF's
    /// `trainer.evaluate()`), as a run's evaluations do: on one rank, in chunks of
    /// `--per-device-eval-batch-size`, every eval example once, the losses
    /// weighted as `T`'s policy and the flags say, under the run's precision. The
    /// log's `step` and `epoch` are 0. The run's settings are checked as for
    /// training; a run without an eval set (no [`Run::with_eval`]) or with an
    /// empty one is a typed error.
    pub fn evaluate<T>(&self, trainer: &mut T) -> Result<EvalLog>
    where
        T: AdaptiveTrainer,
        C: CollateFor<T, D>,
    {
        let Some(eval) = self.data.eval else {
            return Err(Error::Settings(SettingsError::NoEvalSet {
                what: "Run::evaluate",
            }));
        };
        // As a run's start refuses it (`check_run`), and before the settings:
        // `T::evaluate` builds them on the eval set.
        if eval.is_empty() {
            return Err(Error::Data(DataError::EvalSetTooSmall {
                world_size: 1,
                examples: 0,
            }));
        }
        let settings = self.settings::<T>(1)?;
        let device = settings.device.open(0)?;
        let input = EvalInput::of((eval, self.data.collate), &device, &settings);
        evaluate(trainer, &Single, &input, 0, 0.0)
    }

    /// Trains on `--nproc-per-node` ranks (threads on CPU; with the `nccl` feature,
    /// one thread per GPU); `factory` builds each rank's trainer on the rank's
    /// device (weights are then made identical from rank 0). Returns rank 0's
    /// trained trainer with the summary.
    pub fn launch<T, F>(self, factory: F) -> Result<Trained<T>>
    where
        T: AdaptiveTrainer + Send,
        C: CollateFor<T, D>,
        F: RankFactory<T>,
    {
        let settings = self.settings::<T>(self.args.launch.nproc_per_node)?;
        if self.args.launch.dry_run {
            let device = settings.device.open(0)?;
            return dry_run_launch(self.data.train, self.args, &settings, (0, device), factory);
        }
        // Several GPUs with NCCL: device-side all-reduce, one thread per GPU. Without
        // the `nccl` feature, CUDA ranks use the host-staged `Local` communicator below.
        #[cfg(feature = "nccl")]
        if settings.device.is_cuda() && settings.world_size > 1 {
            let ordinals = settings.device.cuda_ordinals(settings.world_size)?;
            let members = crate::dist::nccl::Nccl::group_on(&ordinals)?;
            return run_group(members, self.data, self.args, &settings, factory);
        }
        if settings.world_size == 1 {
            let mut logger = settings.logger(self.args)?;
            let device = settings.device.open(0)?;
            let mut trainer = factory(&RankContext::new(0, 1, device.clone(), settings.seed))?;
            let logger = Some(&mut logger);
            let summary = rank_run(&mut trainer, &Single, self.data, &settings, &device, logger)?;
            return Ok(Trained { trainer, summary });
        }
        if !settings.device.is_cuda() {
            if let Some(threads) = crate::dist::cpu_threads::share_cpu_cores(settings.world_size) {
                if !self.args.logging.quiet {
                    crate::report::messages::note(&format!(
                        "note: {} CPU ranks in one process: candle computes on {threads} thread(s) (set CANDLE_NUM_THREADS to choose)",
                        settings.world_size
                    ));
                }
            }
        }
        let members = Local::group(settings.world_size)
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| Ok((comm, settings.device.open(rank)?)))
            .collect::<Result<Vec<_>>>()?;
        run_group(members, self.data, self.args, &settings, factory)
    }

    /// Trains on the ranks this process hosts, one thread per `(communicator,
    /// device)`. The group may span processes and machines (e.g. NCCL across
    /// nodes): each process calls this with its own members, and
    /// `comm.world_size()` is the whole group. `--nproc-per-node` is ignored here.
    /// Returns the trainer of the lowest rank this process hosts (rank 0's where
    /// this process has it).
    pub fn group<T, F, M>(self, members: Vec<(M, Device)>, factory: F) -> Result<Trained<T>>
    where
        T: AdaptiveTrainer + Send,
        C: CollateFor<T, D>,
        F: RankFactory<T>,
        M: Communicator,
    {
        let Some((first, _)) = members.first() else {
            return Err(Error::Settings(SettingsError::EmptyGroup));
        };
        let settings = self.settings::<T>(first.world_size())?;
        if self.args.launch.dry_run {
            let (comm, device) = members
                .iter()
                .min_by_key(|(c, _)| c.rank())
                .unwrap_or(&members[0]);
            let rank_device = (comm.rank(), device.clone());
            return dry_run_launch(self.data.train, self.args, &settings, rank_device, factory);
        }
        run_group(members, self.data, self.args, &settings, factory)
    }
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
    F: RankFactory<T>,
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
                    let result = rank_thread(comm, device, data, settings, factory, logger);
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
                    Err(Error::Distributed(DistributedError::RankPanicked {
                        rank,
                        message: panic_message(&*p),
                    }))
                });
                (rank, result)
            })
            .collect()
    });
    pick_result(results)
}

/// One rank's thread: its trainer built (every rank learns whether every factory
/// succeeded before training), then its run; a panic becomes this rank's error.
fn rank_thread<T, D, C, F, M>(
    comm: &M,
    device: &Device,
    data: RunData<'_, D, C>,
    settings: &RunSettings,
    factory: &F,
    mut logger: Option<Logger>,
) -> Result<Trained<T>>
where
    T: AdaptiveTrainer + Send,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
    F: RankFactory<T>,
    M: Communicator,
{
    let rank = comm.rank();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let context = RankContext::new(rank, settings.world_size, device.clone(), settings.seed);
        let built = factory(&context);
        match (comm.any(built.is_err())?, built) {
            (false, Ok(mut trainer)) => {
                let logger = logger.as_mut();
                let summary = rank_run(&mut trainer, comm, data, settings, device, logger)?;
                Ok(Trained { trainer, summary })
            }
            (_, Err(e)) => Err(e),
            (true, Ok(_)) => Err(Error::Distributed(DistributedError::PeerFailed { rank })),
        }
    }));
    outcome.unwrap_or_else(|payload| {
        Err(Error::Distributed(DistributedError::RankPanicked {
            rank,
            message: panic_message(&*payload),
        }))
    })
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
        .position(|e| !matches!(e, Error::Distributed(DistributedError::PeerFailed { .. })))
    {
        return Err(errors.swap_remove(root));
    }
    match (errors.pop(), first) {
        (Some(e), _) => Err(e),
        (None, Some(t)) => Ok(t),
        (None, None) => Err(Error::Settings(SettingsError::EmptyGroup)),
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
