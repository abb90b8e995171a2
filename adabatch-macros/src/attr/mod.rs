//! The attribute's keys: the table of keys, the typed value of a key
//! ([`PolicyValue`], each family's type re-exported from its file), and the dispatch
//! of each `key = value` to the reader of its family (one file each).
//!
//! Every key is read on its own, so that every mistake of one attribute is reported;
//! rules that span several keys are in `check`.

mod call;
mod choices;
mod grad_accum;
mod mix;
mod schedule;
pub mod suggest;
mod values;

use std::collections::HashMap;

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Lit, Path};

use crate::ctxt::Ctxt;
use crate::parse::{path_to_string, Arg, AttrArgs, Value};
use suggest::unknown;

pub use choices::{LrScaling, Oom, Reweight};

/// What the parser accepts, by name: the test `tests::grammar` holds the documented
/// grammars to these lists.
#[cfg(test)]
pub mod accepted {
    pub use super::choices::{LR_SCALINGS, OOMS, REWEIGHTS};
    pub use super::grad_accum::{GRAD_ACCUMS, TARGET_ARGS};
    pub use super::mix::{MIXES, ONLINE_ARGS, PIKE_ARGS};
    pub use super::schedule::{SCHEDULES, SCHEDULE_ARGS};
    pub use super::KEYS;
}
pub use grad_accum::GradAccum;
pub use mix::{Mix, Warmup};
pub use schedule::{Every, Growth, Schedule};

/// Every key of the DSL, in the order of the documentation.
pub const KEYS: &[&str] = &[
    "schedule",
    "min_batch",
    "max_batch",
    "drop_last",
    "reweight",
    "oom",
    "grad_accum",
    "lr_scaling",
    "shuffle",
    "seed",
    "mix",
    "crate",
];

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

/// A key as the attribute gives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Written<T> {
    /// Not written.
    Absent,
    /// Written, with a mistake (already reported).
    Invalid,
    /// Written and valid.
    Valid(T),
}

/// The interpreted arguments: the valid keys (the spec's policy), and what the
/// checks across keys need.
#[derive(Debug, Clone)]
pub struct Attrs<'a> {
    /// Valid policy keys, in source order.
    pub keys: Vec<PolicyKey>,
    /// `crate = ...`.
    pub krate: Written<Path>,
    /// `schedule = ...`.
    pub schedule: Written<Schedule>,
    /// `min_batch = n`, with its value's tokens.
    pub min_batch: Option<(usize, &'a Value)>,
    /// `max_batch = n`, with its value's tokens.
    pub max_batch: Option<(usize, &'a Value)>,
}

impl Attrs<'_> {
    /// Where generated code finds the facade: `::adabatch` unless `crate = "..."`;
    /// `None` when `crate` was given but is not a path.
    pub fn krate(&self) -> Option<Path> {
        match &self.krate {
            Written::Absent => Some(syn::parse_quote!(::adabatch)),
            Written::Valid(path) => Some(path.clone()),
            Written::Invalid => None,
        }
    }
}

/// Interprets every argument, pushing an error for each mistake; the keys that were
/// valid are kept (the spec is only built when no error was pushed).
pub fn parse_args<'a>(args: &'a AttrArgs, cx: &mut Ctxt) -> Attrs<'a> {
    let mut seen: HashMap<String, &'a Arg> = HashMap::new();
    let mut attrs = Attrs {
        keys: Vec::new(),
        krate: Written::Absent,
        schedule: Written::Absent,
        min_batch: None,
        max_batch: None,
    };

    for arg in &args.args {
        let Some(name) = new_key(arg, &mut seen, cx) else {
            continue;
        };
        match &arg.value {
            Some((_, value)) => attrs.read(&name, value, cx),
            None => attrs.missing_value(&name, arg, cx),
        }
    }
    attrs
}

/// The name of `arg`'s key (without `r#`) when it is a key not given before;
/// reports it otherwise.
fn new_key<'a>(arg: &'a Arg, seen: &mut HashMap<String, &'a Arg>, cx: &mut Ctxt) -> Option<String> {
    let name = arg.key.to_string();
    let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
    if !KEYS.contains(&name.as_str()) {
        cx.at(arg.key.span(), unknown("key", &name, KEYS));
        return None;
    }
    if let Some(first) = seen.get(&name) {
        cx.at(
            arg.key.span(),
            format!(
                "duplicate key `{name}`: each key may be given once; `{}` comes first",
                short(first)
            ),
        );
        return None;
    }
    seen.insert(name.clone(), arg);
    Some(name)
}

impl<'a> Attrs<'a> {
    /// Reports a key written without `= value`; a broken `schedule` or `crate` is
    /// remembered, so that the checks across keys do not guess at it.
    fn missing_value(&mut self, name: &str, arg: &Arg, cx: &mut Ctxt) {
        cx.at(
            arg.key.span(),
            format!("`{name}` needs a value, e.g. `{name} = {}`", example(name)),
        );
        match name {
            "schedule" => self.schedule = Written::Invalid,
            "crate" => self.krate = Written::Invalid,
            _ => {}
        }
    }

    /// Reads `name = value`: keeps the key when it is valid, and what the checks
    /// across keys need.
    fn read(&mut self, name: &str, value: &'a Value, cx: &mut Ctxt) {
        let span = value.span();
        let parsed = match name {
            "crate" => {
                self.krate = written(values::crate_path(value, cx));
                return;
            }
            "schedule" => {
                let s = schedule::schedule(value, cx);
                self.schedule = written(s.clone());
                s.map(PolicyValue::Schedule)
            }
            "min_batch" => values::batch_size(name, value, cx).map(|n| {
                self.min_batch = Some((n, value));
                PolicyValue::MinBatch(n)
            }),
            "max_batch" => values::batch_size(name, value, cx).map(|n| {
                self.max_batch = Some((n, value));
                PolicyValue::MaxBatch(n)
            }),
            _ => policy_value(name, value, cx),
        };
        if let Some(value) = parsed {
            self.keys.push(PolicyKey { value, span });
        }
    }
}

/// The value of a key that no check across keys looks at.
fn policy_value(name: &str, value: &Value, cx: &mut Ctxt) -> Option<PolicyValue> {
    match name {
        "drop_last" => values::boolean(name, value, cx).map(PolicyValue::DropLast),
        "shuffle" => values::boolean(name, value, cx).map(PolicyValue::Shuffle),
        "seed" => values::int::<u64>(name, value, cx).map(PolicyValue::Seed),
        "reweight" => choices::reweight(value, cx).map(PolicyValue::Reweight),
        "oom" => choices::oom(value, cx).map(PolicyValue::Oom),
        "lr_scaling" => choices::lr_scaling(value, cx).map(PolicyValue::LrScaling),
        "grad_accum" => grad_accum::grad_accum(value, cx).map(PolicyValue::GradAccum),
        "mix" => mix::mix(value, cx).map(PolicyValue::Mix),
        _ => unreachable!("every key of KEYS is handled"),
    }
}

fn written<T>(value: Option<T>) -> Written<T> {
    value.map_or(Written::Invalid, Written::Valid)
}

/// A key as written, its value short: `seed = 1`, `oom = halve`,
/// `schedule = interval(..)`.
fn short(arg: &Arg) -> String {
    let key = arg.key.to_string();
    let key = key.strip_prefix("r#").unwrap_or(&key);
    let Some((_, value)) = &arg.value else {
        return key.to_string();
    };
    let value = match value {
        Value::Lit(Lit::Str(s)) => format!("{:?}", s.value()),
        Value::Lit(lit) => quote::ToTokens::to_token_stream(lit).to_string(),
        Value::Path(p) => path_to_string(p),
        Value::Call(c) => format!("{}(..)", path_to_string(&c.name)),
    };
    format!("{key} = {value}")
}

/// An example value of `key`, for "`key` needs a value".
fn example(key: &str) -> &'static str {
    match key {
        "schedule" => "interval(5, +1)",
        "min_batch" => "1",
        "max_batch" => "64",
        "drop_last" | "shuffle" => "true",
        "reweight" => "sample_count",
        "oom" => "fail",
        "grad_accum" => "fixed(2)",
        "lr_scaling" => "sqrt",
        "seed" => "42",
        "mix" => "fixed(new = 0.75, replay = 0.25)",
        _ => "\"::adabatch\"",
    }
}
