//! CUDA checks (feature `cuda`; the NCCL test needs `nccl`). Each test skips, with
//! a message, when no CUDA device can be opened, so this file also runs on a
//! machine without a GPU. The checks are those of `examples/gpu_check.rs`, which
//! is compiled in here as a module.
//!
//! ```text
//! cargo test --release --features nccl --test gpu -- --nocapture --test-threads 1
//! ```
#![cfg(feature = "cuda")]

#[allow(dead_code)]
#[path = "../examples/gpu_check.rs"]
mod gpu_check;

use std::io::Write;

use adabatch::memory::device::{memory_info, PeakSampler};
use candle_core::{DType, Device, Tensor};

/// A CUDA device, or `None` after saying why the test is skipped.
fn cuda_or_skip(test: &str) -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipping: no CUDA device for `{test}` ({e})");
            None
        }
    }
}

/// A small corpus of sentences of varied lengths, some with commas.
fn corpus() -> tempfile_like::TempFile {
    let mut file = tempfile_like::TempFile::new("gpu_test_corpus.txt");
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
fn replay_on_cuda_matches_cpu() {
    if cuda_or_skip("replay_on_cuda_matches_cpu").is_none() {
        return;
    }
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
fn nccl_world_of_one() {
    if cuda_or_skip("nccl_world_of_one").is_none() {
        return;
    }
    check(&["gpu_check", "nccl", "--timing-iters", "5"]);
}

#[test]
fn memory_figures_on_cuda() {
    let Some(device) = cuda_or_skip("memory_figures_on_cuda") else {
        return;
    };
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
    let data = corpus();
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
fn bench_and_breakdown_run() {
    if cuda_or_skip("bench_and_breakdown_run").is_none() {
        return;
    }
    let data = corpus();
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
