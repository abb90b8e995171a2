//! OOM recovery as a controller: after a step some rank could not fit, the policy
//! (`fail`, `halve`, `split_retry`, `skip`) decides what the next step retries.
//! It acts first: a step that ran out of memory is not adapted to by the others.

use crate::adapt::schedule::ScheduleSpec;
use crate::config::policy::OomPolicy;
use crate::data::planner::{StepBatches, StepPlanner};
use crate::error::{Error, Result, TrainingError};
use crate::report::record::StepLog;
use crate::train::step::{StepOom, StepOutcome};

use super::controller::{Controller, Restore, Save, Steer, StepReport};
use super::states;

/// What the loop does after a step ran out of memory on some rank: the recovery
/// state of the step being retried.
#[derive(Debug)]
pub(crate) struct OomControl {
    policy: OomPolicy,
    /// Pieces each rank slice is split into after `split_retry` OOMs of this step.
    chunks: usize,
    /// OOM events handled over the run, and since the last logged step.
    events: usize,
    events_since_log: usize,
    /// At the floor (size 1, or one example per chunk) an OOM may still be
    /// transient (fragmentation): one plain retry, then give up.
    retried_at_floor: bool,
    /// Whether the collate's examples read their batch-mates
    /// (`Collate::examples_independent` false): a smaller batch then changes
    /// their losses, which the recovery's log line says.
    examples_read_each_other: bool,
}

impl OomControl {
    pub(crate) fn new(policy: OomPolicy) -> Self {
        Self {
            policy,
            chunks: 1,
            events: 0,
            events_since_log: 0,
            retried_at_floor: false,
            examples_read_each_other: false,
        }
    }

    /// Tells it whether the collate's examples read their batch-mates.
    pub(crate) fn with_examples_independent(self, independent: bool) -> Self {
        Self {
            examples_read_each_other: !independent,
            ..self
        }
    }

    /// Pieces each rank's slice of the step is split into.
    pub(crate) fn chunks(&self) -> usize {
        self.chunks
    }

    /// OOM events handled over the run.
    pub(crate) fn events(&self) -> usize {
        self.events
    }

    /// The step trained: the next one starts unsplit.
    fn step_trained(&mut self) {
        self.chunks = 1;
        self.retried_at_floor = false;
    }

    /// Applies the policy to the step that ran out of memory (the same on every
    /// rank); returns what it did, for the log, or the error that ends the run.
    fn recover(
        &mut self,
        planner: &mut StepPlanner<ScheduleSpec>,
        batches: &StepBatches,
        step: usize,
        oom: &StepOom,
    ) -> Result<String> {
        let out_of_memory = |also: &str| {
            let whose = match oom {
                StepOom::Here(_) => "on this rank".to_string(),
                StepOom::Elsewhere { .. } => oom.to_string(),
            };
            Error::Training(TrainingError::OutOfMemory {
                step,
                detail: format!("{whose}{also}"),
                source: oom.cause(),
            })
        };
        match self.policy {
            OomPolicy::Fail => Err(out_of_memory("")),
            OomPolicy::Halve | OomPolicy::SplitRetry => {
                let before = planner.per_device();
                planner.rewind(batches);
                let shrunk = match self.policy {
                    OomPolicy::Halve => planner.halve(),
                    _ if self.chunks < batches.max_local() => {
                        self.chunks = (self.chunks * 2).min(batches.max_local());
                        true
                    }
                    _ => false,
                };
                if !shrunk {
                    if self.retried_at_floor {
                        return Err(out_of_memory("; still out of memory at the smallest size"));
                    }
                    self.retried_at_floor = true;
                }
                let recovery = match self.policy {
                    OomPolicy::Halve => format!(
                        "halve: per-device size {before} -> {}, retrying the same {} examples",
                        planner.per_device(),
                        batches.global_size()
                    ),
                    _ => format!(
                        "split_retry: replaying the same {} examples in {} chunk(s) per rank",
                        batches.global_size(),
                        self.chunks
                    ),
                };
                Ok(match self.examples_read_each_other {
                    true => format!(
                        "{recovery}; the collate's examples read their batch-mates \
                         (cross-document attention), so examples now in separate \
                         batches no longer see each other and their losses change"
                    ),
                    false => recovery,
                })
            }
            OomPolicy::Skip => {
                planner.skip_step();
                Ok(format!(
                    "skip: dropped {} examples {:?}",
                    batches.global_size(),
                    batches.indices()
                ))
            }
        }
    }
}

impl Controller for OomControl {
    fn adapt(&mut self, report: &StepReport<'_>, steer: &mut Steer<'_>) -> Result<()> {
        let StepOutcome::OutOfMemory { oom } = report.outcome else {
            self.step_trained();
            return Ok(());
        };
        let (step, batches) = (report.step, report.batches);
        self.events += 1;
        self.events_since_log += 1;
        let detail = oom.to_string();
        let action = self.recover(steer.planner, batches, step, oom)?;
        if let Some(logger) = steer.logger {
            logger.event(&format!("step {step}: out of memory ({detail}); {action}"));
            if self.policy == OomPolicy::Skip {
                logger.advance(batches.global_size(), steer.planner.sampler().epoch());
            }
        }
        Ok(())
    }

    fn record(&mut self, entry: &mut StepLog) {
        entry.oom_events = std::mem::take(&mut self.events_since_log);
    }

    fn save(&mut self, at: &mut Save<'_>) -> Result<()> {
        at.into.put(states::OOM, 1, &self.events)
    }

    fn restore(&mut self, at: &mut Restore<'_>) -> Result<()> {
        self.events = at.from.get(states::OOM, 1)?.unwrap_or(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapt::schedule::{BatchLimits, Growth};
    use crate::data::planner::RunLength;
    use crate::data::sampler::GlobalBatchSampler;

    fn planner() -> StepPlanner<ScheduleSpec> {
        let sampler = GlobalBatchSampler::new(16, 2, 0, true, false).unwrap();
        let schedule = ScheduleSpec::Interval {
            every: 2,
            growth: Growth::Add(1),
        };
        let limits = BatchLimits::new(1, None).unwrap();
        StepPlanner::new(sampler, schedule, limits, 4, RunLength::Epochs(1), 2, false).unwrap()
    }

    /// Each recovery says what it replays; where the collate's examples read
    /// their batch-mates it also says that their losses change.
    #[test]
    fn a_recovery_says_when_smaller_batches_change_the_examples_losses() {
        for policy in [OomPolicy::Halve, OomPolicy::SplitRetry] {
            for independent in [true, false] {
                let mut planner = planner();
                let batches = planner.next_step().unwrap();
                let oom = StepOom::Elsewhere { ranks: 1 };
                let mut control = OomControl::new(policy).with_examples_independent(independent);
                let line = control.recover(&mut planner, &batches, 1, &oom).unwrap();
                assert!(
                    line.contains("retrying") || line.contains("replaying"),
                    "{line}"
                );
                assert_eq!(
                    line.contains("their losses change"),
                    !independent,
                    "{policy:?}: {line}"
                );
            }
        }
    }
}
