//! CUDA checks (feature `cuda`; the NCCL test needs `nccl`). The tests that need
//! a GPU are `#[ignore]`d, so a machine without one reports them as *ignored*
//! (never as passed); on the GPU machine run them with `--include-ignored`, and
//! there a missing CUDA device fails them. The checks are those of
//! `examples/gpu_check/` (one module per subcommand), compiled in here as a module.
//!
//! ```text
//! cargo test --release --features nccl --test gpu -- --include-ignored --nocapture --test-threads 1
//! ```
#![cfg(feature = "cuda")]

#[allow(dead_code)]
#[path = "../examples/gpu_check/main.rs"]
mod gpu_check;

use std::io::Write;

use adabatch::memory::device_memory::{memory_info, PeakSampler};
use candle_core::{DType, Device, Tensor};

/// The CUDA device; a test that asked for one fails without it.
fn cuda(test: &str) -> Device {
    Device::new_cuda(0)
        .unwrap_or_else(|e| panic!("`{test}` needs a CUDA device and none opened: {e}"))
}

/// A small corpus of sentences of varied lengths, some with commas, in a file of
/// its own for each test (`test` names it).
fn corpus(test: &str) -> tempfile_like::TempFile {
    let mut file = tempfile_like::TempFile::new(&format!("gpu_test_corpus_{test}.txt"));
    for i in 0..300 {
        let words = 3 + (i * 7) % 40;
        let line: Vec<String> = (0..words)
            .map(|w| {
                if (i + w) % 11 == 0 {
                    format!("word{w},")
                } else {
                    format!("w{}", (i * w) % 97)
                }
            })
            .collect();
        writeln!(file.handle(), "{}", line.join(" ")).expect("write the test corpus");
    }
    file
}

mod tempfile_like {
    use std::fs::File;
    use std::path::PathBuf;

    /// A file in the temp folder, removed on drop.
    pub struct TempFile {
        path: PathBuf,
        file: File,
    }

    impl TempFile {
        pub fn new(name: &str) -> Self {
            let path = std::env::temp_dir().join(format!("{}_{name}", std::process::id()));
            let file = File::create(&path).expect("create a temp file");
            Self { path, file }
        }
        pub fn handle(&mut self) -> &mut File {
            &mut self.file
        }
        pub fn path(&self) -> &str {
            self.path.to_str().expect("utf-8 temp path")
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn check(args: &[&str]) {
    match gpu_check::run_args(args) {
        Ok(true) => {}
        Ok(false) => panic!("{args:?}: a check failed (see the JSON lines printed above)"),
        Err(e) => panic!("{args:?}: {e}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn kernels_match_their_cpu_twins() {
    cuda("kernels_match_their_cpu_twins");
    check(&["gpu_check", "kernels", "--rounds", "2"]);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn replay_on_cuda_matches_cpu() {
    cuda("replay_on_cuda_matches_cpu");
    check(&["gpu_check", "replay"]);
    check(&[
        "gpu_check",
        "replay",
        "--num-train-examples",
        "37",
        "--num-train-epochs",
        "3",
    ]);
}

#[cfg(feature = "nccl")]
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn nccl_world_of_one() {
    cuda("nccl_world_of_one");
    check(&["gpu_check", "nccl", "--timing-iters", "5"]);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn memory_figures_on_cuda() {
    let device = cuda("memory_figures_on_cuda");
    let info = memory_info(&device).expect("memory_info on a CUDA device");
    assert!(
        info.total_bytes > 0 && info.free_bytes <= info.total_bytes,
        "{info:?}"
    );
    let sampler = PeakSampler::start(&device);
    let a = Tensor::ones((1024, 1024), DType::F32, &device).expect("alloc");
    let b = a.matmul(&a).expect("matmul");
    drop((a, b));
    let mem = sampler.finish();
    eprintln!("{mem:?}");
    if let Some(peak) = mem.pool_peak {
        assert!(
            peak >= 2 * 4 * 1024 * 1024,
            "two 4 MiB tensors were live: {mem:?}"
        );
    }
    let data = corpus("memory_figures_on_cuda");
    check(&[
        "gpu_check",
        "memory",
        "--data",
        data.path(),
        "--batches",
        "2,4,8",
        "--d-model",
        "64",
    ]);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on the GPU machine"]
fn bench_and_breakdown_run() {
    cuda("bench_and_breakdown_run");
    let data = corpus("bench_and_breakdown_run");
    let small = [
        "--data",
        data.path(),
        "--steps",
        "6",
        "--warmup-steps",
        "2",
        "--d-model",
        "64",
        "--per-device-train-batch-size",
        "4",
    ];
    check(&[&["gpu_check", "bench"][..], &small[..]].concat());
    check(&[&["gpu_check", "breakdown"][..], &small[..]].concat());
}

#[test]
fn cpu_device_has_no_memory_figures() {
    assert!(memory_info(&Device::Cpu).is_none());
}
