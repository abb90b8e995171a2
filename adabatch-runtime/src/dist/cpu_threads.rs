//! CPU ranks are threads of one process, and candle's CPU kernels run on one
//! process-wide pool sized to every core, whose callers take turns: two ranks on
//! two cores then had the pool's spinning workers and the other rank fighting for
//! the same cores (a step of the language-model example took 1.9 times as long
//! as with one pool thread). As torchrun sets `OMP_NUM_THREADS=1` for the
//! processes it starts, a run of several CPU ranks gives candle `cores / ranks`
//! threads (at least one) — unless `CANDLE_NUM_THREADS` or `RAYON_NUM_THREADS` is
//! set, which always wins. candle sizes its pools once, at their first use: a
//! process that ran candle CPU kernels before its first launch keeps its pools.

use std::sync::OnceLock;

/// What [`share_cpu_cores`] decided: the threads given to candle, or `None` when the
/// environment already chose.
static DECIDED: OnceLock<Option<usize>> = OnceLock::new();

/// Sets candle's CPU thread count for `ranks` CPU ranks in this process, once per
/// process (the first multi-rank launch decides); returns the count it set, or
/// `None` when the environment chose. A launch of several CPU ranks calls it; a
/// program that runs candle CPU kernels before such a launch (a reference
/// model's losses, say) calls it first with the launch's ranks, or the run's
/// ranks share pools sized to every core.
pub fn share_cpu_cores(ranks: usize) -> Option<usize> {
    *DECIDED.get_or_init(|| {
        let chosen = ["CANDLE_NUM_THREADS", "RAYON_NUM_THREADS"]
            .iter()
            .any(|name| std::env::var_os(name).is_some());
        if chosen {
            return None;
        }
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads = (cores / ranks.max(1)).max(1);
        // Before any rank thread starts, and read by candle when it first builds
        // its pools.
        std::env::set_var("CANDLE_NUM_THREADS", threads.to_string());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        Some(threads)
    })
}
