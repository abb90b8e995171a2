//! The documented programs compile as shown. README.md's one ```` ```rust ```` block
//! is tests/quickstart/src/main.rs byte for byte (built as the example `readme`, and
//! by CI as a crate of its own with `adabatch` as its only dependency); the crate's
//! front page (src/lib.rs) shows the same program as a doctest; the guide's getting
//! started chapter holds examples/quickstart.rs byte for byte, as a doctest.

const README: &str = include_str!("../../README.md");
const PROGRAM: &str = include_str!("../quickstart/src/main.rs");
const LIB: &str = include_str!("../../src/lib.rs");
const CHAPTER: &str = include_str!("../../docs/guide/getting_started.md");
const EXAMPLE: &str = include_str!("../../examples/quickstart.rs");

/// The text of the first code block opened by `fence` after `heading` (the whole
/// text when `heading` is empty).
fn block<'a>(text: &'a str, heading: &str, fence: &str) -> &'a str {
    let section = if heading.is_empty() {
        text
    } else {
        text.split_once(&format!("\n{heading}\n"))
            .unwrap_or_else(|| panic!("a `{heading}` section"))
            .1
    };
    let code = section
        .split_once(&format!("\n{fence}\n"))
        .unwrap_or_else(|| panic!("a {fence} block after `{heading}`"))
        .1;
    let end = code.find("\n```\n").expect("the code block is closed");
    &code[..=end]
}

/// The `//!` lines of src/lib.rs without their prefix.
fn front_page(lib: &str) -> String {
    lib.lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| {
            l.strip_prefix("//! ")
                .unwrap_or(l.trim_start_matches("//!"))
        })
        .fold(String::new(), |text, l| text + l + "\n")
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

fn assert_same(copy: &str, original: &str, what: &str) {
    assert!(
        copy == original,
        "{what} ({}): paste the original's text into it",
        first_difference(copy, original)
    );
}

#[test]
fn readme_program_is_the_standalone_crate() {
    assert_eq!(
        README.matches("\n```rust\n").count(),
        1,
        "README.md has one ```rust block, the program"
    );
    assert_same(
        block(README, "", "```rust"),
        PROGRAM,
        "README.md's rust block differs from tests/quickstart/src/main.rs",
    );
}

#[test]
fn front_page_program_is_the_standalone_crate() {
    assert_same(
        block(&front_page(LIB), "", "```no_run"),
        PROGRAM,
        "src/lib.rs's example differs from tests/quickstart/src/main.rs",
    );
}

#[test]
fn guide_quickstart_is_examples_quickstart() {
    assert_same(
        block(CHAPTER, "## The quickstart program", "```no_run"),
        EXAMPLE,
        "docs/guide/getting_started.md's quickstart differs from examples/quickstart.rs",
    );
}

#[test]
fn readme_keeps_the_two_commands() {
    let section = README
        .split_once("\n## The two commands\n")
        .expect("README.md has a `## The two commands` section")
        .1;
    for command in [
        "cargo run --release --example replay_dataloader",
        "cargo test --workspace",
    ] {
        assert!(
            section.contains(&format!("\n{command}\n")),
            "README's two commands lack `{command}`"
        );
    }
}

#[test]
fn programs_name_no_other_crate() {
    // Only `adabatch::...` paths (and std): the standalone crate has no other dependency.
    for (file, text) in [
        ("tests/quickstart/src/main.rs", PROGRAM),
        ("examples/quickstart.rs", EXAMPLE),
    ] {
        for line in text.lines().filter(|l| l.trim_start().starts_with("use ")) {
            let path = line.trim_start().trim_start_matches("use ");
            assert!(
                path.starts_with("adabatch::") || path.starts_with("std::"),
                "{file} imports outside adabatch: {line}"
            );
        }
    }
}

#[test]
fn the_block_finder_reads_what_it_should() {
    let readme = "# x\n\n## Quickstart\n\nText.\n\n```rust\nfn main() {}\n```\n\n## Next\n";
    assert_eq!(block(readme, "## Quickstart", "```rust"), "fn main() {}\n");
    assert_eq!(front_page("//! a\n//!\n//!  b\nfn x() {}\n"), "a\n\n b\n");
}
