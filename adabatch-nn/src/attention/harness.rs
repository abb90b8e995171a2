//! The packed attention's CUDA bodies on CPU tensors, through the kernels' harness
//! (feature `kernels-on-cpu`, test code): the launches `attention/cuda.rs` makes
//! on a GPU ([`Geometry::forward_pass`], [`Geometry::backward_passes`]), with
//! buffers allocated as cudarc's `alloc_zeros` gives them.

use candle_core::{Result, WithDType, bail};

use super::layout::{Geometry, MAX_HEAD_DIM};
use crate::cuda::harness::{Args, launch};
use crate::cuda::kernel::Pass;

/// The output `[kv, b, g·t, d]` and the rows' log-sum-exp.
pub(super) fn forward<T: WithDType, A: WithDType>(
    geo: &Geometry,
    [q, k, v]: [&[T]; 3],
    ids: Option<&[i64]>,
) -> Result<(Vec<T>, Vec<A>)> {
    let mut out = vec![T::from_f64(0.0); geo.q_len().max(1)];
    let mut lse = vec![A::from_f64(0.0); geo.q_rows().max(1)];
    if !empty(geo)? {
        let mut unused = [A::from_f64(0.0)];
        let buffers = Buffers {
            inputs: [q.as_ptr(), k.as_ptr(), v.as_ptr(), q.as_ptr(), q.as_ptr()],
            ids,
            lse: lse.as_mut_ptr(),
            dsum: unused.as_mut_ptr(),
            out: out.as_mut_ptr(),
        };
        let pass = geo.forward_pass(T::DTYPE.as_str(), std::mem::size_of::<A>());
        buffers.launch(geo, &pass)?;
    }
    out.truncate(geo.q_len());
    lse.truncate(geo.q_rows());
    Ok((out, lse))
}

/// `[dq | dk | dv]` from the inputs, the forward's output, its gradient and the
/// log-sum-exp.
pub(super) fn backward<T: WithDType, A: WithDType>(
    geo: &Geometry,
    [q, k, v, o, grad]: [&[T]; 5],
    lse: &[A],
    ids: Option<&[i64]>,
) -> Result<Vec<T>> {
    let len = geo.q_len() + 2 * geo.kv_len();
    let mut out = vec![T::from_f64(0.0); len.max(1)];
    if !empty(geo)? {
        let mut dsum = vec![A::from_f64(0.0); geo.q_rows()];
        let buffers = Buffers {
            inputs: [
                q.as_ptr(),
                k.as_ptr(),
                v.as_ptr(),
                o.as_ptr(),
                grad.as_ptr(),
            ],
            ids,
            // The kernels only read it in the backward.
            lse: lse.as_ptr().cast_mut(),
            dsum: dsum.as_mut_ptr(),
            out: out.as_mut_ptr(),
        };
        for pass in geo.backward_passes(T::DTYPE.as_str(), std::mem::size_of::<A>()) {
            buffers.launch(geo, &pass)?;
        }
    }
    out.truncate(len);
    Ok(out)
}

/// Nothing to compute (no query row or a head of nothing), or an error for heads
/// the kernels do not take, as on a GPU.
fn empty(geo: &Geometry) -> Result<bool> {
    if geo.d > MAX_HEAD_DIM {
        bail!("heads of {} exceed the CUDA body's {MAX_HEAD_DIM}", geo.d)
    }
    Ok(geo.q_len() == 0 || geo.kv_len() == 0)
}

/// The kernels' buffers: q, k, v, o and dout; the ids; lse, dsum, the output.
struct Buffers<'a, T, A> {
    inputs: [*const T; 5],
    ids: Option<&'a [i64]>,
    lse: *mut A,
    dsum: *mut A,
    out: *mut T,
}

impl<T, A> Buffers<'_, T, A> {
    fn launch(&self, geo: &Geometry, pass: &Pass) -> Result<()> {
        let placeholder = [0i64];
        let ids = self.ids.unwrap_or(&placeholder).as_ptr();
        let args = geo.kernel_args(self.ids.is_some())?;
        let [q, k, v, o, dout] = &self.inputs;
        let args = Args::new()
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(o)
            .arg(dout)
            .arg(&ids)
            .arg(&self.lse)
            .arg(&self.dsum)
            .arg(&self.out)
            .arg(&args);
        // SAFETY: the arguments of kernels/attention.cu's entry points, as
        // attention/cuda.rs passes them: q, k, v, o and dout of the geometry's
        // lengths, ids [b, t] (or one unread), lse and dsum of a value per query
        // row, the output of the kernel's length.
        unsafe { launch(pass, args) }
    }
}
