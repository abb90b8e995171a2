//! The training loop, written once and monomorphised per trainer.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Optimizer;

use crate::args::TrainingArgs;
use crate::communicator::{Communicator, Local, Single};
use crate::error::{Error, Result};
use crate::logging::{Logger, StepLog};
use crate::lr::LrSchedule;
use crate::model::{Batch, Collate, Dataset, TrainModel};
use crate::planner::{RunLength, StepPlanner};
use crate::policy::{Reweight, TrainerPolicy};
use crate::sampler::{GlobalBatchSampler, StepPlan};
use crate::schedule::{validate_spec, BatchLimits, Schedule, ScheduleSpec};
use crate::trainer::{AdaptiveTrainer, RankContext};

/// What a finished run reports (rank 0's view; every rank computes the same).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TrainSummary {
    /// Optimisation steps taken.
    pub global_step: usize,
    /// Examples seen / N.
    pub epoch: f64,
    /// Examples seen in total.
    pub examples_seen: usize,
    /// Mean of the step losses.
    pub train_loss: f64,
    /// Loss of every step, in order.
    pub step_losses: Vec<f64>,
    /// Per-device batch size the schedule had reached at the end.
    pub final_per_device_batch_size: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Wall time of the loop, seconds.
    pub train_runtime: f64,
    /// Examples per second over the run.
    pub train_samples_per_second: f64,
}

impl std::fmt::Display for TrainSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{{'train_runtime': {:.3}, 'train_samples_per_second': {:.1}, 'train_loss': {:.4}, 'epoch': {:.2}, 'global_step': {}, 'examples_seen': {}, 'final_per_device_batch_size': {}, 'world_size': {}}}",
            self.train_runtime,
            self.train_samples_per_second,
            self.train_loss,
            self.epoch,
            self.global_step,
            self.examples_seen,
            self.final_per_device_batch_size,
            self.world_size
        )
    }
}

/// Settings of one run, checked once before any rank starts.
#[derive(Debug, Clone)]
struct RunPlan {
    num_examples: usize,
    world_size: usize,
    seed: u64,
    drop_last: bool,
    shuffle: bool,
    schedule: ScheduleSpec,
    limits: BatchLimits,
    initial_per_device: usize,
    length: RunLength,
    reweight: Reweight,
    lr: LrSchedule,
    max_grad_norm: f64,
    logging_steps: usize,
}

impl RunPlan {
    fn new(policy: &TrainerPolicy, num_examples: usize, args: &TrainingArgs) -> Result<Self> {
        let world_size = args.nproc_per_node;
        if world_size == 0 {
            return Err(Error::InvalidConfig(
                "nproc_per_node must be at least 1".into(),
            ));
        }
        if num_examples == 0 {
            return Err(Error::EmptyDataset);
        }
        if world_size > num_examples {
            return Err(Error::MoreRanksThanExamples {
                world_size,
                examples: num_examples,
            });
        }
        if args.per_device_train_batch_size == 0 {
            return Err(Error::ZeroBatchSize {
                what: "per_device_train_batch_size",
            });
        }
        if args.max_steps == Some(0) {
            return Err(Error::InvalidConfig("max_steps must be at least 1".into()));
        }
        if args.num_train_epochs == 0 && args.max_steps.is_none() {
            return Err(Error::ZeroEpochs);
        }
        if args.logging_steps == 0 {
            return Err(Error::InvalidConfig(
                "logging_steps must be at least 1".into(),
            ));
        }
        if !(args.learning_rate.is_finite() && args.learning_rate >= 0.0) {
            return Err(Error::InvalidConfig(format!(
                "learning_rate {} must be finite and >= 0",
                args.learning_rate
            )));
        }
        if !(0.0..=1.0).contains(&args.warmup_ratio) {
            return Err(Error::InvalidConfig(format!(
                "warmup_ratio {} must be in [0, 1]",
                args.warmup_ratio
            )));
        }
        if !(args.max_grad_norm.is_finite() && args.max_grad_norm >= 0.0) {
            return Err(Error::InvalidConfig(format!(
                "max_grad_norm {} must be finite and >= 0",
                args.max_grad_norm
            )));
        }
        if let Some(reason) = policy.unsupported() {
            return Err(Error::InvalidConfig(reason.into()));
        }
        validate_spec(&policy.schedule)?;
        let limits = BatchLimits::new(policy.min_batch, policy.max_batch)?;
        let drop_last = args.dataloader_drop_last.unwrap_or(policy.drop_last);
        let initial_per_device =
            limits.apply(0, policy.schedule.initial(args.per_device_train_batch_size))?;
        let length = args
            .max_steps
            .map_or(RunLength::Epochs(args.num_train_epochs), RunLength::Steps);
        let total_examples = (args.num_train_epochs.max(1) * num_examples) as f64;
        Ok(Self {
            num_examples,
            world_size,
            seed: args.seed.unwrap_or(policy.seed),
            drop_last,
            shuffle: policy.shuffle,
            schedule: policy.schedule,
            limits,
            initial_per_device,
            length,
            reweight: policy.reweight,
            lr: LrSchedule {
                base: args.learning_rate,
                kind: args.lr_scheduler_type,
                warmup_examples: args.warmup_ratio * total_examples,
                total_examples,
                scaling: policy.lr_scaling,
                initial_global_batch: (initial_per_device * world_size).min(num_examples),
            },
            max_grad_norm: args.max_grad_norm,
            logging_steps: args.logging_steps,
        })
    }

    fn logger(&self, args: &TrainingArgs) -> Result<Logger> {
        let total = match self.length {
            RunLength::Epochs(e) => Some((e * self.num_examples) as u64),
            RunLength::Steps(_) => None,
        };
        let bar = if args.quiet || args.disable_tqdm {
            None
        } else {
            total
        };
        Logger::new(
            args.log_jsonl.as_deref(),
            bar,
            !args.quiet,
            args.log_indices,
        )
    }
}

/// The device of `rank` for a `--device` spec.
fn rank_device(spec: &str, rank: usize) -> Result<Device> {
    let cuda = |ordinal: usize| {
        Device::new_cuda(ordinal).map_err(|e| Error::Device(spec.into(), e.to_string()))
    };
    match spec {
        "cpu" => Ok(Device::Cpu),
        "cuda" => cuda(rank),
        _ => match spec.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(first)) => cuda(first + rank),
            _ => Err(Error::Device(
                spec.into(),
                "expected `cpu`, `cuda` or `cuda:N`".into(),
            )),
        },
    }
}

/// Trains `trainer` on one rank.
pub(crate) fn run_single<T, D, C>(
    mut trainer: T,
    dataset: &D,
    collate: &C,
    args: &TrainingArgs,
) -> Result<TrainSummary>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: Collate<D::Item, Batch = <T::Model as TrainModel>::Batch>,
{
    let plan = RunPlan::new(&T::POLICY, dataset.len(), args)?;
    let device = rank_device(&args.device, 0)?;
    let mut logger = plan.logger(args)?;
    rank_loop(
        &mut trainer,
        &Single,
        dataset,
        collate,
        &plan,
        &device,
        Some(&mut logger),
    )
}

/// Builds one trainer per rank with `factory` and trains them together.
pub(crate) fn run<T, D, C, F>(
    dataset: &D,
    collate: &C,
    args: &TrainingArgs,
    factory: F,
) -> Result<TrainSummary>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: Collate<D::Item, Batch = <T::Model as TrainModel>::Batch>,
    F: Fn(&RankContext) -> Result<T> + Sync,
{
    let plan = RunPlan::new(&T::POLICY, dataset.len(), args)?;
    let mut logger = plan.logger(args)?;
    if plan.world_size == 1 {
        let device = rank_device(&args.device, 0)?;
        let mut trainer = factory(&RankContext::new(0, 1, device.clone(), plan.seed))?;
        return rank_loop(
            &mut trainer,
            &Single,
            dataset,
            collate,
            &plan,
            &device,
            Some(&mut logger),
        );
    }
    let comms = Local::group(plan.world_size);
    let mut loggers: Vec<Option<&mut Logger>> = std::iter::once(Some(&mut logger)).collect();
    loggers.resize_with(plan.world_size, || None);
    let results: Vec<Result<TrainSummary>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter()
            .zip(loggers)
            .map(|(comm, logger)| {
                let (plan, factory, args) = (&plan, &factory, args);
                scope.spawn(move || {
                    let rank = comm.rank();
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        let built = rank_device(&args.device, rank).and_then(|device| {
                            factory(&RankContext::new(
                                rank,
                                plan.world_size,
                                device.clone(),
                                plan.seed,
                            ))
                            .map(|t| (t, device))
                        });
                        // Every rank learns whether every factory succeeded before training.
                        match (comm.any(built.is_err())?, built) {
                            (false, Ok((mut trainer, device))) => rank_loop(
                                &mut trainer,
                                comm,
                                dataset,
                                collate,
                                plan,
                                &device,
                                logger,
                            ),
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
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|p| {
                    Err(Error::RankPanicked {
                        rank,
                        message: panic_message(&*p),
                    })
                })
            })
            .collect()
    });
    pick_result(results)
}

/// Rank 0's summary if every rank succeeded; otherwise the root cause (the first
/// error that is not a peer merely reporting another rank's failure).
fn pick_result(results: Vec<Result<TrainSummary>>) -> Result<TrainSummary> {
    let mut errors: Vec<Error> = Vec::new();
    let mut summary = None;
    for result in results {
        match result {
            Ok(s) => summary = summary.or(Some(s)),
            Err(e) => errors.push(e),
        }
    }
    if let Some(root) = errors
        .iter()
        .position(|e| !matches!(e, Error::PeerFailed { .. }))
    {
        return Err(errors.swap_remove(root));
    }
    match (errors.pop(), summary) {
        (Some(e), _) => Err(e),
        (None, Some(s)) => Ok(s),
        (None, None) => Err(Error::Comm("no rank returned a result".into())),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// The model's parameters sorted by name, checked for duplicates.
fn sorted_parameters<M: TrainModel>(model: &M) -> Result<Vec<(String, Var)>> {
    let mut params = model.named_parameters();
    if params.is_empty() {
        return Err(Error::NoParameters);
    }
    params.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = params.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::InvalidConfig(format!(
            "parameter name `{}` appears twice in named_parameters",
            w[0].0
        )));
    }
    Ok(params)
}

/// Makes every rank start from rank 0's weights, after checking they agree on the
/// parameter set.
fn synchronise_parameters(comm: &impl Communicator, params: &[(String, Var)]) -> Result<()> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let elems: usize = params.iter().map(|(_, v)| v.elem_count()).sum();
    let mut totals = [params.len() as f64, elems as f64];
    comm.all_reduce_sum(&mut [], &mut totals)?;
    let world = comm.world_size() as f64;
    if totals != [params.len() as f64 * world, elems as f64 * world] {
        return Err(Error::ParameterMismatch {
            rank: comm.rank(),
            detail: format!(
                "this rank has {} tensors / {elems} values; the group disagrees",
                params.len()
            ),
        });
    }
    let mut tensors: Vec<Tensor> = params.iter().map(|(_, v)| v.as_tensor().clone()).collect();
    comm.broadcast(&mut tensors, 0)?;
    for ((_, var), value) in params.iter().zip(&tensors) {
        var.set(value)?;
    }
    Ok(())
}

/// One rank's share of a step: gradients of its examples, already divided by the
/// global weight, and its part of the global loss.
struct LocalStep {
    grads: Option<GradStore>,
    loss: Option<Tensor>,
}

struct StepInput<'a, D: ?Sized, C> {
    dataset: &'a D,
    collate: &'a C,
    device: &'a Device,
}

/// Collates this rank's examples (`None` for an empty rank).
fn collate_local<B: Batch, D, C>(
    input: &StepInput<'_, D, C>,
    indices: &[usize],
) -> Result<Option<B>>
where
    D: Dataset + ?Sized,
    C: Collate<D::Item, Batch = B>,
{
    if indices.is_empty() {
        return Ok(None);
    }
    let items: Vec<D::Item> = indices.iter().map(|&i| input.dataset.get(i)).collect();
    let batch = input.collate.collate(&items, input.device)?;
    if batch.num_examples() != items.len() {
        return Err(Error::InvalidConfig(format!(
            "collate returned a batch of {} examples for {} items",
            batch.num_examples(),
            items.len()
        )));
    }
    Ok(Some(batch))
}

/// Forward and backward of this rank's batch; `global_weight` turns the local loss
/// sum into this rank's share of the global mean.
fn forward_backward<M: TrainModel>(
    model: &M,
    batch: Option<&M::Batch>,
    reweight: Reweight,
    global_weight: f64,
) -> Result<LocalStep> {
    let Some(batch) = batch else {
        return Ok(LocalStep {
            grads: None,
            loss: None,
        });
    };
    let examples = batch.num_examples();
    let losses = model.per_example_loss(batch)?;
    if losses.dims() != [examples] {
        return Err(Error::LossShape {
            shape: losses.dims().to_vec(),
            examples,
        });
    }
    let local_sum = losses.sum_all()?;
    let share = match reweight {
        Reweight::SampleCount | Reweight::TokenCount => (local_sum / global_weight)?,
        Reweight::RankMean => (local_sum / (examples as f64 * global_weight))?,
    };
    let grads = share.backward()?;
    Ok(LocalStep {
        grads: Some(grads),
        loss: Some(share),
    })
}

/// Runs `f`, turning a panic into this rank's error.
fn guarded<R>(rank: usize, f: impl FnOnce() -> Result<R>) -> Result<R> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::RankPanicked {
            rank,
            message: panic_message(&*p),
        })
    })
}

/// Makes every rank agree on whether any rank failed; returns this rank's own error
/// first, [`Error::PeerFailed`] where only a peer failed.
fn agree<R>(comm: &impl Communicator, local: Result<R>, scalars: &mut [f64]) -> Result<R> {
    let n = scalars.len();
    let mut buffer: Vec<f64> = scalars
        .iter()
        .copied()
        .chain([f64::from(u8::from(local.is_err()))])
        .collect();
    comm.all_reduce_sum(&mut [], &mut buffer)?;
    scalars.copy_from_slice(&buffer[..n]);
    let value = local?;
    if buffer[n] > 0.0 {
        return Err(Error::PeerFailed { rank: comm.rank() });
    }
    Ok(value)
}

/// Per-rank mutable state of the loop.
struct Progress {
    step: usize,
    per_device: usize,
    losses_since_log: Vec<f64>,
    examples_since_log: usize,
    last_log: Instant,
    step_losses: Vec<f64>,
}

fn rank_loop<T, D, C>(
    trainer: &mut T,
    comm: &impl Communicator,
    dataset: &D,
    collate: &C,
    plan: &RunPlan,
    device: &Device,
    mut logger: Option<&mut Logger>,
) -> Result<TrainSummary>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: Collate<D::Item, Batch = <T::Model as TrainModel>::Batch>,
{
    let (model, _) = trainer.parts();
    let params = sorted_parameters(&*model)?;
    synchronise_parameters(comm, &params)?;
    let sampler = GlobalBatchSampler::new(
        plan.num_examples,
        plan.world_size,
        plan.seed,
        plan.shuffle,
        plan.drop_last,
    );
    let mut planner = StepPlanner::new(
        sampler,
        plan.schedule,
        plan.limits,
        plan.initial_per_device,
        plan.length,
        plan.world_size,
        plan.drop_last,
    )?;
    let input = StepInput {
        dataset,
        collate,
        device,
    };
    let started = Instant::now();
    let mut progress = Progress {
        step: 0,
        per_device: plan.initial_per_device,
        losses_since_log: Vec::new(),
        examples_since_log: 0,
        last_log: started,
        step_losses: Vec::new(),
    };
    while let Some(step_plan) = planner.next_step() {
        progress.step = planner.step();
        let sampler = planner.sampler();
        let consumed_before = sampler.examples_seen() - step_plan.global_size();
        let lr = plan.lr.at(consumed_before, step_plan.global_size());
        let log_now =
            logger.is_some() && (progress.step % plan.logging_steps == 0 || planner.is_last_step());
        let (loss, grad_norm) = train_step(
            trainer,
            comm,
            &input,
            &params,
            &step_plan,
            lr,
            plan,
            progress.step,
            log_now,
        )?;
        progress.step_losses.push(loss);
        progress.losses_since_log.push(loss);
        progress.examples_since_log += step_plan.global_size();
        if let Some(logger) = logger.as_deref_mut() {
            logger.advance(step_plan.global_size(), sampler.epoch());
            if log_now {
                logger.log(&step_log(
                    &mut progress,
                    sampler,
                    &step_plan,
                    grad_norm.unwrap_or(f64::NAN),
                    lr,
                ))?;
            }
        }
        planner.finish_step()?;
        progress.per_device = planner.per_device();
    }
    if let Some(logger) = logger {
        logger.finish();
    }
    let sampler = planner.sampler();
    let runtime = started.elapsed().as_secs_f64();
    let steps = progress.step_losses.len().max(1) as f64;
    Ok(TrainSummary {
        global_step: progress.step,
        epoch: sampler.epoch(),
        examples_seen: sampler.examples_seen(),
        train_loss: progress.step_losses.iter().sum::<f64>() / steps,
        step_losses: progress.step_losses,
        final_per_device_batch_size: progress.per_device,
        world_size: plan.world_size,
        train_runtime: runtime,
        train_samples_per_second: sampler.examples_seen() as f64 / runtime.max(f64::MIN_POSITIVE),
    })
}

fn step_log(
    progress: &mut Progress,
    sampler: &GlobalBatchSampler,
    plan: &StepPlan,
    grad_norm: f64,
    lr: f64,
) -> StepLog {
    let elapsed = progress.last_log.elapsed().as_secs_f64();
    let losses = std::mem::take(&mut progress.losses_since_log);
    let entry = StepLog {
        step: progress.step,
        epoch: sampler.epoch(),
        train_coverage: sampler.train_coverage(),
        local_batch_sizes: plan.local_sizes(),
        global_batch: plan.global_size(),
        indices: plan.per_rank_indices(),
        loss: losses.iter().sum::<f64>() / losses.len().max(1) as f64,
        grad_norm,
        learning_rate: lr,
        examples_per_s: progress.examples_since_log as f64 / elapsed.max(f64::MIN_POSITIVE),
    };
    progress.examples_since_log = 0;
    progress.last_log = Instant::now();
    entry
}

/// Maps candle's out-of-memory errors to [`Error::OutOfMemory`].
pub(crate) fn classify(error: Error, step: usize) -> Error {
    match error {
        Error::Candle(e) if e.to_string().to_lowercase().contains("out of memory") => {
            Error::OutOfMemory {
                step,
                detail: e.to_string(),
            }
        }
        other => other,
    }
}

/// One optimisation step on this rank; returns the global loss and, when asked
/// for (or needed for clipping), the gradient norm.
#[allow(clippy::too_many_arguments)]
fn train_step<T, D, C>(
    trainer: &mut T,
    comm: &impl Communicator,
    input: &StepInput<'_, D, C>,
    params: &[(String, Var)],
    step_plan: &StepPlan,
    lr: f64,
    plan: &RunPlan,
    step: usize,
    want_norm: bool,
) -> Result<(f64, Option<f64>)>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: Collate<D::Item, Batch = <T::Model as TrainModel>::Batch>,
{
    let (model, optimizer) = trainer.parts();
    let (rank, world) = (comm.rank(), comm.world_size());
    let batch = guarded(rank, || collate_local(input, step_plan.local(rank)));
    let local_tokens = match &batch {
        Ok(Some(b)) => b.num_tokens() as f64,
        _ => 0.0,
    };
    // Sample counts follow from the plan that every rank holds; token counts and
    // collate failures need one small collective.
    let mut tokens = [local_tokens];
    let batch = if world > 1 {
        agree(comm, batch, &mut tokens)?
    } else {
        batch?
    };
    let global_weight = match plan.reweight {
        Reweight::SampleCount => step_plan.global_size() as f64,
        Reweight::RankMean => step_plan.active_ranks() as f64,
        Reweight::TokenCount => tokens[0],
    };
    if global_weight <= 0.0 {
        return Err(Error::InvalidConfig(format!(
            "step {step}: the global batch has no tokens to weigh the loss by"
        )));
    }
    let local = guarded(rank, || {
        forward_backward(&*model, batch.as_ref(), plan.reweight, global_weight)
    })
    .map_err(|e| classify(e, step));
    let (mut grads, loss) = if world == 1 {
        let local = local?;
        (
            local.grads.unwrap_or_default(),
            scalar(local.loss.as_ref())?,
        )
    } else {
        reduce_gradients(comm, params, local)?
    };
    if !loss.is_finite() {
        return Err(Error::NonFiniteLoss { step, loss });
    }
    let clipping = plan.max_grad_norm > 0.0;
    let grad_norm = if want_norm || clipping {
        Some(global_norm(&grads, params)?)
    } else {
        None
    };
    if let (true, Some(norm)) = (clipping, grad_norm) {
        if norm > plan.max_grad_norm {
            let factor = plan.max_grad_norm / (norm + 1e-6);
            for (_, var) in params {
                if let Some(g) = grads.remove(var.as_tensor()) {
                    grads.insert(var.as_tensor(), (g * factor)?);
                }
            }
        }
    }
    optimizer.set_learning_rate(lr);
    optimizer
        .step(&grads)
        .map_err(|e| classify(e.into(), step))?;
    Ok((loss, grad_norm))
}

fn scalar(t: Option<&Tensor>) -> Result<f64> {
    Ok(match t {
        Some(t) => t.to_dtype(DType::F64)?.to_scalar::<f64>()?,
        None => 0.0,
    })
}

/// All-reduces gradients (zeros for parameters without one) and the loss shares,
/// with a failure flag so every rank agrees before anyone steps.
fn reduce_gradients(
    comm: &impl Communicator,
    params: &[(String, Var)],
    local: Result<LocalStep>,
) -> Result<(GradStore, f64)> {
    let zeros = |var: &Var| var.as_tensor().zeros_like();
    let (mut tensors, loss) = match &local {
        Ok(step) => {
            let tensors = params
                .iter()
                .map(
                    |(_, var)| match step.grads.as_ref().and_then(|g| g.get(var.as_tensor())) {
                        Some(g) => Ok(g.clone()),
                        None => zeros(var),
                    },
                )
                .collect::<candle_core::Result<Vec<_>>>()?;
            (tensors, scalar(step.loss.as_ref())?)
        }
        Err(_) => (
            params
                .iter()
                .map(|(_, var)| zeros(var))
                .collect::<candle_core::Result<Vec<_>>>()?,
            0.0,
        ),
    };
    let failed = f64::from(u8::from(local.is_err()));
    let mut scalars = [loss, failed];
    comm.all_reduce_sum(&mut tensors, &mut scalars)?;
    local?;
    if scalars[1] > 0.0 {
        return Err(Error::PeerFailed { rank: comm.rank() });
    }
    let mut grads = GradStore::default();
    for ((_, var), grad) in params.iter().zip(tensors) {
        grads.insert(var.as_tensor(), grad);
    }
    Ok((grads, scalars[0]))
}

fn global_norm(grads: &GradStore, params: &[(String, Var)]) -> Result<f64> {
    let mut sum = 0.0;
    for (_, var) in params {
        if let Some(g) = grads.get(var.as_tensor()) {
            sum += g
                .to_dtype(DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?;
        }
    }
    Ok(sum.sqrt())
}
