//! `mix = ...`: how a dataset of several sources is mixed — `fixed(name = w, ..)`,
//! `online(temperature = t, floor = f, smoothing = s, warmup = n | fraction)`,
//! `custom(path)` or `pike(t0 = n, zeta1 = z, zeta2 = z, floor = f, smoothing =
//! s, tau = τ)`.

use syn::Path;

use super::call::{exact_args, named_args};
use super::suggest::unknown;
use super::values::{float, float_arg, int, kept};
use crate::ctxt::Ctxt;
use crate::parse::{path_to_string, Call, CallArg, Value};
use adabatch_rules::mixer as rules;
use adabatch_rules::pike as pike_rules;

/// `mix = ...`
#[derive(Debug, Clone, PartialEq)]
pub enum Mix {
    /// `fixed(name = w, ..)`
    Fixed(Vec<(String, f64)>),
    /// `online(temperature = t, floor = f, smoothing = s, warmup = n)`
    Online {
        /// Softmax temperature.
        temperature: f64,
        /// Even share.
        floor: f64,
        /// Moving-average factor.
        smoothing: f64,
        /// Equal shares first.
        warmup: Warmup,
    },
    /// `custom(path)`: a `fn(&SourceStats) -> Vec<f64>`.
    Custom(Path),
    /// `pike(t0 = n, zeta1 = z, zeta2 = z, floor = f, smoothing = s, tau = τ)`:
    /// PiKE, Balanced-PiKE with `tau`.
    Pike {
        /// `T₀`, steps between measurements.
        t0: usize,
        /// `ζ₁`, `ζ₂`, the floor and the smoothing.
        numbers: [f64; 4],
        /// Balanced-PiKE's `τ`.
        tau: Option<f64>,
    },
}

/// `online(warmup = ..)`: an integer is steps, a decimal a share of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Warmup {
    /// `warmup = 100`
    Steps(usize),
    /// `warmup = 0.4` (the default, [`rules::WARMUP_FRACTION`])
    Fraction(f64),
}

/// The forms, for messages: `online`'s arguments at their defaults (the rules').
fn mix_forms() -> String {
    format!(
        "expected one of `fixed(new = 0.75, replay = 0.25)`, `online`, `online(temperature = {}, floor = {}, smoothing = {}, warmup = {})`, `custom(path::to::fn)`, `pike`, `pike(t0 = {}, zeta1 = {}, zeta2 = {}, floor = {}, smoothing = {}, tau = {})`",
        rules::TEMPERATURE,
        rules::FLOOR,
        rules::SMOOTHING,
        rules::WARMUP_FRACTION,
        pike_rules::T0,
        pike_rules::ZETA1,
        pike_rules::ZETA2,
        pike_rules::FLOOR,
        pike_rules::SMOOTHING,
        pike_rules::TAU,
    )
}
pub const MIXES: &[&str] = &["fixed", "online", "custom", "pike"];
/// The named arguments of `pike(..)` (`tau`: Balanced-PiKE).
pub const PIKE_ARGS: &[&str] = &["t0", "zeta1", "zeta2", "floor", "smoothing", "tau"];
/// The named arguments of `online(..)`.
pub const ONLINE_ARGS: &[&str] = &["temperature", "floor", "smoothing", "warmup"];

/// Reads `mix = ...`.
pub fn mix(value: &Value, cx: &mut Ctxt) -> Option<Mix> {
    match value {
        Value::Call(call) => match path_to_string(&call.name).as_str() {
            "fixed" => fixed(call, cx),
            "online" => online(call, cx),
            "custom" => custom(call, cx),
            "pike" => pike(call, cx),
            name => {
                cx.on(
                    &call.name,
                    format!("{}; {}", unknown_mix(name), mix_forms()),
                );
                None
            }
        },
        Value::Path(p) => match path_to_string(p).as_str() {
            "online" => Some(Mix::Online {
                temperature: rules::TEMPERATURE,
                floor: rules::FLOOR,
                smoothing: rules::SMOOTHING,
                warmup: Warmup::Fraction(rules::WARMUP_FRACTION),
            }),
            "pike" => Some(Mix::Pike {
                t0: pike_rules::T0,
                numbers: [
                    pike_rules::ZETA1,
                    pike_rules::ZETA2,
                    pike_rules::FLOOR,
                    pike_rules::SMOOTHING,
                ],
                tau: None,
            }),
            "fixed" => {
                cx.on(
                    p,
                    "`fixed` needs a weight per source: `fixed(new = 0.75, replay = 0.25)`",
                );
                None
            }
            "custom" => {
                cx.on(
                    p,
                    "`custom` needs the path of a `fn(&SourceStats) -> Vec<f64>`: `custom(my_mix)`",
                );
                None
            }
            name => {
                cx.on(p, format!("{}; {}", unknown_mix(name), mix_forms()));
                None
            }
        },
        Value::Lit(lit) => {
            cx.on(
                lit,
                format!("invalid `mix`: {}; found {}", mix_forms(), value.describe()),
            );
            None
        }
    }
}

/// "unknown mix `x`: did you mean `y`?" without the choices (the forms follow).
fn unknown_mix(name: &str) -> String {
    let message = unknown("mix", name, MIXES);
    match message.find(" (expected") {
        Some(cut) => message[..cut].to_string(),
        None => message,
    }
}

/// `fixed(name = w, ..)`: one finite weight >= 0 per named source, not all 0.
fn fixed(call: &Call, cx: &mut Ctxt) -> Option<Mix> {
    let mut weights: Vec<(String, f64)> = Vec::new();
    let mut ok = true;
    for arg in &call.args {
        let CallArg::Named { name, value, .. } = arg else {
            cx.on(
                arg,
                "`fixed` takes a weight per source by name: `fixed(new = 0.75, replay = 0.25)`",
            );
            ok = false;
            continue;
        };
        let source = name.to_string();
        if weights.iter().any(|(n, _)| *n == source) {
            cx.at(
                name.span(),
                format!("duplicate source `{source}` in `fixed`"),
            );
            ok = false;
            continue;
        }
        match float(&source, value, cx) {
            Some(w) if adabatch_rules::mixer::weight(w).is_ok() => weights.push((source, w)),
            Some(w) => {
                cx.on(
                    value,
                    format!(
                        "`fixed`: the weight of `{source}` must be a finite number >= 0, found {w}"
                    ),
                );
                ok = false;
            }
            None => ok = false,
        }
    }
    if !ok {
        return None;
    }
    if weights.is_empty() {
        cx.at(
            call.paren.span.join(),
            "`fixed` needs a weight per source: `fixed(new = 0.75, replay = 0.25)`",
        );
        return None;
    }
    let values: Vec<f64> = weights.iter().map(|(_, w)| *w).collect();
    if adabatch_rules::mixer::weights(&values).is_err() {
        cx.at(
            call.paren.span.join(),
            "`fixed`: all weights are 0; at least one source must have a positive weight",
        );
        return None;
    }
    Some(Mix::Fixed(weights))
}

/// `custom(path)`: the function is type-checked where the expansion uses it.
fn custom(call: &Call, cx: &mut Ctxt) -> Option<Mix> {
    let [arg] = exact_args::<1>(call, "custom(path::to::fn)", cx)?;
    match arg {
        CallArg::Plain(Value::Path(p)) => Some(Mix::Custom(p.clone())),
        other => {
            cx.on(
                other,
                "expected the path of a `fn(&adabatch::SourceStats) -> Vec<f64>`, as in `custom(my_mix)`",
            );
            None
        }
    }
}

/// `warmup = n` (steps) or `warmup = f` (a decimal: that share of the run's
/// expected steps, in `[0, 1]`).
fn warmup(value: &Value, cx: &mut Ctxt) -> Option<Warmup> {
    match value {
        Value::Lit(syn::Lit::Float(_)) => {
            let f = float("warmup", value, cx)?;
            kept(
                "online",
                value,
                Warmup::Fraction(f),
                rules::warmup_fraction(f),
                cx,
            )
        }
        other => int("warmup", other, cx).map(Warmup::Steps),
    }
}

/// `online(temperature = t, floor = f, smoothing = s, warmup = n)`, each optional.
fn online(call: &Call, cx: &mut Ctxt) -> Option<Mix> {
    let named = named_args(call, ONLINE_ARGS, cx)?;
    let mut read =
        |name, default, rule| float_arg(("online", name), named.get(name), default, rule, cx);
    let temperature = read("temperature", rules::TEMPERATURE, rules::temperature);
    let floor = read("floor", rules::FLOOR, rules::floor);
    let smoothing = read("smoothing", rules::SMOOTHING, rules::smoothing);
    let warmup = match named.get("warmup") {
        Some(v) => warmup(v, cx),
        None => Some(Warmup::Fraction(rules::WARMUP_FRACTION)),
    };
    Some(Mix::Online {
        temperature: temperature?,
        floor: floor?,
        smoothing: smoothing?,
        warmup: warmup?,
    })
}

/// `pike(t0 = n, zeta1 = z, zeta2 = z, floor = f, smoothing = s, tau = τ)`, each
/// optional; `tau` asks for Balanced-PiKE.
fn pike(call: &Call, cx: &mut Ctxt) -> Option<Mix> {
    let named = named_args(call, PIKE_ARGS, cx)?;
    let t0 = match named.get("t0") {
        Some(v) => {
            int::<usize>("t0", v, cx).and_then(|n| kept("pike", *v, n, pike_rules::t0(n), cx))
        }
        None => Some(pike_rules::T0),
    };
    let mut read =
        |name, default, rule| float_arg(("pike", name), named.get(name), default, rule, cx);
    let zeta1 = read("zeta1", pike_rules::ZETA1, pike_rules::zeta1);
    let zeta2 = read("zeta2", pike_rules::ZETA2, pike_rules::zeta2);
    let floor = read("floor", pike_rules::FLOOR, pike_rules::floor);
    let smoothing = read("smoothing", pike_rules::SMOOTHING, pike_rules::smoothing);
    let tau = match named.get("tau") {
        Some(_) => Some(read("tau", pike_rules::TAU, pike_rules::tau)?),
        None => None,
    };
    Some(Mix::Pike {
        t0: t0?,
        numbers: [zeta1?, zeta2?, floor?, smoothing?],
        tau,
    })
}
