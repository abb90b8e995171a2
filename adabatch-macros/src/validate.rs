//! Interprets the parsed arguments and the struct, collecting *every* error of one
//! attribute (`syn::Error::combine`) and producing a [`TrainerSpec`].

use std::collections::HashMap;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Fields, Ident, Item, ItemStruct, Lit, Meta, Path};

use crate::parse::{path_to_string, AttrArgs, Call, CallArg, Op, Value};
use crate::spec::{
    FieldRef, GradAccum, Growth, LrScaling, Oom, PolicyKey, PolicyValue, Reweight, Schedule,
    TrainerSpec,
};

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
    "crate",
];

/// The schedule kinds.
pub const SCHEDULES: &[&str] = &[
    "constant", "interval", "linear", "steps", "custom", "memory",
];
/// `reweight` values.
pub const REWEIGHTS: &[&str] = &["sample_count", "token_count", "none"];
/// `oom` values.
pub const OOMS: &[&str] = &["fail", "halve", "split_retry", "skip"];
/// `grad_accum` forms.
pub const GRAD_ACCUMS: &[&str] = &["fixed", "target"];
/// `lr_scaling` values.
pub const LR_SCALINGS: &[&str] = &["none", "linear", "sqrt"];
/// The field attributes.
pub const FIELD_ATTRS: &[&str] = &["model", "optimizer", "regressor"];

/// Names users bring from Hugging Face / PyTorch, with where they belong here.
const KNOWN_ELSEWHERE: &[(&str, &str)] = &[
    ("dataloader_drop_last", "the key is `drop_last = true|false`"),
    ("gradient_accumulation_steps", "the key is `grad_accum = fixed(n)`"),
    ("auto_find_batch_size", "write `oom = halve`"),
    ("batch_size", "the initial size is a run-time setting: `TrainingArgs::per_device_train_batch_size`; the attribute takes `schedule`, `min_batch`, `max_batch`"),
    ("per_device_train_batch_size", "this is a run-time setting: set it in `TrainingArgs`"),
    ("num_train_epochs", "this is a run-time setting: set it in `TrainingArgs`"),
    ("epochs", "this is a run-time setting: `TrainingArgs::num_train_epochs`"),
    ("learning_rate", "this is a run-time setting: set it in `TrainingArgs`; the attribute takes `lr_scaling`"),
    ("lr", "this is a run-time setting: `TrainingArgs::learning_rate`; the attribute takes `lr_scaling`"),
    ("max_steps", "this is a run-time setting: set it in `TrainingArgs`"),
];

/// The user's item could not become a trainer: emit it (field attributes stripped)
/// and the errors.
pub struct Invalid {
    /// The item as written, minus `#[model]` / `#[optimizer]` / `#[regressor]`.
    pub item: TokenStream,
    /// All errors, combined.
    pub error: syn::Error,
}

/// Collects errors; `combine` keeps them all.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds one error.
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }
    /// Adds an error on a span.
    pub fn at(&mut self, span: Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }
    /// Adds an error spanning `tokens` (from their first to their last token).
    pub fn on(&mut self, tokens: impl ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }
    /// `Err` with everything collected, if anything was.
    pub fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// The whole check: arguments (already parsed, or the parse error) and the item.
pub fn validate(args: syn::Result<AttrArgs>, item: Item) -> Result<TrainerSpec, Invalid> {
    let mut errors = Errors::default();
    let policy = match args {
        Ok(args) => Some(validate_args(&args, &mut errors)),
        Err(e) => {
            errors.push(e);
            None
        }
    };
    let shape = validate_item(item, &mut errors);
    let (item, fields) = match shape {
        Shape::Struct(item, fields) => (item, fields),
        Shape::Other(tokens) => {
            return Err(Invalid {
                item: tokens,
                error: errors.finish().unwrap_err(),
            });
        }
    };
    if let (Some(policy), Some(fields)) = (&policy, &fields) {
        if let Some(regressor) = &fields.regressor_attr {
            if !policy.schedule_is_memory && !policy.schedule_is_broken {
                errors.on(
                    regressor,
                    "`#[regressor]` needs `schedule = memory(..)`: the memory model only drives the memory schedule; add `schedule = memory(threshold = 0.9, max_range = 2.0)` or remove the field attribute",
                );
            }
        }
    }
    match (policy, fields, errors.finish()) {
        (Some(policy), Some(fields), Ok(())) => Ok(TrainerSpec {
            krate: policy.krate,
            policy: policy.keys,
            item,
            model: fields.model,
            optimizer: fields.optimizer,
            regressor: fields.regressor,
        }),
        (_, _, Err(error)) => Err(Invalid {
            item: item.into_token_stream(),
            error,
        }),
        // Unreachable in practice: every `None` above pushed an error.
        _ => Err(Invalid {
            item: item.into_token_stream(),
            error: syn::Error::new(Span::call_site(), "invalid `#[adaptive_trainer]`"),
        }),
    }
}

/// The interpreted arguments.
#[derive(Debug, Clone)]
pub struct Policy {
    /// `crate = ...` or `::adabatch`.
    pub krate: Path,
    /// Policy keys in source order.
    pub keys: Vec<PolicyKey>,
    schedule_is_memory: bool,
    schedule_is_broken: bool,
}

/// Interprets every argument, pushing an error for each mistake; the keys that were
/// valid are kept (the result is only used when no error was pushed).
pub fn validate_args(args: &AttrArgs, errors: &mut Errors) -> Policy {
    let mut local = Errors::default();
    let mut seen: HashMap<String, &Ident> = HashMap::new();
    let mut keys = Vec::new();
    let mut krate = None;
    let mut schedule_is_memory = false;
    let mut schedule_is_broken = false;
    let mut min_batch: Option<(usize, &Value)> = None;
    let mut max_batch: Option<(usize, &Value)> = None;

    for arg in &args.args {
        let name = arg.key.to_string();
        let name = name.strip_prefix("r#").unwrap_or(&name).to_string();
        if !KEYS.contains(&name.as_str()) {
            local.at(arg.key.span(), unknown("key", &name, KEYS));
            continue;
        }
        if let Some(first) = seen.get(&name) {
            local.at(
                arg.key.span(),
                format!("duplicate key `{name}`: each key may be given once"),
            );
            local.at(first.span(), format!("`{name}` is first given here"));
            continue;
        }
        seen.insert(name.clone(), &arg.key);
        let Some((_, value)) = &arg.value else {
            local.at(
                arg.key.span(),
                format!("`{name}` needs a value, e.g. `{name} = {}`", example(&name)),
            );
            if name == "schedule" {
                schedule_is_broken = true;
            }
            continue;
        };
        let span = value.span();
        let parsed = match name.as_str() {
            "crate" => {
                krate = crate_path(value, &mut local);
                continue;
            }
            "schedule" => {
                if let Some(call) = callee(value) {
                    schedule_is_memory = call == "memory";
                }
                let s = schedule(value, &mut local);
                schedule_is_broken = s.is_none();
                s.map(PolicyValue::Schedule)
            }
            "min_batch" => batch_size(&name, value, &mut local).map(|n| {
                min_batch = Some((n, value));
                PolicyValue::MinBatch(n)
            }),
            "max_batch" => batch_size(&name, value, &mut local).map(|n| {
                max_batch = Some((n, value));
                PolicyValue::MaxBatch(n)
            }),
            "drop_last" => boolean(&name, value, &mut local).map(PolicyValue::DropLast),
            "shuffle" => boolean(&name, value, &mut local).map(PolicyValue::Shuffle),
            "seed" => int::<u64>(&name, value, &mut local).map(PolicyValue::Seed),
            "reweight" => choice(&name, value, REWEIGHTS, &mut local).map(|c| {
                PolicyValue::Reweight(match c {
                    "sample_count" => Reweight::SampleCount,
                    "token_count" => Reweight::TokenCount,
                    _ => Reweight::RankMean,
                })
            }),
            "oom" => choice(&name, value, OOMS, &mut local).map(|c| {
                PolicyValue::Oom(match c {
                    "fail" => Oom::Fail,
                    "halve" => Oom::Halve,
                    "split_retry" => Oom::SplitRetry,
                    _ => Oom::Skip,
                })
            }),
            "lr_scaling" => choice(&name, value, LR_SCALINGS, &mut local).map(|c| {
                PolicyValue::LrScaling(match c {
                    "none" => LrScaling::Off,
                    "linear" => LrScaling::Linear,
                    _ => LrScaling::Sqrt,
                })
            }),
            "grad_accum" => grad_accum(value, &mut local).map(PolicyValue::GradAccum),
            _ => unreachable!("every key of KEYS is handled"),
        };
        if let Some(value) = parsed {
            keys.push(PolicyKey { value, span });
        }
    }

    if let (Some((min, _)), Some((max, max_value))) = (min_batch, max_batch) {
        if min > max {
            local.on(
                max_value,
                format!("`max_batch = {max}` is smaller than `min_batch = {min}`"),
            );
        }
    }

    if let Err(e) = local.finish() {
        errors.push(e);
    }
    Policy {
        krate: krate.unwrap_or_else(|| syn::parse_quote!(::adabatch)),
        keys,
        schedule_is_memory,
        schedule_is_broken,
    }
}

fn callee(value: &Value) -> Option<String> {
    match value {
        Value::Call(Call { name, .. }) | Value::Path(name) => {
            name.get_ident().map(ToString::to_string)
        }
        Value::Lit(_) => None,
    }
}

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
        _ => "\"::adabatch\"",
    }
}

/// "expected one of `a`, `b`, `c`"
pub fn one_of(choices: &[&str]) -> String {
    let list: Vec<String> = choices.iter().map(|c| format!("`{c}`")).collect();
    format!("expected one of {}", list.join(", "))
}

fn unknown(what: &str, name: &str, choices: &[&str]) -> String {
    unknown_of(what, name, "", choices)
}

/// "unknown {what} `{name}`{of}: did you mean `x`? (expected one of ...)"
fn unknown_of(what: &str, name: &str, of: &str, choices: &[&str]) -> String {
    let head = format!("unknown {what} `{name}`{of}");
    let elsewhere = KNOWN_ELSEWHERE
        .iter()
        .find(|(k, _)| *k == name && what == "key");
    if let Some((_, hint)) = elsewhere {
        format!("{head}: {hint}; {}", one_of(choices))
    } else if let Some(best) = did_you_mean(name, choices) {
        format!("{head}: did you mean `{best}`? ({})", one_of(choices))
    } else {
        format!("{head}; {}", one_of(choices))
    }
}

/// The closest choice, if it is close enough to be a typo.
pub fn did_you_mean<'a>(name: &str, choices: &[&'a str]) -> Option<&'a str> {
    let lower = name.to_lowercase();
    choices
        .iter()
        .map(|c| (osa_distance(&lower, c), *c))
        .filter(|(d, c)| *d <= (c.len().max(lower.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Optimal-string-alignment distance: Levenshtein plus adjacent transpositions.
pub fn osa_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

// ---------------------------------------------------------------------------------
// Scalar values

fn int<T>(what: &str, value: &Value, errors: &mut Errors) -> Option<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    match value {
        Value::Lit(Lit::Int(i)) if i.base10_digits().starts_with('-') => {
            errors.on(
                i,
                format!(
                    "expected a non-negative integer for `{what}`, found `{}`",
                    i.base10_digits()
                ),
            );
            None
        }
        Value::Lit(Lit::Int(i)) => match i.base10_parse::<T>() {
            Ok(n) => Some(n),
            Err(e) => {
                errors.on(i, format!("invalid integer for `{what}`: {e}"));
                None
            }
        },
        Value::Lit(Lit::Str(s)) if s.value().parse::<T>().is_ok() => {
            errors.on(
                s,
                format!(
                    "expected an integer for `{what}`, found a string: write `{}` without quotes",
                    s.value()
                ),
            );
            None
        }
        other => {
            errors.on(
                other,
                format!(
                    "expected a non-negative integer for `{what}`, found {}",
                    other.describe()
                ),
            );
            None
        }
    }
}

/// A `linear` argument: an integer of at least 1.
fn positive(what: &str, value: &Value, errors: &mut Errors) -> Option<usize> {
    let n = int::<usize>(what, value, errors)?;
    if n == 0 {
        errors.on(value, format!("`linear`: `{what}` must be at least 1"));
        return None;
    }
    Some(n)
}

fn batch_size(key: &str, value: &Value, errors: &mut Errors) -> Option<usize> {
    let n = int::<usize>(key, value, errors)?;
    if n == 0 {
        errors.on(
            value,
            format!("`{key} = 0`: a batch size must be at least 1"),
        );
        return None;
    }
    Some(n)
}

fn float(what: &str, value: &Value, errors: &mut Errors) -> Option<f64> {
    match value {
        Value::Lit(Lit::Float(f)) => f
            .base10_parse::<f64>()
            .map_err(|e| errors.on(f, format!("invalid number for `{what}`: {e}")))
            .ok(),
        Value::Lit(Lit::Int(i)) => i
            .base10_parse::<f64>()
            .map_err(|e| errors.on(i, format!("invalid number for `{what}`: {e}")))
            .ok(),
        other => {
            errors.on(
                other,
                format!("expected a number for `{what}`, found {}", other.describe()),
            );
            None
        }
    }
}

fn boolean(key: &str, value: &Value, errors: &mut Errors) -> Option<bool> {
    match value {
        Value::Lit(Lit::Bool(b)) => Some(b.value),
        other => {
            errors.on(
                other,
                format!(
                    "expected `true` or `false` for `{key}`, found {}",
                    other.describe()
                ),
            );
            None
        }
    }
}

fn choice(
    key: &str,
    value: &Value,
    choices: &[&'static str],
    errors: &mut Errors,
) -> Option<&'static str> {
    let Some(ident) = value.as_ident() else {
        let hint = match value {
            Value::Lit(Lit::Str(s)) if choices.contains(&s.value().as_str()) => {
                format!(": write `{key} = {}` without quotes", s.value())
            }
            _ => String::new(),
        };
        errors.on(
            value,
            format!(
                "invalid `{key}`: {}, found {}{hint}",
                one_of(choices),
                value.describe()
            ),
        );
        return None;
    };
    let name = ident.to_string();
    match choices.iter().find(|c| **c == name) {
        Some(c) => Some(c),
        None => {
            errors.at(
                ident.span(),
                unknown(&format!("`{key}` value"), &name, choices),
            );
            None
        }
    }
}

fn crate_path(value: &Value, errors: &mut Errors) -> Option<Path> {
    match value {
        Value::Lit(Lit::Str(s)) => match s.parse::<Path>() {
            Ok(p) => Some(p),
            Err(_) => {
                errors.on(
                    s,
                    format!(
                        "`crate = {:?}` is not a path; expected e.g. `crate = \"::adabatch\"`",
                        s.value()
                    ),
                );
                None
            }
        },
        Value::Path(p) => Some(p.clone()),
        other => {
            errors.on(
                other,
                format!(
                    "expected a path for `crate`, e.g. `crate = \"::adabatch\"`, found {}",
                    other.describe()
                ),
            );
            None
        }
    }
}

// ---------------------------------------------------------------------------------
// grad_accum

fn grad_accum(value: &Value, errors: &mut Errors) -> Option<GradAccum> {
    let forms = "expected `fixed(n)` or `target(global = n)`";
    let call = match value {
        Value::Call(call) => call,
        Value::Lit(Lit::Int(i)) => {
            errors.on(
                i,
                format!(
                    "invalid `grad_accum`: {forms}; write `grad_accum = fixed({})`",
                    i.base10_digits()
                ),
            );
            return None;
        }
        Value::Path(p) if p.is_ident("fixed") || p.is_ident("target") => {
            let example = if p.is_ident("fixed") {
                "fixed(2)"
            } else {
                "target(global = 64)"
            };
            errors.on(
                p,
                format!(
                    "`{}` needs an argument, e.g. `grad_accum = {example}`",
                    path_to_string(p)
                ),
            );
            return None;
        }
        Value::Path(p) if p.get_ident().is_some() => {
            errors.on(
                p,
                unknown("`grad_accum` form", &path_to_string(p), GRAD_ACCUMS),
            );
            return None;
        }
        other => {
            errors.on(
                other,
                format!("invalid `grad_accum`: {forms}, found {}", other.describe()),
            );
            return None;
        }
    };
    let name = path_to_string(&call.name);
    match name.as_str() {
        "fixed" => {
            let [arg] = exact_args::<1>(call, "fixed(n)", errors)?;
            match arg {
                CallArg::Plain(v) => {
                    let n = int::<usize>("fixed", v, errors)?;
                    if n == 0 {
                        errors.on(v, "`fixed(0)`: accumulate at least 1 micro-batch per step");
                        return None;
                    }
                    Some(GradAccum::Fixed(n))
                }
                other => {
                    errors.on(other, "expected an integer, as in `fixed(2)`");
                    None
                }
            }
        }
        "target" => {
            let named = named_args(call, &["global"], errors)?;
            let Some(v) = named.get("global") else {
                errors.at(
                    call.paren.span.join(),
                    "`target` needs `global = n`, e.g. `target(global = 64)`",
                );
                return None;
            };
            let n = int::<usize>("global", v, errors)?;
            if n == 0 {
                errors.on(
                    *v,
                    "`target(global = 0)`: the effective global batch must be at least 1",
                );
                return None;
            }
            Some(GradAccum::Target(n))
        }
        _ => {
            errors.on(&call.name, unknown("`grad_accum` form", &name, GRAD_ACCUMS));
            None
        }
    }
}

/// Exactly `N` arguments, else an error on the parentheses naming the form.
fn exact_args<'a, const N: usize>(
    call: &'a Call,
    form: &str,
    errors: &mut Errors,
) -> Option<[&'a CallArg; N]> {
    let args: Vec<&CallArg> = call.args.iter().collect();
    match <[&CallArg; N]>::try_from(args) {
        Ok(a) => Some(a),
        Err(args) => {
            let plural = if N == 1 { "" } else { "s" };
            errors.at(
                call.paren.span.join(),
                format!(
                    "`{}` takes {N} argument{plural}, found {}: `{form}`",
                    path_to_string(&call.name),
                    args.len()
                ),
            );
            None
        }
    }
}

/// Only `name = value` arguments, each known and given once.
fn named_args<'a>(
    call: &'a Call,
    allowed: &[&str],
    errors: &mut Errors,
) -> Option<HashMap<String, &'a Value>> {
    let mut out = HashMap::new();
    let mut ok = true;
    let callee = path_to_string(&call.name);
    for arg in &call.args {
        match arg {
            CallArg::Named { name, value, .. } => {
                let n = name.to_string();
                if !allowed.contains(&n.as_str()) {
                    errors.at(
                        name.span(),
                        unknown_of("argument", &n, &format!(" of `{callee}`"), allowed),
                    );
                    ok = false;
                } else if out.insert(n.clone(), value).is_some() {
                    errors.at(
                        name.span(),
                        format!("duplicate argument `{n}` of `{callee}`"),
                    );
                    ok = false;
                }
            }
            other => {
                let names: Vec<String> = allowed.iter().map(|a| format!("`{a} = ..`")).collect();
                errors.on(
                    other,
                    format!("`{callee}` takes named arguments: {}", names.join(", ")),
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

// ---------------------------------------------------------------------------------
// schedule

const SCHEDULE_FORMS: &str = "expected one of `constant`, `constant(n)`, `interval(every, +k)`, `interval(every, -k)`, `interval(every, *k)`, `linear(from, to, over = n)`, `steps(0 => 8, 100 => 16)`, `custom(path::to::fn)`, `memory(threshold = 0.9, max_range = 2.0)`";

fn schedule(value: &Value, errors: &mut Errors) -> Option<Schedule> {
    match value {
        Value::Path(p) => match p.get_ident().map(ToString::to_string).as_deref() {
            Some("constant") => Some(Schedule::Constant(None)),
            Some("memory") => Some(Schedule::Memory {
                threshold: 0.9,
                max_range: 2.0,
            }),
            Some(name @ ("interval" | "linear" | "steps" | "custom")) => {
                let form = match name {
                    "interval" => "interval(every, +k)",
                    "linear" => "linear(from, to, over = n)",
                    "steps" => "steps(0 => 8, 100 => 16)",
                    _ => "custom(path::to::fn)",
                };
                errors.on(p, format!("`{name}` needs arguments: `{form}`"));
                None
            }
            Some(name) => {
                errors.on(
                    p,
                    unknown("schedule", name, SCHEDULES)
                        .replace(&one_of(SCHEDULES), SCHEDULE_FORMS),
                );
                None
            }
            None => {
                errors.on(
                    p,
                    format!(
                        "invalid `schedule`: {SCHEDULE_FORMS}; found {}",
                        value.describe()
                    ),
                );
                None
            }
        },
        Value::Call(call) => {
            let name = path_to_string(&call.name);
            match name.as_str() {
                "constant" => constant(call, errors),
                "interval" => interval(call, errors),
                "linear" => linear(call, errors),
                "steps" => steps(call, errors),
                "custom" => custom(call, errors),
                "memory" => memory(call, errors),
                _ => {
                    let msg = if call.name.get_ident().is_some() {
                        unknown("schedule", &name, SCHEDULES)
                            .replace(&one_of(SCHEDULES), SCHEDULE_FORMS)
                    } else {
                        format!("unknown schedule `{name}(..)`; {SCHEDULE_FORMS}; a function of your own goes in `custom({name})`")
                    };
                    errors.on(&call.name, msg);
                    None
                }
            }
        }
        Value::Lit(lit) => {
            let hint = match lit {
                Lit::Int(i) => {
                    format!("; for a fixed size write `constant({})`", i.base10_digits())
                }
                _ => String::new(),
            };
            errors.on(
                lit,
                format!(
                    "invalid `schedule`: {SCHEDULE_FORMS}; found {}{hint}",
                    value.describe()
                ),
            );
            None
        }
    }
}

fn constant(call: &Call, errors: &mut Errors) -> Option<Schedule> {
    if call.args.is_empty() {
        return Some(Schedule::Constant(None));
    }
    let [arg] = exact_args::<1>(call, "constant(n)", errors)?;
    let CallArg::Plain(v) = arg else {
        errors.on(arg, "expected a batch size, as in `constant(8)`");
        return None;
    };
    let n = int::<usize>("constant", v, errors)?;
    if n == 0 {
        errors.on(v, "`constant(0)`: a batch size must be at least 1");
        return None;
    }
    Some(Schedule::Constant(Some(n)))
}

fn interval(call: &Call, errors: &mut Errors) -> Option<Schedule> {
    let [every_arg, growth_arg] = exact_args::<2>(call, "interval(every, +k)", errors)?;
    let every = match every_arg {
        CallArg::Plain(v) => match int::<usize>("every", v, errors) {
            Some(0) => {
                errors.on(v, "`interval`: `every` must be at least 1 (the size changes after every `every` steps)");
                None
            }
            n => n,
        },
        other => {
            errors.on(
                other,
                "expected the number of steps between changes, as in `interval(5, +1)`",
            );
            None
        }
    };
    let growth = match growth_arg {
        CallArg::Op { op, value } => match (op, int::<u64>("interval", value, errors)) {
            (_, None) => None,
            (Op::Add(_) | Op::Sub(_), Some(0)) => {
                errors.on(
                    growth_arg,
                    "`interval`: the step must not be zero; use `constant` for a fixed size",
                );
                None
            }
            (Op::Mul(_), Some(k)) if k < 2 => {
                errors.on(
                    growth_arg,
                    format!("`interval`: the factor `*{k}` must be at least 2"),
                );
                None
            }
            (Op::Mul(_), Some(k)) => match usize::try_from(k) {
                Ok(k) => Some(Growth::Mul(k)),
                Err(_) => {
                    errors.on(value, "`interval`: factor too large");
                    None
                }
            },
            (Op::Add(_), Some(k)) => i64::try_from(k).ok().map(Growth::Add),
            (Op::Sub(_), Some(k)) => i64::try_from(k).ok().map(|k| Growth::Add(-k)),
        }
        .or_else(|| {
            if let CallArg::Op {
                value: Value::Lit(Lit::Int(i)),
                ..
            } = growth_arg
            {
                if i.base10_parse::<u64>().is_ok_and(|k| k > i64::MAX as u64) {
                    errors.on(growth_arg, "`interval`: step too large");
                }
            }
            None
        }),
        CallArg::Plain(Value::Lit(Lit::Int(i))) => {
            errors.on(
                i,
                format!("expected `+k`, `-k` or `*k` as the change of `interval`, found `{0}`: write `+{0}` to grow by {0}, or `*{0}` to multiply", i.base10_digits()),
            );
            None
        }
        other => {
            errors.on(
                other,
                "expected `+k`, `-k` or `*k` as the change of `interval`, as in `interval(5, +1)`",
            );
            None
        }
    };
    Some(Schedule::Interval {
        every: every?,
        growth: growth?,
    })
}

fn linear(call: &Call, errors: &mut Errors) -> Option<Schedule> {
    let mut positional = Vec::new();
    let mut over = None;
    let mut ok = true;
    for arg in &call.args {
        match arg {
            CallArg::Plain(v) => positional.push(v),
            CallArg::Named { name, value, .. } if name == "over" => {
                if over.replace(value).is_some() {
                    errors.at(name.span(), "duplicate argument `over` of `linear`");
                    ok = false;
                }
            }
            CallArg::Named { name, .. } => {
                errors.at(
                    name.span(),
                    unknown_of("argument", &name.to_string(), " of `linear`", &["over"]),
                );
                ok = false;
            }
            other => {
                errors.on(other, "expected a batch size; `linear(from, to, over = n)`");
                ok = false;
            }
        }
    }
    if !ok {
        return None;
    }
    let (from, to) = match positional.as_slice() {
        [from, to] => (*from, *to),
        [from, to, third] if over.is_none() => {
            errors.on(
                *third,
                "write the length of the ramp as `over = n`: `linear(from, to, over = n)`",
            );
            let _ = (from, to);
            return None;
        }
        other => {
            errors.at(
                call.paren.span.join(),
                format!("`linear` takes two sizes and `over = n`, found {} positional argument(s): `linear(from, to, over = n)`", other.len()),
            );
            return None;
        }
    };
    let from = positive("from", from, errors);
    let to = positive("to", to, errors);
    let over = match over {
        Some(v) => positive("over", v, errors),
        None => {
            errors.at(
                call.paren.span.join(),
                "`linear` needs the length of the ramp: `linear(from, to, over = n)`",
            );
            None
        }
    };
    Some(Schedule::Linear {
        from: from?,
        to: to?,
        over: over?,
    })
}

fn steps(call: &Call, errors: &mut Errors) -> Option<Schedule> {
    if call.args.is_empty() {
        errors.at(
            call.paren.span.join(),
            "`steps` needs at least one `threshold => size` pair, e.g. `steps(0 => 8, 100 => 16)`",
        );
        return None;
    }
    let mut table = Vec::new();
    let mut ok = true;
    let mut previous: Option<usize> = None;
    for arg in &call.args {
        let CallArg::Arrow { lhs, rhs, .. } = arg else {
            errors.on(
                arg,
                "expected `threshold => size`, as in `steps(0 => 8, 100 => 16)`",
            );
            ok = false;
            continue;
        };
        let threshold = int::<usize>("steps threshold", lhs, errors);
        let size = int::<usize>("steps size", rhs, errors);
        if size == Some(0) {
            errors.on(rhs, "`steps`: a batch size must be at least 1");
            ok = false;
        }
        if let (Some(t), Some(p)) = (threshold, previous) {
            if t <= p {
                errors.on(
                    lhs,
                    format!(
                        "`steps`: thresholds must be strictly increasing: `{t}` comes after `{p}`"
                    ),
                );
                ok = false;
            }
        }
        match (threshold, size) {
            (Some(t), Some(s)) => table.push((t, s)),
            _ => ok = false,
        }
        if threshold.is_some() {
            previous = threshold;
        }
    }
    ok.then_some(Schedule::Steps(table))
}

fn custom(call: &Call, errors: &mut Errors) -> Option<Schedule> {
    let [arg] = exact_args::<1>(call, "custom(path::to::fn)", errors)?;
    match arg {
        CallArg::Plain(Value::Path(p)) => Some(Schedule::Custom(p.clone())),
        other => {
            errors.on(other, "expected the path of a `fn(step: usize, current: usize) -> usize`, as in `custom(my_schedule)`");
            None
        }
    }
}

fn memory(call: &Call, errors: &mut Errors) -> Option<Schedule> {
    let named = named_args(call, &["threshold", "max_range"], errors)?;
    let threshold = match named.get("threshold") {
        None => Some(0.9),
        Some(v) => float("threshold", v, errors).and_then(|t| {
            if t > 0.0 && t <= 1.0 {
                Some(t)
            } else {
                errors.on(*v, format!("`memory`: `threshold = {t}` must be in (0, 1]: a fraction of the baseline batch's peak memory"));
                None
            }
        }),
    };
    let max_range = match named.get("max_range") {
        None => Some(2.0),
        Some(v) => float("max_range", v, errors).and_then(|r| {
            if r.is_finite() && r >= 1.0 {
                Some(r)
            } else {
                errors.on(*v, format!("`memory`: `max_range = {r}` must be at least 1.0: the largest growth factor over the initial size"));
                None
            }
        }),
    };
    Some(Schedule::Memory {
        threshold: threshold?,
        max_range: max_range?,
    })
}

// ---------------------------------------------------------------------------------
// the item

/// The marked fields of a valid struct.
pub struct Fields3 {
    /// `#[model]`
    pub model: FieldRef,
    /// `#[optimizer]`
    pub optimizer: FieldRef,
    /// `#[regressor]`
    pub regressor: Option<FieldRef>,
    /// The `#[regressor]` attribute, for errors about it.
    pub regressor_attr: Option<Attribute>,
}

/// What the item turned out to be (built once per expansion: size does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Shape {
    /// A struct (field attributes stripped), with its marked fields when they are valid.
    Struct(ItemStruct, Option<Fields3>),
    /// Anything else, as tokens to emit unchanged (field attributes stripped).
    Other(TokenStream),
}

const NEEDS_NAMED: &str =
    "`#[adaptive_trainer]` needs a struct with named fields, one `#[model]` and one `#[optimizer]`";

/// Checks the item's shape and its field attributes; strips the attributes.
pub fn validate_item(item: Item, errors: &mut Errors) -> Shape {
    match item {
        Item::Struct(mut s) => {
            let fields = match &mut s.fields {
                Fields::Named(named) => field_attrs(&s.ident, &mut named.named, errors),
                Fields::Unnamed(unnamed) => {
                    errors.at(unnamed.paren_token.span.join(), format!("{NEEDS_NAMED}; found a tuple struct: name its fields, as in `struct Trainer {{ #[model] model: M, #[optimizer] opt: O }}`"));
                    let _ = field_attrs(&s.ident, &mut unnamed.unnamed, &mut Errors::default());
                    None
                }
                Fields::Unit => {
                    errors.at(
                        s.ident.span(),
                        format!("{NEEDS_NAMED}; found a unit struct"),
                    );
                    None
                }
            };
            Shape::Struct(s, fields)
        }
        Item::Enum(mut e) => {
            errors.at(e.enum_token.span, format!("{NEEDS_NAMED}; found an enum"));
            for variant in &mut e.variants {
                for field in variant.fields.iter_mut() {
                    field.attrs.retain(|a| !is_field_attr(a));
                }
            }
            Shape::Other(e.into_token_stream())
        }
        Item::Union(mut u) => {
            errors.at(u.union_token.span, format!("{NEEDS_NAMED}; found a union"));
            for field in u.fields.named.iter_mut() {
                field.attrs.retain(|a| !is_field_attr(a));
            }
            Shape::Other(u.into_token_stream())
        }
        other => {
            errors.on(
                item_head(&other),
                format!("{NEEDS_NAMED}; it cannot be applied to this item"),
            );
            Shape::Other(other.into_token_stream())
        }
    }
}

fn item_head(item: &Item) -> TokenStream {
    match item {
        Item::Fn(f) => f.sig.to_token_stream(),
        Item::Impl(i) => i.impl_token.to_token_stream(),
        Item::Trait(t) => t.trait_token.to_token_stream(),
        Item::Mod(m) => m.mod_token.to_token_stream(),
        other => other.to_token_stream(),
    }
}

fn attr_name(attr: &Attribute) -> Option<String> {
    attr.path().get_ident().map(ToString::to_string)
}

fn is_field_attr(attr: &Attribute) -> bool {
    attr_name(attr).is_some_and(|n| FIELD_ATTRS.contains(&n.as_str()))
}

/// A near miss of a field attribute, `#[modle]`: stripped, reported with a hint.
fn near_miss(attr: &Attribute) -> Option<&'static str> {
    let name = attr_name(attr)?;
    if FIELD_ATTRS.contains(&name.as_str()) || BUILTIN_ATTRS.contains(&name.as_str()) {
        return None;
    }
    did_you_mean(&name, FIELD_ATTRS)
}

const BUILTIN_ATTRS: &[&str] = &[
    "doc",
    "cfg",
    "cfg_attr",
    "allow",
    "warn",
    "deny",
    "expect",
    "forbid",
    "deprecated",
    "must_use",
];

fn field_attrs(
    ident: &Ident,
    fields: &mut Punctuated<syn::Field, syn::token::Comma>,
    errors: &mut Errors,
) -> Option<Fields3> {
    let mut found: HashMap<&'static str, (FieldRef, Attribute)> = HashMap::new();
    // Roles already reported on (a near miss, a conflict): not reported missing too.
    let mut attempted: Vec<&'static str> = Vec::new();
    let mut ok = true;
    for field in fields.iter_mut() {
        let mut roles: Vec<(&'static str, Attribute)> = Vec::new();
        let mut kept = Vec::new();
        for attr in std::mem::take(&mut field.attrs) {
            if let Some(best) = near_miss(&attr) {
                attempted.extend(FIELD_ATTRS.iter().find(|r| **r == best));
                errors.on(attr.path(), format!("unknown field attribute `#[{}]`: did you mean `#[{best}]`? (expected one of `#[model]`, `#[optimizer]`, `#[regressor]`)", attr_name(&attr).unwrap_or_default()));
                ok = false;
                continue;
            }
            let Some(role) =
                attr_name(&attr).and_then(|n| FIELD_ATTRS.iter().find(|r| **r == n).copied())
            else {
                kept.push(attr);
                continue;
            };
            match &attr.meta {
                Meta::Path(_) => {}
                Meta::List(list) => {
                    errors.at(
                        list.delimiter.span().join(),
                        format!("`#[{role}]` takes no arguments: write `#[{role}]`"),
                    );
                    ok = false;
                }
                Meta::NameValue(nv) => {
                    errors.on(
                        &nv.value,
                        format!("`#[{role}]` takes no value: write `#[{role}]`"),
                    );
                    ok = false;
                }
            }
            roles.push((role, attr));
        }
        field.attrs = kept;
        if roles.len() > 1 {
            errors.on(&roles[1].1, format!("a field can have only one of `#[model]`, `#[optimizer]`, `#[regressor]`; this one is already `#[{}]`", roles[0].0));
            attempted.extend(roles.iter().map(|(role, _)| *role));
            ok = false;
            continue;
        }
        let Some((role, attr)) = roles.pop() else {
            continue;
        };
        let Some(field_ident) = field.ident.clone() else {
            continue;
        };
        if let Some((first, _)) = found.get(role) {
            errors.on(
                &attr,
                format!(
                    "duplicate `#[{role}]`: exactly one field can be the {}; `{}` already is",
                    role_noun(role),
                    first.ident
                ),
            );
            ok = false;
            continue;
        }
        found.insert(
            role,
            (
                FieldRef {
                    ident: field_ident,
                    ty: field.ty.clone(),
                },
                attr,
            ),
        );
    }
    for role in ["model", "optimizer"] {
        if !found.contains_key(role) && !attempted.contains(&role) {
            let example = if role == "model" {
                "#[model] model: MyModel"
            } else {
                "#[optimizer] opt: candle_nn::AdamW"
            };
            errors.at(
                ident.span(),
                format!(
                    "missing `#[{role}]`: mark the field that holds the {}, as in `{example}`",
                    role_noun(role)
                ),
            );
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    let (model, _) = found.remove("model")?;
    let (optimizer, _) = found.remove("optimizer")?;
    let (regressor, regressor_attr) = match found.remove("regressor") {
        Some((f, a)) => (Some(f), Some(a)),
        None => (None, None),
    };
    Some(Fields3 {
        model,
        optimizer,
        regressor,
        regressor_attr,
    })
}

fn role_noun(role: &str) -> &'static str {
    match role {
        "model" => "model",
        "optimizer" => "optimizer",
        _ => "memory model",
    }
}
