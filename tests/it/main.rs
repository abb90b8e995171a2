//! The integration tests: one binary, a module per concern (each was a
//! `tests/<name>.rs` binary of its own, and each linked candle), helpers in
//! `common/`, in the package `adabatch-tests` (`Cargo.toml` beside this file).
//! Run one module with `cargo test -p adabatch-tests --test it <module>::`.
//!
//! The modules share one process and run on parallel threads, so none may change
//! what the process holds for all of them: environment variables, the current
//! directory, the allocator's settings, signal handlers, a fixed output path (temp
//! files are named by the process id and a counter, `common::temp_log`). Tests that
//! need a process of their own are binaries of their own:
//!
//! - `tests/llama_interop.rs`: candle-transformers reads adabatch's Llama weights
//!   (a dependency only it builds);
//! - `tests/host_heap.rs`: the host heap setting (`memory::host`) is made once per
//!   process, by the first training run in it;
//! - `tests/ui/ui.rs`: the trybuild suite of `#[adaptive_trainer]`, a package of
//!   its own (it compiles programs; `TRYBUILD=overwrite cargo test -p
//!   adabatch-ui-tests --test ui` regenerates its output);
//! - `tests/gpu.rs`: the CUDA checks (feature `cuda`), built on their own by
//!   `scripts/build-gpu-check.sh`.
//!
//! `resume::a_killed_run_resumes_exactly` re-runs this binary as its child, with a
//! filter selecting `resume::kill_test_child` only.

// `#[macro_use]`: the helper macros (`hand_trainer!`) reach every module below.
#[macro_use]
mod common;
// The digits data set and its MLP, shared with the examples; `continual` and
// `precision` train on it.
#[path = "../../examples/support/digits.rs"]
#[allow(dead_code)]
mod digits;
// The language-model examples' decoder; `language_model` and `domains` train it.
#[path = "../../examples/support/decoder.rs"]
#[allow(dead_code)]
mod decoder;

mod adaptation;
mod best_model;
mod callbacks;
mod checkpoint;
mod continual;
mod domains;
mod dry_run;
mod early_checks;
mod engine;
mod equivalence;
mod errors;
mod eval;
mod first_program;
mod flags;
mod fuzz;
mod language_model;
mod memory;
mod mixing;
mod noise_scale;
mod numerics;
mod oom;
mod output_dir;
mod parameters;
mod pike;
mod plot;
mod porting;
mod precision;
mod prefetch;
mod properties;
mod ramp;
mod readme;
mod resume;
mod sampling;
mod tensorboard;
mod token_ramp;
mod tokens;
mod ui_pass;
