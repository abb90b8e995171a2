//! The attribute's compile-pass programs (`tests/ui/pass/*.rs`, built by `cargo
//! test` as the examples `ui_pass_*`) run to success. Each must be one: a program
//! in that folder that is not an example would go unchecked.

use std::path::PathBuf;
use std::process::Command;

/// Where cargo put this package's examples: `target/<profile>/examples`, beside
/// the `deps` folder that holds this test binary.
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples")
}

#[test]
fn every_pass_program_is_an_example_and_runs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/pass");
    let mut programs: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    programs.sort();
    assert_eq!(
        programs.len(),
        9,
        "a new pass program needs an [[example]] entry in tests/it/Cargo.toml"
    );
    for program in programs {
        let exe = examples_dir().join(format!("ui_pass_{program}{}", std::env::consts::EXE_SUFFIX));
        assert!(
            exe.is_file(),
            "{} is not built: add it as an [[example]] of tests/it/Cargo.toml",
            exe.display()
        );
        let output = Command::new(&exe).output().unwrap();
        assert!(
            output.status.success(),
            "{program} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
