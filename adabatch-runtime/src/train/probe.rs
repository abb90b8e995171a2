//! What a controller measures inside a step: a [`StepProbe`].
//!
//! A probe declares scalars of its own that ride in the step's one all-reduce
//! ([`StepProbe::slots`]), writes this rank's values from what the step shows it
//! (each chunk's per-example losses, each micro-batch's gradient, a value it
//! brings), and turns the values summed over the ranks into a typed [`Reading`]
//! that the step's result carries ([`Readings`]) and its controller reads back.
//! The step knows this interface only: a new measurement is a probe in its
//! controller's file, not fields in the step, its payload or its result.

use std::any::Any;

use candle_core::Tensor;

use crate::data::planner::StepBatches;
use crate::error::Result;

/// What a probe needs the step to compute for it, beyond its scalars.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Needs {
    /// Each chunk's per-example losses on the host ([`StepProbe::chunk`]; it
    /// waits for the device).
    pub(crate) losses: bool,
    /// Each micro-batch's gradient on this rank, summed apart before it joins
    /// the step's ([`StepProbe::micro`]).
    pub(crate) micro_gradients: bool,
    /// The optimizer's preconditioner of the gradients (Adam's second moment).
    pub(crate) preconditioner: bool,
    /// The summed gradient's norm before clipping ([`SummedStep::norm`]).
    pub(crate) summed_norm: bool,
}

impl Needs {
    /// What any of `self` and `other` needs.
    fn or(self, other: Self) -> Self {
        Self {
            losses: self.losses || other.losses,
            micro_gradients: self.micro_gradients || other.micro_gradients,
            preconditioner: self.preconditioner || other.preconditioner,
            summed_norm: self.summed_norm || other.summed_norm,
        }
    }
}

/// One chunk's per-example losses, after its forward pass on this rank.
pub(crate) struct ChunkLosses<'a> {
    /// The examples' dataset indices.
    pub(crate) indices: &'a [usize],
    /// Their losses.
    pub(crate) losses: &'a [f64],
    /// Their tokens (targets), when the batch knows them.
    pub(crate) tokens: Option<&'a [usize]>,
    /// Their group ([`StepProbe::groups`]) on a step that groups its examples:
    /// such a step's chunks hold one group each.
    pub(crate) group: Option<usize>,
    /// The chunk's tokens as the step counts them (`Batch::num_tokens`).
    pub(crate) batch_tokens: usize,
}

/// A step's examples in groups whose gradients the step keeps apart
/// ([`StepProbe::groups`]): each example's group, in the order of
/// [`StepBatches::indices`], and the number of groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Groups {
    pub(crate) of: Vec<usize>,
    pub(crate) count: usize,
}

/// One micro-batch's gradient on this rank, summed over its chunks.
pub(crate) struct MicroGradient<'a> {
    /// The micro-batch's number in the step, this rank's, and the number of ranks.
    pub(crate) micro: usize,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// Its size in the unit the loss is averaged over: examples, or target
    /// tokens under `reweight = token_count`.
    pub(crate) size: f64,
    /// The factor that turns the gradients into the mean gradient over its
    /// `size` (before the loss scale is divided out).
    pub(crate) to_mean: f64,
    /// The step's loss scale (`--fp16`; 1 otherwise).
    pub(crate) loss_scale: f64,
    /// The gradients, aligned with the trained parameters.
    pub(crate) grads: &'a [Option<Tensor>],
    /// The optimizer's preconditioner when some probe asked for it.
    pub(crate) preconditioner: Option<&'a [Option<Tensor>]>,
}

/// The step after its all-reduce, as every rank sees it.
pub(crate) struct SummedStep<'a> {
    /// The summed gradients, unscaled and before clipping; `None` when `--fp16`'s
    /// gradients overflowed and the update is skipped.
    pub(crate) grads: Option<&'a [Option<Tensor>]>,
    /// Their norm, when some probe, the log or clipping needed it.
    pub(crate) norm: Option<f64>,
    /// The optimizer's preconditioner when some probe asked for it.
    pub(crate) preconditioner: Option<&'a [Option<Tensor>]>,
    /// Under `reweight = token_count`: the step's examples per target token.
    pub(crate) examples_per_token: Option<f64>,
    /// The number of ranks.
    pub(crate) world: usize,
    /// On a step that grouped its examples ([`StepProbe::groups`]), each
    /// group's gradient of its examples' summed losses; `None` under
    /// `rank_mean` (a rank's examples are not weighted alike there) and when
    /// `--fp16`'s gradients overflowed.
    pub(crate) groups: Option<GroupGradients<'a>>,
}

/// Each group's gradient of its examples' summed losses (under `reweight =
/// token_count`: summed over their tokens), summed over the ranks: `scale`
/// times `sums`, the scale left for the reader to multiply in as it reads
/// (scaling a copy of every group's gradients first cost as much as the rest
/// of the statistics).
#[derive(Clone, Copy)]
pub(crate) struct GroupGradients<'a> {
    pub(crate) sums: &'a [Vec<Option<Tensor>>],
    pub(crate) scale: f64,
}

/// A probe's result of a step, read back by type ([`Readings::get`]).
pub(crate) trait Reading: std::fmt::Debug {
    /// For the downcast (the MSRV predates trait upcasting).
    fn as_any(&self) -> &dyn Any;
}

impl<T: Any + std::fmt::Debug> Reading for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Every probe's reading of a step.
#[derive(Debug, Default)]
pub(crate) struct Readings(Vec<Box<dyn Reading>>);

impl Readings {
    /// The reading of type `R`, when a probe gave one.
    pub(crate) fn get<R: Any>(&self) -> Option<&R> {
        // `**r`: the box itself is a `Reading` too (the blanket impl), and its
        // `as_any` would give the box.
        self.0
            .iter()
            .find_map(|r| (**r).as_any().downcast_ref::<R>())
    }
}

/// Something measured inside a step, for a controller. Every rank's probes are
/// the same, in the same order, with the same slots: their scalars line up in
/// the all-reduce.
pub(crate) trait StepProbe {
    /// The scalars it adds to the step of `batches` (the same on every rank).
    fn slots(&self, batches: &StepBatches) -> usize;
    /// What the step computes for it, beyond its scalars.
    fn needs(&self, batches: &StepBatches) -> Needs {
        let _ = batches;
        Needs::default()
    }
    /// The groups whose gradients the step is to keep apart, summed over the
    /// ranks in its one all-reduce, for [`SummedStep::groups`]; the first
    /// probe's that has some is the step's. The default: none.
    fn groups(&self, batches: &StepBatches) -> Option<Groups> {
        let _ = batches;
        None
    }
    /// Its values known before the step (`out`: its slots, zeros).
    fn local(&self, out: &mut [f64]) {
        let _ = out;
    }
    /// A chunk's losses, when it [`Needs::losses`].
    fn chunk(&self, chunk: &ChunkLosses<'_>, out: &mut [f64]) {
        let _ = (chunk, out);
    }
    /// A micro-batch's gradient, when it [`Needs::micro_gradients`].
    fn micro(&self, micro: &MicroGradient<'_>, out: &mut [f64]) -> Result<()> {
        let _ = (micro, out);
        Ok(())
    }
    /// Its reading of the step from its slots summed over the ranks.
    fn read(&self, summed: &[f64], step: &SummedStep<'_>) -> Result<Box<dyn Reading>>;
}

/// Where each probe's slots lie in the step's scalars, and what they need.
pub(crate) struct ProbeLayout<'p> {
    probes: &'p [Box<dyn StepProbe + 'p>],
    /// Each probe's first slot, then the total.
    offsets: Vec<usize>,
    /// What any of them needs.
    pub(crate) needs: Needs,
    /// The step's groups, when a probe asked for some.
    pub(crate) groups: Option<Groups>,
}

impl<'p> ProbeLayout<'p> {
    /// The layout of `probes` in the step of `batches`.
    pub(crate) fn of(probes: &'p [Box<dyn StepProbe + 'p>], batches: &StepBatches) -> Self {
        let mut offsets = vec![0];
        let mut needs = Needs::default();
        let mut groups = None;
        for probe in probes {
            offsets.push(offsets[offsets.len() - 1] + probe.slots(batches));
            needs = needs.or(probe.needs(batches));
            groups = groups.or_else(|| probe.groups(batches));
        }
        Self {
            probes,
            offsets,
            needs,
            groups,
        }
    }

    /// Every probe's slots in all.
    pub(crate) fn slots(&self) -> usize {
        self.offsets[self.offsets.len() - 1]
    }

    /// Each probe with its slots of `values`.
    fn each<'v>(
        &self,
        values: &'v mut [f64],
    ) -> impl Iterator<Item = (&'p dyn StepProbe, &'v mut [f64])> + use<'p, 'v, '_> {
        let mut rest = values;
        self.probes
            .iter()
            .zip(self.offsets.windows(2))
            .map(move |(probe, span)| {
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut(span[1] - span[0]);
                rest = tail;
                (&**probe, mine)
            })
    }

    /// This rank's values before the step: zeros, and what each probe brings.
    pub(crate) fn local(&self) -> Vec<f64> {
        let mut values = vec![0.0; self.slots()];
        for (probe, out) in self.each(&mut values) {
            probe.local(out);
        }
        values
    }

    /// A chunk's losses to every probe that needs them.
    pub(crate) fn chunk(&self, chunk: &ChunkLosses<'_>, values: &mut [f64]) {
        for (probe, out) in self.each(values) {
            probe.chunk(chunk, out);
        }
    }

    /// A micro-batch's gradient to every probe.
    pub(crate) fn micro(&self, micro: &MicroGradient<'_>, values: &mut [f64]) -> Result<()> {
        for (probe, out) in self.each(values) {
            probe.micro(micro, out)?;
        }
        Ok(())
    }

    /// Every probe's reading from the summed `values`.
    pub(crate) fn read(&self, values: &mut [f64], step: &SummedStep<'_>) -> Result<Readings> {
        let mut readings = Vec::with_capacity(self.probes.len());
        for (probe, summed) in self.each(values) {
            readings.push(probe.read(summed, step)?);
        }
        Ok(Readings(readings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::sampler::GlobalBatch;

    /// Brings a value, counts the chunks' examples per slot.
    struct Counting {
        value: f64,
        slots: usize,
    }

    #[derive(Debug, PartialEq)]
    struct Counted(Vec<f64>);

    impl StepProbe for Counting {
        fn slots(&self, _: &StepBatches) -> usize {
            self.slots
        }
        fn needs(&self, _: &StepBatches) -> Needs {
            Needs {
                losses: true,
                ..Needs::default()
            }
        }
        fn local(&self, out: &mut [f64]) {
            out[0] = self.value;
        }
        fn chunk(&self, chunk: &ChunkLosses<'_>, out: &mut [f64]) {
            out[out.len() - 1] += chunk.losses.len() as f64;
        }
        fn read(&self, summed: &[f64], _: &SummedStep<'_>) -> Result<Box<dyn Reading>> {
            Ok(Box::new(Counted(summed.to_vec())))
        }
    }

    #[derive(Debug)]
    struct Other;

    #[test]
    fn each_probe_writes_and_reads_its_own_slots() {
        let batches = StepBatches {
            micro: vec![GlobalBatch {
                indices: vec![0, 1, 2],
                splits: vec![0..2, 2..3],
            }],
        };
        let (a, b) = (
            Counting {
                value: 1.5,
                slots: 2,
            },
            Counting {
                value: 7.0,
                slots: 1,
            },
        );
        let probes: [Box<dyn StepProbe>; 2] = [Box::new(a), Box::new(b)];
        let layout = ProbeLayout::of(&probes, &batches);
        assert_eq!(layout.slots(), 3);
        assert!(layout.needs.losses && !layout.needs.micro_gradients);
        let mut values = layout.local();
        assert_eq!(values, vec![1.5, 0.0, 7.0]);
        let chunk = ChunkLosses {
            indices: &[0, 1],
            losses: &[0.5, 0.25],
            tokens: None,
            group: None,
            batch_tokens: 0,
        };
        layout.chunk(&chunk, &mut values);
        assert_eq!(values, vec![1.5, 2.0, 9.0]);
        let step = SummedStep {
            grads: None,
            norm: None,
            preconditioner: None,
            examples_per_token: None,
            world: 1,
            groups: None,
        };
        let readings = layout.read(&mut values, &step).unwrap();
        assert_eq!(readings.get::<Counted>(), Some(&Counted(vec![1.5, 2.0])));
        assert!(readings.get::<Other>().is_none());
    }
}
