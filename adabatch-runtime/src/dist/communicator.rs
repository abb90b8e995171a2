//! Collectives between ranks: [`Single`] (one rank, no-op) and [`Local`] (ranks as
//! threads of one process, with a real all-reduce).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use candle_core::{CpuStorage, DType, Storage, Tensor};

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
    /// Each slot gets a new tensor, never written into in place: a caller may put
    /// one tensor in several slots (the step shares a zero per parameter).
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
    result: std::result::Result<Arc<Vec<f64>>, SizeMismatch>,
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
                result: Ok(Arc::new(Vec::new())),
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

    /// `buffer` summed over ranks, shared by them (each reads it where it
    /// needs it rather than copying it back: the copy was a full pass over
    /// fresh memory per rank).
    fn all_reduce_flat(&self, buffer: Vec<f64>) -> Result<Arc<Vec<f64>>> {
        let mut state = self.lock();
        if state.aborted {
            return Err(Error::Distributed(DistributedError::PeerFailed {
                rank: self.rank,
            }));
        }
        state.deposits[self.rank] = Some(buffer);
        state.arrived += 1;
        let generation = state.generation;
        if state.arrived == self.group.world_size {
            let deposits: Vec<Vec<f64>> = state
                .deposits
                .iter_mut()
                .map(|d| d.take().unwrap_or_default())
                .collect();
            state.result = sum_in_rank_order(deposits).map(Arc::new);
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
        match &state.result {
            Ok(sum) => Ok(Arc::clone(sum)),
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
        let sum = self.all_reduce_flat(flat)?;
        let tensor_len = sum.len() - scalars.len();
        scalars.copy_from_slice(&sum[tensor_len..]);
        unflatten(&sum[..tensor_len], tensors)
    }
    fn broadcast(&self, tensors: &mut [Tensor], root: usize) -> Result<()> {
        // Everyone but the root contributes zeros: the sum is the root's values.
        let mut flat = flatten(tensors)?;
        if self.rank != root {
            flat.iter_mut().for_each(|v| *v = 0.0);
        }
        let sum = self.all_reduce_flat(flat)?;
        unflatten(&sum, tensors)
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
        extend_with(&mut flat, t)?;
    }
    Ok(flat)
}

/// `t`'s values appended to `flat`. An f32 tensor in host memory is read in
/// place and one in device memory copied once: converting it to an f64 tensor
/// first, then to a vector, made two more copies of every gradient, which on a
/// CPU step that keeps per-source gradients apart cost more than its sum.
fn extend_with(flat: &mut Vec<f64>, t: &Tensor) -> Result<()> {
    let t = t.flatten_all()?;
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(values)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            flat.extend(values[start..end].iter().map(|&v| f64::from(v)));
            return Ok(());
        }
    }
    match t.dtype() {
        DType::F32 => flat.extend(t.to_vec1::<f32>()?.into_iter().map(f64::from)),
        DType::F64 => flat.extend(t.to_vec1::<f64>()?),
        _ => flat.extend(t.to_dtype(DType::F64)?.to_vec1::<f64>()?),
    }
    Ok(())
}

/// Replaces each tensor with its slice of `flat`, keeping shape, dtype and device
/// (an f32 tensor made from its values rounded as `to_dtype` rounds them, with
/// no f64 tensor in between).
pub fn unflatten(flat: &[f64], tensors: &mut [Tensor]) -> Result<()> {
    let mut offset = 0;
    for t in tensors.iter_mut() {
        let n = t.elem_count();
        let values = flat.get(offset..offset + n).ok_or_else(|| {
            Error::Distributed(DistributedError::CollectiveInput {
                detail: "all-reduce returned fewer values than sent".into(),
            })
        })?;
        *t = match t.dtype() {
            DType::F32 => {
                let rounded: Vec<f32> = values.iter().map(|&v| v as f32).collect();
                Tensor::from_vec(rounded, t.shape(), t.device())?
            }
            dtype => Tensor::from_slice(values, t.shape(), t.device())?.to_dtype(dtype)?,
        };
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

    /// Flattening reads each dtype's values exactly (a transposed f32 view in
    /// its logical order, f16, bf16 and f64 through f64), and unflattening
    /// rounds back as `to_dtype` from f64 does.
    #[test]
    fn flatten_and_unflatten_keep_every_dtype_and_layout() {
        let device = Device::Cpu;
        let base = Tensor::new(&[[1.5f32, -2.25, 3.0], [0.1, 1e-8, 7.0]], &device).unwrap();
        let transposed = base.t().unwrap();
        let tensors: Vec<Tensor> = [DType::F32, DType::F16, DType::BF16, DType::F64]
            .iter()
            .map(|&d| base.to_dtype(d).unwrap())
            .chain([transposed.clone()])
            .collect();
        let flat = flatten(&tensors).unwrap();
        let expected: Vec<f64> = (tensors.iter())
            .flat_map(|t| {
                let t = t.flatten_all().unwrap().to_dtype(DType::F64).unwrap();
                t.to_vec1::<f64>().unwrap()
            })
            .collect();
        assert_eq!(flat, expected);
        assert_eq!(
            flat[24..],
            [1.5, 0.1f32 as f64, -2.25, 1e-8f32 as f64, 3.0, 7.0]
        );
        let doubled: Vec<f64> = flat.iter().map(|v| v * 2.0 + 1e-9).collect();
        let mut back = tensors.clone();
        unflatten(&doubled, &mut back).unwrap();
        for (t, original) in back.iter().zip(&tensors) {
            assert_eq!(t.dtype(), original.dtype());
            assert_eq!(t.dims(), original.dims());
        }
        let mut offset = 0;
        for t in &back {
            let n = t.elem_count();
            let reference = Tensor::from_slice(&doubled[offset..offset + n], t.shape(), &device)
                .unwrap()
                .to_dtype(t.dtype())
                .unwrap();
            let same = |x: &Tensor| x.flatten_all().unwrap().to_dtype(DType::F64).unwrap();
            assert_eq!(
                same(t).to_vec1::<f64>().unwrap(),
                same(&reference).to_vec1::<f64>().unwrap()
            );
            offset += n;
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
