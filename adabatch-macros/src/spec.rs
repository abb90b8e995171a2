//! The validated trainer description: plain data, with the spans generated code
//! needs to point its own errors (trait bounds, const evaluation) at user tokens.

use proc_macro2::Span;
use syn::{Ident, ItemStruct, Path, Type};

/// Everything `expand` needs, and nothing it has to check again.
#[derive(Debug, Clone)]
pub struct TrainerSpec {
    /// Path of the facade crate (`::adabatch` unless `crate = "..."`).
    pub krate: Path,
    /// The keys written in the attribute, in source order.
    pub policy: Vec<PolicyKey>,
    /// The user's struct, field attributes stripped.
    pub item: ItemStruct,
    /// The `#[model]` field.
    pub model: FieldRef,
    /// The `#[optimizer]` field.
    pub optimizer: FieldRef,
    /// The `#[regressor]` field, if any.
    pub regressor: Option<FieldRef>,
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
}

/// `schedule = ...`
#[derive(Debug, Clone)]
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
    /// `memory(threshold = x, max_range = y)`
    Memory {
        /// Fraction of the baseline's peak memory.
        threshold: f64,
        /// Largest growth factor.
        max_range: f64,
    },
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        use Schedule::*;
        match (self, other) {
            (Constant(a), Constant(b)) => a == b,
            (
                Interval {
                    every: a,
                    growth: g,
                },
                Interval {
                    every: b,
                    growth: h,
                },
            ) => a == b && g == h,
            (
                Linear {
                    from: a,
                    to: b,
                    over: c,
                },
                Linear {
                    from: d,
                    to: e,
                    over: f,
                },
            ) => (a, b, c) == (d, e, f),
            (Steps(a), Steps(b)) => a == b,
            (Custom(a), Custom(b)) => a == b,
            (
                Memory {
                    threshold: a,
                    max_range: b,
                },
                Memory {
                    threshold: c,
                    max_range: d,
                },
            ) => (a, b) == (c, d),
            _ => false,
        }
    }
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
