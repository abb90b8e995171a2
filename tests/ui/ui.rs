//! Compile-time behaviour of `#[adaptive_trainer]`: every `tests/ui/<category>/*.rs`
//! must fail to compile with exactly the checked-in `.stderr`. Every
//! `tests/ui/pass/*.rs` must compile and run: those are examples of the tests
//! package (`ui_pass_*` in `tests/it/Cargo.toml`, built by `cargo test`) run by
//! `tests/it/ui_pass.rs`, so that this
//! suite only type-checks (trybuild then needs no code generation of the
//! dependencies, which it builds in a target folder of its own).
//!
//! After changing a message, regenerate the expected output with
//!
//! ```text
//! TRYBUILD=overwrite cargo test -p adabatch-ui-tests --test ui
//! ```
//!
//! and review each changed `.stderr`: the error must point at the offending token
//! (the key, the value, the field type), not at the attribute as a whole, and there
//! must be exactly one error per mistake (`fallback/` checks that a mistake does not
//! cascade into the program's uses of the generated items).

const COMPILE_FAIL: &[&str] = &[
    "unknown_key",
    "typo",
    "duplicate",
    "bad_value",
    "schedule_args",
    "struct_shape",
    "field_attrs",
    "trait_not_implemented",
    "custom_fn",
    "unsupported",
    "fallback",
];

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    for category in COMPILE_FAIL {
        t.compile_fail(format!("{category}/*.rs"));
    }
}
