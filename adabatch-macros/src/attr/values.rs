//! Scalar values: integers, numbers, booleans, a choice among names, the crate path.
//!
//! Each reader pushes one error on the offending token and returns `None` when the
//! value is not of the expected kind.

use std::fmt::Display;
use std::str::FromStr;

use syn::{Lit, Path};

use super::suggest::{one_of, unknown};
use crate::ctxt::Ctxt;
use crate::parse::Value;

/// A non-negative integer literal of type `T` (`what` names it in messages).
pub fn int<T>(what: &str, value: &Value, cx: &mut Ctxt) -> Option<T>
where
    T: FromStr,
    T::Err: Display,
{
    match value {
        Value::Lit(Lit::Int(i)) if i.base10_digits().starts_with('-') => {
            cx.on(
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
                cx.on(i, format!("invalid integer for `{what}`: {e}"));
                None
            }
        },
        Value::Lit(Lit::Str(s)) if s.value().parse::<T>().is_ok() => {
            cx.on(
                s,
                format!(
                    "expected an integer for `{what}`, found a string: write `{}` without quotes",
                    s.value()
                ),
            );
            None
        }
        other => {
            cx.on(
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

/// `min_batch` / `max_batch`: an integer of at least 1.
pub fn batch_size(key: &str, value: &Value, cx: &mut Ctxt) -> Option<usize> {
    let n = int::<usize>(key, value, cx)?;
    if n == 0 {
        cx.on(
            value,
            format!("`{key} = 0`: a batch size must be at least 1"),
        );
        return None;
    }
    Some(n)
}

/// A number: a float or an integer literal.
pub fn float(what: &str, value: &Value, cx: &mut Ctxt) -> Option<f64> {
    match value {
        Value::Lit(Lit::Float(f)) => f
            .base10_parse::<f64>()
            .map_err(|e| cx.on(f, format!("invalid number for `{what}`: {e}")))
            .ok(),
        Value::Lit(Lit::Int(i)) => i
            .base10_parse::<f64>()
            .map_err(|e| cx.on(i, format!("invalid number for `{what}`: {e}")))
            .ok(),
        other => {
            cx.on(
                other,
                format!("expected a number for `{what}`, found {}", other.describe()),
            );
            None
        }
    }
}

/// `true` or `false`.
pub fn boolean(key: &str, value: &Value, cx: &mut Ctxt) -> Option<bool> {
    match value {
        Value::Lit(Lit::Bool(b)) => Some(b.value),
        other => {
            cx.on(
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

/// One of `choices`, written as a bare name.
pub fn choice(
    key: &str,
    value: &Value,
    choices: &[&'static str],
    cx: &mut Ctxt,
) -> Option<&'static str> {
    let Some(ident) = value.as_ident() else {
        let hint = match value {
            Value::Lit(Lit::Str(s)) if choices.contains(&s.value().as_str()) => {
                format!(": write `{key} = {}` without quotes", s.value())
            }
            _ => String::new(),
        };
        cx.on(
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
            cx.at(
                ident.span(),
                unknown(&format!("`{key}` value"), &name, choices),
            );
            None
        }
    }
}

/// `crate = "path"` or `crate = path`.
pub fn crate_path(value: &Value, cx: &mut Ctxt) -> Option<Path> {
    match value {
        Value::Lit(Lit::Str(s)) => match s.parse::<Path>() {
            Ok(p) => Some(p),
            Err(_) => {
                cx.on(
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
            cx.on(
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

/// `value` when it keeps `rule` (a check of `adabatch-rules`, which the engine
/// runs too); otherwise the rule's message after the setting's name (`` `memory`:
/// ``), spanned on `at`.
pub fn kept<T>(
    setting: &str,
    at: impl quote::ToTokens,
    value: T,
    rule: adabatch_rules::Check,
    cx: &mut Ctxt,
) -> Option<T> {
    match rule {
        Ok(()) => Some(value),
        Err(broken) => {
            cx.on(at, format!("`{setting}`: {broken}"));
            None
        }
    }
}

/// A number argument of `setting`, `default` when absent, kept by `rule`.
pub fn float_arg(
    (setting, name): (&str, &str),
    value: Option<&&Value>,
    default: f64,
    rule: fn(f64) -> adabatch_rules::Check,
    cx: &mut Ctxt,
) -> Option<f64> {
    let Some(v) = value else {
        return Some(default);
    };
    let f = float(name, v, cx)?;
    kept(setting, *v, f, rule(f), cx)
}
