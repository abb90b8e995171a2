//! The documented grammars say what the parser accepts: every key, every schedule,
//! mix and grad_accum form with its named arguments, every choice, and nothing
//! else. Two documents hold the grammar: the attribute's rustdoc
//! (docs/adaptive_trainer.md) and the guide's chapter (docs/guide/attribute.md).

use std::collections::{BTreeMap, BTreeSet};

use crate::attr::accepted::*;

const RUSTDOC: &str = include_str!("../../../docs/adaptive_trainer.md");
const CHAPTER: &str = include_str!("../../../docs/guide/attribute.md");

/// One alternative of a key as documented: `name` or `name(args)`.
#[derive(Debug)]
struct Form {
    name: String,
    /// The named arguments written in the parentheses (`over = n` → `over`), also
    /// those of `a = x | b = y` alternatives.
    named: BTreeSet<String>,
}

/// The first ```` ```text ```` block after the heading `heading`.
fn grammar_block<'a>(doc: &'a str, heading: &str) -> &'a str {
    let after = doc
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no heading {heading:?}"))
        .1;
    let code = after.split_once("```text\n").expect("a ```text block").1;
    &code[..code.find("\n```").expect("the block is closed")]
}

/// `key = ...` at the start of `text`: the key and the rest after `=`.
fn key_at(text: &str) -> Option<(&str, &str)> {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    let rest = text[end..].trim_start().strip_prefix('=')?;
    (end > 0 && !rest.starts_with(['>', '='])).then(|| (&text[..end], rest))
}

/// Every key of a grammar block with its forms. A line at parenthesis depth 0
/// starts a key (`key = form`), continues one (`| form`), or is a comment; forms
/// have no space outside their parentheses, and what follows a form other than
/// `| form` is a comment.
fn read_grammar(block: &str) -> BTreeMap<String, Vec<Form>> {
    let mut keys: BTreeMap<String, Vec<Form>> = BTreeMap::new();
    let mut key = String::new();
    let mut lines = block.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.contains(":=") || t.starts_with('#') {
            continue;
        }
        let (alt, t) = match t.strip_prefix('|') {
            Some(rest) => (true, rest.trim_start()),
            None => (false, t),
        };
        let mut rest = match key_at(t) {
            Some((k, rest)) => {
                key = k.to_string();
                assert!(!keys.contains_key(&key), "key `{key}` documented twice");
                keys.insert(key.clone(), Vec::new());
                rest.to_string()
            }
            None if alt => t.to_string(),
            None => continue,
        };
        loop {
            // One form: up to whitespace at depth 0, across lines inside parentheses.
            let mut form = String::new();
            let mut depth = 0usize;
            let mut chars: Vec<char> = rest.trim_start().chars().collect();
            let mut i = 0;
            loop {
                if i == chars.len() {
                    if depth == 0 {
                        break;
                    }
                    chars = lines
                        .next()
                        .expect("parenthesis closed")
                        .trim()
                        .chars()
                        .collect();
                    form.push(' ');
                    i = 0;
                    continue;
                }
                let c = chars[i];
                if c.is_whitespace() && depth == 0 {
                    break;
                }
                depth = match c {
                    '(' => depth + 1,
                    ')' => depth - 1,
                    _ => depth,
                };
                form.push(c);
                i += 1;
            }
            keys.get_mut(&key).unwrap().push(parse_form(&form));
            let after: String = chars[i..].iter().collect();
            match after.trim_start().strip_prefix('|') {
                Some(next) => rest = next.to_string(),
                None => break,
            }
        }
    }
    keys
}

fn parse_form(form: &str) -> Form {
    let (name, args) = match form.split_once('(') {
        Some((name, args)) => (name, args.strip_suffix(')').expect("form ends in `)`")),
        None => (form, ""),
    };
    // Top-level pieces of the arguments, split at `,` and `|`.
    let mut pieces = vec![String::new()];
    let mut depth = 0;
    for c in args.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '|' if depth == 0 => {
                pieces.push(String::new());
                continue;
            }
            _ => {}
        }
        pieces.last_mut().unwrap().push(c);
    }
    let named = pieces
        .iter()
        .filter_map(|p| key_at(p.trim()).map(|(k, _)| k.to_string()))
        .collect();
    Form {
        name: name.to_string(),
        named,
    }
}

fn names(forms: &[Form]) -> BTreeSet<&str> {
    forms.iter().map(|f| f.name.as_str()).collect()
}

fn set<'a>(list: &[&'a str]) -> BTreeSet<&'a str> {
    list.iter().copied().collect()
}

/// The named arguments documented for the forms called `name`.
fn named_of(forms: &[Form], name: &str) -> BTreeSet<String> {
    forms
        .iter()
        .filter(|f| f.name == name)
        .flat_map(|f| f.named.iter().cloned())
        .collect()
}

fn owned(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn check(doc: &str, grammar: &BTreeMap<String, Vec<Form>>) {
    let documented: BTreeSet<&str> = grammar.keys().map(String::as_str).collect();
    assert_eq!(documented, set(KEYS), "{doc}: the keys");

    let schedule = &grammar["schedule"];
    assert_eq!(names(schedule), set(SCHEDULES), "{doc}: the schedules");
    for name in SCHEDULES {
        let accepted = SCHEDULE_ARGS
            .iter()
            .find(|(s, _)| s == name)
            .map_or(BTreeSet::new(), |(_, args)| owned(args));
        assert_eq!(
            named_of(schedule, name),
            accepted,
            "{doc}: the named arguments of `{name}`"
        );
    }

    let choices = [
        ("reweight", REWEIGHTS),
        ("oom", OOMS),
        ("lr_scaling", LR_SCALINGS),
        ("drop_last", &["true", "false"]),
        ("shuffle", &["true", "false"]),
        ("grad_accum", GRAD_ACCUMS),
        ("mix", MIXES),
    ];
    for (key, accepted) in choices {
        assert_eq!(
            names(&grammar[key]),
            set(accepted),
            "{doc}: the values of `{key}`"
        );
    }
    let grad_accum = &grammar["grad_accum"];
    assert_eq!(
        named_of(grad_accum, "target"),
        owned(TARGET_ARGS),
        "{doc}: `target`"
    );
    assert_eq!(
        named_of(grad_accum, "fixed"),
        BTreeSet::new(),
        "{doc}: `fixed`"
    );
    let mix = &grammar["mix"];
    assert_eq!(
        named_of(mix, "online"),
        owned(ONLINE_ARGS),
        "{doc}: `online`"
    );
    assert_eq!(named_of(mix, "pike"), owned(PIKE_ARGS), "{doc}: `pike`");
}

#[test]
fn the_attributes_rustdoc_documents_what_the_parser_accepts() {
    check(
        "docs/adaptive_trainer.md",
        &read_grammar(grammar_block(RUSTDOC, "# Grammar")),
    );
}

#[test]
fn the_guides_chapter_documents_what_the_parser_accepts() {
    check(
        "docs/guide/attribute.md",
        &read_grammar(grammar_block(CHAPTER, "## Grammar")),
    );
}

#[test]
fn the_grammar_reader_reads_forms_keys_and_comments() {
    let g = read_grammar(
        "key = value :=\n\
         schedule = constant | ramp(start = a, samples = c | tokens = c,\n\
         \x20   global = g)     a comment (x = 1)\n\
         \x20   the comment goes on = here\n\
         \x20 | steps(t0 => b0, ..)\n\
         | oom = fail | skip   (fail)\n",
    );
    assert_eq!(g.keys().collect::<Vec<_>>(), ["oom", "schedule"]);
    assert_eq!(names(&g["schedule"]), set(&["constant", "ramp", "steps"]));
    assert_eq!(
        named_of(&g["schedule"], "ramp"),
        owned(&["start", "samples", "tokens", "global"])
    );
    assert!(named_of(&g["schedule"], "steps").is_empty());
    assert_eq!(names(&g["oom"]), set(&["fail", "skip"]));
}
