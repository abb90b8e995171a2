//! The struct and the roles of its fields.

use syn::parse_quote;

use super::{item_errors, spec};

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
    assert_eq!(s.parts.model.ident, "model");
    assert_eq!(s.parts.optimizer.ident, "opt");
    assert_eq!(
        s.parts.regressor.as_ref().map(|r| r.ident.to_string()),
        Some("mem".into())
    );
    let printed = quote::ToTokens::to_token_stream(&s.item).to_string();
    assert!(!printed.contains("model ]"), "{printed}");
    assert!(!printed.contains("optimizer"), "{printed}");
    assert!(!printed.contains("regressor"), "{printed}");
    assert!(printed.contains("doc"), "{printed}");
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
