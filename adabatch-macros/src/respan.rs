//! Span helpers of the expansion: where generated tokens report their errors.
//!
//! In a file of their own (as serde_derive's `internals/respan.rs`) so that the
//! expansion files share them without importing each other.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::ToTokens;

/// A span that reports at `location` but, like the rest of the expansion, counts as
/// macro-generated (lints such as clippy's skip it).
pub fn at(location: Span) -> Span {
    Span::call_site().located_at(location)
}

/// `tokens` with every span (groups included) set to `span`.
pub fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let TokenTree::Group(group) = &tree {
                let mut inner = Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tree = TokenTree::Group(inner);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}

/// The span of the first token of `tokens` (the call site when there is none).
pub fn first_span(tokens: impl ToTokens) -> Span {
    tokens
        .into_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |t| t.span())
}
