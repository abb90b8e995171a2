//! The packed attention's CUDA bodies: `kernels/attention.cu`, loaded through
//! `crate::cuda`'s modules. The forward is one kernel (output and log-sum-exp); the
//! backward two, in order: dq (which leaves `D = Σ dO·O` per query row), then dk
//! and dv.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{Layout, Result, Storage, Tensor, bail};

use super::layout::{AttnArgs, Geometry, MAX_HEAD_DIM};
use crate::cuda::kernel::Pass;
use crate::cuda::{self, Module};

const NAME: &str = "adabatch-packed-attention";

// SAFETY: a plain `repr(C)` struct of a double and integers, laid out as the
// kernels' `AttnArgs`, passed by value.
unsafe impl DeviceRepr for AttnArgs {}

/// The forward on CUDA: the output `[kv, b, g·t, d]` and the rows' log-sum-exp
/// `[kv, b, g·t]` (f32, or f64 for f64 inputs).
pub(super) fn forward(
    geo: &Geometry,
    inputs: [(&CudaStorage, &Layout); 3],
    ids: Option<&Tensor>,
) -> Result<(CudaStorage, Tensor)> {
    let ids = ids.map(|ids| ids.storage_and_layout());
    let ids = ids.as_ref().map(|(s, l)| (&**s, *l));
    match &inputs[0].0.slice {
        CudaStorageSlice::F32(_) => Bodies::<f32, f32>::new(geo, "f32", inputs, ids)?.forward(),
        CudaStorageSlice::F64(_) => Bodies::<f64, f64>::new(geo, "f64", inputs, ids)?.forward(),
        CudaStorageSlice::F16(_) => {
            Bodies::<half::f16, f32>::new(geo, "f16", inputs, ids)?.forward()
        }
        CudaStorageSlice::BF16(_) => {
            Bodies::<half::bf16, f32>::new(geo, "bf16", inputs, ids)?.forward()
        }
        _ => bail!("{NAME}: unsupported dtype {:?}", inputs[0].0.dtype()),
    }
}

/// The backward on CUDA: `[dq | dk | dv]` from the inputs and what the forward
/// left (`saved`: its output, the output's gradient, the log-sum-exp).
pub(super) fn backward(
    geo: &Geometry,
    inputs: [(&CudaStorage, &Layout); 3],
    saved: [&Tensor; 3],
    ids: Option<&Tensor>,
) -> Result<CudaStorage> {
    let ids = ids.map(|ids| ids.storage_and_layout());
    let ids = ids.as_ref().map(|(s, l)| (&**s, *l));
    let saved = saved.map(|t| t.storage_and_layout());
    let [o, grad, lse] = [0, 1, 2].map(|i| (&*saved[i].0, saved[i].1));
    match &inputs[0].0.slice {
        CudaStorageSlice::F32(_) => {
            Bodies::<f32, f32>::new(geo, "f32", inputs, ids)?.backward(o, grad, lse)
        }
        CudaStorageSlice::F64(_) => {
            Bodies::<f64, f64>::new(geo, "f64", inputs, ids)?.backward(o, grad, lse)
        }
        CudaStorageSlice::F16(_) => {
            Bodies::<half::f16, f32>::new(geo, "f16", inputs, ids)?.backward(o, grad, lse)
        }
        CudaStorageSlice::BF16(_) => {
            Bodies::<half::bf16, f32>::new(geo, "bf16", inputs, ids)?.backward(o, grad, lse)
        }
        _ => bail!("{NAME}: unsupported dtype {:?}", inputs[0].0.dtype()),
    }
}

/// One attention's kernels in `T`, computing in `A`: its inputs on the device and
/// its launch geometry.
struct Bodies<'a, T, A> {
    geo: &'a Geometry,
    suffix: &'static str,
    device: CudaDevice,
    q: CudaView<'a, T>,
    k: CudaView<'a, T>,
    v: CudaView<'a, T>,
    /// The document ids, or one unread index.
    ids: IdsView<'a>,
    args: AttnArgs,
    _acc: std::marker::PhantomData<A>,
}

/// Document ids on the device: the tensor's, or a placeholder the kernels never read.
enum IdsView<'a> {
    Given(CudaView<'a, i64>),
    Placeholder(CudaSlice<i64>),
}

impl<'a, T, A> Bodies<'a, T, A>
where
    T: CudaDType + DeviceRepr + ValidAsZeroBits,
    A: CudaDType + DeviceRepr + ValidAsZeroBits,
{
    fn new(
        geo: &'a Geometry,
        suffix: &'static str,
        [(q, ql), (k, kl), (v, vl)]: [(&'a CudaStorage, &Layout); 3],
        ids: Option<(&'a Storage, &Layout)>,
    ) -> Result<Self> {
        if geo.d > MAX_HEAD_DIM {
            bail!(
                "{NAME}: heads of {} exceed the CUDA body's {MAX_HEAD_DIM}; use heads of at \
                 most {MAX_HEAD_DIM} (or the composite: set_cuda_bodies(false))",
                geo.d
            )
        }
        let device = q.device().clone();
        let ids = match ids {
            None => IdsView::Placeholder(device.alloc_zeros::<i64>(1)?),
            Some((Storage::Cuda(ids), layout)) => {
                IdsView::Given(cuda::indices(NAME, 3, ids, layout)?)
            }
            Some(_) => bail!("{NAME}: the document ids are not on the queries' CUDA device"),
        };
        let args = geo.kernel_args(matches!(ids, IdsView::Given(_)))?;
        Ok(Self {
            geo,
            suffix,
            device,
            q: cuda::values(NAME, 0, q, ql)?,
            k: cuda::values(NAME, 1, k, kl)?,
            v: cuda::values(NAME, 2, v, vl)?,
            ids,
            args,
            _acc: std::marker::PhantomData,
        })
    }

    /// The output and the log-sum-exp.
    fn forward(self) -> Result<(CudaStorage, Tensor)> {
        let geo = self.geo;
        let mut out = self.device.alloc_zeros::<T>(geo.q_len().max(1))?;
        let mut lse = self.device.alloc_zeros::<A>(geo.q_rows().max(1))?;
        if !self.empty() {
            let mut unused = self.device.alloc_zeros::<A>(1)?;
            let (q, k, v) = (&self.q, &self.k, &self.v);
            let slots = Slots {
                o: q,
                dout: q,
                lse: Lse::Written(&mut lse),
                dsum: &mut unused,
            };
            let pass = geo.forward_pass(self.suffix, std::mem::size_of::<A>());
            self.launch(&pass, [q, k, v], slots, &mut out)?;
        }
        let lse = A::wrap_cuda_slice(lse, self.device.clone());
        let dims = (geo.kv, geo.b, geo.g * geo.t);
        let lse = Tensor::from_storage(Storage::Cuda(lse), dims, BackpropOp::none(), false);
        Ok((T::wrap_cuda_slice(out, self.device.clone()), lse))
    }

    /// `[dq | dk | dv]`: dq (and D) first, then dk and dv.
    fn backward(
        self,
        (o, ol): (&Storage, &Layout),
        (grad, gl): (&Storage, &Layout),
        (lse, ll): (&Storage, &Layout),
    ) -> Result<CudaStorage> {
        let geo = self.geo;
        let len = geo.q_len() + 2 * geo.kv_len();
        let mut out = self.device.alloc_zeros::<T>(len.max(1))?;
        if !self.empty() {
            let (Storage::Cuda(o), Storage::Cuda(grad), Storage::Cuda(lse)) = (o, grad, lse) else {
                bail!("{NAME}: what the forward kept is not on the CUDA device")
            };
            let o = cuda::values::<T>(NAME, 4, o, ol)?;
            let grad = cuda::values::<T>(NAME, 5, grad, gl)?;
            let lse = cuda::values::<A>(NAME, 6, lse, ll)?;
            let mut dsum = self.device.alloc_zeros::<A>(geo.q_rows())?;
            let (q, k, v) = (&self.q, &self.k, &self.v);
            for pass in geo.backward_passes(self.suffix, std::mem::size_of::<A>()) {
                let slots = Slots {
                    o: &o,
                    dout: &grad,
                    lse: Lse::Read(&lse),
                    dsum: &mut dsum,
                };
                self.launch(&pass, [q, k, v], slots, &mut out)?;
            }
        }
        Ok(T::wrap_cuda_slice(out, self.device.clone()))
    }

    /// Nothing to compute: no query row or a head of nothing.
    fn empty(&self) -> bool {
        self.geo.q_len() == 0 || self.geo.kv_len() == 0
    }

    /// Launches `pass`.
    fn launch(
        &self,
        pass: &Pass,
        [q, k, v]: [&CudaView<'_, T>; 3],
        slots: Slots<'_, '_, T, A>,
        out: &mut CudaSlice<T>,
    ) -> Result<()> {
        let function = cuda::function(&self.device, Module::Attention, &pass.entry)?;
        let stream = self.device.cuda_stream();
        let mut builder = stream.launch_builder(&function);
        builder.arg(q).arg(k).arg(v).arg(slots.o).arg(slots.dout);
        match &self.ids {
            IdsView::Given(ids) => builder.arg(ids),
            IdsView::Placeholder(ids) => builder.arg(ids),
        };
        match slots.lse {
            Lse::Written(lse) => builder.arg(lse),
            Lse::Read(lse) => builder.arg(lse),
        };
        builder.arg(slots.dsum).arg(out).arg(&self.args);
        let config = LaunchConfig {
            grid_dim: pass.grid,
            block_dim: pass.block,
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernels' signature (kernels/attention.cu):
        // q, k, v, o and dout of the geometry's lengths in T, ids [b, t] (or unread),
        // lse and dsum of a value per query row in A, the output of the kernel's
        // length in T, `AttnArgs` by value.
        unsafe { builder.launch(config) }.w()?;
        Ok(())
    }
}

/// The kernels' arguments besides q, k, v and the output: the forward's output
/// and its gradient (the backward's), the log-sum-exp (the forward writes it, the
/// backward reads it) and D.
struct Slots<'s, 'v, T, A> {
    o: &'s CudaView<'v, T>,
    dout: &'s CudaView<'v, T>,
    lse: Lse<'s, 'v, A>,
    dsum: &'s mut CudaSlice<A>,
}

/// The log-sum-exp: the forward's output, the backward's input.
enum Lse<'s, 'v, A> {
    Written(&'s mut CudaSlice<A>),
    Read(&'s CudaView<'v, A>),
}
