//! The error collector: every mistake of one attribute is reported together, each on
//! its own token.
//!
//! As serde_derive's `Ctxt`, it must be drained: [`Ctxt::check`] takes the errors out,
//! and dropping a `Ctxt` that was never checked is a bug of this crate: it panics, so
//! a forgotten error cannot silently vanish.

use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects errors; [`Ctxt::check`] returns them combined.
pub struct Ctxt {
    /// `None` once drained.
    errors: Option<Vec<syn::Error>>,
}

impl Ctxt {
    /// An empty collector.
    pub fn new() -> Self {
        Ctxt {
            errors: Some(Vec::new()),
        }
    }

    /// Adds one error (or several, if `error` was combined).
    pub fn push(&mut self, error: syn::Error) {
        self.errors
            .as_mut()
            .expect("error pushed to a drained Ctxt")
            .push(error);
    }

    /// Adds an error on a span.
    pub fn at(&mut self, span: Span, msg: impl Display) {
        self.push(syn::Error::new(span, msg));
    }

    /// Adds an error spanning `tokens` (from their first to their last token).
    pub fn on(&mut self, tokens: impl ToTokens, msg: impl Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    /// Drains the collector: `Err` with every error combined, in the order pushed.
    pub fn check(mut self) -> syn::Result<()> {
        let mut errors = self.errors.take().unwrap_or_default().into_iter();
        let Some(mut all) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            all.combine(error);
        }
        Err(all)
    }
}

impl Default for Ctxt {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if self.errors.is_some() && !std::thread::panicking() {
            panic!("a Ctxt was dropped without `check()`");
        }
    }
}
