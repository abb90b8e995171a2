//! wip
use crate::*;
/// Summary.
#[derive(Debug)]
pub struct TrainSummary;
pub(crate) fn run<T: AdaptiveTrainer, D: Dataset + ?Sized, C: Collate<D::Item, Batch = <T::Model as TrainModel>::Batch>, F: Fn(&RankContext) -> Result<T> + Sync>(_d: &D, _c: &C, _a: &TrainingArgs, _f: F) -> Result<TrainSummary> { todo!() }
pub(crate) fn run_single<T: AdaptiveTrainer, D: Dataset + ?Sized, C: Collate<D::Item, Batch = <T::Model as TrainModel>::Batch>>(_t: T, _d: &D, _c: &C, _a: &TrainingArgs) -> Result<TrainSummary> { todo!() }
