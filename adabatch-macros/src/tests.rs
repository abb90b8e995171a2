//! Unit tests of parsing and validation (no compiler involved: `syn::parse_quote!`).

use quote::quote;
use syn::parse_quote;

use crate::parse::AttrArgs;
use crate::spec::{
    GradAccum, Growth, LrScaling, Oom, PolicyValue, Reweight, Schedule, TrainerSpec,
};
use crate::validate::{did_you_mean, osa_distance, validate, validate_args, Errors};

fn keys(args: AttrArgs) -> Vec<PolicyValue> {
    let mut errors = Errors::default();
    let policy = validate_args(&args, &mut errors);
    if let Err(e) = errors.finish() {
        panic!("unexpected errors: {:?}", messages(e));
    }
    policy.keys.into_iter().map(|k| k.value).collect()
}

fn one(args: AttrArgs) -> PolicyValue {
    let mut all = keys(args);
    assert_eq!(all.len(), 1);
    all.remove(0)
}

fn schedule(args: AttrArgs) -> Schedule {
    match one(args) {
        PolicyValue::Schedule(s) => s,
        other => panic!("not a schedule: {other:?}"),
    }
}

fn messages(e: syn::Error) -> Vec<String> {
    e.into_iter().map(|e| e.to_string()).collect()
}

fn errors(args: AttrArgs) -> Vec<String> {
    let mut errors = Errors::default();
    validate_args(&args, &mut errors);
    messages(errors.finish().expect_err("expected errors"))
}

fn assert_error(args: AttrArgs, needle: &str) {
    let all = errors(args);
    assert!(
        all.iter().any(|m| m.contains(needle)),
        "no error containing {needle:?} in {all:#?}"
    );
}

fn item_errors(args: AttrArgs, item: syn::Item) -> Vec<String> {
    match validate(Ok(args), item) {
        Ok(_) => panic!("expected errors"),
        Err(invalid) => messages(invalid.error),
    }
}

fn spec(args: AttrArgs, item: syn::Item) -> TrainerSpec {
    match validate(Ok(args), item) {
        Ok(spec) => spec,
        Err(invalid) => panic!("unexpected errors: {:?}", messages(invalid.error)),
    }
}

fn trainer() -> syn::Item {
    parse_quote! {
        struct T {
            #[model] model: M,
            #[optimizer] opt: O,
        }
    }
}

// ---------------------------------------------------------------------------------
// every key and form

#[test]
fn empty_attribute_is_the_default_policy() {
    assert!(keys(parse_quote!()).is_empty());
}

#[test]
fn schedule_constant_forms() {
    assert_eq!(
        schedule(parse_quote!(schedule = constant)),
        Schedule::Constant(None)
    );
    assert_eq!(
        schedule(parse_quote!(schedule = constant())),
        Schedule::Constant(None)
    );
    assert_eq!(
        schedule(parse_quote!(schedule = constant(8))),
        Schedule::Constant(Some(8))
    );
}

#[test]
fn schedule_interval_forms() {
    assert_eq!(
        schedule(parse_quote!(schedule = interval(5, +1))),
        Schedule::Interval {
            every: 5,
            growth: Growth::Add(1)
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = interval(3, -2))),
        Schedule::Interval {
            every: 3,
            growth: Growth::Add(-2)
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = interval(10, *2))),
        Schedule::Interval {
            every: 10,
            growth: Growth::Mul(2)
        }
    );
}

#[test]
fn schedule_linear_steps_custom_memory() {
    assert_eq!(
        schedule(parse_quote!(schedule = linear(2, 32, over = 100))),
        Schedule::Linear {
            from: 2,
            to: 32,
            over: 100
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = steps(0 => 8, 100 => 16, 200 => 32,))),
        Schedule::Steps(vec![(0, 8), (100, 16), (200, 32)])
    );
    assert_eq!(
        schedule(parse_quote!(schedule = custom(crate::schedules::warmup))),
        Schedule::Custom(parse_quote!(crate::schedules::warmup))
    );
    assert_eq!(
        schedule(parse_quote!(
            schedule = memory(threshold = 0.8, max_range = 3)
        )),
        Schedule::Memory {
            threshold: 0.8,
            max_range: 3.0
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = memory(max_range = 1.5))),
        Schedule::Memory {
            threshold: 0.9,
            max_range: 1.5
        }
    );
    assert_eq!(
        schedule(parse_quote!(schedule = memory)),
        Schedule::Memory {
            threshold: 0.9,
            max_range: 2.0
        }
    );
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

#[test]
fn struct_fields_are_found_and_attributes_stripped() {
    let s = spec(
        parse_quote!(schedule = memory(threshold = 0.9, max_range = 2.0)),
        parse_quote! {
            pub struct T<M: Clone> where M: Send {
                /// The model.
                #[model] pub model: M,
                #[optimizer] opt: candle_nn::AdamW,
                #[regressor] mem: Mem,
                other: u32,
            }
        },
    );
    assert_eq!(s.model.ident, "model");
    assert_eq!(s.optimizer.ident, "opt");
    assert_eq!(
        s.regressor.as_ref().map(|r| r.ident.to_string()),
        Some("mem".into())
    );
    let printed = quote::ToTokens::to_token_stream(&s.item).to_string();
    assert!(!printed.contains("model ]"), "{printed}");
    assert!(!printed.contains("optimizer"), "{printed}");
    assert!(!printed.contains("regressor"), "{printed}");
    assert!(printed.contains("doc"), "{printed}");
}

#[test]
fn expansion_mentions_the_runtime_paths() {
    let s = spec(
        parse_quote!(schedule = steps(0 => 8, 100 => 16), crate = "::ab", oom = halve),
        trainer(),
    );
    let out = crate::expand::expand(&s).to_string();
    assert!(
        out.contains(":: ab :: __private :: AdaptiveTrainer"),
        "{out}"
    );
    assert!(out.contains("Steps (& [(0 , 8) , (100 , 16)])"), "{out}");
    // One refusal check per policy key (`crate` is none), reported on that key, and
    // one for the whole policy, guarded so that it only fires when no single key was
    // refused.
    assert_eq!(out.matches("assert_supported").count(), 2 + 1, "{out}");
    assert_eq!(
        out.matches("unsupported () . is_none ()").count(),
        2,
        "{out}"
    );
    assert!(out.contains("OomPolicy :: Halve"), "{out}");
    assert!(out.contains("pub fn launch"), "{out}");
    assert!(!out.contains("fn regressor"), "{out}");
}

// ---------------------------------------------------------------------------------
// errors

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
fn all_errors_of_one_attribute_are_reported() {
    let all = errors(parse_quote!(drop_last = 3, sed = 1, oom = maybe, schedule = interval(0, +0)));
    assert_eq!(all.len(), 5, "{all:#?}");
}

#[test]
fn duplicate_keys_point_at_both() {
    let all = errors(parse_quote!(seed = 1, seed = 2));
    assert_eq!(
        all,
        vec![
            "duplicate key `seed`: each key may be given once",
            "`seed` is first given here"
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
fn schedule_argument_checks() {
    assert_error(
        parse_quote!(schedule = constant(0)),
        "`constant(0)`: a batch size must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = constant(1, 2)),
        "`constant` takes 1 argument, found 2",
    );
    assert_error(
        parse_quote!(schedule = interval(0, +1)),
        "`every` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = interval(5, +0)),
        "the step must not be zero",
    );
    assert_error(
        parse_quote!(schedule = interval(5, -0)),
        "the step must not be zero",
    );
    assert_error(
        parse_quote!(schedule = interval(5, *1)),
        "the factor `*1` must be at least 2",
    );
    assert_error(
        parse_quote!(schedule = interval(5, 1)),
        "write `+1` to grow by 1",
    );
    assert_error(
        parse_quote!(schedule = interval(5)),
        "`interval` takes 2 arguments, found 1",
    );
    assert_error(
        parse_quote!(schedule = interval),
        "`interval` needs arguments: `interval(every, +k)`",
    );
    assert_error(
        parse_quote!(schedule = linear(0, 8, over = 10)),
        "`linear`: `from` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 0, over = 10)),
        "`to` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 8, over = 0)),
        "`over` must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 8)),
        "`linear` needs the length of the ramp",
    );
    assert_error(
        parse_quote!(schedule = linear(1, 8, 10)),
        "write the length of the ramp as `over = n`",
    );
    assert_error(
        parse_quote!(schedule = steps()),
        "`steps` needs at least one `threshold => size` pair",
    );
    assert_error(
        parse_quote!(schedule = steps(0 => 8, 0 => 16)),
        "thresholds must be strictly increasing: `0` comes after `0`",
    );
    assert_error(
        parse_quote!(schedule = steps(10 => 8, 5 => 16)),
        "thresholds must be strictly increasing",
    );
    assert_error(
        parse_quote!(schedule = steps(0 => 0)),
        "`steps`: a batch size must be at least 1",
    );
    assert_error(
        parse_quote!(schedule = steps(0, 8)),
        "expected `threshold => size`",
    );
    assert_error(
        parse_quote!(schedule = custom(1)),
        "expected the path of a `fn(step: usize, current: usize) -> usize`",
    );
    assert_error(
        parse_quote!(schedule = custom(a, b)),
        "`custom` takes 1 argument, found 2",
    );
    assert_error(
        parse_quote!(schedule = memory(threshold = 0.0)),
        "`threshold = 0` must be in (0, 1]",
    );
    assert_error(
        parse_quote!(schedule = memory(threshold = 1.5)),
        "must be in (0, 1]",
    );
    assert_error(
        parse_quote!(schedule = memory(max_range = 0.5)),
        "`max_range = 0.5` must be at least 1.0",
    );
    assert_error(
        parse_quote!(schedule = memory(0.9)),
        "`memory` takes named arguments",
    );
    assert_error(
        parse_quote!(schedule = memory(threshold = 0.5, threshold = 0.6)),
        "duplicate argument `threshold`",
    );
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

#[test]
fn item_shape_errors() {
    let enum_: syn::Item = parse_quote!(
        enum E {
            A,
        }
    );
    assert!(item_errors(parse_quote!(), enum_)[0].contains("found an enum"));
    let tuple: syn::Item = parse_quote!(
        struct T(#[model] M, #[optimizer] O);
    );
    assert!(item_errors(parse_quote!(), tuple)[0].contains("found a tuple struct"));
    let unit: syn::Item = parse_quote!(
        struct T;
    );
    assert!(item_errors(parse_quote!(), unit)[0].contains("found a unit struct"));
    let union_: syn::Item = parse_quote!(union U { a: u32 });
    assert!(item_errors(parse_quote!(), union_)[0].contains("found a union"));
    let func: syn::Item = parse_quote!(
        fn f() {}
    );
    assert!(item_errors(parse_quote!(), func)[0].contains("cannot be applied to this item"));
}

#[test]
fn field_attribute_errors() {
    let all = item_errors(
        parse_quote!(),
        parse_quote!(
            struct T {
                a: u32,
            }
        ),
    );
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all[0].starts_with("missing `#[model]`"));
    assert!(all[1].starts_with("missing `#[optimizer]`"));

    let all = item_errors(
        parse_quote!(),
        parse_quote!(
            struct T {
                #[model]
                a: M,
                #[model]
                b: M,
                #[optimizer]
                o: O,
            }
        ),
    );
    assert_eq!(
        all,
        vec!["duplicate `#[model]`: exactly one field can be the model; `a` already is"]
    );

    let all = item_errors(
        parse_quote!(schedule = memory),
        parse_quote!(
            struct T {
                #[model]
                a: M,
                #[optimizer]
                o: O,
                #[regressor]
                r: R,
                #[regressor]
                s: R,
            }
        ),
    );
    assert!(all[0].starts_with("duplicate `#[regressor]`"), "{all:?}");

    let all = item_errors(
        parse_quote!(),
        parse_quote!(
            struct T {
                #[model(x)]
                a: M,
                #[optimizer = 1]
                o: O,
            }
        ),
    );
    assert_eq!(
        all,
        vec![
            "`#[model]` takes no arguments: write `#[model]`",
            "`#[optimizer]` takes no value: write `#[optimizer]`"
        ]
    );

    let all = item_errors(
        parse_quote!(),
        parse_quote!(
            struct T {
                #[model]
                #[optimizer]
                a: M,
            }
        ),
    );
    assert!(
        all[0].starts_with("a field can have only one of"),
        "{all:?}"
    );

    let all = item_errors(
        parse_quote!(),
        parse_quote!(
            struct T {
                #[modle]
                a: M,
                #[optimizer]
                o: O,
            }
        ),
    );
    assert!(all[0].contains("did you mean `#[model]`?"), "{all:?}");

    let all = item_errors(
        parse_quote!(schedule = constant),
        parse_quote!(
            struct T {
                #[model]
                a: M,
                #[optimizer]
                o: O,
                #[regressor]
                r: R,
            }
        ),
    );
    assert!(
        all[0].starts_with("`#[regressor]` needs `schedule = memory(..)`"),
        "{all:?}"
    );
}

#[test]
fn argument_and_struct_errors_are_reported_together() {
    let all = item_errors(
        parse_quote!(sede = 1),
        parse_quote!(
            struct T {
                #[model]
                a: M,
            }
        ),
    );
    assert_eq!(all.len(), 2, "{all:?}");
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

/// `cargo test -p adabatch-macros print_expansion -- --ignored --nocapture`
#[test]
#[ignore = "prints an expansion, for debugging"]
fn print_expansion() {
    let s = spec(
        parse_quote!(schedule = custom(my::f), oom = halve),
        parse_quote!(
            pub struct T<D: Clone> {
                #[model]
                model: M<D>,
                #[optimizer]
                opt: O,
                x: D,
            }
        ),
    );
    println!("{}", crate::expand::expand(&s));
}
