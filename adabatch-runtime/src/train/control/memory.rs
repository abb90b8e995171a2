//! The memory model as a controller: memory-aware runs measure each step's peak,
//! the online model (and a user `#[regressor]`) learn from it, and each
//! length-aware epoch is planned from what they predict.

use candle_core::Device;

use crate::data::length::{LengthAwareEpoch, LengthBatching, LengthIndex, LengthOptions};
use crate::data::planner::StepBatches;
use crate::dist::communicator::Communicator;
use crate::error::{DistributedError, Error, Result, TrainingError};
use crate::memory::memory_model::{
    cpu_memory_proxy, BatchFeatures, MemoryModel, MostConservative, OnlineMemoryModel,
    OnlineMemoryState,
};
use crate::report::record::StepLog;

use crate::user::data::Dataset;

use super::controller::{Controller, Restore, Save, Steer, StepReport, UserControllers};
use super::states::{self, MemoryEntry};

/// This rank's online memory model, whether the run is memory-aware, and the
/// last step's measured peak.
pub(crate) struct MemoryControl {
    /// This rank's fit; memory-aware runs plan epochs from every rank's, and
    /// checkpoints keep every rank's.
    online: OnlineMemoryModel,
    /// `schedule = memory(..)`: steps measure their memory.
    memory_mode: bool,
    batching: Option<(LengthBatching, LengthOptions)>,
    seed: u64,
    measured: Option<u64>,
}

/// What a length-aware epoch's plan derives from.
pub(crate) struct EpochPlan<'a> {
    batching: (LengthBatching, LengthOptions),
    index: &'a LengthIndex,
    seed: u64,
    epoch: usize,
}

impl MemoryControl {
    /// `margin`: the online model's safety margin; `batching`: a length-aware
    /// run's batching, whose epochs it plans from `seed`.
    pub(crate) fn new(
        margin: f64,
        batching: Option<(LengthBatching, LengthOptions)>,
        seed: u64,
    ) -> Self {
        Self {
            online: OnlineMemoryModel::new(margin),
            memory_mode: matches!(batching, Some((LengthBatching::Memory { .. }, _))),
            batching,
            seed,
            measured: None,
        }
    }

    /// Whether steps measure their memory.
    pub(crate) fn memory_mode(&self) -> bool {
        self.memory_mode
    }

    /// The plan of a length-aware epoch (see [`length_aware_epoch`]).
    pub(crate) fn plan_epoch(
        &self,
        index: Option<&LengthIndex>,
        trainer: &mut dyn UserControllers,
        comm: &dyn Communicator,
        epoch: usize,
    ) -> Result<Option<LengthAwareEpoch>> {
        let (Some(batching), Some(index)) = (self.batching, index) else {
            return Ok(None);
        };
        let plan = EpochPlan {
            batching,
            index,
            seed: self.seed,
            epoch,
        };
        length_aware_epoch(&plan, trainer, &self.online, comm).map(Some)
    }

    /// Memory-aware runs: the features and peak memory of this rank's (first)
    /// chunk of a step that ran. A rank without examples has nothing to measure.
    pub(crate) fn measure<D: Dataset + ?Sized>(
        &self,
        dataset: &D,
        device: &Device,
        batches: &StepBatches,
        (rank, chunks): (usize, usize),
        device_peak: Option<u64>,
    ) -> Option<(BatchFeatures, u64)> {
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
        Some((features, bytes))
    }
}

impl Controller for MemoryControl {
    fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()> {
        self.measured = None;
        if let Some((features, bytes)) = &report.memory {
            self.online.observe(features, *bytes);
            if let Some(user) = steer.trainer.regressor() {
                user.observe(features, *bytes);
            }
            self.measured = Some(*bytes);
        }
        Ok(())
    }

    fn record(&mut self, entry: &mut StepLog) {
        entry.measured_memory = self.measured;
    }

    /// Memory-aware runs gather every rank's online model.
    fn save(&mut self, at: &mut Save<'_>) -> Result<()> {
        if self.memory_mode {
            let entry = MemoryEntry {
                fit: Some(self.online.snapshot()),
                model: None,
                models: Some(gather_memory_models(at.comm, &self.online)?),
            };
            at.into.put(states::MEMORY, 1, &entry)?;
        }
        Ok(())
    }

    /// Rank `r` continues rank `r % world_size`'s model (older checkpoints: rank
    /// 0's whole model, or only its fit).
    fn restore(&mut self, at: &mut Restore<'_>) -> Result<()> {
        let Some(entry) = at.from.get::<MemoryEntry>(states::MEMORY, 1)? else {
            return Ok(());
        };
        match (&entry.models, &entry.model, entry.fit) {
            (Some(models), _, _) if !models.is_empty() => {
                self.online = OnlineMemoryModel::from_state(&models[at.rank % models.len()]);
            }
            (_, Some(model), _) => self.online = OnlineMemoryModel::from_state(model),
            (_, _, Some(fit)) => self.online = OnlineMemoryModel::from_snapshot(fit),
            _ => {}
        }
        Ok(())
    }
}

/// Every rank's online memory model, by rank, on every rank: two all-reduces of
/// sums in which each rank fills only its own slots (its count of numbers, then
/// its numbers), so the sums are the numbers exactly.
fn gather_memory_models(
    comm: &dyn Communicator,
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
                Error::Distributed(DistributedError::CollectiveInput {
                    detail: format!("rank {r}'s online memory model did not arrive whole"),
                })
            })
        })
        .collect()
}

/// The plan of a length-aware epoch. Every rank must plan the same batches: a
/// user `#[regressor]` is checked for agreement, and the built-in online models
/// (each fitted to its own rank's measurements) are combined by taking the most
/// conservative prediction.
pub(crate) fn length_aware_epoch(
    plan: &EpochPlan<'_>,
    trainer: &mut dyn UserControllers,
    online: &OnlineMemoryModel,
    comm: &dyn Communicator,
) -> Result<LengthAwareEpoch> {
    let ((batching, options), index, seed, epoch) =
        (plan.batching, plan.index, plan.seed, plan.epoch);
    let world = comm.world_size();
    if let Some(user) = trainer.regressor() {
        let epoch_plan = index.plan_epoch(batching, &options, &*user, seed, epoch);
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
                return Err(Error::Training(TrainingError::RegressorDisagrees { epoch }));
            }
        }
        return Ok(epoch_plan);
    }
    if world == 1 || !matches!(batching, LengthBatching::Memory { .. }) {
        return Ok(index.plan_epoch(batching, &options, online, seed, epoch));
    }
    let mut all = vec![0.0; 5 * world];
    all[5 * comm.rank()..5 * comm.rank() + 5].copy_from_slice(&online.snapshot());
    comm.all_reduce_sum(&mut [], &mut all)?;
    let models = all
        .chunks(5)
        .map(|s| OnlineMemoryModel::from_snapshot([s[0], s[1], s[2], s[3], s[4]]))
        .collect();
    Ok(index.plan_epoch(batching, &options, &MostConservative(models), seed, epoch))
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
