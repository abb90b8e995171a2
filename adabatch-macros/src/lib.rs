//! The `#[adaptive_trainer(...)]` attribute of adabatch.
//!
//! Use it through the `adabatch` crate (`use adabatch::prelude::*;`), which documents
//! the DSL. The pipeline, one concept per module:
//!
//! - `parse`: the loose syntax of the arguments, every value with its span;
//! - `attr` (one file per key family) and `item` (the struct and its field roles)
//!   read them into typed values, collecting every mistake in a `ctxt::Ctxt`;
//! - `check`: rules that span several keys;
//! - `spec`: the plain `TrainerSpec` (or, with mistakes, a `Fallback`);
//! - `expand` and `glue`: tokens from the spec only, a small typed glue layer that
//!   calls the generic engine through `::adabatch::__private`; `fallback`: the errors
//!   and stand-ins for the generated items, so that one mistake does not cascade;
//!   `respan`: the span helpers they share.

mod attr;
mod check;
mod ctxt;
mod expand;
mod fallback;
mod glue;
mod item;
mod parse;
mod respan;
mod spec;

#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Turns a struct with a `#[model]` and an `#[optimizer]` field into an adabatch
/// trainer. See the `adabatch` crate for the documentation of the DSL.
#[proc_macro_attribute]
pub fn adaptive_trainer(args: TokenStream, input: TokenStream) -> TokenStream {
    let args = syn::parse::<parse::AttrArgs>(args);
    let item = match syn::parse::<syn::Item>(input.clone()) {
        Ok(item) => item,
        Err(error) => {
            let mut out = input;
            out.extend(TokenStream::from(error.to_compile_error()));
            return out;
        }
    };
    match spec::build(args, item) {
        Ok(spec) => expand::expand(&spec).into(),
        Err(fallback) => fallback::expand(&fallback).into(),
    }
}
