//! "did you mean", and the distance behind it.

use syn::parse_quote;

use super::assert_error;
use crate::attr::suggest::{did_you_mean, osa_distance};

#[test]
fn typos_get_a_suggestion() {
    assert_error(
        parse_quote!(dorp_last = true),
        "unknown key `dorp_last`: did you mean `drop_last`?",
    );
    assert_error(parse_quote!(schedul = constant), "did you mean `schedule`?");
    assert_error(
        parse_quote!(reweight = samplecount),
        "did you mean `sample_count`?",
    );
    assert_error(
        parse_quote!(oom = halv),
        "unknown `oom` value `halv`: did you mean `halve`?",
    );
    assert_error(
        parse_quote!(schedule = intervall(5, +1)),
        "unknown schedule `intervall`: did you mean `interval`?",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 2, ovr = 3)),
        "did you mean `over`?",
    );
    assert_error(
        parse_quote!(schedule = memory(treshold = 0.5)),
        "did you mean `threshold`?",
    );
    assert_error(
        parse_quote!(gradient_accumulation_steps = 4),
        "the key is `grad_accum = fixed(n)`",
    );
    assert_error(parse_quote!(learning_rate = 1), "run-time setting");
}

#[test]
fn distances() {
    assert_eq!(osa_distance("drop_last", "dorp_last"), 1);
    assert_eq!(osa_distance("seed", "sede"), 1);
    assert_eq!(osa_distance("", "abc"), 3);
    assert_eq!(
        did_you_mean("Shuffle", &["shuffle", "seed"]),
        Some("shuffle")
    );
    assert_eq!(did_you_mean("xyz", &["shuffle", "seed"]), None);
}
