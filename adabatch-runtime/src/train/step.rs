//! One optimisation step on one rank: collate, forward and backward of every
//! micro-batch (in chunks after an OOM), one all-reduce with agreement flags, the
//! optimizer update.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use crate::config::policy::Reweight;
use crate::data::planner::StepBatches;
use crate::dist::communicator::Communicator;
use std::borrow::Cow;
use std::sync::Arc;

use crate::error::{
    Cause, DataError, DistributedError, Error, ModelError, Result, SettingsError, SharedError,
    TrainingError,
};
use crate::optim::precision::{loss_in_f32, AutocastScope, Precision};
use crate::optim::TrainOptimizer;
use crate::train::collate::{collate_indices, guarded};
use crate::train::grads::{add_into, global_norm, scale_grads};
use crate::train::interrupt::Interrupts;
use crate::train::out_of_memory::{is_out_of_memory, FaultInjector};
use crate::train::payload::{PayloadLayout, StepScalars};
use crate::train::prefetch::{take_chunk, Prefetched};
use crate::train::probe::{
    ChunkLosses, GroupGradients, Groups, MicroGradient, ProbeLayout, Readings, StepProbe,
    SummedStep,
};
use crate::train::settings::StepRules;
use crate::user::data::{Collate, Dataset};
use crate::user::train_model::{Batch, TrainModel};
use crate::user::trainer::{AdaptiveTrainer, CollateFor};

/// What one rank needs besides the model to run a step.
pub(crate) struct StepInput<'a, D: ?Sized, C> {
    pub dataset: &'a D,
    pub collate: &'a C,
    pub device: &'a Device,
    pub reweight: Reweight,
    pub max_grad_norm: f64,
    pub faults: FaultInjector,
    /// Check at the next update that the optimizer changes every parameter that
    /// has a gradient.
    pub verify_update: bool,
    /// Check at the next trained step that every parameter got a gradient on
    /// some rank (the first step, and the first after a resume).
    pub check_coverage: bool,
    /// The dtype the model computes in (`--bf16` / `--fp16`).
    pub precision: Precision,
    /// `--fp16`: the loss scale of this step (1 otherwise).
    pub loss_scale: f64,
    /// Whether a signal asked the run to stop (its flag rides in the step's
    /// all-reduce, so every rank stops after the same step).
    pub interrupts: Interrupts,
}

impl<'a, D: ?Sized, C> StepInput<'a, D, C> {
    /// A run's step input: the data, the device and the step rules.
    pub(crate) fn new(
        dataset: &'a D,
        collate: &'a C,
        device: &'a Device,
        rules: &StepRules,
    ) -> Self {
        Self {
            dataset,
            collate,
            device,
            reweight: rules.reweight,
            max_grad_norm: rules.max_grad_norm,
            faults: rules.faults.clone(),
            verify_update: true,
            check_coverage: true,
            precision: rules.precision,
            loss_scale: 1.0,
            interrupts: Interrupts::start(),
        }
    }
}

/// One step's work on this rank: its batches and number, the learning rate, the
/// pieces each rank slice is split into (after OOMs), whether the log wants the
/// gradient norm, the batches collated ahead, and what the controllers measure
/// in it (the same probes on every rank).
pub(crate) struct StepPlan<'b, B> {
    pub(crate) batches: &'b StepBatches,
    pub(crate) step: usize,
    pub(crate) lr: f64,
    pub(crate) chunks: usize,
    pub(crate) want_norm: bool,
    pub(crate) ready: Prefetched<B>,
    pub(crate) probes: &'b [Box<dyn StepProbe + 'b>],
}

/// How a step ended, the same on every rank.
#[derive(Debug)]
pub(crate) enum StepOutcome {
    /// The step ran (its update possibly skipped under `--fp16`).
    Trained(TrainedStep),
    /// Some rank ran out of memory; nobody stepped.
    OutOfMemory { oom: StepOom },
}

/// A step that ran, the same on every rank.
#[derive(Debug)]
pub(crate) struct TrainedStep {
    /// Under `--fp16`: the scaled gradients were not finite and the update was
    /// skipped.
    pub(crate) overflowed: bool,
    /// The step's loss (the global mean under the run's reweighting).
    pub(crate) loss: f64,
    /// The gradients' norm before clipping, when the log, clipping or a probe
    /// needed it.
    pub(crate) grad_norm: Option<f64>,
    /// A signal reached some rank: the run stops after this step.
    pub(crate) interrupted: bool,
    /// What the controllers' probes measured in it.
    pub(crate) readings: Readings,
}

/// Which ranks ran out of memory in a step.
#[derive(Clone, Debug)]
pub(crate) enum StepOom {
    /// This rank did: the device's error.
    Here(Arc<Error>),
    /// Other ranks did, this one did not.
    Elsewhere {
        /// How many.
        ranks: usize,
    },
}

impl StepOom {
    /// This rank's OOM, by the error's first line: candle appends a backtrace when
    /// `RUST_BACKTRACE` is set, which does not belong in the run's log.
    fn here(error: Error) -> Self {
        StepOom::Here(Arc::new(error))
    }

    /// The device's error, on the rank that ran out of memory.
    pub(crate) fn cause(&self) -> Option<Cause> {
        match self {
            StepOom::Here(error) => Some(Box::new(SharedError(Arc::clone(error)))),
            StepOom::Elsewhere { .. } => None,
        }
    }
}

impl std::fmt::Display for StepOom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepOom::Here(error) => {
                let message = error.to_string();
                f.write_str(message.lines().next().unwrap_or_default().trim_end())
            }
            StepOom::Elsewhere { ranks } => write!(f, "{ranks} rank(s) ran out of memory"),
        }
    }
}

impl StepOutcome {
    /// The step, when it ran.
    pub(crate) fn trained(&self) -> Option<&TrainedStep> {
        match self {
            StepOutcome::Trained(step) => Some(step),
            StepOutcome::OutOfMemory { .. } => None,
        }
    }
}

/// Gradients (aligned with the parameters), loss share and token count: this
/// rank's, or after the all-reduce every rank's summed.
struct LocalGrads {
    grads: Vec<Option<Tensor>>,
    loss: f64,
    tokens: f64,
    /// The probes' values (after the all-reduce: summed).
    probed: Vec<f64>,
    /// When coverage is checked: whether each parameter got a gradient (after
    /// the all-reduce: on some rank).
    covered: Option<Vec<bool>>,
    /// 1 when a signal asked this rank to stop (after the all-reduce: how many did).
    interrupt: f64,
    /// On a step that groups its examples, each group's gradients (after the
    /// all-reduce: summed), weighted as the step's; empty otherwise.
    groups: Vec<Vec<Option<Tensor>>>,
}

/// How the losses of a step are weighted: `known_weight` (the global example
/// count, or the number of active rank slices for `RankMean`) scales each loss so
/// the sum is the global mean; token counts are only known afterwards and scale
/// at the end.
fn known_weight(reweight: Reweight, batches: &StepBatches) -> f64 {
    match reweight {
        Reweight::SampleCount => batches.global_size() as f64,
        Reweight::RankMean => batches
            .micro
            .iter()
            .map(|m| m.active_ranks())
            .sum::<usize>() as f64,
        Reweight::TokenCount => 1.0,
    }
}

/// The step's probes, and the optimizer's preconditioner when one asked for it.
struct Probing<'p> {
    layout: ProbeLayout<'p>,
    preconditioner: Option<Vec<Option<Tensor>>>,
}

impl<'p> Probing<'p> {
    /// The probes of `plan`, with what they need from `optimizer`.
    fn of<B>(
        plan: &StepPlan<'p, B>,
        optimizer: &impl TrainOptimizer,
        params: &[(String, Var)],
    ) -> Result<Self> {
        let layout = ProbeLayout::of(plan.probes, plan.batches);
        let preconditioner = match layout.needs.preconditioner {
            true => optimizer.preconditioner(params)?,
            false => None,
        };
        Ok(Self {
            layout,
            preconditioner,
        })
    }
}

/// Forward and backward over this rank's share of every micro-batch, each split in
/// `plan.chunks` pieces, gradients summed.
fn accumulate_local<M, D, C>(
    model: &M,
    input: &mut StepInput<'_, D, C>,
    params: &[(String, Var)],
    (plan, probing): (&mut StepPlan<'_, M::Batch>, &Probing<'_>),
    rank: usize,
) -> Result<LocalGrads>
where
    M: TrainModel,
    D: Dataset + ?Sized,
    C: Collate<D::Item, Batch = M::Batch>,
{
    let batches = plan.batches;
    if probing.layout.groups.is_some() && !input.collate.examples_independent() {
        return Err(SettingsError::ConflictingSettings {
            first: "a mixer that measures each source's gradients (pike)",
            second: "a collate whose examples read their batch-mates (cross-document attention)",
            reason: "the measuring step collates each source's halves apart, which would change their losses and the step's update",
        }
        .into());
    }
    let mut local = LocalGrads {
        grads: vec![None; params.len()],
        loss: 0.0,
        tokens: 0.0,
        probed: probing.layout.local(),
        covered: None,
        interrupt: f64::from(u8::from(input.interrupts.requested())),
        groups: vec![
            vec![None; params.len()];
            probing.layout.groups.as_ref().map_or(0, |g| g.count)
        ],
    };
    let known_weight = known_weight(input.reweight, batches);
    let active_ranks = batches.local_sizes().iter().filter(|&&n| n > 0).count();
    let world = batches.local_sizes().len();
    let mut first = 0;
    for (m, micro) in batches.micro.iter().enumerate() {
        let indices = micro.local(rank);
        let micro_start = first + <[_]>::get(&micro.splits, rank).map_or(0, |r| r.start);
        first += micro.indices.len();
        if indices.is_empty() {
            continue;
        }
        let tokens_before = local.tokens;
        let chunk_len = indices.len().div_ceil(plan.chunks);
        // A probe that reads micro-batches gets this one's share summed apart.
        let needs_micro = probing.layout.needs.micro_gradients;
        let mut micro_grads = needs_micro.then(|| vec![None; params.len()]);
        for (c, chunk) in indices.chunks(chunk_len).enumerate() {
            input
                .faults
                .check(plan.step, rank, active_ranks, chunk.len())?;
            let share = ChunkShare {
                rank_slice: indices.len(),
                known_weight,
            };
            let start = micro_start + c * chunk_len;
            for (group, piece) in pieces(probing.layout.groups.as_ref(), chunk, start) {
                let batch = match take_chunk(&mut plan.ready, &piece) {
                    Some(batch) => batch?,
                    None => collate_indices(input.dataset, input.collate, input.device, &piece)?,
                };
                let probes = &probing.layout;
                let part = (&batch, &piece[..], group);
                let grads = chunk_backward(model, input, part, share, &mut local, probes)?;
                let target = micro_grads.as_mut().unwrap_or(&mut local.grads);
                add_store(target, params, &grads)?;
                if let Some(group) = group {
                    add_store(&mut local.groups[group], params, &grads)?;
                }
            }
        }
        if let Some(micro_grads) = micro_grads {
            let tokens = local.tokens - tokens_before;
            let share = (indices.len(), tokens, known_weight);
            probe_micro(
                input,
                probing,
                (m, rank, world),
                share,
                micro_grads,
                &mut local,
            )?;
        }
    }
    Ok(local)
}

/// A chunk (its examples from position `start` of the step) as the pieces it
/// runs in: itself, or on a step that groups its examples one piece per group
/// (the examples' losses do not depend on the others of their batch, so the
/// pieces' gradients sum to the chunk's).
fn pieces<'c>(
    groups: Option<&Groups>,
    chunk: &'c [usize],
    start: usize,
) -> Vec<(Option<usize>, Cow<'c, [usize]>)> {
    let Some(groups) = groups else {
        return vec![(None, Cow::Borrowed(chunk))];
    };
    let mut by_group: Vec<Vec<usize>> = vec![Vec::new(); groups.count];
    for (i, &index) in chunk.iter().enumerate() {
        let group = <[_]>::get(&groups.of, start + i).copied().unwrap_or(0);
        by_group[group.min(groups.count - 1)].push(index);
    }
    (by_group.into_iter().enumerate())
        .filter(|(_, piece)| !piece.is_empty())
        .map(|(g, piece)| (Some(g), Cow::Owned(piece)))
        .collect()
}

/// A chunk's gradients added into `target` (aligned with `params`).
fn add_store(
    target: &mut [Option<Tensor>],
    params: &[(String, Var)],
    grads: &GradStore,
) -> Result<()> {
    for (slot, (_, var)) in target.iter_mut().zip(params) {
        if let Some(g) = grads.get(var.as_tensor()) {
            add_into(slot, g)?;
        }
    }
    Ok(())
}

/// A micro-batch's gradient on this rank, summed apart (`micro`: its number,
/// the rank's, the number of ranks; `share`: its examples, tokens and the step's
/// known weight), to the probes, then into the step's.
fn probe_micro<D: ?Sized, C>(
    input: &StepInput<'_, D, C>,
    probing: &Probing<'_>,
    (micro, rank, world): (usize, usize, usize),
    (examples, tokens, known_weight): (usize, f64, f64),
    micro_grads: Vec<Option<Tensor>>,
    local: &mut LocalGrads,
) -> Result<()> {
    // The share is (sum of losses) / B: its mean gradient is B / b times it;
    // with token counts it is the sum of the losses of t tokens.
    let (size, to_mean) = match input.reweight {
        Reweight::TokenCount => (tokens, 1.0 / tokens.max(1.0)),
        _ => (examples as f64, known_weight / examples as f64),
    };
    let view = MicroGradient {
        micro,
        rank,
        world,
        size,
        to_mean,
        loss_scale: input.loss_scale,
        grads: &micro_grads,
        preconditioner: probing.preconditioner.as_deref(),
    };
    probing.layout.micro(&view, &mut local.probed)?;
    for (slot, g) in local.grads.iter_mut().zip(micro_grads) {
        if let Some(g) = g {
            add_into(slot, &g)?;
        }
    }
    Ok(())
}

/// How one chunk's losses are weighted: the size of this rank's slice of the
/// micro-batch, and the step's known weight.
#[derive(Clone, Copy)]
struct ChunkShare {
    rank_slice: usize,
    known_weight: f64,
}

/// Forward and backward of one chunk (its batch and dataset indices): its loss
/// share and tokens go into `local`, its losses to the probes that read them;
/// returns its gradients.
fn chunk_backward<M, D, C>(
    model: &M,
    input: &StepInput<'_, D, C>,
    (batch, chunk, group): (&M::Batch, &[usize], Option<usize>),
    share: ChunkShare,
    local: &mut LocalGrads,
    probes: &ProbeLayout<'_>,
) -> Result<GradStore>
where
    M: TrainModel,
    D: ?Sized,
{
    local.tokens += batch.num_tokens() as f64;
    let autocast = AutocastScope::enter(input.precision);
    let losses = model.per_example_loss(batch)?;
    autocast.check_used(input.precision)?;
    drop(autocast);
    let losses = loss_in_f32(losses)?;
    if losses.dims() != [chunk.len()] {
        return Err(Error::Model(ModelError::LossShape {
            shape: losses.dims().to_vec(),
            examples: chunk.len(),
        }));
    }
    if probes.needs.losses {
        let values = losses.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        let tokens = batch.example_tokens();
        let chunk = ChunkLosses {
            indices: chunk,
            losses: &values,
            tokens: tokens.as_deref(),
            group,
            batch_tokens: batch.num_tokens(),
        };
        probes.chunk(&chunk, &mut local.probed);
    }
    let sum = losses.sum_all()?;
    let weighted = match input.reweight {
        Reweight::SampleCount => (sum / share.known_weight)?,
        Reweight::TokenCount => sum,
        Reweight::RankMean => (sum / (share.rank_slice as f64 * share.known_weight))?,
    };
    local.loss += weighted.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    Ok(if input.loss_scale == 1.0 {
        weighted.backward()?
    } else {
        (weighted * input.loss_scale)?.backward()?
    })
}

/// One optimisation step on this rank. Every rank calls it with the same batches,
/// `chunks` and probes; OOMs and failures are agreed through one all-reduce
/// before anyone updates its weights.
pub(crate) fn train_step<T, D, C>(
    trainer: &mut T,
    comm: &impl Communicator,
    input: &mut StepInput<'_, D, C>,
    params: &[(String, Var)],
    mut plan: StepPlan<'_, <T::Model as TrainModel>::Batch>,
) -> Result<StepOutcome>
where
    T: AdaptiveTrainer,
    D: Dataset + ?Sized,
    C: CollateFor<T, D>,
{
    let (model, optimizer) = trainer.parts();
    let rank = comm.rank();
    let step = plan.step;
    let probing = Probing::of(&plan, &*optimizer, params)?;
    let local = guarded(rank, || {
        accumulate_local(&*model, input, params, (&mut plan, &probing), rank)
    })
    .map_err(|e| on_rank(e, rank, step));
    let slots = (
        probing.layout.slots(),
        probing.layout.groups.as_ref().map_or(0, |g| g.count),
    );
    let mut summed = match gather_checked(comm, params, local, input, slots)? {
        Ok(summed) => summed,
        Err(oom) => return Ok(StepOutcome::OutOfMemory { oom }),
    };
    let examples_per_token = per_token_mean(&mut summed, input.reweight, &plan)?;
    let groups = group_sums(std::mem::take(&mut summed.groups), input, plan.batches);
    let mut probed = std::mem::take(&mut summed.probed);
    let (loss, interrupted) = (summed.loss, summed.interrupt > 0.0);
    let mut summed_step = SummedStep {
        grads: None,
        norm: None,
        preconditioner: probing.preconditioner.as_deref(),
        examples_per_token,
        world: comm.world_size(),
        groups: None,
    };
    let Some(mut update) = unscale(summed, input.loss_scale)? else {
        let readings = probing.layout.read(&mut probed, &summed_step)?;
        return Ok(StepOutcome::Trained(TrainedStep {
            overflowed: true,
            loss,
            grad_norm: None,
            interrupted,
            readings,
        }));
    };
    if !update.loss.is_finite() {
        return Err(Error::Training(TrainingError::NonFiniteLoss {
            step: plan.step,
            loss: update.loss,
            last_checkpoint: None,
        }));
    }
    // Before clipping: the probes read the gradient as it came.
    let wanted = plan.want_norm || probing.layout.needs.summed_norm;
    let grad_norm = unclipped_norm(&update, input.max_grad_norm, wanted)?;
    summed_step.grads = Some(&update.grads);
    summed_step.norm = grad_norm;
    summed_step.groups = groups.view();
    let readings = probing.layout.read(&mut probed, &summed_step)?;
    clip(&mut update, input.max_grad_norm, grad_norm)?;
    apply_update(
        optimizer,
        params,
        update.grads,
        plan.lr,
        &mut input.verify_update,
    )?;
    Ok(StepOutcome::Trained(TrainedStep {
        overflowed: false,
        loss: update.loss,
        grad_norm,
        interrupted,
        readings,
    }))
}

/// The groups' summed gradients (of the step's scaled losses) with the factor
/// to [`SummedStep::groups`]' sums of their losses.
struct GroupSums {
    sums: Vec<Vec<Option<Tensor>>>,
    /// `None` without groups, and under `rank_mean`.
    scale: Option<f64>,
}

impl GroupSums {
    fn view(&self) -> Option<GroupGradients<'_>> {
        (self.scale).map(|scale| GroupGradients {
            sums: &self.sums,
            scale,
        })
    }
}

/// The step's `groups` as [`GroupSums`].
fn group_sums<D: ?Sized, C>(
    groups: Vec<Vec<Option<Tensor>>>,
    input: &StepInput<'_, D, C>,
    batches: &StepBatches,
) -> GroupSums {
    // Sample counts divide every loss by the step's examples; token counts
    // divide the sums later, by the step's tokens (not done to the groups).
    let factor = match input.reweight {
        _ if groups.is_empty() => None,
        Reweight::SampleCount => Some(batches.global_size() as f64),
        Reweight::TokenCount => Some(1.0),
        Reweight::RankMean => None,
    };
    GroupSums {
        sums: groups,
        scale: factor.map(|f| f / input.loss_scale),
    }
}

/// The gradients' global norm before clipping, when it is wanted or clipping
/// needs it (already known under `--fp16`).
fn unclipped_norm(update: &Update, max_grad_norm: f64, wanted: bool) -> Result<Option<f64>> {
    match update.norm {
        Some(norm) => Ok(Some(norm)),
        None if wanted || max_grad_norm > 0.0 => Ok(Some(global_norm(&update.grads, None)?)),
        None => Ok(None),
    }
}

/// The gradients clipped to `max_grad_norm` (0: no clipping) given their `norm`.
fn clip(update: &mut Update, max_grad_norm: f64, norm: Option<f64>) -> Result<()> {
    if let (true, Some(norm)) = (max_grad_norm > 0.0, norm) {
        if norm > max_grad_norm {
            let grads = std::mem::take(&mut update.grads);
            update.grads = scale_grads(grads, max_grad_norm / (norm + 1e-6))?;
        }
    }
    Ok(())
}

/// A failure inside this rank's share of a step (its collate, its model) names
/// the rank and the step; an out-of-memory error stays as it is (every rank
/// recovers from it together), and so do the engine's own typed errors.
fn on_rank(error: Error, rank: usize, step: usize) -> Error {
    match error {
        Error::Candle(_) | Error::Message(_) | Error::User(_) if !is_out_of_memory(&error) => {
            Error::OnRank {
                rank,
                step,
                source: Box::new(error),
            }
        }
        other => other,
    }
}

/// With `token_count`, the summed gradients and loss divided by the global batch's
/// target tokens; returns examples per token then, for a probe that measures per
/// example what the step measures per token.
fn per_token_mean<B>(
    summed: &mut LocalGrads,
    reweight: Reweight,
    plan: &StepPlan<'_, B>,
) -> Result<Option<f64>> {
    if reweight != Reweight::TokenCount {
        return Ok(None);
    }
    if summed.tokens <= 0.0 {
        return Err(Error::Data(DataError::NoTokens { step: plan.step }));
    }
    summed.grads = scale_grads(std::mem::take(&mut summed.grads), 1.0 / summed.tokens)?;
    summed.loss /= summed.tokens;
    Ok(Some(plan.batches.global_size() as f64 / summed.tokens))
}

/// The step's summed gradients ready for the update, with their norm when it
/// was already taken.
struct Update {
    grads: Vec<Option<Tensor>>,
    loss: f64,
    norm: Option<f64>,
}

/// `--fp16`: gradients carry the loss scale; `None` when they overflowed. Every
/// rank sees the same all-reduced values, so all skip an overflowed step together.
fn unscale(summed: LocalGrads, loss_scale: f64) -> Result<Option<Update>> {
    let mut update = Update {
        grads: summed.grads,
        loss: summed.loss,
        norm: None,
    };
    if loss_scale == 1.0 {
        return Ok(Some(update));
    }
    let scaled_norm = global_norm(&update.grads, None)?;
    if !scaled_norm.is_finite() || !update.loss.is_finite() {
        return Ok(None);
    }
    let inverse = 1.0 / loss_scale;
    update.grads = scale_grads(update.grads, inverse)?;
    update.norm = Some(scaled_norm * inverse);
    Ok(Some(update))
}

/// The optimizer's step on the gradients at learning rate `lr`. The first update
/// is checked (`verify`): an optimizer built from other variables (or before the
/// model made its own) would otherwise train nothing, silently. One that says
/// what it holds was checked by that before the first step, so its update is
/// not: a first rate too small to change a weight in its precision (a long
/// warm-up's) would read as no update.
fn apply_update(
    optimizer: &mut impl TrainOptimizer,
    params: &[(String, Var)],
    grads: Vec<Option<Tensor>>,
    lr: f64,
    verify: &mut bool,
) -> Result<()> {
    let mut store = GradStore::default();
    for ((_, var), grad) in params.iter().zip(grads) {
        if let Some(grad) = grad {
            store.insert(var.as_tensor(), grad);
        }
    }
    let before = if *verify && lr > 0.0 {
        *verify = false;
        match optimizer.held_parameters() {
            Some(_) => None,
            None => Some(gradient_carrying_values(params, &store)?),
        }
    } else {
        None
    };
    optimizer.set_learning_rate(lr);
    optimizer.step(&store)?;
    if let Some(before) = before {
        check_updated(&before)?;
    }
    Ok(())
}

/// [`gather`], and on the step that checks coverage (the first), an error
/// unless every parameter got a gradient on some rank.
fn gather_checked<D: ?Sized, C>(
    comm: &impl Communicator,
    params: &[(String, Var)],
    local: Result<LocalGrads>,
    input: &mut StepInput<'_, D, C>,
    (probe_slots, groups): (usize, usize),
) -> Result<std::result::Result<LocalGrads, StepOom>> {
    let check = input.check_coverage;
    let layout = PayloadLayout {
        probes: probe_slots,
        coverage: if check { params.len() } else { 0 },
    };
    let local = local.map(|mut l| {
        l.covered = check.then(|| l.grads.iter().map(Option::is_some).collect());
        l
    });
    let mut summed = gather(comm, params, local, (layout, groups))?;
    if let Ok(Some(covered)) = summed.as_mut().map(|s| s.covered.take()) {
        input.check_coverage = false;
        check_coverage(params, &covered)?;
    }
    Ok(summed)
}

/// Every rank's gradients, loss, tokens and sums, summed (on one rank: its own);
/// `Err` when some rank ran out of memory.
fn gather(
    comm: &impl Communicator,
    params: &[(String, Var)],
    local: Result<LocalGrads>,
    layout: (PayloadLayout, usize),
) -> Result<std::result::Result<LocalGrads, StepOom>> {
    if comm.world_size() > 1 {
        return reduce(comm, params, local, layout);
    }
    match local {
        Ok(local) => Ok(Ok(local)),
        Err(e) if is_out_of_memory(&e) => Ok(Err(StepOom::here(e))),
        Err(e) => Err(e),
    }
}

/// All-reduces gradients (zeros where a rank has none), the `groups` groups'
/// gradients after them, and the step's scalars (loss, tokens, the failure /
/// OOM flags, ..., laid out by `layout`) in one collective.
fn reduce(
    comm: &impl Communicator,
    params: &[(String, Var)],
    mut local: Result<LocalGrads>,
    (layout, groups): (PayloadLayout, usize),
) -> Result<std::result::Result<LocalGrads, StepOom>> {
    // A part of another length than the layout's goes as a failed step: every rank
    // still reaches the all-reduce, and every rank stops.
    let mismatch = local
        .as_ref()
        .ok()
        .map(|l| layout.check(&l.probed, l.covered.as_deref()));
    if let Some(Err(e)) = mismatch {
        local = Err(e);
    }
    let (mut tensors, scalars) = outgoing(&mut local, params, groups)?;
    let mut flat = layout.write(&scalars);
    comm.all_reduce_sum(&mut tensors, &mut flat)?;
    let summed = layout.read(&flat);
    match local {
        Err(e) if !is_out_of_memory(&e) => Err(e),
        _ if summed.failed > 0.0 => Err(Error::Distributed(DistributedError::PeerFailed {
            rank: comm.rank(),
        })),
        Err(e) => Ok(Err(StepOom::here(e))),
        Ok(_) if summed.out_of_memory > 0.0 => Ok(Err(StepOom::Elsewhere {
            ranks: summed.out_of_memory as usize,
        })),
        Ok(_) => Ok(Ok(LocalGrads {
            groups: tensors
                .split_off(params.len())
                .chunks(params.len().max(1))
                .map(|g| g.iter().cloned().map(Some).collect())
                .collect(),
            grads: tensors.into_iter().map(Some).collect(),
            loss: summed.loss,
            tokens: summed.tokens,
            probed: summed.probed,
            covered: (layout.coverage > 0)
                .then(|| summed.covered.iter().map(|&c| c > 0.0).collect()),
            interrupt: summed.interrupt,
        })),
    }
}

/// What this rank puts into the step's all-reduce: its gradients (zeros where it
/// has none, all zeros after a failure) and its scalars (only the flags after a
/// failure). The probes' values move out of `local`: the summed ones replace
/// them.
fn outgoing(
    local: &mut Result<LocalGrads>,
    params: &[(String, Var)],
    groups: usize,
) -> Result<(Vec<Tensor>, StepScalars)> {
    let zeros = |var: &Var| var.as_tensor().zeros_like();
    let l = match local {
        Ok(l) => l,
        Err(e) => {
            let oom = is_out_of_memory(e);
            let tensors = (0..=groups).flat_map(|_| params.iter().map(|(_, v)| zeros(v)));
            let scalars = StepScalars {
                failed: f64::from(u8::from(!oom)),
                out_of_memory: f64::from(u8::from(oom)),
                ..StepScalars::default()
            };
            return Ok((tensors.collect::<candle_core::Result<Vec<_>>>()?, scalars));
        }
    };
    // One zero tensor per parameter, shared by every slot without a gradient
    // (on a measuring step, each half this rank holds none of).
    let mut zero: Vec<Option<Tensor>> = vec![None; params.len()];
    let mut tensors = Vec::with_capacity((1 + l.groups.len()) * params.len());
    for grads in std::iter::once(&l.grads).chain(&l.groups) {
        for (i, (g, (_, var))) in grads.iter().zip(params).enumerate() {
            tensors.push(match (g, &zero[i]) {
                (Some(g), _) => g.clone(),
                (None, Some(z)) => z.clone(),
                (None, None) => zero[i].insert(zeros(var)?).clone(),
            });
        }
    }
    let scalars = StepScalars {
        loss: l.loss,
        tokens: l.tokens,
        interrupt: l.interrupt,
        probed: std::mem::take(&mut l.probed),
        covered: l
            .covered
            .iter()
            .flatten()
            .map(|&got| f64::from(u8::from(got)))
            .collect(),
        ..StepScalars::default()
    };
    Ok((tensors, scalars))
}

/// Copies of the parameters whose gradient is not zero, with their variables.
fn gradient_carrying_values(
    params: &[(String, Var)],
    store: &GradStore,
) -> Result<Vec<(String, Var, Tensor)>> {
    let mut values = Vec::new();
    for (name, var) in params {
        if let Some(grad) = store.get(var.as_tensor()) {
            let largest = grad
                .abs()?
                .max_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
            if largest > 0.0 {
                values.push((name.clone(), var.clone(), var.as_tensor().copy()?));
            }
        }
    }
    Ok(values)
}

/// An error naming the parameters no rank computed a gradient for.
fn check_coverage(params: &[(String, Var)], covered: &[bool]) -> Result<()> {
    let names: Vec<String> = params
        .iter()
        .zip(covered)
        .filter(|(_, &got)| !got)
        .map(|((name, _), _)| name.clone())
        .collect();
    if names.is_empty() {
        Ok(())
    } else {
        Err(Error::Model(ModelError::ParametersWithoutGradient {
            names,
        }))
    }
}

/// An error when the update left parameters with a gradient unchanged.
fn check_updated(before: &[(String, Var, Tensor)]) -> Result<()> {
    let mut stale = Vec::new();
    for (name, var, old) in before {
        let moved = (var.as_tensor() - old)?
            .abs()?
            .max_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        if moved == 0.0 {
            stale.push(name.clone());
        }
    }
    match stale.len() {
        0 => Ok(()),
        n if n == before.len() => Err(Error::Model(ModelError::OptimizerUpdatesNothing {
            parameters: stale.len(),
        })),
        _ => Err(Error::Model(ModelError::ParametersNotUpdated {
            names: stale,
        })),
    }
}
