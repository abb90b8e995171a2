//! The error collector.

use proc_macro2::Span;

use crate::ctxt::Ctxt;

#[test]
fn errors_come_out_in_order_and_combined() {
    let mut cx = Ctxt::new();
    cx.at(Span::call_site(), "first");
    cx.at(Span::call_site(), "second");
    let all: Vec<String> = cx
        .check()
        .unwrap_err()
        .into_iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(all, ["first", "second"]);
}

#[test]
fn an_empty_collector_checks_ok() {
    assert!(Ctxt::new().check().is_ok());
}

#[test]
#[should_panic(expected = "without `check()`")]
fn a_collector_must_be_drained() {
    let mut cx = Ctxt::new();
    cx.at(Span::call_site(), "lost");
}
