//! Unit tests of parsing, checking and expansion (no compiler involved:
//! `syn::parse_quote!`), one file per concept.

mod ctxt;
mod expand;
mod grammar;
mod item;
mod keys;
mod mix;
mod schedule;
mod suggest;
mod values;

use crate::attr::parse_args;
use crate::check::check;
use crate::ctxt::Ctxt;
use crate::parse::AttrArgs;
use crate::spec::{build, Fallback, PolicyValue, Schedule, TrainerSpec};

/// The valid keys of an attribute without mistakes.
fn keys(args: AttrArgs) -> Vec<PolicyValue> {
    let mut cx = Ctxt::new();
    let attrs = parse_args(&args, &mut cx);
    check(&attrs, None, &mut cx);
    let keys = attrs.keys.into_iter().map(|k| k.value).collect();
    if let Err(e) = cx.check() {
        panic!("unexpected errors: {:?}", messages(e));
    }
    keys
}

/// The only key of an attribute.
fn one(args: AttrArgs) -> PolicyValue {
    let mut all = keys(args);
    assert_eq!(all.len(), 1);
    all.remove(0)
}

/// The schedule of `schedule = ...`.
fn schedule(args: AttrArgs) -> Schedule {
    match one(args) {
        PolicyValue::Schedule(s) => s,
        other => panic!("not a schedule: {other:?}"),
    }
}

fn messages(e: syn::Error) -> Vec<String> {
    e.into_iter().map(|e| e.to_string()).collect()
}

/// Every error of the arguments alone.
fn errors(args: AttrArgs) -> Vec<String> {
    let mut cx = Ctxt::new();
    let attrs = parse_args(&args, &mut cx);
    check(&attrs, None, &mut cx);
    messages(cx.check().expect_err("expected errors"))
}

fn assert_error(args: AttrArgs, needle: &str) {
    let all = errors(args);
    assert!(
        all.iter().any(|m| m.contains(needle)),
        "no error containing {needle:?} in {all:#?}"
    );
}

/// The fallback of an attribute or an item with mistakes.
fn fallback(args: AttrArgs, item: syn::Item) -> Fallback {
    match build(Ok(args), item) {
        Ok(_) => panic!("expected errors"),
        Err(fallback) => *fallback,
    }
}

/// Every error of the arguments and the item.
fn item_errors(args: AttrArgs, item: syn::Item) -> Vec<String> {
    messages(fallback(args, item).error)
}

fn spec(args: AttrArgs, item: syn::Item) -> TrainerSpec {
    match build(Ok(args), item) {
        Ok(spec) => spec,
        Err(fallback) => panic!("unexpected errors: {:?}", messages(fallback.error)),
    }
}

fn trainer() -> syn::Item {
    syn::parse_quote! {
        struct T {
            #[model] model: M,
            #[optimizer] opt: O,
        }
    }
}
