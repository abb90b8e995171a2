//! AdamW's moments on a CUDA device and the one-kernel update
//! (`kernels/adamw.cu`) of the parameter beside them.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, CudaStorageSlice, WrapErr};
use candle_core::{Device, Layout, Result, Shape, Tensor, bail};

use super::adamw::AdamWStep;
use crate::cuda::{Module, function};

/// One f32 parameter's moments on its CUDA device.
#[derive(Debug)]
pub struct CudaMoments {
    device: CudaDevice,
    m: CudaSlice<f32>,
    v: CudaSlice<f32>,
}

impl CudaMoments {
    /// Zero moments for a parameter of `len` elements on `device`.
    pub fn zeros(device: &CudaDevice, len: usize) -> Result<Self> {
        Ok(Self {
            device: device.clone(),
            m: device.alloc_zeros::<f32>(len.max(1))?,
            v: device.alloc_zeros::<f32>(len.max(1))?,
        })
    }

    /// The moments as tensors of `shape` on their device (for a checkpoint).
    pub fn to_tensors(&self, shape: &Shape) -> Result<(Tensor, Tensor)> {
        let n = shape.elem_count();
        let device = Device::Cuda(self.device.clone());
        let read = |slice: &CudaSlice<f32>| -> Result<Tensor> {
            let values = self.device.clone_dtoh(&slice.slice(..n))?;
            Tensor::from_vec(values, shape, &device)
        };
        Ok((read(&self.m)?, read(&self.v)?))
    }

    /// Sets the moments from tensors of the parameter's length (a resume).
    pub fn set(&mut self, m: &Tensor, v: &Tensor) -> Result<()> {
        for (slice, tensor) in [(&mut self.m, m), (&mut self.v, v)] {
            let values = tensor
                .flatten_all()?
                .to_dtype(candle_core::DType::F32)?
                .to_vec1::<f32>()?;
            if values.len() > slice.len() {
                bail!(
                    "AdamW moments of {} values for a parameter of {}",
                    values.len(),
                    slice.len()
                )
            }
            self.device
                .memcpy_htod(values.as_slice(), &mut slice.slice_mut(..values.len()))?;
        }
        Ok(())
    }

    /// One update of `theta` (f32, contiguous) from `grad`, in place.
    pub fn update(
        &mut self,
        theta: &mut CudaStorage,
        theta_layout: &Layout,
        grad: &CudaStorage,
        grad_layout: &Layout,
        step: AdamWStep,
    ) -> Result<()> {
        let (Some((t0, t1)), Some((g0, g1))) = (
            theta_layout.contiguous_offsets(),
            grad_layout.contiguous_offsets(),
        ) else {
            bail!("adabatch AdamW: the fused step needs contiguous tensors")
        };
        let n = t1 - t0;
        if g1 - g0 != n || n > self.m.len() {
            bail!(
                "adabatch AdamW: a gradient of {} for a parameter of {n}",
                g1 - g0
            )
        }
        let device = theta.device().clone();
        let (CudaStorageSlice::F32(theta), CudaStorageSlice::F32(grad)) =
            (&mut theta.slice, &grad.slice)
        else {
            bail!("adabatch AdamW: the fused step needs f32 parameters and gradients")
        };
        if n == 0 {
            return Ok(());
        }
        let pass = AdamWStep::pass(n);
        let function = function(&device, Module::AdamW, &pass.entry)?;
        let (mut theta, grad) = (theta.slice_mut(t0..t1), grad.slice(g0..g1));
        let len = n as i64;
        let config = LaunchConfig {
            grid_dim: pass.grid,
            block_dim: pass.block,
            shared_mem_bytes: 0,
        };
        let stream = device.cuda_stream();
        let mut builder = stream.launch_builder(&function);
        builder
            .arg(&mut theta)
            .arg(&grad)
            .arg(&mut self.m)
            .arg(&mut self.v)
            .arg(&step)
            .arg(&len);
        // SAFETY: the arguments match `adabatch_adamw_f32` (kernels/adamw.cu):
        // theta, grad and both moments hold at least `n` f32s each.
        unsafe { builder.launch(config) }.w()?;
        Ok(())
    }
}
