//! Device memory figures: free / total bytes of a GPU, and the peak memory of a
//! step.
//!
//! What is measured, on CUDA:
//! - [`memory_info`]: `cuMemGetInfo` for the device's context — memory free on the
//!   whole GPU, as the driver sees it (other processes included).
//! - [`PeakSampler`]: the high-water mark of the device's current memory pool
//!   (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`). candle allocates its tensors with
//!   `cuMemAllocAsync` from that pool, so this is the peak of the bytes held by
//!   tensors between [`PeakSampler::start`] and [`PeakSampler::finish`]. It does
//!   not include the CUDA context, loaded kernels, cuBLAS workspaces or NCCL
//!   buffers (allocated outside the pool); the `used_*` figures from
//!   `cuMemGetInfo` do, but they are samples, not peaks. Where the pool is not
//!   available (a device without stream-ordered allocation) the peak is `None`.
//!
//! On CPU every figure is `None`.

use candle_core::Device;

/// Free and total memory of a device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryInfo {
    /// Bytes free on the device.
    pub free_bytes: u64,
    /// Bytes the device has.
    pub total_bytes: u64,
}

impl MemoryInfo {
    /// `total - free`: everything in use on the device (every process).
    pub fn used_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.free_bytes)
    }
}

/// Free / total memory of `device`; `None` on CPU, or when the driver call fails.
pub fn memory_info(device: &Device) -> Option<MemoryInfo> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(dev) => cuda::memory_info(dev),
        _ => None,
    }
}

/// Memory of one measured section (a step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct StepMemory {
    /// Device-wide used bytes (`total - free`) when the section started.
    pub used_before: Option<u64>,
    /// Device-wide used bytes when it ended.
    pub used_after: Option<u64>,
    /// Peak bytes held in the memory pool during the section (tensors).
    pub pool_peak: Option<u64>,
    /// Bytes held in the pool when it ended.
    pub pool_current: Option<u64>,
}

/// Samples memory around a section: `let s = PeakSampler::start(&dev); ...; s.finish()`.
///
/// `finish` synchronises the device first, so the figures include the section's
/// queued kernels.
#[derive(Debug)]
pub struct PeakSampler {
    device: Device,
    used_before: Option<u64>,
}

impl PeakSampler {
    /// Resets the pool's high-water mark and records the used memory.
    pub fn start(device: &Device) -> Self {
        let _ = device.synchronize();
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            cuda::reset_pool_peak(dev);
        }
        Self {
            device: device.clone(),
            used_before: memory_info(device).map(|m| m.used_bytes()),
        }
    }

    /// Ends the section.
    pub fn finish(self) -> StepMemory {
        let _ = self.device.synchronize();
        #[allow(unused_mut)]
        let mut out = StepMemory {
            used_before: self.used_before,
            used_after: memory_info(&self.device).map(|m| m.used_bytes()),
            pool_peak: None,
            pool_current: None,
        };
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = &self.device {
            (out.pool_peak, out.pool_current) = cuda::pool_usage(dev);
        }
        out
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::CudaDevice;

    use super::MemoryInfo;

    pub(super) fn memory_info(dev: &CudaDevice) -> Option<MemoryInfo> {
        let (free, total) = dev.cuda_stream().context().mem_get_info().ok()?;
        Some(MemoryInfo {
            free_bytes: free as u64,
            total_bytes: total as u64,
        })
    }

    /// The pool `cuMemAllocAsync` draws from on this device.
    fn pool(dev: &CudaDevice) -> Option<sys::CUmemoryPool> {
        let stream = dev.cuda_stream();
        let ctx = stream.context();
        ctx.bind_to_thread().ok()?;
        if !ctx.has_async_alloc() {
            return None;
        }
        let mut pool = std::ptr::null_mut();
        // SAFETY: a valid device handle from a live context, and an out pointer.
        unsafe { sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()) }
            .result()
            .ok()?;
        (!pool.is_null()).then_some(pool)
    }

    fn attribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Option<u64> {
        let mut value: u64 = 0;
        // SAFETY: these attributes are `cuuint64_t`; `value` outlives the call.
        unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) }
            .result()
            .ok()?;
        Some(value)
    }

    pub(super) fn reset_pool_peak(dev: &CudaDevice) {
        if let Some(pool) = pool(dev) {
            // Keep freed memory in the pool: with the default threshold of 0 every
            // synchronisation (each step reads its loss) returns it to the driver.
            let mut keep: u64 = u64::MAX;
            // SAFETY: RELEASE_THRESHOLD is a `cuuint64_t`; `keep` outlives the call.
            let _ = unsafe {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut keep as *mut u64).cast(),
                )
            };
            let mut zero: u64 = 0;
            // SAFETY: USED_MEM_HIGH may only be set to 0 (a reset); `zero` outlives the call.
            let _ = unsafe {
                sys::cuMemPoolSetAttribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                )
            };
        }
    }

    pub(super) fn pool_usage(dev: &CudaDevice) -> (Option<u64>, Option<u64>) {
        match pool(dev) {
            Some(pool) => (
                attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                ),
                attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                ),
            ),
            None => (None, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_has_no_figures() {
        assert_eq!(memory_info(&Device::Cpu), None);
        let sampler = PeakSampler::start(&Device::Cpu);
        assert_eq!(sampler.finish(), StepMemory::default());
        let m = MemoryInfo {
            free_bytes: 30,
            total_bytes: 100,
        };
        assert_eq!(m.used_bytes(), 70);
    }
}
