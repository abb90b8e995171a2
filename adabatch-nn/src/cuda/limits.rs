//! How many threads each kernel of `kernels/` is launched with: the launchers
//! (the cudarc one and the CPU harness's) take their blocks from here, and
//! `build.rs` checks ptxas's register and shared-memory report against them, so
//! a kernel that could not launch is a build error. Plain constants: `build.rs`
//! includes this file.

/// The most threads a row kernel's block has: one per element up to this.
pub(crate) const ROW_THREADS_MAX: u32 = 1024;

/// Threads of a column pass's block (one thread per column).
pub(crate) const COLUMN_THREADS: u32 = 256;

/// Threads of an attention kernel's block: 4 warps (`WARPS` of
/// `kernels/attention.cu`, its `__launch_bounds__`).
pub(crate) const ATTENTION_THREADS: u32 = 128;

/// Threads of AdamW's blocks.
pub(crate) const ADAMW_THREADS: u32 = 256;

/// Registers of one block, on every GPU from compute capability 5.0 to 9.0.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const REGISTERS_PER_BLOCK: u32 = 65_536;

/// Static shared memory a block may declare (`build.rs` reads it).
#[allow(dead_code)]
pub(crate) const STATIC_SHARED_BYTES: u32 = 48 * 1024;

/// The most threads per block the launchers give the entry point `name`
/// (`adabatch_<kernel>_<dtype>`), or `None` for a name no launcher knows.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn max_threads(name: &str) -> Option<u32> {
    let kernel = name.strip_prefix("adabatch_")?;
    if kernel.starts_with("adamw_") {
        Some(ADAMW_THREADS)
    } else if kernel.starts_with("attention_") {
        Some(ATTENTION_THREADS)
    } else if kernel.contains("_cols_") {
        Some(COLUMN_THREADS)
    } else {
        Some(ROW_THREADS_MAX)
    }
}

/// Registers a block of `threads` threads takes at `per_thread` registers each:
/// allocated per warp in units of 256, so per thread in units of 8.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn block_registers(per_thread: u32, threads: u32) -> u32 {
    per_thread.div_ceil(8) * 8 * threads.div_ceil(32) * 32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::layout::Geometry;
    use crate::cuda::kernel::CudaKernel;
    use crate::optim::AdamWStep;

    #[test]
    fn every_launch_stays_within_the_block_build_rs_checks() {
        let mut passes = Vec::new();
        for n in [1, 33, 1024, 1025, 5000] {
            let kernel = CudaKernel::rows_then_columns("rms_norm_bwd", 1e-5, 1);
            passes.extend(kernel.launch((3, n), "f32").unwrap().unwrap().passes);
            passes.push(AdamWStep::pass(n * 1000));
        }
        for d in [8, 64, 200, 256] {
            let geo = Geometry {
                kv: 2,
                b: 3,
                g: 2,
                t: 100,
                d,
                window: 100,
                scale: 0.1,
            };
            passes.push(geo.forward_pass("bf16", 4));
            passes.extend(geo.backward_passes("f64", 8));
        }
        for pass in passes {
            let threads = pass.block.0 * pass.block.1 * pass.block.2;
            let most = max_threads(&pass.entry).expect("a known kernel");
            assert!(threads <= most, "{pass:?}: {threads} threads > {most}");
        }
        assert_eq!(
            max_threads("adabatch_rms_norm_bwd_cols_f32"),
            Some(COLUMN_THREADS)
        );
        assert_eq!(max_threads("something_else"), None);
    }

    #[test]
    fn registers_are_counted_as_a_gpu_allocates_them() {
        // 64 registers fill a block of 1,024 threads; 65 round up to 72.
        assert_eq!(block_registers(64, 1024), REGISTERS_PER_BLOCK);
        assert!(block_registers(65, 1024) > REGISTERS_PER_BLOCK);
        // A partial warp takes a whole warp's registers.
        assert_eq!(block_registers(8, 33), 8 * 64);
    }
}
