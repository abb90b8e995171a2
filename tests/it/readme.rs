//! The README's quickstart is a program that compiles: its code block is
//! examples/quickstart.rs byte for byte (built by `cargo build --examples` and run
//! in CI), and tests/quickstart/src/main.rs (built by CI as a crate of its own with
//! `adabatch` as its only dependency) is the same file again.

const README: &str = include_str!("../../README.md");
const EXAMPLE: &str = include_str!("../../examples/quickstart.rs");
const STANDALONE: &str = include_str!("../quickstart/src/main.rs");

/// The text of the first ```` ```rust ```` block after the `## Quickstart` heading.
fn quickstart_block(readme: &str) -> &str {
    let section = readme
        .split_once("\n## Quickstart\n")
        .expect("README.md has a `## Quickstart` section")
        .1;
    let code = section
        .split_once("\n```rust\n")
        .expect("the Quickstart section has a ```rust block")
        .1;
    let end = code
        .find("\n```\n")
        .expect("the Quickstart code block is closed");
    &code[..=end]
}

/// The first line where `a` and `b` differ, for the failure message.
fn first_difference(a: &str, b: &str) -> String {
    let (mut left, mut right) = (a.lines(), b.lines());
    for line in 1.. {
        match (left.next(), right.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => return "only in line endings or a trailing newline".into(),
            (x, y) => return format!("line {line}: {x:?} vs {y:?}"),
        }
    }
    unreachable!()
}

#[test]
fn readme_quickstart_is_examples_quickstart() {
    let block = quickstart_block(README);
    assert!(
        block == EXAMPLE,
        "README.md's Quickstart block differs from examples/quickstart.rs ({}): \
         paste the example's text into the README",
        first_difference(block, EXAMPLE)
    );
}

#[test]
fn standalone_crate_is_examples_quickstart() {
    assert!(
        STANDALONE == EXAMPLE,
        "tests/quickstart/src/main.rs differs from examples/quickstart.rs ({}): \
         copy the example over it",
        first_difference(STANDALONE, EXAMPLE)
    );
}

#[test]
fn quickstart_names_no_other_crate() {
    // Only `adabatch::...` paths (and std): the standalone crate has no other dependency.
    for line in EXAMPLE
        .lines()
        .filter(|l| l.trim_start().starts_with("use "))
    {
        let path = line.trim_start().trim_start_matches("use ");
        assert!(
            path.starts_with("adabatch::") || path.starts_with("std::"),
            "examples/quickstart.rs imports outside adabatch: {line}"
        );
    }
}

#[test]
fn the_block_finder_reads_what_it_should() {
    let readme = "# x\n\n## Quickstart\n\nText.\n\n```rust\nfn main() {}\n```\n\n## Next\n";
    assert_eq!(quickstart_block(readme), "fn main() {}\n");
}
