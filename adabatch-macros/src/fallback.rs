//! The expansion of an attribute with mistakes (as thiserror-impl's `fallback.rs`):
//! the user's item, the errors, and stand-ins for what the macro would have
//! generated, so that the user's own uses of `new`, `train`, `launch` and `POLICY`
//! do not cascade into "no function or associated item named ..." errors.

use proc_macro2::TokenStream;
use quote::quote;

use crate::expand::trainer_impl;
use crate::glue::{self, Mode};
use crate::spec::{Fallback, FallbackItem, Parts};

/// The item, the errors, and the stand-ins.
pub fn expand(fallback: &Fallback) -> TokenStream {
    let errors = fallback.error.to_compile_error();
    let (krate, item, parts) = match &fallback.item {
        FallbackItem::Struct { krate, item, parts } => (krate, item, parts),
        FallbackItem::Other(tokens) => return quote!(#tokens #errors),
    };
    // Without a path to the runtime (a broken `crate = ..`), nothing can stand in.
    let stand_ins = krate.as_ref().map(|krate| {
        let p = quote!(#krate::__private);
        let policy = quote!(#p::TrainerPolicy::DEFAULT);
        // With valid roles the trait impl is the real one under the default policy
        // (a constant schedule: no `regressor`, whose type may be the next thing
        // the user changes), so calls through `AdaptiveTrainer` do not cascade.
        let trainer_impl = parts.as_ref().map(|parts| {
            let parts = Parts {
                regressor: None,
                callback: None,
                mixer: None,
                ..parts.clone()
            };
            trainer_impl(&p, item, &parts, &policy)
        });
        let inherent = glue::inherent(&p, item, &policy, Mode::Stub);
        quote! {
            const _: () = {
                #trainer_impl
                #inherent
            };
        }
    });
    quote! {
        #item
        #errors
        #stand_ins
    }
}
