//! What the noise-scale controller measures inside a step: the previous step's
//! time (every step), and on a measuring step each small batch's size and the
//! squared norm of its mean gradient (one small batch per micro-batch and rank:
//! `Σ_k`'s terms of [`crate::adapt::noise_scale`]).

use crate::adapt::noise_scale::{NoiseScaleEstimator, SmallBatchSums};
use crate::data::planner::StepBatches;
use crate::error::Result;
use crate::train::grads::global_norm;
use crate::train::probe::{MicroGradient, Needs, Reading, StepProbe, SummedStep};

/// The probe of one step. Its slots: the previous step's seconds, then (when it
/// measures) one size per (micro-batch, rank), then as many squared norms.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NoiseProbe {
    /// Whether this step measures the noise scale.
    pub(crate) measures: bool,
    /// On gradients preconditioned by the optimizer (`lr_scaling = adamscale`).
    pub(crate) precondition: bool,
    /// Seconds this rank took for the previous trained step (0: none).
    pub(crate) previous_seconds: f64,
}

/// What the probe read of a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct NoiseReading {
    /// This step's (|G|², tr Σ) estimate, when it measured and had two small
    /// batches or more.
    pub(crate) measurement: Option<(f64, f64)>,
    /// The previous trained step's seconds, the mean over ranks (`None` when no
    /// rank measured one: the first step, after a resume or an OOM).
    pub(crate) previous_step_seconds: Option<f64>,
}

/// One (micro-batch, rank) pair per small batch.
fn small_batches(batches: &StepBatches) -> usize {
    batches.micro.len() * batches.local_sizes().len()
}

impl StepProbe for NoiseProbe {
    fn slots(&self, batches: &StepBatches) -> usize {
        1 + if self.measures {
            2 * small_batches(batches)
        } else {
            0
        }
    }

    fn needs(&self, batches: &StepBatches) -> Needs {
        Needs {
            micro_gradients: self.measures,
            // Only a step with two small batches or more reads the norms.
            preconditioner: self.measures && self.precondition && small_batches(batches) >= 2,
            summed_norm: self.measures,
            ..Needs::default()
        }
    }

    fn local(&self, out: &mut [f64]) {
        out[0] = self.previous_seconds;
    }

    fn micro(&self, micro: &MicroGradient<'_>, out: &mut [f64]) -> Result<()> {
        let half = (out.len() - 1) / 2;
        let (sizes, squared_norms) = out[1..].split_at_mut(half);
        let norm =
            global_norm(micro.grads, micro.preconditioner)? * micro.to_mean / micro.loss_scale;
        let slot = micro.micro * micro.world + micro.rank;
        sizes[slot] = micro.size;
        squared_norms[slot] = norm * norm;
        Ok(())
    }

    fn read(&self, summed: &[f64], step: &SummedStep<'_>) -> Result<Box<dyn Reading>> {
        // 0: nobody measured (a NaN or a negative is passed on: goodput refuses it).
        let previous_step_seconds = Some(summed[0] / step.world as f64).filter(|&s| s != 0.0);
        let big_norm = match (step.grads, step.preconditioner) {
            (Some(grads), Some(p)) => Some(global_norm(grads, Some(p))?),
            (Some(_), None) => step.norm,
            (None, _) => None,
        };
        let measurement = big_norm
            .filter(|_| self.measures)
            .and_then(|norm| estimates(&summed[1..], norm, step.examples_per_token));
        Ok(Box::new(NoiseReading {
            measurement,
            previous_step_seconds,
        }))
    }
}

/// A step's (|G|², tr Σ) estimate from its small batches (sizes, then squared
/// norms), when it has two: the big batch is all of them (its size the sum of
/// theirs), `norm` its mean gradient's norm; tr Σ per example with
/// `examples_per_token`.
fn estimates(small: &[f64], norm: f64, examples_per_token: Option<f64>) -> Option<(f64, f64)> {
    let (sizes, squared_norms) = small.split_at(small.len() / 2);
    // Sizes are whole numbers of examples or tokens.
    let sizes: Vec<usize> = sizes.iter().map(|&b| b.round() as usize).collect();
    let big: usize = sizes.iter().sum();
    let mut sums = SmallBatchSums::default();
    for (&b, &squared_norm) in sizes.iter().zip(squared_norms) {
        sums.add(b, big, squared_norm);
    }
    let (g2, trace) = NoiseScaleEstimator::step_estimates(&sizes, big, sums, norm * norm).ok()?;
    Some((g2, trace * examples_per_token.unwrap_or(1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::sampler::GlobalBatch;
    use crate::train::probe::ProbeLayout;
    use candle_core::{Device, Tensor};

    /// Two ranks' halves of one micro-batch of 4: their mean gradients (1, 0)
    /// and (0, 1), the big batch's (0.5, 0.5). Sums by hand: S_k = 1, S_B = 0.5,
    /// |G|² = (4·0.5 − 2·1)/2 = 0 per small batch, tr Σ = (1 − 0.5)/(1/2 − 1/4) = 2.
    #[test]
    fn the_slots_of_two_ranks_give_the_papers_estimates() {
        let batches = StepBatches {
            micro: vec![GlobalBatch {
                indices: vec![0, 1, 2, 3],
                splits: vec![0..2, 2..4],
            }],
        };
        let probe = NoiseProbe {
            measures: true,
            precondition: false,
            previous_seconds: 0.5,
        };
        let probes: [Box<dyn StepProbe>; 1] = [Box::new(probe)];
        let layout = ProbeLayout::of(&probes, &batches);
        assert_eq!(layout.slots(), 5);
        assert!(layout.needs.micro_gradients && !layout.needs.preconditioner);
        let mut summed = vec![0.0; 5];
        for (rank, g) in [[2.0f32, 0.0], [0.0, 2.0]].into_iter().enumerate() {
            let mut values = layout.local();
            // This rank's share is (sum of 2 losses) / 4: half its mean gradient.
            let grads = [Some(Tensor::new(&g, &Device::Cpu).unwrap() * 0.25)
                .transpose()
                .unwrap()];
            let micro = MicroGradient {
                micro: 0,
                rank,
                world: 2,
                size: 2.0,
                to_mean: 2.0,
                loss_scale: 1.0,
                grads: &grads,
                preconditioner: None,
            };
            layout.micro(&micro, &mut values).unwrap();
            summed.iter_mut().zip(&values).for_each(|(s, v)| *s += v);
        }
        let step = SummedStep {
            grads: Some(&[]),
            norm: Some(0.5f64.sqrt()),
            preconditioner: None,
            examples_per_token: None,
            world: 2,
            groups: None,
        };
        let readings = layout.read(&mut summed, &step).unwrap();
        let reading = readings.get::<NoiseReading>().unwrap();
        let (g2, trace) = reading.measurement.unwrap();
        assert!(
            g2.abs() < 1e-12 && (trace - 2.0).abs() < 1e-12,
            "{g2} {trace}"
        );
        assert_eq!(reading.previous_step_seconds, Some(0.5));
        let overflowed = SummedStep {
            grads: None,
            ..step
        };
        let readings = layout.read(&mut summed, &overflowed).unwrap();
        assert_eq!(readings.get::<NoiseReading>().unwrap().measurement, None);
    }
}
