//! Every key and its values.

use syn::parse_quote;

use super::{keys, one, spec, trainer};
use crate::spec::{GradAccum, LrScaling, Oom, PolicyValue, Reweight};

#[test]
fn empty_attribute_is_the_default_policy() {
    assert!(keys(parse_quote!()).is_empty());
}

#[test]
fn scalar_keys() {
    let all = keys(parse_quote!(
        min_batch = 2,
        max_batch = 64,
        drop_last = true,
        shuffle = false,
        seed = 18446744073709551615,
    ));
    assert_eq!(
        all,
        vec![
            PolicyValue::MinBatch(2),
            PolicyValue::MaxBatch(64),
            PolicyValue::DropLast(true),
            PolicyValue::Shuffle(false),
            PolicyValue::Seed(u64::MAX),
        ]
    );
}

#[test]
fn choice_keys() {
    assert_eq!(
        one(parse_quote!(reweight = sample_count)),
        PolicyValue::Reweight(Reweight::SampleCount)
    );
    assert_eq!(
        one(parse_quote!(reweight = token_count)),
        PolicyValue::Reweight(Reweight::TokenCount)
    );
    assert_eq!(
        one(parse_quote!(reweight = none)),
        PolicyValue::Reweight(Reweight::RankMean)
    );
    assert_eq!(one(parse_quote!(oom = fail)), PolicyValue::Oom(Oom::Fail));
    assert_eq!(one(parse_quote!(oom = halve)), PolicyValue::Oom(Oom::Halve));
    assert_eq!(
        one(parse_quote!(oom = split_retry)),
        PolicyValue::Oom(Oom::SplitRetry)
    );
    assert_eq!(one(parse_quote!(oom = skip)), PolicyValue::Oom(Oom::Skip));
    assert_eq!(
        one(parse_quote!(lr_scaling = none)),
        PolicyValue::LrScaling(LrScaling::Off)
    );
    assert_eq!(
        one(parse_quote!(lr_scaling = linear)),
        PolicyValue::LrScaling(LrScaling::Linear)
    );
    assert_eq!(
        one(parse_quote!(lr_scaling = sqrt)),
        PolicyValue::LrScaling(LrScaling::Sqrt)
    );
    assert_eq!(
        one(parse_quote!(lr_scaling = adamscale)),
        PolicyValue::LrScaling(LrScaling::AdamScale)
    );
}

#[test]
fn grad_accum_forms() {
    assert_eq!(
        one(parse_quote!(grad_accum = fixed(4))),
        PolicyValue::GradAccum(GradAccum::Fixed(4))
    );
    assert_eq!(
        one(parse_quote!(grad_accum = target(global = 256))),
        PolicyValue::GradAccum(GradAccum::Target(256))
    );
}

#[test]
fn crate_path_as_string_or_path() {
    let s = spec(parse_quote!(crate = "my_reexport::adabatch"), trainer());
    assert_eq!(s.krate, parse_quote!(my_reexport::adabatch));
    let s = spec(parse_quote!(crate = ::other), trainer());
    assert_eq!(s.krate, parse_quote!(::other));
    let s = spec(parse_quote!(), trainer());
    assert_eq!(s.krate, parse_quote!(::adabatch));
}
