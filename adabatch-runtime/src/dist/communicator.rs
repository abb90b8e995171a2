//! Collectives between ranks: [`Single`] (one rank, no-op) and [`Local`] (ranks as
//! threads of one process, with a real all-reduce).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use candle_core::Tensor;

use crate::error::{DistributedError, Error, Result};

/// Collective operations every rank calls in the same order.
///
/// A rank that fails must still either take part in the collectives of its step
/// (with a failure flag, see [`Communicator::any`]) or abort the group, so that no
/// peer waits forever.
pub trait Communicator: Send + Sync {
    /// This rank (0-based).
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Element-wise sum over ranks of `tensors` and `scalars`; every rank gets the
    /// sum. Tensors keep their shapes; the same shapes must be passed on every rank.
    fn all_reduce_sum(&self, tensors: &mut [Tensor], scalars: &mut [f64]) -> Result<()>;
    /// Overwrites `tensors` on every rank with rank `root`'s values.
    fn broadcast(&self, tensors: &mut [Tensor], root: usize) -> Result<()>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()> {
        self.all_reduce_sum(&mut [], &mut []).map(|_| ())
    }
    /// Whether `flag` is set on any rank (used so all ranks agree on a failure or an
    /// OOM before anyone steps).
    fn any(&self, flag: bool) -> Result<bool> {
        let mut flags = [f64::from(u8::from(flag))];
        self.all_reduce_sum(&mut [], &mut flags)?;
        Ok(flags[0] > 0.0)
    }
    /// Tells the peers that this rank stopped with an error outside a collective.
    fn abort(&self) {}
}

/// One rank: every collective is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct Single;

impl Communicator for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _: &mut [Tensor], _: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _: &mut [Tensor], _: usize) -> Result<()> {
        Ok(())
    }
}

/// Ranks as threads in one process. The last rank to arrive sums every rank's buffer
/// in rank order, so every rank receives bit-identical results.
#[derive(Debug, Clone)]
pub struct Local {
    rank: usize,
    group: Arc<Group>,
}

#[derive(Debug)]
struct Group {
    world_size: usize,
    state: Mutex<GroupState>,
    arrived_all: Condvar,
}

#[derive(Debug)]
struct GroupState {
    deposits: Vec<Option<Vec<f64>>>,
    arrived: usize,
    generation: u64,
    result: Arc<std::result::Result<Vec<f64>, SizeMismatch>>,
    aborted: bool,
}

impl Local {
    /// One communicator per rank of a new group of `world_size` threads.
    pub fn group(world_size: usize) -> Vec<Local> {
        let group = Arc::new(Group {
            world_size,
            state: Mutex::new(GroupState {
                deposits: vec![None; world_size],
                arrived: 0,
                generation: 0,
                result: Arc::new(Ok(Vec::new())),
                aborted: false,
            }),
            arrived_all: Condvar::new(),
        });
        (0..world_size)
            .map(|rank| Local {
                rank,
                group: Arc::clone(&group),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, GroupState> {
        self.group.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sums `buffer` over ranks in place.
    fn all_reduce_flat(&self, buffer: &mut Vec<f64>) -> Result<()> {
        let mut state = self.lock();
        if state.aborted {
            return Err(Error::Distributed(DistributedError::PeerFailed {
                rank: self.rank,
            }));
        }
        state.deposits[self.rank] = Some(std::mem::take(buffer));
        state.arrived += 1;
        let generation = state.generation;
        if state.arrived == self.group.world_size {
            let deposits: Vec<Vec<f64>> = state
                .deposits
                .iter_mut()
                .map(|d| d.take().unwrap_or_default())
                .collect();
            state.result = Arc::new(sum_in_rank_order(deposits));
            state.arrived = 0;
            state.generation += 1;
            self.group.arrived_all.notify_all();
        } else {
            while state.generation == generation && !state.aborted {
                state = self
                    .group
                    .arrived_all
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if state.generation == generation {
                return Err(Error::Distributed(DistributedError::PeerFailed {
                    rank: self.rank,
                }));
            }
        }
        match &*state.result {
            Ok(sum) => {
                buffer.clone_from(sum);
                Ok(())
            }
            Err(m) => Err(Error::Distributed(
                DistributedError::AllReduceSizeMismatch {
                    expected: m.expected,
                    rank: m.rank,
                    sent: m.sent,
                },
            )),
        }
    }
}

/// Ranks that sent all-reduces of different lengths (shared by every rank of the
/// group, hence a plain copyable record rather than the error itself).
#[derive(Clone, Copy, Debug)]
struct SizeMismatch {
    expected: usize,
    rank: usize,
    sent: usize,
}

fn sum_in_rank_order(deposits: Vec<Vec<f64>>) -> std::result::Result<Vec<f64>, SizeMismatch> {
    let mut iter = deposits.into_iter();
    let mut sum = iter.next().unwrap_or_default();
    for (rank, buffer) in iter.enumerate() {
        if buffer.len() != sum.len() {
            return Err(SizeMismatch {
                expected: sum.len(),
                rank: rank + 1,
                sent: buffer.len(),
            });
        }
        sum.iter_mut().zip(&buffer).for_each(|(s, b)| *s += b);
    }
    Ok(sum)
}

impl Communicator for Local {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.group.world_size
    }
    fn all_reduce_sum(&self, tensors: &mut [Tensor], scalars: &mut [f64]) -> Result<()> {
        let mut flat = flatten(tensors)?;
        flat.extend_from_slice(scalars);
        self.all_reduce_flat(&mut flat)?;
        let tensor_len = flat.len() - scalars.len();
        scalars.copy_from_slice(&flat[tensor_len..]);
        unflatten(&flat[..tensor_len], tensors)
    }
    fn broadcast(&self, tensors: &mut [Tensor], root: usize) -> Result<()> {
        // Everyone but the root contributes zeros: the sum is the root's values.
        let mut flat = flatten(tensors)?;
        if self.rank != root {
            flat.iter_mut().for_each(|v| *v = 0.0);
        }
        self.all_reduce_flat(&mut flat)?;
        unflatten(&flat, tensors)
    }
    fn abort(&self) {
        self.lock().aborted = true;
        self.group.arrived_all.notify_all();
    }
}

/// Concatenates tensors into one host buffer (f64 holds every f32/f16/bf16 exactly).
pub fn flatten(tensors: &[Tensor]) -> Result<Vec<f64>> {
    let mut flat = Vec::with_capacity(tensors.iter().map(Tensor::elem_count).sum());
    for t in tensors {
        flat.extend(
            t.flatten_all()?
                .to_dtype(candle_core::DType::F64)?
                .to_vec1::<f64>()?,
        );
    }
    Ok(flat)
}

/// Replaces each tensor with its slice of `flat`, keeping shape, dtype and device.
pub fn unflatten(flat: &[f64], tensors: &mut [Tensor]) -> Result<()> {
    let mut offset = 0;
    for t in tensors.iter_mut() {
        let n = t.elem_count();
        let values = flat.get(offset..offset + n).ok_or_else(|| {
            Error::Distributed(DistributedError::CollectiveInput {
                detail: "all-reduce returned fewer values than sent".into(),
            })
        })?;
        *t = Tensor::from_slice(values, t.shape(), t.device())?.to_dtype(t.dtype())?;
        offset += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn local_all_reduce_sums_over_threads() {
        let comms = Local::group(3);
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let r = c.rank() as f32;
                        let mut t = [Tensor::new(&[r, 2.0 * r], &Device::Cpu).unwrap()];
                        let mut scalars = [1.0];
                        c.all_reduce_sum(&mut t, &mut scalars).unwrap();
                        let any = c.any(c.rank() == 2).unwrap();
                        let mut b = [Tensor::new(&[r + 10.0], &Device::Cpu).unwrap()];
                        c.broadcast(&mut b, 1).unwrap();
                        (
                            t[0].to_vec1::<f32>().unwrap(),
                            scalars[0],
                            any,
                            b[0].to_vec1::<f32>().unwrap(),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (t, s, any, b) in results {
            assert_eq!(t, vec![3.0, 6.0]);
            assert_eq!(s, 3.0);
            assert!(any);
            assert_eq!(b, vec![11.0]);
        }
    }

    #[test]
    fn abort_releases_waiting_ranks() {
        let comms = Local::group(2);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| comms[0].barrier());
            std::thread::sleep(std::time::Duration::from_millis(20));
            comms[1].abort();
            assert!(matches!(
                waiter.join().unwrap(),
                Err(Error::Distributed(DistributedError::PeerFailed { rank: 0 }))
            ));
        });
    }
}
