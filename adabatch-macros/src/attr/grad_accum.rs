//! `grad_accum = fixed(n) | target(global = n)`.

use syn::Lit;

use super::call::{exact_args, named_args};
use super::suggest::unknown;
use super::values::int;
use crate::ctxt::Ctxt;
use crate::parse::{path_to_string, Call, CallArg, Value};

/// `grad_accum = ...`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradAccum {
    /// `fixed(n)`
    Fixed(usize),
    /// `target(global = n)`
    Target(usize),
}

/// `grad_accum` forms.
pub const GRAD_ACCUMS: &[&str] = &["fixed", "target"];

/// The forms, for messages.
/// The named arguments of `target(..)`.
pub const TARGET_ARGS: &[&str] = &["global"];
const FORMS: &str = "expected `fixed(n)` or `target(global = n)`";

/// Reads `grad_accum = ...`.
pub fn grad_accum(value: &Value, cx: &mut Ctxt) -> Option<GradAccum> {
    let call = as_call(value, cx)?;
    let name = path_to_string(&call.name);
    match name.as_str() {
        "fixed" => fixed(call, cx),
        "target" => target(call, cx),
        _ => {
            cx.on(&call.name, unknown("`grad_accum` form", &name, GRAD_ACCUMS));
            None
        }
    }
}

/// The call form of the value; anything else is reported with what to write.
fn as_call<'a>(value: &'a Value, cx: &mut Ctxt) -> Option<&'a Call> {
    match value {
        Value::Call(call) => Some(call),
        Value::Lit(Lit::Int(i)) => {
            cx.on(
                i,
                format!(
                    "invalid `grad_accum`: {FORMS}; write `grad_accum = fixed({})`",
                    i.base10_digits()
                ),
            );
            None
        }
        Value::Path(p) if p.is_ident("fixed") || p.is_ident("target") => {
            let example = if p.is_ident("fixed") {
                "fixed(2)"
            } else {
                "target(global = 64)"
            };
            cx.on(
                p,
                format!(
                    "`{}` needs an argument, e.g. `grad_accum = {example}`",
                    path_to_string(p)
                ),
            );
            None
        }
        Value::Path(p) if p.get_ident().is_some() => {
            cx.on(
                p,
                unknown("`grad_accum` form", &path_to_string(p), GRAD_ACCUMS),
            );
            None
        }
        other => {
            cx.on(
                other,
                format!("invalid `grad_accum`: {FORMS}, found {}", other.describe()),
            );
            None
        }
    }
}

/// `fixed(n)`: `n` micro-batches per step, at least 1.
fn fixed(call: &Call, cx: &mut Ctxt) -> Option<GradAccum> {
    let [arg] = exact_args::<1>(call, "fixed(n)", cx)?;
    match arg {
        CallArg::Plain(v) => {
            let n = int::<usize>("fixed", v, cx)?;
            if let Err(broken) = adabatch_rules::grad_accum::fixed(n) {
                cx.on(v, broken.message);
                return None;
            }
            Some(GradAccum::Fixed(n))
        }
        other => {
            cx.on(other, "expected an integer, as in `fixed(2)`");
            None
        }
    }
}

/// `target(global = n)`: as many micro-batches as reach a global batch of `n`.
fn target(call: &Call, cx: &mut Ctxt) -> Option<GradAccum> {
    let named = named_args(call, TARGET_ARGS, cx)?;
    let Some(v) = named.get("global") else {
        cx.at(
            call.paren.span.join(),
            "`target` needs `global = n`, e.g. `target(global = 64)`",
        );
        return None;
    };
    let n = int::<usize>("global", v, cx)?;
    if let Err(broken) = adabatch_rules::grad_accum::target(n) {
        cx.on(*v, broken.message);
        return None;
    }
    Some(GradAccum::Target(n))
}
