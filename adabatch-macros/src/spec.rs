//! The validated trainer description: plain data, with the spans generated code
//! needs to point its own errors (trait bounds, const evaluation) at user tokens;
//! and, for an attribute with mistakes, what the fallback expansion needs; `build`
//! runs the readers and the checks to make one of the two.
//!
//! The value of each key and the marked fields are defined by the file that reads
//! them (`attr/`, `item`) and re-exported here, so that the expansion reads the spec
//! alone.

use proc_macro2::{Span, TokenStream};
use syn::{ItemStruct, Path};

use crate::attr::{parse_args, Attrs};
use crate::check::check;
use crate::ctxt::Ctxt;
use crate::item::{parse_item, Shape};
use crate::parse::AttrArgs;

pub use crate::attr::{
    Every, GradAccum, Growth, LrScaling, Mix, Oom, PolicyKey, PolicyValue, Reweight, Schedule,
    Warmup,
};
pub use crate::item::Parts;

/// Everything `expand` needs, and nothing it has to check again.
#[derive(Debug, Clone)]
pub struct TrainerSpec {
    /// Path of the facade crate (`::adabatch` unless `crate = "..."`).
    pub krate: Path,
    /// The keys written in the attribute, in source order.
    pub policy: Vec<PolicyKey>,
    /// The user's struct, field attributes stripped.
    pub item: ItemStruct,
    /// Its marked fields.
    pub parts: Parts,
}

/// An attribute with mistakes: the errors, and the item to emit with stand-ins for
/// the generated items, so that the user's later uses of them do not cascade.
pub struct Fallback {
    /// Every mistake, combined.
    pub error: syn::Error,
    /// The item.
    pub item: FallbackItem,
}

/// The item of a [`Fallback`].
#[allow(clippy::large_enum_variant)]
pub enum FallbackItem {
    /// A struct (field attributes stripped): stand-ins can be generated.
    Struct {
        /// Where generated code finds the facade; `None` when `crate = ..` is broken.
        krate: Option<Path>,
        /// The struct.
        item: ItemStruct,
        /// Its marked fields, when they are valid.
        parts: Option<Parts>,
    },
    /// Anything else, emitted as is (field attributes stripped).
    Other(TokenStream),
}

/// Reads the attribute's arguments (or their syntax error) and the item, collecting
/// every mistake: the spec, or what the fallback expansion needs.
pub fn build(args: syn::Result<AttrArgs>, item: syn::Item) -> Result<TrainerSpec, Box<Fallback>> {
    let mut cx = Ctxt::new();
    let args = args.map_err(|e| cx.push(e)).ok();
    let attrs: Option<Attrs> = args.as_ref().map(|args| parse_args(args, &mut cx));
    let shape = parse_item(item, &mut cx);
    let (item, roles) = match shape {
        Shape::Struct(item, roles) => (item, roles),
        Shape::Other(tokens) => {
            let error = cx.check().err().unwrap_or_else(|| {
                syn::Error::new(Span::call_site(), "invalid `#[adaptive_trainer]`")
            });
            return Err(Box::new(Fallback {
                error,
                item: FallbackItem::Other(tokens),
            }));
        }
    };
    if let Some(attrs) = &attrs {
        check(attrs, roles.as_ref(), &mut cx);
    }
    let parts = roles.map(|r| r.parts);
    let result = cx.check();
    if let (Ok(()), Some(attrs), Some(parts)) = (&result, &attrs, &parts) {
        return Ok(TrainerSpec {
            krate: attrs
                .krate()
                .unwrap_or_else(|| syn::parse_quote!(::adabatch)),
            policy: attrs.keys.clone(),
            item,
            parts: parts.clone(),
        });
    }
    // Every `None` above pushed an error: the last resort is unreachable in practice.
    let error = result
        .err()
        .unwrap_or_else(|| syn::Error::new(Span::call_site(), "invalid `#[adaptive_trainer]`"));
    Err(Box::new(Fallback {
        error,
        item: FallbackItem::Struct {
            // A syntax error in the arguments: assume the default path.
            krate: attrs.map_or_else(|| Some(syn::parse_quote!(::adabatch)), |a| a.krate()),
            item,
            parts,
        },
    }))
}
