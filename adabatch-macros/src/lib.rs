//! The `#[adaptive_trainer(...)]` attribute of adabatch.
//!
//! Use it through the `adabatch` crate (`use adabatch::prelude::*;`), which documents
//! the DSL. The pipeline: `parse` reads the arguments into a loose syntax tree,
//! `validate` interprets them and the struct into a `spec::TrainerSpec` while
//! collecting every error, and `expand` turns the spec into a small typed glue layer
//! that calls the generic engine through `::adabatch::__private`.

mod expand;
mod parse;
mod spec;
mod validate;

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
    match validate::validate(args, item) {
        Ok(spec) => expand::expand(&spec).into(),
        Err(invalid) => {
            let mut out = invalid.item;
            out.extend(invalid.error.to_compile_error());
            out.into()
        }
    }
}
