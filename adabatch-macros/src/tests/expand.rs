//! Tokens from a spec, and the fallback expansion.

use syn::parse_quote;

use super::{fallback, spec, trainer};
use crate::fallback;

/// Every key: `..DEFAULT` is still written (a field added to `TrainerPolicy` must not
/// break generated code), and clippy's `needless_update` is silenced for it.
#[test]
fn the_policy_literal_always_ends_with_default() {
    let s = spec(
        parse_quote!(
            schedule = interval(5, +1),
            min_batch = 1,
            max_batch = 8,
            drop_last = true,
            reweight = none,
            oom = skip,
            grad_accum = fixed(1),
            lr_scaling = sqrt,
            shuffle = false,
            seed = 3,
        ),
        trainer(),
    );
    let out = crate::expand::expand(&s).to_string();
    let policy = out
        .split("const __ADABATCH_POLICY")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .expect("the policy const");
    assert!(
        policy
            .trim_end()
            .ends_with(".. :: adabatch :: __private :: TrainerPolicy :: DEFAULT }"),
        "{policy}"
    );
    assert!(out.contains("allow (clippy :: needless_update)"), "{out}");
}

/// The glue's bounds reach the model through a method parameter, so a model that is
/// not a `TrainModel` is reported at `type Model` only.
#[test]
fn the_glue_names_the_model_through_a_parameter() {
    let out = crate::expand::expand(&spec(parse_quote!(), trainer())).to_string();
    assert!(out.contains("pub fn train < D , C , M >"), "{out}");
    assert!(out.contains("pub fn launch < D , C , F , M >"), "{out}");
    assert!(
        out.contains("pub fn launch_with_eval < D , C , F , M >"),
        "{out}"
    );
    assert!(out.contains("pub fn evaluate < D , C , M >"), "{out}");
    assert_eq!(
        out.matches("Self : :: adabatch :: __private :: AdaptiveTrainer < Model = M >")
            .count(),
        4,
        "{out}"
    );
    assert!(!out.contains("< Self as :: adabatch :: __private :: AdaptiveTrainer >"));
}

/// Method generics do not clash with the struct's.
#[test]
fn method_generics_are_fresh() {
    let s = spec(
        parse_quote!(),
        parse_quote!(
            struct T<M, D> {
                #[model]
                model: M,
                #[optimizer]
                opt: D,
            }
        ),
    );
    let out = crate::expand::expand(&s).to_string();
    assert!(out.contains("pub fn train < __D , C , __M >"), "{out}");
}

#[test]
fn fallback_has_the_item_the_errors_and_stand_ins() {
    let f = fallback(parse_quote!(sede = 1), trainer());
    let out = fallback::expand(&f).to_string();
    assert!(
        out.starts_with("struct T { model : M , opt : O , }"),
        "{out}"
    );
    assert_eq!(out.matches("compile_error").count(), 1, "{out}");
    // The roles are valid: the trait impl under the default policy.
    assert!(
        out.contains("impl :: adabatch :: __private :: AdaptiveTrainer for T"),
        "{out}"
    );
    assert!(out.contains("pub const POLICY : :: adabatch :: __private :: TrainerPolicy = :: adabatch :: __private :: TrainerPolicy :: DEFAULT"), "{out}");
    assert!(
        out.contains("pub fn new (model : M , opt : O) -> Self"),
        "{out}"
    );
    assert!(out.contains("pub fn train < D , C > (& mut self"), "{out}");
    assert!(out.contains("pub fn launch < D , C , F > ("), "{out}");
    assert!(
        out.contains("pub fn launch_with_eval < D , C , F > ("),
        "{out}"
    );
    assert!(
        out.contains("pub fn evaluate < D , C > (& mut self"),
        "{out}"
    );
    assert_eq!(
        out.matches(":: core :: unimplemented ! ()").count(),
        4,
        "{out}"
    );
    // No policy checks, no bounds on the model.
    assert!(!out.contains("assert_supported"), "{out}");
    assert!(!out.contains("TrainModel"), "{out}");
}

#[test]
fn fallback_without_roles_has_only_the_inherent_stand_ins() {
    let f = fallback(
        parse_quote!(),
        parse_quote!(
            pub struct T<X> {
                #[modle]
                model: X,
                opt: u32,
            }
        ),
    );
    let out = fallback::expand(&f).to_string();
    assert!(!out.contains("AdaptiveTrainer for"), "{out}");
    assert!(out.contains("impl < X > T < X >"), "{out}");
    assert!(
        out.contains("pub fn new (model : X , opt : u32) -> Self"),
        "{out}"
    );
    assert!(out.contains("pub fn launch"), "{out}");
}

#[test]
fn fallback_of_a_tuple_struct_takes_its_fields_in_order() {
    let f = fallback(
        parse_quote!(),
        parse_quote!(
            struct T(M, O);
        ),
    );
    let out = fallback::expand(&f).to_string();
    assert!(
        out.contains("pub fn new (_0 : M , _1 : O) -> Self { Self (_0 , _1) }"),
        "{out}"
    );
}

#[test]
fn no_stand_ins_without_a_struct_or_a_path_to_the_runtime() {
    let f = fallback(
        parse_quote!(),
        parse_quote!(
            enum E {
                A,
            }
        ),
    );
    let out = fallback::expand(&f).to_string();
    assert!(!out.contains("impl"), "{out}");
    let f = fallback(parse_quote!(crate = 1), trainer());
    let out = fallback::expand(&f).to_string();
    assert!(!out.contains("impl"), "{out}");
    let f = fallback(parse_quote!(crate = "::other", seed = -1), trainer());
    let out = fallback::expand(&f).to_string();
    assert!(out.contains("pub fn train < D , C > (& mut self , dataset : & D , collate : & C , args : & :: other :: __private :: TrainingArgs ,)"), "{out}");
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

/// `cargo test -p adabatch-macros print_fallback -- --ignored --nocapture`
#[test]
#[ignore = "prints a fallback expansion, for debugging"]
fn print_fallback() {
    let f = fallback(parse_quote!(seed = "1"), trainer());
    println!("{}", fallback::expand(&f));
}
