//! The fused ops' CUDA bodies: `kernels/*.cu`, each compiled by `build.rs` into a
//! fatbin (SASS for the build's GPU, PTX beside it) and loaded once per device
//! ([`function`]); the row ops' kernels (`kernels/rows.cu`) are launched here, one
//! block per row. Every kernel has one signature, `(in0, in1, in2,
//! out, stats, args)`, so this one launcher serves them all; an input of indices
//! (i64) is passed where the kernel reads one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaModule, CudaView, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::cuda_backend::{
    CudaDType, CudaDevice, CudaStorage, CudaStorageSlice, DeviceId, WrapErr,
};
use candle_core::{Layout, Result, Shape, bail};

use super::kernel::{CudaKernel, RowArgs};

/// `kernel` of the op `name` on CUDA, in the first input's dtype, over `rows`
/// rows of `n`, its output of `shape`.
pub(crate) fn launch(
    kernel: CudaKernel,
    name: &'static str,
    rows: (usize, usize),
    shape: &Shape,
    inputs: &[(&CudaStorage, &Layout)],
) -> Result<CudaStorage> {
    let Some(&(first, _)) = inputs.first() else {
        bail!("{name}: no inputs")
    };
    let launch = Launch {
        kernel,
        name,
        rows,
        out_len: shape.elem_count(),
    };
    match &first.slice {
        CudaStorageSlice::F32(_) => launch.run::<f32, f32>("f32", inputs),
        CudaStorageSlice::F64(_) => launch.run::<f64, f64>("f64", inputs),
        CudaStorageSlice::F16(_) => launch.run::<half::f16, f32>("f16", inputs),
        CudaStorageSlice::BF16(_) => launch.run::<half::bf16, f32>("bf16", inputs),
        _ => bail!("{name}: unsupported dtype {:?}", first.dtype()),
    }
}

// SAFETY: a plain `repr(C)` struct of integers and a float, laid out as the
// kernels' `RowArgs`, passed by value.
unsafe impl DeviceRepr for RowArgs {}

/// One op's launch: its kernel, its rows and the length of its output.
struct Launch {
    kernel: CudaKernel,
    name: &'static str,
    rows: (usize, usize),
    out_len: usize,
}

impl Launch {
    /// Runs the kernel in `T`, its per-row statistics in the accumulation type `A`.
    fn run<T, A>(&self, suffix: &str, inputs: &[(&CudaStorage, &Layout)]) -> Result<CudaStorage>
    where
        T: CudaDType + DeviceRepr + ValidAsZeroBits,
        A: DeviceRepr + ValidAsZeroBits,
    {
        let device = inputs[0].0.device().clone();
        let views = inputs
            .iter()
            .enumerate()
            .map(|(i, (storage, layout))| self.view::<T>(i, storage, layout))
            .collect::<Result<Vec<_>>>()?;

        let Some(plan) = self.kernel.launch(self.rows, suffix)? else {
            // No rows: the parameters' summed gradients (if any) are zeros.
            let zeros = device.alloc_zeros::<T>(self.out_len.max(1))?;
            return Ok(T::wrap_cuda_slice(zeros, device));
        };
        // SAFETY: every element is written by the kernels below (the row kernel
        // writes each row's outputs, the column pass the summed rows).
        let mut out = unsafe { device.alloc::<T>(self.out_len.max(1))? };
        let mut stats = device.alloc_zeros::<A>(plan.stats_len)?;
        let (in1, in2) = (
            views.get(1).unwrap_or(&views[0]),
            views.get(2).unwrap_or(&views[0]),
        );
        for pass in &plan.passes {
            let function = function(&device, Module::Rows, &pass.entry)?;
            let stream = device.cuda_stream();
            let mut builder = stream.launch_builder(&function);
            for input in [&views[0], in1, in2] {
                input.push(&mut builder);
            }
            builder.arg(&mut out).arg(&mut stats).arg(&plan.args);
            let config = LaunchConfig {
                grid_dim: pass.grid,
                block_dim: pass.block,
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match the kernel's signature (kernels/rows.cu):
            // three inputs of `rows × n` (or `n`) elements of T, an output of
            // `out_len`, and `stats_per_row` A's per row.
            unsafe { builder.launch(config) }.w()?;
        }
        Ok(T::wrap_cuda_slice(out, device))
    }

    /// Input `i`'s elements, contiguous, as the kernel reads them: of the first
    /// input's dtype, or indices.
    fn view<'a, T: CudaDType>(
        &self,
        i: usize,
        storage: &'a CudaStorage,
        layout: &Layout,
    ) -> Result<Input<'a, T>> {
        match &storage.slice {
            CudaStorageSlice::I64(_) => Ok(Input::Indices(indices(self.name, i, storage, layout)?)),
            _ => Ok(Input::Values(values(self.name, i, storage, layout)?)),
        }
    }
}

/// Input `i` of the op `name`: its elements of `T`, contiguous.
pub(crate) fn values<'a, T: CudaDType>(
    name: &str,
    i: usize,
    storage: &'a CudaStorage,
    layout: &Layout,
) -> Result<CudaView<'a, T>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("{name}: input {i} has to be contiguous")
    };
    match T::as_cuda_slice(storage) {
        Ok(slice) => Ok(slice.slice(start..end)),
        Err(_) => bail!(
            "{name}: input {i} is {:?}, not the op's dtype",
            storage.dtype()
        ),
    }
}

/// Input `i` of the op `name`: its i64 indices, contiguous.
pub(crate) fn indices<'a>(
    name: &str,
    i: usize,
    storage: &'a CudaStorage,
    layout: &Layout,
) -> Result<CudaView<'a, i64>> {
    match (&storage.slice, layout.contiguous_offsets()) {
        (CudaStorageSlice::I64(indices), Some((start, end))) => Ok(indices.slice(start..end)),
        _ => bail!("{name}: input {i} has to be contiguous i64"),
    }
}

/// A kernel's input: values of the op's dtype, or indices.
enum Input<'a, T> {
    Values(CudaView<'a, T>),
    Indices(CudaView<'a, i64>),
}

impl<'a, T> Input<'a, T> {
    /// Pushes the input's device pointer as the next argument.
    fn push<'b, 'c>(&'a self, builder: &'b mut LaunchArgs<'c>) -> &'b mut LaunchArgs<'c>
    where
        'a: 'c,
    {
        match self {
            Input::Values(view) => builder.arg(view),
            Input::Indices(view) => builder.arg(view),
        }
    }
}

/// A compiled kernel file of `kernels/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Module {
    Rows,
    AdamW,
    Attention,
}

impl Module {
    fn fatbin(self) -> &'static [u8] {
        match self {
            Module::Rows => include_bytes!(concat!(env!("OUT_DIR"), "/rows.fatbin")),
            Module::AdamW => include_bytes!(concat!(env!("OUT_DIR"), "/adamw.fatbin")),
            Module::Attention => include_bytes!(concat!(env!("OUT_DIR"), "/attention.fatbin")),
        }
    }
}

/// `name` of `module` on `device`, the module loaded on first use.
pub(crate) fn function(device: &CudaDevice, module: Module, name: &str) -> Result<CudaFunction> {
    type Loaded = HashMap<(DeviceId, Module), Arc<CudaModule>>;
    static MODULES: OnceLock<Mutex<Loaded>> = OnceLock::new();
    let key = (device.id(), module);
    let mut modules = MODULES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let loaded = match modules.get(&key) {
        Some(loaded) => loaded.clone(),
        None => {
            let stream = device.cuda_stream();
            let loaded = stream
                .context()
                .load_module(Ptx::from_binary(module.fatbin().to_vec()))
                .w()?;
            modules.insert(key, loaded.clone());
            loaded
        }
    };
    loaded.load_function(name).w()
}
