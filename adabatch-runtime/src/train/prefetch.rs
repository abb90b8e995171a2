//! Collating ahead (HF's `dataloader_num_workers`): the batches of the next steps
//! are collated on worker threads while the current step computes.
//!
//! The next steps are predicted on a copy of the planner, as if nothing adaptive
//! happened in between. A step takes a prefetched batch only when it asks for
//! exactly the same examples in the same chunks, so a memory-aware change, a noise
//! scale or mixer decision, or an OOM costs only the discarded prefetch: the
//! batches a step trains on are the ones it would have collated itself.

use std::collections::VecDeque;
use std::thread::{Scope, ScopedJoinHandle};

use candle_core::Device;

use crate::adapt::schedule::Schedule;
use crate::data::planner::{StepBatches, StepPlanner};
use crate::error::{DataError, DistributedError, Error, Result};
use crate::train::collate::{collate_indices, guarded, panic_message};
use crate::user::data::{Collate, Dataset};
use crate::user::train_model::Batch;

/// This rank's collation work of a step, in the order the step runs it: each
/// micro-batch's local share cut in `chunks` pieces (empty shares skipped).
pub(crate) fn local_chunks(batches: &StepBatches, rank: usize, chunks: usize) -> Vec<&[usize]> {
    batches
        .micro
        .iter()
        .map(|micro| micro.local(rank))
        .filter(|indices| !indices.is_empty())
        .flat_map(|indices| indices.chunks(indices.len().div_ceil(chunks.max(1))))
        .collect()
}

/// Batches collated ahead for one step, keyed by the examples they hold.
pub(crate) type Prefetched<B> = VecDeque<(Vec<usize>, Result<B>)>;

/// A step predicted and being collated.
struct Pending<'scope, B> {
    chunks: Vec<Vec<usize>>,
    worker: ScopedJoinHandle<'scope, Prefetched<B>>,
}

/// How prefetching went, for the run's log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefetchStats {
    /// Steps that trained on batches collated ahead.
    pub used: usize,
    /// Predicted steps whose batches were thrown away (the run changed course).
    pub discarded: usize,
}

/// Keeps up to `workers` predicted steps collating, one thread each.
pub(crate) struct Prefetcher<'scope, 'env, D: Dataset + ?Sized, C: Collate<D::Item>, S> {
    scope: &'scope Scope<'scope, 'env>,
    dataset: &'env D,
    collate: &'env C,
    device: &'env Device,
    rank: usize,
    workers: usize,
    /// Predicted steps in order: the next step first.
    pending: VecDeque<Pending<'scope, C::Batch>>,
    /// A planner copy stops looking ahead where it would start a length-aware
    /// epoch (planning one is collective).
    length_aware: bool,
    pub stats: PrefetchStats,
    _schedule: std::marker::PhantomData<S>,
}

impl<'scope, 'env, D, C, S> Prefetcher<'scope, 'env, D, C, S>
where
    D: Dataset + ?Sized,
    C: Collate<D::Item>,
    C::Batch: Send + 'scope,
    S: Schedule + Clone,
{
    pub(crate) fn new(
        scope: &'scope Scope<'scope, 'env>,
        (dataset, collate, device): (&'env D, &'env C, &'env Device),
        rank: usize,
        workers: usize,
        length_aware: bool,
    ) -> Self {
        Self {
            scope,
            dataset,
            collate,
            device,
            rank,
            workers,
            pending: VecDeque::new(),
            length_aware,
            stats: PrefetchStats::default(),
            _schedule: std::marker::PhantomData,
        }
    }

    /// The batches collated ahead for this step, if it was predicted right; a wrong
    /// prediction discards everything predicted after it too.
    pub(crate) fn take(&mut self, batches: &StepBatches, chunks: usize) -> Prefetched<C::Batch> {
        let Some(next) = self.pending.pop_front() else {
            return VecDeque::new();
        };
        let wanted = local_chunks(batches, self.rank, chunks);
        if next.chunks.len() == wanted.len() && next.chunks.iter().zip(&wanted).all(|(a, b)| a == b)
        {
            self.stats.used += 1;
            return next.worker.join().unwrap_or_else(|payload| {
                // `guarded` already turns a collate panic into an error; this is a
                // panic outside it, reported the same way on the step that needs it.
                let message = panic_message(&*payload);
                let error = || {
                    Error::Distributed(DistributedError::RankPanicked {
                        rank: self.rank,
                        message: message.clone(),
                    })
                };
                next.chunks.into_iter().map(|c| (c, Err(error()))).collect()
            });
        }
        // Dropped handles finish in the background; the scope joins them.
        self.stats.discarded += 1 + self.pending.len();
        self.pending.clear();
        VecDeque::new()
    }

    /// Predicts the steps after the one `planner` has just planned and keeps the
    /// next `workers` of them collating. `chunks`: the current OOM split.
    pub(crate) fn look_ahead(&mut self, planner: &StepPlanner<S>, chunks: usize) {
        if self.workers == 0 {
            return;
        }
        let mut ahead = planner.clone();
        for slot in 0..self.workers {
            let predicted = ahead.finish_step().ok().and_then(|()| {
                let length_aware = self.length_aware;
                ahead
                    .next_step_with(|_| {
                        if length_aware {
                            Err(Error::Data(DataError::EmptyDataset)) // any error: stop looking ahead
                        } else {
                            Ok(None)
                        }
                    })
                    .ok()
                    .flatten()
            });
            let Some(batches) = predicted else {
                break;
            };
            let wanted: Vec<Vec<usize>> = local_chunks(&batches, self.rank, chunks)
                .into_iter()
                .map(<[usize]>::to_vec)
                .collect();
            if let Some(pending) = self.pending.get(slot) {
                if pending.chunks == wanted {
                    continue;
                }
                self.stats.discarded += self.pending.len() - slot;
                self.pending.truncate(slot);
            }
            self.pending.push_back(self.spawn(wanted));
        }
    }

    fn spawn(&self, chunks: Vec<Vec<usize>>) -> Pending<'scope, C::Batch> {
        let (dataset, collate, device, rank) = (self.dataset, self.collate, self.device, self.rank);
        let work = chunks.clone();
        let worker = self.scope.spawn(move || {
            work.into_iter()
                .map(|chunk| {
                    let batch = guarded(rank, || collate_indices(dataset, collate, device, &chunk));
                    (chunk, batch)
                })
                .collect()
        });
        Pending { chunks, worker }
    }
}

/// Takes the batch of `chunk` from what was collated ahead, when it is next there.
pub(crate) fn take_chunk<B: Batch>(
    ready: &mut Prefetched<B>,
    chunk: &[usize],
) -> Option<Result<B>> {
    match ready.front() {
        Some((indices, _)) if indices == chunk => ready.pop_front().map(|(_, batch)| batch),
        Some(_) => {
            ready.clear();
            None
        }
        None => None,
    }
}
