//! The host heap (`memory::host`): a run keeps freed memory by default and leaves
//! malloc alone with `--release-freed-memory`. One test in its own binary, because
//! the setting is process-wide and is made once.

#[path = "it/common/mod.rs"]
mod common;

use adabatch::memory::host::{host_heap, HostHeap};
use common::*;

#[test]
fn a_run_keeps_freed_memory_unless_told_to_release_it() {
    let data = dataset(24, 5);
    let run = |release: bool| {
        let mut a = args(2, 3, 1);
        a.data.release_freed_memory = release;
        adabatch::Run::new(&data, &collate, &a)
            .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
            .expect("train")
            .summary
            .step_losses
    };
    let released = run(true);
    assert_eq!(host_heap(), None, "--release-freed-memory touched malloc");
    let kept = run(false);
    let expected = if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        HostHeap::UserTunables
    } else if cfg!(all(target_os = "linux", target_env = "gnu")) {
        HostHeap::Kept
    } else {
        HostHeap::Unsupported
    };
    assert_eq!(host_heap(), Some(expected));
    // Where memory comes from does not change what is computed.
    assert_eq!(released, kept);
}
