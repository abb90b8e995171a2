//! With the `cuda` feature: compiles each `kernels/*.cu` into a fatbin, SASS for the
//! build's compute capability (`CUDA_COMPUTE_CAP`, default 90: H100/H200) beside
//! its PTX (which newer GPUs compile when they load it). SASS is why nvcc is run
//! here directly rather than through cudaforge (which builds PTX only): a GPU of
//! that capability loads the kernels without a JIT wait on its first run. ptxas's
//! resource report is checked against each kernel's launch (`src/cuda/limits.rs`):
//! a kernel that could not launch is a build error.
//!
//! With the `kernels-on-cpu` feature (test code): the same `.cu` files, unchanged,
//! compiled by g++ through the CPU harness of `kernels/harness/`.

use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)]
#[path = "src/cuda/limits.rs"]
mod limits;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=kernels");
    println!("cargo::rerun-if-changed=src/cuda/limits.rs");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=CUDA_HOME");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    #[cfg(feature = "kernels-on-cpu")]
    harness::build(&out);
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let cap: String = cap.chars().filter(char::is_ascii_digit).collect();
    for name in ["rows", "adamw", "attention"] {
        let source = format!("kernels/{name}.cu");
        let report = compile(&source, &out.join(format!("{name}.fatbin")), &cap);
        if let Err(problems) = check_launch_limits(&report) {
            panic!("{source}: kernels that could not launch:\n{problems}");
        }
    }
}

/// `source` into the fatbin `target`: SASS for `cap` and its PTX. Returns ptxas's
/// resource report.
fn compile(source: &str, target: &Path, cap: &str) -> String {
    let output = Command::new(nvcc())
        .args(["--fatbin", "-O3", "-std=c++17", "--resource-usage"])
        .arg(format!("-gencode=arch=compute_{cap},code=sm_{cap}"))
        .arg(format!("-gencode=arch=compute_{cap},code=compute_{cap}"))
        .arg(source)
        .arg("-o")
        .arg(target)
        .output();
    match output {
        Ok(output) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr)
        }
        Ok(output) => panic!(
            "nvcc failed on {source} ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => panic!(
            "the `cuda` feature needs nvcc (on PATH or under CUDA_HOME/bin; scripts/cuda-toolchain.sh installs one): {error}"
        ),
    }
}

/// Every entry point of ptxas's `report` against the block its launcher gives it:
/// registers × threads within a block's registers, static shared memory within
/// 48 KiB. The problems, one per line, or an error when the report names no kernel.
fn check_launch_limits(report: &str) -> Result<(), String> {
    let mut problems = Vec::new();
    let mut checked = 0;
    let mut kernel: Option<String> = None;
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            kernel = rest.split('\'').next().map(str::to_string);
            continue;
        }
        let (Some(name), Some(used)) = (&kernel, line.split("Used ").nth(1)) else {
            continue;
        };
        let number_before = |unit: &str| -> u32 {
            used.split(", ")
                .find_map(|part| part.strip_suffix(unit))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        };
        let registers = number_before(" registers");
        let smem = used
            .split(", ")
            .find_map(|part| part.strip_suffix(" bytes smem"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0u32);
        checked += 1;
        let Some(threads) = limits::max_threads(name) else {
            problems.push(format!(
                "{name}: no launcher gives it a block size (src/cuda/limits.rs)"
            ));
            continue;
        };
        let block = limits::block_registers(registers, threads);
        if block > limits::REGISTERS_PER_BLOCK {
            problems.push(format!(
                "{name}: {registers} registers × {threads} threads = {block} > {}",
                limits::REGISTERS_PER_BLOCK
            ));
        }
        if smem > limits::STATIC_SHARED_BYTES {
            problems.push(format!(
                "{name}: {smem} bytes of static shared memory > {}",
                limits::STATIC_SHARED_BYTES
            ));
        }
        kernel = None;
    }
    match (checked, problems.is_empty()) {
        (0, _) => Err("ptxas reported no kernel (--resource-usage)".into()),
        (_, true) => Ok(()),
        (_, false) => Err(problems.join("\n")),
    }
}

/// `$CUDA_HOME/bin/nvcc` when CUDA_HOME is set, else `nvcc` from the PATH.
fn nvcc() -> PathBuf {
    match std::env::var_os("CUDA_HOME") {
        Some(home) => Path::new(&home).join("bin").join("nvcc"),
        None => PathBuf::from("nvcc"),
    }
}

/// The CPU harness: `kernels/harness/kernels.cpp` (every `.cu` file) with
/// `-fno-weak`, so that each `__shared__` array is a common symbol; `shared.cpp`
/// (written here from the object's symbols) defines each of them (with a redzone
/// under AddressSanitizer) and lists them for the runtime's fill at each block's
/// start; `runtime.cpp` runs the launches.
#[cfg(feature = "kernels-on-cpu")]
mod harness {
    use std::fmt::Write as _;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    pub fn build(out: &Path) {
        // The script passes a digest of kernels/: an edit is rebuilt even when an
        // export restored the files' old times.
        println!("cargo::rerun-if-env-changed=ADABATCH_KERNELS_DIGEST");
        println!("cargo::rerun-if-env-changed=ADABATCH_KERNELS_SANITIZER");
        let sanitizer = std::env::var("ADABATCH_KERNELS_SANITIZER").unwrap_or_default();
        let flags: &[&str] = match sanitizer.as_str() {
            "" => &[],
            "address" => &["-fsanitize=address", "-fno-omit-frame-pointer", "-g"],
            "thread" => &["-fsanitize=thread", "-g"],
            other => panic!("ADABATCH_KERNELS_SANITIZER={other}: address, thread or empty"),
        };
        let base = || {
            let mut build = cc::Build::new();
            build
                .cpp(true)
                .std("c++14")
                .opt_level(2)
                .flag("-ffp-contract=off")
                .include("kernels/harness/include")
                .include("kernels/harness")
                .warnings(false);
            for flag in flags {
                build.flag(flag);
            }
            build
        };
        let kernels = base()
            .flag("-fno-weak")
            .file("kernels/harness/kernels.cpp")
            .compile_intermediates();
        let shared = out.join("shared.cpp");
        std::fs::write(&shared, shared_source(&kernels)).expect("write shared.cpp");
        let mut runtime = base();
        runtime
            .file("kernels/harness/runtime.cpp")
            .file(&shared)
            .objects(&kernels);
        runtime.compile("adabatch_kernels_harness");
        // rustc links with -nodefaultlibs, which leaves the sanitizer's runtime out:
        // name it (the runs set verify_asan_link_order=0, as it is not first).
        match sanitizer.as_str() {
            "address" => println!("cargo::rustc-link-lib=dylib=asan"),
            "thread" => println!("cargo::rustc-link-lib=dylib=tsan"),
            _ => {}
        }
    }

    /// A definition of every `__shared__` array of `objects` (their common
    /// symbols), and the table of them.
    fn shared_source(objects: &[PathBuf]) -> String {
        let nm = std::env::var("NM").unwrap_or_else(|_| "nm".into());
        let output = Command::new(&nm)
            .arg("-P")
            .args(objects)
            .output()
            .unwrap_or_else(|e| panic!("the kernels harness needs nm (binutils): {e}"));
        assert!(
            output.status.success(),
            "nm failed on the harness's kernels"
        );
        let symbols = String::from_utf8_lossy(&output.stdout);
        let mut arrays = Vec::new();
        for line in symbols.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, kind, _, size, ..] = fields[..] else {
                continue;
            };
            let is_static_of_a_function = name.starts_with("_ZZ");
            match kind {
                "C" => {
                    let size = u64::from_str_radix(size, 16).expect("nm prints sizes in hex");
                    arrays.push((name.to_string(), size));
                }
                "b" | "B" | "d" | "D" if is_static_of_a_function => panic!(
                    "{name}: a __shared__ array outside a template function, which the harness \
                     cannot give a block of its own; declare it in a template"
                ),
                _ => {}
            }
        }
        let mut source = String::from("#include \"kernels.h\"\n\n");
        // 64 bytes: at least the alignment of any array a kernel declares.
        for (i, (name, size)) in arrays.iter().enumerate() {
            writeln!(
                source,
                "alignas(64) unsigned char adabatch_shared_{i}[{size}] __asm__(\"{name}\");"
            )
            .expect("write to a String");
        }
        source
            .push_str("\nextern \"C\" const harness::SharedArray adabatch_harness_shared[] = {\n");
        for (i, (_, size)) in arrays.iter().enumerate() {
            writeln!(source, "    {{adabatch_shared_{i}, {size}}},").expect("write to a String");
        }
        if arrays.is_empty() {
            source.push_str("    {nullptr, 0},\n");
        }
        writeln!(
            source,
            "}};\nextern \"C\" const size_t adabatch_harness_shared_count = {};",
            arrays.len()
        )
        .expect("write to a String");
        source
    }
}
