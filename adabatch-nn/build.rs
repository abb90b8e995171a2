//! With the `cuda` feature: compiles each `kernels/*.cu` into a fatbin, SASS for the
//! build's compute capability (`CUDA_COMPUTE_CAP`, default 90: H100/H200) beside
//! its PTX (which newer GPUs compile when they load it). SASS is why nvcc is run
//! here directly rather than through cudaforge (which builds PTX only): a GPU of
//! that capability loads the kernels without a JIT wait on its first run.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=kernels");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=CUDA_HOME");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    for name in ["rows", "adamw", "attention"] {
        compile(
            &format!("kernels/{name}.cu"),
            &out.join(format!("{name}.fatbin")),
            &cap,
        );
    }
}

/// `source` into the fatbin `target`: SASS for `cap` and its PTX.
fn compile(source: &str, target: &Path, cap: &str) {
    let status = Command::new(nvcc())
        .args(["--fatbin", "-O3", "-std=c++17"])
        .arg(format!("-gencode=arch=compute_{cap},code=sm_{cap}"))
        .arg(format!("-gencode=arch=compute_{cap},code=compute_{cap}"))
        .arg(source)
        .arg("-o")
        .arg(target)
        .status();
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => panic!("nvcc failed on {source} ({status})"),
        Err(error) => panic!(
            "the `cuda` feature needs nvcc (on PATH or under CUDA_HOME/bin; scripts/cuda-toolchain.sh installs one): {error}"
        ),
    }
}

/// `$CUDA_HOME/bin/nvcc` when CUDA_HOME is set, else `nvcc` from the PATH.
fn nvcc() -> PathBuf {
    match std::env::var_os("CUDA_HOME") {
        Some(home) => Path::new(&home).join("bin").join("nvcc"),
        None => PathBuf::from("nvcc"),
    }
}
