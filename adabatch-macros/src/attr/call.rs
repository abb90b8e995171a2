//! The argument list of a call form such as `fixed(n)` or `memory(threshold = x)`:
//! how many arguments, and which names.

use std::collections::HashMap;

use super::suggest::unknown_of;
use crate::ctxt::Ctxt;
use crate::parse::{path_to_string, Call, CallArg, Value};

/// Exactly `N` arguments, else an error on the parentheses naming the form.
pub fn exact_args<'a, const N: usize>(
    call: &'a Call,
    form: &str,
    cx: &mut Ctxt,
) -> Option<[&'a CallArg; N]> {
    let args: Vec<&CallArg> = call.args.iter().collect();
    match <[&CallArg; N]>::try_from(args) {
        Ok(a) => Some(a),
        Err(args) => {
            let plural = if N == 1 { "" } else { "s" };
            cx.at(
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
pub fn named_args<'a>(
    call: &'a Call,
    allowed: &[&str],
    cx: &mut Ctxt,
) -> Option<HashMap<String, &'a Value>> {
    let mut out = HashMap::new();
    let mut ok = true;
    let callee = path_to_string(&call.name);
    for arg in &call.args {
        match arg {
            CallArg::Named { name, value, .. } => {
                let n = name.to_string();
                if !allowed.contains(&n.as_str()) {
                    cx.at(
                        name.span(),
                        unknown_of("argument", &n, &format!(" of `{callee}`"), allowed),
                    );
                    ok = false;
                } else if out.insert(n.clone(), value).is_some() {
                    cx.at(
                        name.span(),
                        format!("duplicate argument `{n}` of `{callee}`"),
                    );
                    ok = false;
                }
            }
            other => {
                let names: Vec<String> = allowed.iter().map(|a| format!("`{a} = ..`")).collect();
                cx.on(
                    other,
                    format!("`{callee}` takes named arguments: {}", names.join(", ")),
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}
