//! The CUDA bodies on the CPU (feature `kernels-on-cpu`, test code): the kernels of
//! `kernels/*.cu`, unchanged, compiled by g++ against the harness of
//! `kernels/harness/` (the CUDA programming model on OS threads: what it models
//! and what it cannot see is said in `cuda_cpu.h`), launched here as cudarc
//! launches them on a GPU: an entry point by name, a grid, a block, and a pointer
//! to each argument.
//!
//! The ops' own entry points run them on CPU tensors while [`with_kernels_on_cpu`]
//! runs on the calling thread, so one test drives a CUDA body and its CPU twin.

use std::cell::Cell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::marker::PhantomData;

use candle_core::{Result, bail};

use super::kernel::Pass;

unsafe extern "C" {
    fn adabatch_harness_launch(
        name: *const c_char,
        grid: *const u32,
        block: *const u32,
        params: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn adabatch_harness_kernel_count() -> usize;
    fn adabatch_harness_kernel_name(i: usize) -> *const c_char;
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
}

/// Whether the fused ops called on this thread run their CUDA bodies through the
/// harness instead of their CPU bodies.
pub(crate) fn kernels_on_cpu() -> bool {
    ON.with(Cell::get)
}

/// Runs `f` with the fused ops' CUDA bodies on the CPU (on this thread only: tests
/// beside it keep their CPU bodies).
pub fn with_kernels_on_cpu<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ON.with(|on| on.set(self.0));
        }
    }
    let _restore = Restore(ON.with(|on| on.replace(true)));
    f()
}

/// Every entry point of `kernels/*.cu`, as the harness compiled them.
pub fn kernel_names() -> Vec<String> {
    // SAFETY: the harness's table is static; each name is a NUL-terminated string
    // literal, and the index stays below the count.
    unsafe {
        (0..adabatch_harness_kernel_count())
            .map(|i| {
                CStr::from_ptr(adabatch_harness_kernel_name(i))
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }
}

/// Appends `entry` (once per process) to the file `ADABATCH_KERNELS_LAUNCHED`
/// names, if any: `scripts/kernels-on-cpu.sh` checks that every entry point ran.
fn record_launched(entry: &str) {
    use std::collections::HashSet;
    use std::io::Write as _;
    use std::sync::Mutex;
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let Some(path) = std::env::var_os("ADABATCH_KERNELS_LAUNCHED") else {
        return;
    };
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(entry.to_string())
    {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        // A lost line fails the script's coverage check, which names the entry.
        let _ = file.and_then(|mut file| writeln!(file, "{entry}"));
    }
}

/// A launch's arguments as cuLaunchKernel takes them: a pointer to each value, in
/// the kernel's order. The values (device pointers, argument structs) outlive it.
pub(crate) struct Args<'a> {
    params: Vec<*mut c_void>,
    values: PhantomData<&'a ()>,
}

impl<'a> Args<'a> {
    pub(crate) fn new() -> Self {
        Self {
            params: Vec::new(),
            values: PhantomData,
        }
    }

    /// The next argument: `value` is what the kernel's parameter holds (a pointer,
    /// a struct passed by value).
    pub(crate) fn arg<V>(mut self, value: &'a V) -> Self {
        self.params.push(value as *const V as *mut c_void);
        self
    }
}

/// Runs `pass` through the harness with `args`; an error for an unknown entry
/// point, a launch no GPU would run, a divergent barrier, a deadlock or a stall.
///
/// # Safety
/// `args` must match the kernel's signature in `kernels/*.cu`, and every pointer
/// among them must address as many elements as the kernel reads or writes there,
/// as a GPU launch requires of device pointers.
pub(crate) unsafe fn launch(pass: &Pass, args: Args<'_>) -> Result<()> {
    let Args { mut params, .. } = args;
    record_launched(&pass.entry);
    let name = match CString::new(pass.entry.as_str()) {
        Ok(name) => name,
        Err(_) => bail!("kernel name {:?} holds a NUL", pass.entry),
    };
    let grid = [pass.grid.0, pass.grid.1, pass.grid.2];
    let block = [pass.block.0, pass.block.1, pass.block.2];
    let mut error = vec![0 as c_char; 4096];
    // SAFETY: the pointers are valid for the call; the arguments' validity is the
    // caller's contract.
    let status = unsafe {
        adabatch_harness_launch(
            name.as_ptr(),
            grid.as_ptr(),
            block.as_ptr(),
            params.as_mut_ptr(),
            error.as_mut_ptr(),
            error.len(),
        )
    };
    if status != 0 {
        // SAFETY: the harness wrote a NUL-terminated message within the buffer.
        let message = unsafe { CStr::from_ptr(error.as_ptr()) };
        bail!("kernels harness: {}", message.to_string_lossy())
    }
    Ok(())
}
