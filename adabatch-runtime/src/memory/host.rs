//! The host allocator between steps. A training step allocates and frees the same
//! tensors every time; glibc's malloc gives freed memory back to the OS at once
//! (blocks over its mmap threshold are unmapped, the heap top over 128 KiB is
//! trimmed), so the next step faults every page in again, zeroed by the kernel.
//! On a small CPU model that was more than half of an epoch (BENCHMARKS.md). The
//! engine therefore asks glibc to keep freed memory for the next step, what
//! jemalloc and tcmalloc do by design and what CPU-training guides for PyTorch
//! reach with `LD_PRELOAD`. The process keeps its peak heap instead of shrinking
//! between steps; `--release-freed-memory` leaves malloc as it is.

use std::sync::OnceLock;

/// Largest mmap threshold glibc accepts on 64-bit targets (`HEAP_MAX_SIZE / 2`):
/// blocks up to this size come from the heap and are reused, larger ones are still
/// mapped on their own.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory the heap keeps at its top before trimming it.
const TRIM_THRESHOLD: i32 = 1 << 30;

static OUTCOME: OnceLock<HostHeap> = OnceLock::new();

/// What [`keep_freed_memory`] did to the process's allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostHeap {
    /// glibc now keeps freed memory (fixed mmap and trim thresholds).
    Kept,
    /// Left alone: `GLIBC_TUNABLES` already sets malloc parameters.
    UserTunables,
    /// Left alone: not glibc (another libc, or `mallopt` refused the settings).
    Unsupported,
}

/// Asks glibc's malloc to keep freed memory for reuse instead of returning it to
/// the OS, once per process (later calls return the first call's outcome). The
/// setting is process-wide and stays after training. A `#[global_allocator]`
/// other than the system one is not affected (it does not go through glibc's
/// malloc for Rust allocations).
pub fn keep_freed_memory() -> HostHeap {
    *OUTCOME.get_or_init(|| {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if tunables.contains("glibc.malloc.") {
            return HostHeap::UserTunables;
        }
        set_thresholds()
    })
}

/// What [`keep_freed_memory`] decided, if it has run in this process (a run with
/// `--release-freed-memory` does not call it).
#[cfg(feature = "internals")]
pub fn host_heap() -> Option<HostHeap> {
    OUTCOME.get().copied()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> HostHeap {
    // SAFETY: mallopt only sets allocator parameters; glibc takes its own lock.
    // Setting M_MMAP_THRESHOLD also turns off glibc's dynamic threshold, which
    // otherwise keeps mapping blocks the size of the largest one freed so far.
    let kept = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    };
    if kept {
        HostHeap::Kept
    } else {
        HostHeap::Unsupported
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> HostHeap {
    HostHeap::Unsupported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outcome_is_decided_once() {
        let first = keep_freed_memory();
        assert_eq!(keep_freed_memory(), first);
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if std::env::var("GLIBC_TUNABLES").map_or(true, |t| !t.contains("glibc.malloc.")) {
            assert_eq!(first, HostHeap::Kept);
        }
    }
}
