//! Step planning: the sampler driven by the schedule, epoch by epoch.
//!
//! This is the whole batch-size logic of the engine without the model, so property
//! tests can run it over many configurations.

use crate::error::{Error, Result};
use crate::sampler::{GlobalBatchSampler, StepPlan};
use crate::schedule::{BatchLimits, Schedule};

/// How long a run lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLength {
    /// This many passes over the data.
    Epochs(usize),
    /// This many optimisation steps.
    Steps(usize),
}

/// Yields each step's global batch, applying the schedule after every step.
#[derive(Debug, Clone)]
pub struct StepPlanner<S> {
    sampler: GlobalBatchSampler,
    schedule: S,
    limits: BatchLimits,
    per_device: usize,
    step: usize,
    length: RunLength,
    world_size: usize,
    drop_last: bool,
}

impl<S: Schedule> StepPlanner<S> {
    /// A planner at step 0; `initial_per_device` is the (already clamped) first size.
    pub fn new(
        sampler: GlobalBatchSampler,
        schedule: S,
        limits: BatchLimits,
        initial_per_device: usize,
        length: RunLength,
        world_size: usize,
        drop_last: bool,
    ) -> Result<Self> {
        check_fits(
            drop_last,
            initial_per_device,
            world_size,
            sampler.num_examples(),
            None,
        )?;
        Ok(Self {
            sampler,
            schedule,
            limits,
            per_device: initial_per_device,
            step: 0,
            length,
            world_size,
            drop_last,
        })
    }

    /// The next step's plan, or `None` when the run is over.
    pub fn next_step(&mut self) -> Option<StepPlan> {
        loop {
            match self.length {
                RunLength::Steps(max) if self.step >= max => return None,
                RunLength::Epochs(epochs) if self.sampler.epoch_index() >= epochs => return None,
                _ => {}
            }
            if let Some(plan) = self.sampler.next_step(self.per_device) {
                self.step += 1;
                return Some(plan);
            }
            self.sampler.start_next_epoch();
        }
    }

    /// Asks the schedule for the next size after the step just taken.
    pub fn finish_step(&mut self) -> Result<()> {
        let raw = self.schedule.next(self.step, self.per_device);
        self.per_device = self.limits.apply(self.step, raw)?;
        check_fits(
            self.drop_last,
            self.per_device,
            self.world_size,
            self.sampler.num_examples(),
            Some(self.step),
        )
    }

    /// Steps taken so far.
    pub fn step(&self) -> usize {
        self.step
    }
    /// Per-device size of the next step.
    pub fn per_device(&self) -> usize {
        self.per_device
    }
    /// Coverage and epoch accounting.
    pub fn sampler(&self) -> &GlobalBatchSampler {
        &self.sampler
    }
    /// Whether the step just taken is the run's last by step count.
    pub fn is_last_step(&self) -> bool {
        self.length == RunLength::Steps(self.step)
    }
}

/// With `drop_last`, a global batch larger than the dataset could never be used.
pub fn check_fits(
    drop_last: bool,
    per_device: usize,
    world_size: usize,
    examples: usize,
    after_step: Option<usize>,
) -> Result<()> {
    let global_batch = per_device.saturating_mul(world_size);
    if drop_last && global_batch > examples {
        return Err(Error::GlobalBatchTooLarge {
            global_batch,
            per_device,
            world_size,
            examples,
            after_step,
        });
    }
    Ok(())
}
