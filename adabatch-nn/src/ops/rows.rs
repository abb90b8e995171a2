//! The frame the fused row-wise ops share. An op states its name, its CPU body and
//! its backward ([`RowOp`]); the frame checks its inputs, picks the type the body
//! computes in, and makes it the candle custom op of its arity ([`Apply`]). Which
//! device runs which body is decided here alone ([`runs_fused`]): an op's CUDA body
//! is the kernel its [`RowOp::cuda`] names, launched from the custom ops'
//! `cuda_fwd` by `crate::cuda`.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU8, Ordering};

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, Device, Error, Layout, Result, Shape, Tensor,
    WithDType, bail,
};

use super::cpu::Acc;
pub(crate) use crate::cuda::kernel::{CudaKernel, RopeArgs};
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;

/// Whether `op` runs fused on `device`; elsewhere it falls back to its composite
/// of candle ops, which candle differentiates. On CUDA an op runs fused when it
/// has a CUDA body and those are switched on ([`cuda_bodies_enabled`]).
pub(crate) fn runs_fused<K: RowOp<N>, const N: usize>(op: &K, device: &Device) -> bool {
    fused_on(device, op.cuda().is_some())
}

/// Whether a fused op runs fused on `device`: always on CPU, on CUDA when it has a
/// CUDA body (`has_cuda_body`) and those are switched on, never elsewhere.
pub(crate) fn fused_on(device: &Device, has_cuda_body: bool) -> bool {
    match device {
        Device::Cpu => true,
        Device::Cuda(_) => cfg!(feature = "cuda") && has_cuda_body && cuda_bodies_enabled(),
        _ => false,
    }
}

/// Whether the CUDA bodies run: off until switched on, by
/// [`set_cuda_bodies`] or `ADABATCH_CUDA_KERNELS=1` in the environment, until a
/// GPU has checked them against their CPU twins (`gpu_check kernels`): a kernel
/// that was never run must not change what a user's model computes.
pub fn cuda_bodies_enabled() -> bool {
    match CUDA_BODIES.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let on = std::env::var("ADABATCH_CUDA_KERNELS").is_ok_and(|v| v == "1");
            // A concurrent `set_cuda_bodies` wins over the environment.
            let _ = CUDA_BODIES.compare_exchange(
                UNSET,
                if on { ON } else { OFF },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            CUDA_BODIES.load(Ordering::Relaxed) == ON
        }
    }
}

/// Switches the fused ops' CUDA bodies on or off for the whole process (ops built
/// before keep the body they chose).
pub fn set_cuda_bodies(on: bool) {
    CUDA_BODIES.store(if on { ON } else { OFF }, Ordering::Relaxed);
}

const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static CUDA_BODIES: AtomicU8 = AtomicU8::new(UNSET);

/// A fused op of `N` inputs over the rows of its first one.
pub(crate) trait RowOp<const N: usize>: Send + Sync + 'static {
    /// Its name in candle's graph, and the prefix of its errors.
    fn name(&self) -> &'static str;

    /// The output's shape, from the first input's dims: by default those dims.
    fn shape(&self, dims: &[usize]) -> Shape {
        Shape::from(dims)
    }

    /// The output on CPU, computed in `A`: `f32` for bf16, f16 and f32 inputs (as
    /// candle-nn's kernels do), `f64` for f64 ones.
    fn cpu<T: WithDType, A: Acc>(&self, inputs: &CpuInputs<'_, T>) -> Result<Vec<T>>;

    /// Its CUDA body, if it has one.
    fn cuda(&self) -> Option<CudaKernel> {
        None
    }

    /// The CUDA body's arguments that depend on the inputs' dims (a rope's
    /// geometry): by default none.
    #[cfg_attr(not(any(feature = "cuda", test)), allow(dead_code))]
    fn cuda_for(&self, kernel: CudaKernel, _dims: &[&[usize]]) -> Result<CudaKernel> {
        Ok(kernel)
    }

    /// The inputs' gradients from the output's: none for the backward ops, which
    /// are applied without a backward of their own.
    fn backward(
        &self,
        _inputs: [&Tensor; N],
        _output: &Tensor,
        _grad: &Tensor,
    ) -> Result<[Option<Tensor>; N]> {
        Err(Error::BackwardNotSupported { op: self.name() })
    }
}

/// Runs a [`RowOp`] on tensors, made contiguous first, as a candle op.
pub(crate) trait Apply<const N: usize> {
    /// Differentiable, through [`RowOp::backward`].
    fn apply(self, inputs: [&Tensor; N]) -> Result<Tensor>;
    /// Not differentiable: for the backward ops.
    fn apply_no_bwd(self, inputs: [&Tensor; N]) -> Result<Tensor>;
}

impl<K: RowOp<1>> Apply<1> for K {
    fn apply(self, [a]: [&Tensor; 1]) -> Result<Tensor> {
        a.contiguous()?.apply_op1(Fused(self))
    }
    fn apply_no_bwd(self, [a]: [&Tensor; 1]) -> Result<Tensor> {
        a.contiguous()?.apply_op1_no_bwd(&Fused(self))
    }
}

impl<K: RowOp<2>> Apply<2> for K {
    fn apply(self, [a, b]: [&Tensor; 2]) -> Result<Tensor> {
        a.contiguous()?.apply_op2(&b.contiguous()?, Fused(self))
    }
    fn apply_no_bwd(self, [a, b]: [&Tensor; 2]) -> Result<Tensor> {
        a.contiguous()?
            .apply_op2_no_bwd(&b.contiguous()?, &Fused(self))
    }
}

impl<K: RowOp<3>> Apply<3> for K {
    fn apply(self, [a, b, c]: [&Tensor; 3]) -> Result<Tensor> {
        a.contiguous()?
            .apply_op3(&b.contiguous()?, &c.contiguous()?, Fused(self))
    }
    fn apply_no_bwd(self, [a, b, c]: [&Tensor; 3]) -> Result<Tensor> {
        a.contiguous()?
            .apply_op3_no_bwd(&b.contiguous()?, &c.contiguous()?, &Fused(self))
    }
}

/// A [`RowOp`] as the candle custom op of its arity.
struct Fused<K>(K);

impl<K: RowOp<1>> CustomOp1 for Fused<K> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_forward(&self.0, &[(s1, l1)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s1: &CudaStorage, l1: &Layout) -> Result<(CudaStorage, Shape)> {
        cuda_forward(&self.0, &[(s1, l1)])
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let [d1] = self.0.backward([arg], res, grad)?;
        Ok(d1)
    }
}

impl<K: RowOp<2>> CustomOp2 for Fused<K> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_forward(&self.0, &[(s1, l1), (s2, l2)])
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        cuda_forward(&self.0, &[(s1, l1), (s2, l2)])
    }

    fn bwd(
        &self,
        arg1: &Tensor,
        arg2: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let [d1, d2] = self.0.backward([arg1, arg2], res, grad)?;
        Ok((d1, d2))
    }
}

impl<K: RowOp<3>> CustomOp3 for Fused<K> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_forward(&self.0, &[(s1, l1), (s2, l2), (s3, l3)])
    }

    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        cuda_forward(&self.0, &[(s1, l1), (s2, l2), (s3, l3)])
    }

    fn bwd(
        &self,
        arg1: &Tensor,
        arg2: &Tensor,
        arg3: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let [d1, d2, d3] = self.0.backward([arg1, arg2, arg3], res, grad)?;
        Ok((d1, d2, d3))
    }
}

/// `op`'s CUDA body on the inputs (`cuda/launch.rs` launches the kernel it names).
#[cfg(feature = "cuda")]
fn cuda_forward<K: RowOp<N>, const N: usize>(
    op: &K,
    inputs: &[(&CudaStorage, &Layout)],
) -> Result<(CudaStorage, Shape)> {
    let (Some(kernel), Some((_, layout))) = (op.cuda(), inputs.first()) else {
        bail!("{}: no CUDA body, or no inputs", op.name())
    };
    let dims: Vec<&[usize]> = inputs.iter().map(|(_, l)| l.dims()).collect();
    let kernel = op.cuda_for(kernel, &dims)?;
    let shape = op.shape(layout.dims());
    let out = crate::cuda::launch(kernel, op.name(), rows_of(layout.dims()), &shape, inputs)?;
    Ok((out, shape))
}

/// The dtype dispatch of a row op: runs `op`'s CPU body in the type of the first
/// input.
fn cpu_forward<K: RowOp<N>, const N: usize>(
    op: &K,
    inputs: &[(&CpuStorage, &Layout)],
) -> Result<(CpuStorage, Shape)> {
    let Some(&(first, layout)) = inputs.first() else {
        bail!("{}: no inputs", op.name())
    };
    #[cfg(feature = "kernels-on-cpu")]
    if let Some(kernel) = op.cuda().filter(|_| crate::cuda::harness::kernels_on_cpu()) {
        let dims: Vec<&[usize]> = inputs.iter().map(|(_, l)| l.dims()).collect();
        let shape = op.shape(layout.dims());
        let body = HarnessBody {
            name: op.name(),
            kernel: op.cuda_for(kernel, &dims)?,
            inputs,
            out_len: shape.elem_count(),
        };
        return Ok((on_cpu(op.name(), first, &body)?, shape));
    }
    let out = on_cpu(op.name(), first, &RowBody { op, inputs })?;
    Ok((out, op.shape(layout.dims())))
}

/// A row op's CUDA body on CPU tensors, through the kernels' harness: the launch
/// `crate::cuda`'s launcher makes on a GPU, the output allocated as NaNs (a
/// device allocation is not cleared: what no kernel writes shows).
#[cfg(feature = "kernels-on-cpu")]
struct HarnessBody<'a> {
    name: &'static str,
    kernel: CudaKernel,
    inputs: &'a [(&'a CpuStorage, &'a Layout)],
    out_len: usize,
}

#[cfg(feature = "kernels-on-cpu")]
impl CpuBody for HarnessBody<'_> {
    type Output = CpuStorage;

    fn run<T: WithDType, A: Acc + WithDType>(&self) -> Result<CpuStorage> {
        use crate::cuda::harness::{Args, launch};
        let inputs = CpuInputs::<T>::new(self.name, self.inputs);
        let ptrs = (0..self.inputs.len())
            .map(|i| inputs.address(i))
            .collect::<Result<Vec<_>>>()?;
        let Some(plan) = self.kernel.launch(inputs.rows(), T::DTYPE.as_str())? else {
            return Ok(T::to_cpu_storage_owned(vec![
                T::from_f64(0.0);
                self.out_len
            ]));
        };
        let mut out = vec![T::from_f64(f64::NAN); self.out_len.max(1)];
        let mut stats = vec![A::from_f64(0.0); plan.stats_len];
        let (out_ptr, stats_ptr) = (out.as_mut_ptr(), stats.as_mut_ptr());
        let (in1, in2) = (
            ptrs.get(1).unwrap_or(&ptrs[0]),
            ptrs.get(2).unwrap_or(&ptrs[0]),
        );
        for pass in &plan.passes {
            let args = Args::new()
                .arg(&ptrs[0])
                .arg(in1)
                .arg(in2)
                .arg(&out_ptr)
                .arg(&stats_ptr)
                .arg(&plan.args);
            // SAFETY: the arguments of kernels/rows.cu's entry points, as the cudarc
            // launcher passes them: inputs of the rows (or of `n`), an output of
            // `out_len`, statistics of `stats_len`.
            unsafe { launch(pass, args)? };
        }
        out.truncate(self.out_len);
        Ok(T::to_cpu_storage_owned(out))
    }
}

/// A row op's CPU body on its inputs, as a [`CpuBody`].
struct RowBody<'a, K, const N: usize> {
    op: &'a K,
    inputs: &'a [(&'a CpuStorage, &'a Layout)],
}

impl<K: RowOp<N>, const N: usize> CpuBody for RowBody<'_, K, N> {
    type Output = CpuStorage;

    fn run<T: WithDType, A: Acc + WithDType>(&self) -> Result<CpuStorage> {
        let inputs = CpuInputs::new(self.op.name(), self.inputs);
        Ok(T::to_cpu_storage_owned(self.op.cpu::<T, A>(&inputs)?))
    }
}

/// A fused op's CPU body, generic in its element type `T` and the type `A` it
/// computes in.
pub(crate) trait CpuBody {
    /// What it returns.
    type Output;
    /// The body in `T`, computing in `A`.
    fn run<T: WithDType, A: Acc + WithDType>(&self) -> Result<Self::Output>;
}

/// Runs `body` in the dtype of `first`, computing in `f32` for bf16, f16 and f32
/// (as candle-nn's kernels do), in `f64` for f64; other dtypes are an error of
/// the op `name`.
pub(crate) fn on_cpu<B: CpuBody>(name: &str, first: &CpuStorage, body: &B) -> Result<B::Output> {
    // `_first` only names `T`.
    fn run<B: CpuBody, T: WithDType, A: Acc + WithDType>(
        body: &B,
        _first: &[T],
    ) -> Result<B::Output> {
        body.run::<T, A>()
    }
    match first {
        CpuStorage::BF16(s) => run::<B, _, f32>(body, s),
        CpuStorage::F16(s) => run::<B, _, f32>(body, s),
        CpuStorage::F32(s) => run::<B, _, f32>(body, s),
        CpuStorage::F64(s) => run::<B, _, f64>(body, s),
        other => bail!("{name}: unsupported dtype {:?}", other.dtype()),
    }
}

/// A CPU body's inputs: each is checked to be contiguous, and a float one to be of
/// the first input's dtype `T`, as the body takes it.
pub(crate) struct CpuInputs<'a, T> {
    name: &'static str,
    inputs: &'a [(&'a CpuStorage, &'a Layout)],
    dtype: PhantomData<T>,
}

impl<'a, T: WithDType> CpuInputs<'a, T> {
    /// The inputs of the op `name`, as its body of `T` takes them.
    pub(crate) fn new(name: &'static str, inputs: &'a [(&'a CpuStorage, &'a Layout)]) -> Self {
        Self {
            name,
            inputs,
            dtype: PhantomData,
        }
    }

    /// The first input's dims.
    pub(crate) fn dims(&self) -> &'a [usize] {
        self.inputs.first().map_or(&[], |(_, layout)| layout.dims())
    }

    /// The first input's rows: how many, and their length (its last dim).
    pub(crate) fn rows(&self) -> (usize, usize) {
        rows_of(self.dims())
    }

    /// The first `K` inputs, as slices of `T`.
    pub(crate) fn floats<const K: usize>(&self) -> Result<[&'a [T]; K]> {
        let mut floats = [&[] as &[T]; K];
        for (i, slot) in floats.iter_mut().enumerate() {
            *slot = self.float(i)?;
        }
        Ok(floats)
    }

    /// Input `i`, of `T`.
    fn float(&self, i: usize) -> Result<&'a [T]> {
        let storage = self.input(i)?;
        if storage.dtype() != T::DTYPE {
            bail!(
                "{}: input {i} is {:?}, input 0 is {:?}",
                self.name,
                storage.dtype(),
                T::DTYPE
            )
        }
        Ok(&T::cpu_storage_as_slice(storage)?[self.offsets(i)?])
    }

    /// Input `i`, of i64 indices.
    pub(crate) fn indices(&self, i: usize) -> Result<&'a [i64]> {
        let CpuStorage::I64(all) = self.input(i)? else {
            bail!("{}: input {i} has to be i64", self.name)
        };
        Ok(&all[self.offsets(i)?])
    }

    /// Where input `i`'s elements start, of `T` or of i64 indices, for a kernel.
    #[cfg(feature = "kernels-on-cpu")]
    pub(crate) fn address(&self, i: usize) -> Result<*const std::ffi::c_void> {
        match self.input(i)? {
            CpuStorage::I64(_) => Ok(self.indices(i)?.as_ptr().cast()),
            _ => Ok(self.float(i)?.as_ptr().cast()),
        }
    }

    fn input(&self, i: usize) -> Result<&'a CpuStorage> {
        match self.inputs.get(i) {
            Some((storage, _)) => Ok(storage),
            None => bail!("{}: there is no input {i}", self.name),
        }
    }

    /// Where contiguous input `i` lies in its storage.
    fn offsets(&self, i: usize) -> Result<std::ops::Range<usize>> {
        match self.inputs.get(i).and_then(|(_, l)| l.contiguous_offsets()) {
            Some((start, end)) => Ok(start..end),
            None => bail!("{}: input {i} has to be contiguous", self.name),
        }
    }
}

/// How many rows of the last dim `dims` holds, and its length; rows of nothing
/// count as none, so that a body never reads an empty row.
fn rows_of(dims: &[usize]) -> (usize, usize) {
    let n = dims.last().copied().unwrap_or(1);
    let count: usize = dims.iter().product();
    (count.checked_div(n).unwrap_or(0), n)
}

/// The shape of a backward's output that holds the gradient of an `x` of `dims`
/// and of `params` parameters of its last dim: `[rows + params, n]`, taken apart by
/// [`split_grads`].
pub(crate) fn grads_shape(dims: &[usize], params: usize) -> Shape {
    let (rows, n) = rows_of(dims);
    Shape::from((rows + params, n))
}

/// A backward's output `[rows + M - 1, n]`, the rows of the gradient of `x` then
/// one summed row per parameter, as those `M` gradients (`x`'s shaped like it).
pub(crate) fn split_grads<const M: usize>(grads: &Tensor, x: &Tensor) -> Result<[Tensor; M]> {
    let total = grads.dim(0)?;
    let Some(rows) = (total + 1).checked_sub(M) else {
        bail!("a backward's output of {total} rows has no room for {M} gradients")
    };
    let mut parts = vec![grads.narrow(0, 0, rows)?.reshape(x.shape())?];
    for i in rows..total {
        parts.push(grads.get(i)?);
    }
    parts
        .try_into()
        .map_err(|_| Error::Msg(format!("a backward's output holds no {M} gradients")))
}

/// `grads` where their input needs one, `None` for the others.
pub(crate) fn where_tracked<const N: usize>(
    inputs: [&Tensor; N],
    grads: [Tensor; N],
) -> [Option<Tensor>; N] {
    let mut grads = grads.into_iter();
    inputs.map(|input| grads.next().filter(|_| input.track_op()))
}

/// Checks that `kernel` names entry points `kernels/rows.cu` defines, for every
/// dtype: a misspelt name would fail only on a GPU.
#[cfg(test)]
pub(crate) fn assert_kernel_exists(kernel: CudaKernel) {
    let mut names = vec![kernel.name.to_string()];
    if kernel.column_pass {
        names.push(format!("{}_cols", kernel.name));
    }
    let mut needles: Vec<String> = names
        .iter()
        .map(|name| format!("ENTRY({name}, SUFFIX, T,"))
        .collect();
    needles.extend(DTYPE_INSTANCES.map(|i| format!("ROW_KERNELS{i}")));
    assert_defines("rows.cu", include_str!("../../kernels/rows.cu"), &needles);
}

/// How the `.cu` files instantiate their kernels for each dtype: `(C type, suffix)`.
#[cfg(test)]
pub(crate) const DTYPE_INSTANCES: [&str; 4] = [
    "(float, f32)",
    "(double, f64)",
    "(__half, f16)",
    "(__nv_bfloat16, bf16)",
];

/// Checks that `source` (of `kernels/<file>`) holds each of `needles`: the macro
/// lines that define and instantiate the entry points a launcher names.
#[cfg(test)]
pub(crate) fn assert_defines(file: &str, source: &str, needles: &[String]) {
    for needle in needles {
        assert!(
            source.contains(needle.as_str()),
            "kernels/{file} has no {needle}"
        );
    }
}
