//! Per-source loss sums of a step or an evaluation, laid out flat so that they ride
//! in one all-reduce: each source's loss sum, then its example count, then its
//! tokens (the targets that carry loss, when the batches know them). In a step
//! they ride as a probe ([`SourceProbe`]).

use crate::adapt::mixer::SourceGradient;
use crate::data::planner::StepBatches;
use crate::data::source_spec::SourceSpec;
use crate::error::Result;
use crate::train::probe::{ChunkLosses, Groups, Needs, Reading, StepProbe, SummedStep};
use crate::train::source_grads;

/// Flat sums of `sources` sources: `3 · sources` values.
pub(crate) fn zeroed(sources: usize) -> Vec<f64> {
    vec![0.0; 3 * sources]
}

/// Adds a chunk's per-example `losses` of the dataset indices `chunk` (and each
/// example's tokens, when known) to `sums`.
pub(crate) fn add(
    sums: &mut [f64],
    spec: &SourceSpec,
    chunk: &[usize],
    losses: &[f64],
    tokens: Option<&[usize]>,
) {
    let n = spec.names.len();
    for (i, (&loss, &index)) in losses.iter().zip(chunk).enumerate() {
        let source = spec.locate(index).0;
        sums[source] += loss;
        sums[n + source] += 1.0;
        if let Some(tokens) = tokens {
            sums[2 * n + source] += tokens.get(i).copied().unwrap_or(0) as f64;
        }
    }
}

/// Each source's mean loss from summed `sums`: per token when `per_token` and
/// tokens were counted (the unit of `eval_loss` under `reweight = token_count`),
/// else per example; NaN for a source with nothing in it. `None` without sources.
pub(crate) fn means(sums: &[f64], per_token: bool) -> Option<Vec<f64>> {
    if sums.is_empty() {
        return None;
    }
    let n = sums.len() / 3;
    let (losses, rest) = sums.split_at(n);
    let (counts, tokens) = rest.split_at(n);
    let by_tokens = per_token && tokens.iter().sum::<f64>() > 0.0;
    let denominators = if by_tokens { tokens } else { counts };
    Some(
        losses
            .iter()
            .zip(denominators)
            .map(|(sum, &d)| if d > 0.0 { sum / d } else { f64::NAN })
            .collect(),
    )
}

/// Each source's tokens in summed `sums` (`None` without sources or when no
/// batch counted them).
pub(crate) fn tokens(sums: &[f64]) -> Option<Vec<f64>> {
    let n = sums.len() / 3;
    let tokens = &sums[2 * n..];
    (n > 0 && tokens.iter().sum::<f64>() > 0.0).then(|| tokens.to_vec())
}

/// A step's per-source losses, for the mixer and the log; on a step that
/// measures them, the sources' gradient statistics too.
pub(crate) struct SourceProbe<'a> {
    /// The run's sources.
    pub(crate) spec: &'a SourceSpec,
    /// Means per token (`reweight = token_count`) where the batches count them.
    pub(crate) per_token: bool,
    /// Whether this step measures each source's gradient statistics.
    pub(crate) gradients: bool,
}

/// What [`SourceProbe`] read of a step.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SourceLosses {
    /// Each source's mean loss in the step, per token under `reweight =
    /// token_count` when the batches count tokens, else per example (NaN for a
    /// source without examples in it).
    pub(crate) loss: Vec<f64>,
    /// Each source's tokens (targets) in the step, when the batches count them.
    pub(crate) tokens: Option<Vec<f64>>,
    /// Each source's gradient statistics, on a step that measured them.
    pub(crate) gradients: Option<Vec<SourceGradient>>,
}

impl StepProbe for SourceProbe<'_> {
    /// Each source's sums, then on a measuring step each half's examples and
    /// tokens ([`source_grads`]).
    fn slots(&self, _: &StepBatches) -> usize {
        let halves = if self.gradients {
            2 * source_grads::halves(self.spec)
        } else {
            0
        };
        3 * self.spec.names.len() + halves
    }

    fn groups(&self, batches: &StepBatches) -> Option<Groups> {
        self.gradients
            .then(|| source_grads::groups(self.spec, batches))
    }

    fn needs(&self, _: &StepBatches) -> Needs {
        Needs {
            losses: true,
            ..Needs::default()
        }
    }

    fn chunk(&self, chunk: &ChunkLosses<'_>, out: &mut [f64]) {
        let (sums, halves) = out.split_at_mut(3 * self.spec.names.len());
        add(sums, self.spec, chunk.indices, chunk.losses, chunk.tokens);
        if let (Some(group), false) = (chunk.group, halves.is_empty()) {
            source_grads::count(halves, group, chunk);
        }
    }

    fn read(&self, summed: &[f64], step: &SummedStep<'_>) -> Result<Box<dyn Reading>> {
        let (sums, halves) = summed.split_at(3 * self.spec.names.len());
        let loss = means(sums, self.per_token).unwrap_or_default();
        let gradients = match (self.gradients, step.groups) {
            (true, Some(groups)) => Some(source_grads::statistics(
                halves,
                groups,
                &loss,
                self.per_token,
            )?),
            _ => None,
        };
        Ok(Box::new(SourceLosses {
            loss,
            tokens: tokens(sums),
            gradients,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::policy::StoppingStrategy;

    #[test]
    fn per_token_means_divide_by_each_sources_tokens() {
        let spec = SourceSpec {
            names: vec!["a".into(), "b".into()],
            sizes: vec![2, 2],
            weights: vec![1.0, 1.0],
            stopping: StoppingStrategy::Primary,
            unit: crate::data::source_spec::MixUnit::Examples,
            tokens: vec![2, 2],
        };
        let mut sums = zeroed(2);
        // Examples 0 (a) and 3 (b): 10 nats over 5 tokens, 3 nats over 1 token.
        add(&mut sums, &spec, &[0, 3], &[10.0, 3.0], Some(&[5, 1]));
        add(&mut sums, &spec, &[1], &[2.0], Some(&[5]));
        assert_eq!(means(&sums, true).unwrap(), vec![1.2, 3.0]);
        assert_eq!(means(&sums, false).unwrap(), vec![6.0, 3.0]);
        assert_eq!(tokens(&sums).unwrap(), vec![10.0, 1.0]);
        let mut untold = zeroed(2);
        add(&mut untold, &spec, &[0], &[4.0], None);
        let m = means(&untold, true).unwrap();
        assert_eq!(m[0], 4.0, "per example when no batch counted tokens");
        assert!(m[1].is_nan());
        assert!(tokens(&untold).is_none());
        assert!(means(&[], true).is_none());
    }
}
