//! CPU time from `clock_gettime`: unlike wall time it leaves out the time the
//! scheduler gives to other processes, which dominates on a shared 2-core machine.
#![allow(dead_code)]

/// `clock_gettime`'s clock of the calling thread.
pub const THREAD: i32 = 3;
/// `clock_gettime`'s clock of the whole process (every thread).
pub const PROCESS: i32 = 2;

/// Seconds of CPU time on `clock` ([`THREAD`] or [`PROCESS`]); `None` where the
/// clock cannot be read.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
pub fn cpu_time(clock: i32) -> Option<f64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `struct timespec` for 64-bit Linux.
    let rc = unsafe { clock_gettime(clock, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
pub fn cpu_time(_clock: i32) -> Option<f64> {
    None
}
