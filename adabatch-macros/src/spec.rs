//! The validated trainer description: plain data, with the spans generated code
//! needs to point its own errors (trait bounds, const evaluation) at user tokens;
//! and, for an attribute with mistakes, what the fallback expansion needs.

use proc_macro2::{Span, TokenStream};
use syn::{Ident, ItemStruct, Path, Type};

use crate::attr::{parse_args, Attrs};
use crate::check::check;
use crate::ctxt::Ctxt;
use crate::item::{parse_item, Shape};
use crate::parse::AttrArgs;

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

/// The marked fields of a trainer.
#[derive(Debug, Clone)]
pub struct Parts {
    /// The `#[model]` field.
    pub model: FieldRef,
    /// The `#[optimizer]` field.
    pub optimizer: FieldRef,
    /// The `#[regressor]` field, if any.
    pub regressor: Option<FieldRef>,
    /// The `#[callback]` field, if any.
    pub callback: Option<FieldRef>,
    /// The `#[mixer]` field, if any.
    pub mixer: Option<FieldRef>,
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

/// A marked field.
#[derive(Debug, Clone)]
pub struct FieldRef {
    /// Its name.
    pub ident: Ident,
    /// Its type (spans point into the user's struct).
    pub ty: Type,
}

/// One policy key as written, with the span of `key = value` for errors the
/// runtime raises about it (e.g. "not supported yet").
#[derive(Debug, Clone)]
pub struct PolicyKey {
    /// The value.
    pub value: PolicyValue,
    /// Span of the value as written (its first token).
    pub span: Span,
}

/// A policy field of `TrainerPolicy`, with its value.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyValue {
    /// `schedule = ...`
    Schedule(Schedule),
    /// `min_batch = n`
    MinBatch(usize),
    /// `max_batch = n`
    MaxBatch(usize),
    /// `drop_last = bool`
    DropLast(bool),
    /// `reweight = ...`
    Reweight(Reweight),
    /// `oom = ...`
    Oom(Oom),
    /// `grad_accum = ...`
    GradAccum(GradAccum),
    /// `lr_scaling = ...`
    LrScaling(LrScaling),
    /// `shuffle = bool`
    Shuffle(bool),
    /// `seed = n`
    Seed(u64),
    /// `mix = ...`
    Mix(Mix),
}

/// `mix = ...`
#[derive(Debug, Clone, PartialEq)]
pub enum Mix {
    /// `fixed(name = w, ..)`
    Fixed(Vec<(String, f64)>),
    /// `online(temperature = t, floor = f, smoothing = s)`
    Online {
        /// Softmax temperature.
        temperature: f64,
        /// Even share.
        floor: f64,
        /// Moving-average factor.
        smoothing: f64,
    },
    /// `custom(path)`: a `fn(&SourceStats) -> Vec<f64>`.
    Custom(Path),
}

/// `schedule = ...`
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// `constant` / `constant(n)`
    Constant(Option<usize>),
    /// `interval(every, +k | -k | *k)`
    Interval {
        /// Steps between changes.
        every: usize,
        /// The change.
        growth: Growth,
    },
    /// `linear(from, to, over = n)`
    Linear {
        /// Size at step 0.
        from: usize,
        /// Size from step `over` on.
        to: usize,
        /// Steps of the ramp.
        over: usize,
    },
    /// `steps(t => size, ...)`
    Steps(Vec<(usize, usize)>),
    /// `custom(path)`
    Custom(Path),
    /// `ramp(start = a, increment = b, samples = c, global = g)` (global units)
    Ramp {
        /// Global batch of the first step.
        start: usize,
        /// Growth per stair.
        increment: usize,
        /// Examples of the climb.
        samples: usize,
        /// Global batch after the ramp.
        global: usize,
        /// `tokens = c`: the climb counts tokens consumed.
        in_tokens: bool,
    },
    /// `noise_scale(fraction = f, min = a, max = b)` (global units)
    NoiseScale {
        /// Fraction of the estimated noise scale.
        fraction: f64,
        /// Smallest (and first) global batch.
        min: usize,
        /// Largest global batch.
        max: usize,
    },
    /// `memory(threshold = x, max_range = y)`
    Memory {
        /// Fraction of the baseline's peak memory.
        threshold: f64,
        /// Largest growth factor.
        max_range: f64,
    },
}

/// `interval`'s change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// `+k` / `-k`
    Add(i64),
    /// `*k`
    Mul(usize),
}

/// `reweight = ...`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reweight {
    /// `sample_count`
    SampleCount,
    /// `token_count`
    TokenCount,
    /// `none`
    RankMean,
}

/// `oom = ...`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oom {
    /// `fail`
    Fail,
    /// `halve`
    Halve,
    /// `split_retry`
    SplitRetry,
    /// `skip`
    Skip,
}

/// `grad_accum = ...`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradAccum {
    /// `fixed(n)`
    Fixed(usize),
    /// `target(global = n)`
    Target(usize),
}

/// `lr_scaling = ...`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LrScaling {
    /// `none`
    Off,
    /// `linear`
    Linear,
    /// `sqrt`
    Sqrt,
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
