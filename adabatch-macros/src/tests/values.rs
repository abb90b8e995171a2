//! Mistakes in values: kinds, bounds, duplicates, syntax; all reported together.

use quote::quote;
use syn::parse_quote;

use super::{assert_error, errors, keys};
use crate::parse::AttrArgs;

#[test]
fn unknown_key_lists_the_keys() {
    let all = errors(parse_quote!(warp_speed = 9));
    assert_eq!(all.len(), 1);
    assert!(
        all[0].starts_with("unknown key `warp_speed`; expected one of `schedule`, `min_batch`"),
        "{all:?}"
    );
}

#[test]
fn all_errors_of_one_attribute_are_reported() {
    let all = errors(parse_quote!(drop_last = 3, sed = 1, oom = maybe, schedule = interval(0, +0)));
    assert_eq!(all.len(), 5, "{all:#?}");
}

#[test]
fn duplicate_keys_are_one_error_each() {
    // One mistake, one error: on the repeated key, naming the first.
    let all = errors(parse_quote!(seed = 1, seed = 2));
    assert_eq!(
        all,
        vec!["duplicate key `seed`: each key may be given once; `seed = 1` comes first"]
    );
    let all = errors(parse_quote!(schedule = constant(4), schedule));
    assert_eq!(
        all,
        vec!["duplicate key `schedule`: each key may be given once; `schedule = constant(..)` comes first"]
    );
    let all = errors(parse_quote!(reweight, reweight = none));
    assert_eq!(
        all,
        vec![
            "`reweight` needs a value, e.g. `reweight = sample_count`",
            "duplicate key `reweight`: each key may be given once; `reweight` comes first"
        ]
    );
}

#[test]
fn wrong_value_kinds() {
    assert_error(
        parse_quote!(drop_last = 3),
        "expected `true` or `false` for `drop_last`, found integer `3`",
    );
    assert_error(
        parse_quote!(shuffle = "yes"),
        "expected `true` or `false` for `shuffle`",
    );
    assert_error(
        parse_quote!(seed = -1),
        "expected a non-negative integer for `seed`",
    );
    assert_error(
        parse_quote!(seed = true),
        "expected a non-negative integer for `seed`, found `true`",
    );
    assert_error(parse_quote!(min_batch = "4"), "write `4` without quotes");
    assert_error(
        parse_quote!(reweight = "none"),
        "write `reweight = none` without quotes",
    );
    assert_error(
        parse_quote!(grad_accum = 4),
        "write `grad_accum = fixed(4)`",
    );
    assert_error(
        parse_quote!(grad_accum = fixed),
        "`fixed` needs an argument",
    );
    assert_error(
        parse_quote!(schedule = 8),
        "for a fixed size write `constant(8)`",
    );
    assert_error(parse_quote!(crate = 1), "expected a path for `crate`");
    assert_error(
        parse_quote!(drop_last),
        "`drop_last` needs a value, e.g. `drop_last = true`",
    );
}

#[test]
fn batch_bounds() {
    assert_error(
        parse_quote!(min_batch = 0),
        "`min_batch = 0`: a batch size must be at least 1",
    );
    assert_error(
        parse_quote!(max_batch = 0),
        "`max_batch = 0`: a batch size must be at least 1",
    );
    assert_error(
        parse_quote!(min_batch = 8, max_batch = 4),
        "`max_batch = 4` is smaller than `min_batch = 8`",
    );
    assert_eq!(keys(parse_quote!(min_batch = 4, max_batch = 4)).len(), 2);
}

#[test]
fn syntax_errors_are_reported() {
    let err = syn::parse2::<AttrArgs>(quote!(schedule interval)).unwrap_err();
    assert_eq!(err.to_string(), "expected `=` after `schedule`");
    let err = syn::parse2::<AttrArgs>(quote!(seed = )).unwrap_err();
    assert_eq!(err.to_string(), "expected a value after `seed =`");
    let err = syn::parse2::<AttrArgs>(quote!(= 3)).unwrap_err();
    assert!(err.to_string().starts_with("expected `key = value`"));
}

#[test]
fn grad_accum_argument_checks() {
    assert_error(parse_quote!(grad_accum = fixed(0)), "`fixed(0)`");
    assert_error(
        parse_quote!(grad_accum = target(global = 0)),
        "`target(global = 0)`",
    );
    assert_error(
        parse_quote!(grad_accum = target(4)),
        "`target` takes named arguments: `global = ..`",
    );
    assert_error(
        parse_quote!(grad_accum = target()),
        "`target` needs `global = n`",
    );
}
