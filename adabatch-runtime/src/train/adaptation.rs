//! What the rank loop adapts while it runs, and a checkpoint keeps: the online
//! memory model (length-aware epochs are planned from it), the gradient noise
//! scale, the engine's own mixer and f16's loss scale. Each is updated the same way
//! on every rank.

use candle_core::Device;

use crate::adapt::mixer::Mixer;
use crate::adapt::noise_scale::NoiseScaleEstimator;
use crate::adapt::schedule::{Schedule, ScheduleSpec};
use crate::data::length::{LengthAwareEpoch, LengthBatching, LengthIndex};
use crate::data::planner::{StepBatches, StepPlanner};
use crate::dist::communicator::Communicator;
use crate::error::{Error, Result};
use crate::memory::model::{
    cpu_memory_proxy, BatchFeatures, MemoryModel, MostConservative, OnlineMemoryModel,
    OnlineMemoryState,
};
use crate::optim::precision::LossScaler;
use crate::report::logging::Logger;
use crate::train::checkpoint::{CheckpointState, RunExtras};
use crate::train::settings::RunSettings;
use crate::user::data::Dataset;
use crate::user::trainer::AdaptiveTrainer;

/// The loop's adaptive state besides the planner.
pub(crate) struct Adaptation {
    /// This rank's fit; memory-aware runs plan epochs from every rank's, and
    /// checkpoints keep every rank's.
    pub(crate) online: OnlineMemoryModel,
    /// `schedule = memory(..)`: steps measure their memory.
    pub(crate) memory_mode: bool,
    pub(crate) noise_scale: Option<NoiseScaleEstimator>,
    /// `mix = online(..)` / `custom(..)`, when the trainer has no `#[mixer]`.
    builtin_mixer: Option<Box<dyn Mixer>>,
    pub(crate) loss_scaler: Option<LossScaler>,
}

impl Adaptation {
    /// Fresh from the settings, or continued from a checkpoint.
    pub(crate) fn new(
        settings: &RunSettings,
        resumed: Option<&CheckpointState>,
        rank: usize,
    ) -> Result<Self> {
        let online = match resumed {
            Some(state) => match (&state.memory_models, &state.memory_model, state.memory_fit) {
                (Some(models), _, _) if !models.is_empty() => {
                    OnlineMemoryModel::from_state(&models[rank % models.len()])
                }
                (_, Some(model), _) => OnlineMemoryModel::from_state(model),
                (_, _, Some(fit)) => OnlineMemoryModel::from_snapshot(fit),
                _ => OnlineMemoryModel::new(settings.memory_margin),
            },
            None => OnlineMemoryModel::new(settings.memory_margin),
        };
        let noise_scale = match (settings.noise_scale_beta, resumed) {
            (None, _) => None,
            (Some(_), Some(state)) if state.noise_scale.is_some() => state.noise_scale,
            (Some(beta), _) => Some(NoiseScaleEstimator::new(beta)?),
        };
        let loss_scaler = match (settings.loss_scaler, resumed) {
            (Some(_), Some(state)) if state.loss_scaler.is_some() => state.loss_scaler,
            (scaler, _) => scaler,
        };
        Ok(Self {
            online,
            memory_mode: matches!(settings.batching, Some((LengthBatching::Memory { .. }, _))),
            noise_scale,
            builtin_mixer: settings.builtin_mixer.map(|m| m.build()),
            loss_scaler,
        })
    }

    /// The mixer in force: the trainer's `#[mixer]`, else the engine's.
    pub(crate) fn mixer<'a, T: AdaptiveTrainer>(
        &'a mut self,
        trainer: &'a mut T,
    ) -> Option<&'a mut dyn Mixer> {
        match trainer.mixer() {
            Some(mixer) => Some(mixer),
            None => match &mut self.builtin_mixer {
                Some(mixer) => Some(&mut **mixer),
                None => None,
            },
        }
    }

    /// The loss scale of the next step (1 unless `--fp16`).
    pub(crate) fn loss_scale(&self) -> f64 {
        self.loss_scaler.map_or(1.0, |s| s.scale)
    }

    /// After a step that ran: the loss scale learns whether it overflowed (and
    /// the log says so), the noise-scale estimate resizes the next global batch.
    /// Returns whether the update was skipped.
    pub(crate) fn after_step<S: Schedule>(
        &mut self,
        planner: &mut StepPlanner<S>,
        schedule: ScheduleSpec,
        (step, overflowed): (usize, bool),
        noise: Option<(f64, f64)>,
        logger: Option<&Logger>,
    ) -> Result<bool> {
        if let Some(scaler) = self.loss_scaler.as_mut() {
            let scale = scaler.scale;
            scaler.update(!overflowed, step)?;
            if let (true, Some(logger)) = (overflowed, logger) {
                logger.event(&format!(
                    "step {step}: the f16 gradients overflowed at loss scale {scale}; update skipped, scale now {}",
                    scaler.scale
                ));
            }
        }
        if let (Some(estimator), Some((norm, trace))) = (self.noise_scale.as_mut(), noise) {
            let estimate = estimator.observe(norm, trace);
            if let (ScheduleSpec::NoiseScale { fraction, min, max }, Some(b)) = (schedule, estimate)
            {
                let mut next = noise_scale_batch(fraction, min, max, b);
                // Until the averages span their horizon the estimate rests on a few
                // noisy measurements: the batch at most doubles per step then.
                if !estimator.warmed_up() {
                    next = next.min(2 * planner.global_batch());
                }
                planner.set_global_batch(next);
            }
        }
        Ok(overflowed && self.loss_scaler.is_some())
    }

    /// Memory-aware runs: the peak memory of this rank's (first) chunk of the step,
    /// observed by the online model and a user `#[regressor]`. A rank without
    /// examples this step has nothing to measure.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn observe_memory<T: AdaptiveTrainer, D: Dataset + ?Sized>(
        &mut self,
        trainer: &mut T,
        dataset: &D,
        device: &Device,
        batches: &StepBatches,
        (rank, chunks): (usize, usize),
        device_peak: Option<u64>,
    ) -> Option<u64> {
        if !self.memory_mode {
            return None;
        }
        let local = batches.per_rank_indices().swap_remove(rank);
        if local.is_empty() {
            return None;
        }
        let chunk = &local[..local.len().div_ceil(chunks)];
        let features = BatchFeatures::of_lengths(chunk.iter().map(|&i| dataset.example_len(i)));
        let bytes = measure_memory(device, &features, device_peak)?;
        self.online.observe(&features, bytes);
        if let Some(user) = trainer.regressor() {
            user.observe(&features, bytes);
        }
        Some(bytes)
    }

    /// What a checkpoint keeps besides the planner, weights and optimizer. Every
    /// rank calls it at the same step: memory-aware runs gather every rank's
    /// online model.
    pub(crate) fn extras<T: AdaptiveTrainer>(
        &mut self,
        trainer: &mut T,
        comm: &impl Communicator,
        oom_events: usize,
    ) -> Result<RunExtras> {
        let memory_models = match self.memory_mode {
            true => Some(gather_memory_models(comm, &self.online)?),
            false => None,
        };
        Ok(RunExtras {
            oom_events,
            memory_fit: self.memory_mode.then(|| self.online.snapshot()),
            memory_models,
            noise_scale: self.noise_scale,
            loss_scaler: self.loss_scaler,
            mixer: self.mixer(trainer).map(|m| m.state()),
            best: None,
        })
    }
}

/// Every rank's online memory model, by rank, on every rank: two all-reduces of
/// sums in which each rank fills only its own slots (its count of numbers, then
/// its numbers), so the sums are the numbers exactly.
fn gather_memory_models(
    comm: &impl Communicator,
    online: &OnlineMemoryModel,
) -> Result<Vec<OnlineMemoryState>> {
    let (world, rank) = (comm.world_size(), comm.rank());
    if world == 1 {
        return Ok(vec![online.state()]);
    }
    let own = online.state().to_numbers();
    let mut lengths = vec![0.0; world];
    lengths[rank] = own.len() as f64;
    comm.all_reduce_sum(&mut [], &mut lengths)?;
    let offsets: Vec<usize> = lengths
        .iter()
        .scan(0, |at, &len| {
            let start = *at;
            *at += len as usize;
            Some(start)
        })
        .collect();
    let total = offsets[world - 1] + lengths[world - 1] as usize;
    let mut numbers = vec![0.0; total];
    numbers[offsets[rank]..offsets[rank] + own.len()].copy_from_slice(&own);
    comm.all_reduce_sum(&mut [], &mut numbers)?;
    (0..world)
        .map(|r| {
            let segment = &numbers[offsets[r]..offsets[r] + lengths[r] as usize];
            OnlineMemoryState::from_numbers(segment).ok_or_else(|| {
                Error::Comm(format!(
                    "rank {r}'s online memory model did not arrive whole"
                ))
            })
        })
        .collect()
}

/// The next global batch of `schedule = noise_scale(..)`: `fraction` of the
/// estimate B_simple, rounded, clamped to `[min, max]`.
pub(crate) fn noise_scale_batch(fraction: f64, min: usize, max: usize, estimate: f64) -> usize {
    let wanted = (fraction * estimate).round();
    if wanted.is_nan() || wanted < min as f64 {
        min
    } else if wanted > max as f64 {
        max
    } else {
        wanted as usize
    }
}

/// The plan of a length-aware epoch. Every rank must plan the same batches: a
/// user `#[regressor]` is checked for agreement, and the built-in online models
/// (each fitted to its own rank's measurements) are combined by taking the most
/// conservative prediction.
pub(crate) fn length_aware_epoch<T: AdaptiveTrainer>(
    settings: &RunSettings,
    index: Option<&LengthIndex>,
    trainer: &mut T,
    online: &OnlineMemoryModel,
    comm: &impl Communicator,
    epoch: usize,
) -> Result<Option<LengthAwareEpoch>> {
    let (Some((batching, options)), Some(index)) = (settings.batching, index) else {
        return Ok(None);
    };
    let world = comm.world_size();
    if let Some(user) = trainer.regressor() {
        let epoch_plan = index.plan_epoch(batching, &options, &*user, settings.seed, epoch);
        if world > 1 {
            let fingerprint = epoch_plan
                .sizes
                .iter()
                .enumerate()
                .fold(0u64, |h, (k, &s)| {
                    h.wrapping_mul(1_000_003)
                        .wrapping_add((k as u64 + 1) * s as u64)
                        % (1 << 40)
                }) as f64;
            let mut sums = [fingerprint, epoch_plan.sizes.len() as f64];
            comm.all_reduce_sum(&mut [], &mut sums)?;
            if sums
                != [
                    fingerprint * world as f64,
                    epoch_plan.sizes.len() as f64 * world as f64,
                ]
            {
                return Err(Error::RegressorDisagrees { epoch });
            }
        }
        return Ok(Some(epoch_plan));
    }
    if world == 1 || !matches!(batching, LengthBatching::Memory { .. }) {
        return Ok(Some(index.plan_epoch(
            batching,
            &options,
            online,
            settings.seed,
            epoch,
        )));
    }
    let mut all = vec![0.0; 5 * world];
    all[5 * comm.rank()..5 * comm.rank() + 5].copy_from_slice(&online.snapshot());
    comm.all_reduce_sum(&mut [], &mut all)?;
    let models = all
        .chunks(5)
        .map(|s| OnlineMemoryModel::from_snapshot([s[0], s[1], s[2], s[3], s[4]]))
        .collect();
    Ok(Some(index.plan_epoch(
        batching,
        &options,
        &MostConservative(models),
        settings.seed,
        epoch,
    )))
}

/// Peak memory of a step: on CPU the documented proxy of its features, on a GPU
/// the high-water mark of the device's memory pool during the step.
fn measure_memory(
    device: &Device,
    features: &BatchFeatures,
    device_peak: Option<u64>,
) -> Option<u64> {
    if device.is_cpu() {
        Some(cpu_memory_proxy(features))
    } else {
        device_peak
    }
}
