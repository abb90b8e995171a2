//! `schedule = ...`: the forms `constant`, `interval`, `linear`, `steps`, `custom`,
//! `memory`, `ramp`, `noise_scale`, `goodput`, their arguments' syntax and shape.
//!
//! The simple literal cases of the value rules (`constant(0)`, `interval(0, ..)`,
//! `*1`, ...) are reported here on the offending token; the runtime's
//! `validate_spec` states the same rules for specs built in code.

use std::collections::HashMap;

use syn::{Lit, Path};

use super::call::{exact_args, named_args};
use super::suggest::{one_of, unknown, unknown_of};
use super::values::{boolean, float_arg, int, kept};
use crate::ctxt::Ctxt;
use crate::parse::{path_to_string, Call, CallArg, Op, Value};
use adabatch_rules::schedule as rule;
use adabatch_rules::{
    goodput as goodput_rules, memory as memory_rules, noise_scale as noise_rules,
};

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
    /// `noise_scale(fraction = f, min = a, max = b, factor = k, hysteresis = h,
    /// shrink = s, every = n)` (global units)
    NoiseScale {
        /// Fraction of the estimated noise scale.
        fraction: f64,
        /// Smallest (and first) global batch.
        min: usize,
        /// Largest global batch.
        max: usize,
        /// Integer factor of every change (1: continuous).
        factor: usize,
        /// Relative margin before a change.
        hysteresis: f64,
        /// Whether the batch may shrink.
        shrink: bool,
        /// Which steps measure the noise scale.
        every: Every,
    },
    /// `goodput(min = a, max = b, max_local = m, max_micro_batches = k,
    /// hysteresis = h, step_time = path)` (global units)
    Goodput {
        /// Smallest (and first) global batch.
        min: usize,
        /// Largest global batch.
        max: usize,
        /// Largest micro-batch per rank (0: none).
        max_local: usize,
        /// Most micro-batches per step.
        max_micro_batches: usize,
        /// Relative goodput gain needed to change.
        hysteresis: f64,
        /// A step-time model instead of measured times.
        step_time: Option<Path>,
    },
    /// `memory(threshold = x, max_range = y)`
    Memory {
        /// Fraction of the baseline's peak memory.
        threshold: f64,
        /// Largest growth factor.
        max_range: f64,
    },
}

/// `noise_scale(every = ..)`: which steps measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Every {
    /// `model` (the default): from a fixed model of a split's cost.
    Modeled,
    /// `auto`: from measured step times (reads the clock).
    Auto,
    /// `n`: every `n`-th step.
    Steps(usize),
}

/// `interval`'s change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// `+k` / `-k`
    Add(i64),
    /// `*k`
    Mul(usize),
}

/// The schedule kinds.
pub const SCHEDULES: &[&str] = &[
    "constant",
    "interval",
    "linear",
    "steps",
    "custom",
    "memory",
    "ramp",
    "noise_scale",
    "goodput",
];

/// The named arguments each schedule accepts (`ramp`'s also by position; a schedule
/// not listed takes none).
#[cfg(test)]
pub const SCHEDULE_ARGS: &[(&str, &[&str])] = &[
    ("linear", LINEAR_ARGS),
    ("memory", MEMORY_ARGS),
    ("ramp", RAMP_ARGS),
    ("noise_scale", NOISE_SCALE_ARGS),
    ("goodput", GOODPUT_ARGS),
];
const LINEAR_ARGS: &[&str] = &["over"];
const MEMORY_ARGS: &[&str] = &["threshold", "max_range"];
const RAMP_ARGS: &[&str] = &["start", "increment", "samples", "tokens", "global"];
const NOISE_SCALE_ARGS: &[&str] = &[
    "fraction",
    "min",
    "max",
    "factor",
    "hysteresis",
    "shrink",
    "every",
];
const GOODPUT_ARGS: &[&str] = &[
    "min",
    "max",
    "max_local",
    "max_micro_batches",
    "hysteresis",
    "step_time",
];

/// Every form, for "expected one of".
const SCHEDULE_FORMS: &str = "expected one of `constant`, `constant(n)`, `interval(every, +k)`, `interval(every, -k)`, `interval(every, *k)`, `linear(from, to, over = n)`, `steps(0 => 8, 100 => 16)`, `custom(path::to::fn)`, `memory(threshold = 0.9, max_range = 2.0)`, `ramp(start = 16, increment = 16, samples = 10000, global = 256)`, `noise_scale(fraction = 1.0, min = 32, max = 4096)`, `goodput(min = 8, max = 1024)`";

/// An example of `name`'s arguments, for "needs arguments".
fn form_of(name: &str) -> &'static str {
    match name {
        "interval" => "interval(every, +k)",
        "linear" => "linear(from, to, over = n)",
        "steps" => "steps(0 => 8, 100 => 16)",
        "ramp" => RAMP_FORM,
        "noise_scale" => "noise_scale(fraction = 1.0, min = 32, max = 4096)",
        "goodput" => GOODPUT_FORM,
        _ => "custom(path::to::fn)",
    }
}

/// Reads `schedule = ...`.
pub fn schedule(value: &Value, cx: &mut Ctxt) -> Option<Schedule> {
    match value {
        Value::Path(p) => match p.get_ident().map(ToString::to_string).as_deref() {
            Some("constant") => Some(Schedule::Constant(None)),
            Some("memory") => Some(Schedule::Memory {
                threshold: memory_rules::THRESHOLD,
                max_range: memory_rules::MAX_RANGE,
            }),
            Some(
                name @ ("interval" | "linear" | "steps" | "custom" | "ramp" | "noise_scale"
                | "goodput"),
            ) => {
                cx.on(p, format!("`{name}` needs arguments: `{}`", form_of(name)));
                None
            }
            Some(name) => {
                cx.on(
                    p,
                    unknown("schedule", name, SCHEDULES)
                        .replace(&one_of(SCHEDULES), SCHEDULE_FORMS),
                );
                None
            }
            None => {
                cx.on(
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
                "constant" => constant(call, cx),
                "interval" => interval(call, cx),
                "linear" => linear(call, cx),
                "steps" => steps(call, cx),
                "custom" => custom(call, cx),
                "memory" => memory(call, cx),
                "ramp" => ramp(call, cx),
                "noise_scale" => noise_scale(call, cx),
                "goodput" => goodput(call, cx),
                _ => {
                    let msg = if call.name.get_ident().is_some() {
                        unknown("schedule", &name, SCHEDULES)
                            .replace(&one_of(SCHEDULES), SCHEDULE_FORMS)
                    } else {
                        format!("unknown schedule `{name}(..)`; {SCHEDULE_FORMS}; a function of your own goes in `custom({name})`")
                    };
                    cx.on(&call.name, msg);
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
            cx.on(
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

fn constant(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    if call.args.is_empty() {
        return Some(Schedule::Constant(None));
    }
    let [arg] = exact_args::<1>(call, "constant(n)", cx)?;
    let CallArg::Plain(v) = arg else {
        cx.on(arg, "expected a batch size, as in `constant(8)`");
        return None;
    };
    let n = int::<usize>("constant", v, cx)?;
    let n = kept("constant(0)", v, n, rule::size(n), cx)?;
    Some(Schedule::Constant(Some(n)))
}

fn interval(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    let [every_arg, growth_arg] = exact_args::<2>(call, "interval(every, +k)", cx)?;
    let every = match every_arg {
        CallArg::Plain(v) => {
            int::<usize>("every", v, cx).and_then(|n| kept("interval", v, n, rule::every(n), cx))
        }
        other => {
            cx.on(
                other,
                "expected the number of steps between changes, as in `interval(5, +1)`",
            );
            None
        }
    };
    let growth = match growth_arg {
        CallArg::Op { op, value } => match (op, int::<u64>("interval", value, cx)) {
            (_, None) => None,
            (Op::Add(_) | Op::Sub(_), Some(0)) => {
                kept("interval", growth_arg, None, rule::step(0), cx).flatten()
            }
            (Op::Mul(_), Some(k)) if rule::factor(k).is_err() => {
                kept("interval", growth_arg, None, rule::factor(k), cx).flatten()
            }
            (Op::Mul(_), Some(k)) => match usize::try_from(k) {
                Ok(k) => Some(Growth::Mul(k)),
                Err(_) => {
                    cx.on(value, "`interval`: factor too large");
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
                    cx.on(growth_arg, "`interval`: step too large");
                }
            }
            None
        }),
        CallArg::Plain(Value::Lit(Lit::Int(i))) => {
            cx.on(
                i,
                format!("expected `+k`, `-k` or `*k` as the change of `interval`, found `{0}`: write `+{0}` to grow by {0}, or `*{0}` to multiply", i.base10_digits()),
            );
            None
        }
        other => {
            cx.on(
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

fn linear(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    let mut positional = Vec::new();
    let mut over = None;
    let mut ok = true;
    for arg in &call.args {
        match arg {
            CallArg::Plain(v) => positional.push(v),
            CallArg::Named { name, value, .. } if name == "over" => {
                if over.replace(value).is_some() {
                    cx.at(name.span(), "duplicate argument `over` of `linear`");
                    ok = false;
                }
            }
            CallArg::Named { name, .. } => {
                cx.at(
                    name.span(),
                    unknown_of("argument", &name.to_string(), " of `linear`", LINEAR_ARGS),
                );
                ok = false;
            }
            other => {
                cx.on(other, "expected a batch size; `linear(from, to, over = n)`");
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
            cx.on(
                *third,
                "write the length of the ramp as `over = n`: `linear(from, to, over = n)`",
            );
            let _ = (from, to);
            return None;
        }
        other => {
            cx.at(
                call.paren.span.join(),
                format!("`linear` takes two sizes and `over = n`, found {} positional argument(s): `linear(from, to, over = n)`", other.len()),
            );
            return None;
        }
    };
    let from = positive("from", from, cx);
    let to = positive("to", to, cx);
    let over = match over {
        Some(v) => positive("over", v, cx),
        None => {
            cx.at(
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

fn steps(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    if call.args.is_empty() {
        cx.at(
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
            cx.on(
                arg,
                "expected `threshold => size`, as in `steps(0 => 8, 100 => 16)`",
            );
            ok = false;
            continue;
        };
        let threshold = int::<usize>("steps threshold", lhs, cx);
        let size = int::<usize>("steps size", rhs, cx);
        if let Some(s) = size {
            ok &= kept("steps", rhs, (), rule::size(s), cx).is_some();
        }
        if let (Some(t), Some(p)) = (threshold, previous) {
            ok &= kept("steps", lhs, (), rule::steps_entry(Some(p), t, 1), cx).is_some();
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

fn custom(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    let [arg] = exact_args::<1>(call, "custom(path::to::fn)", cx)?;
    match arg {
        CallArg::Plain(Value::Path(p)) => Some(Schedule::Custom(p.clone())),
        other => {
            cx.on(other, "expected the path of a `fn(step: usize, current: usize) -> usize`, as in `custom(my_schedule)`");
            None
        }
    }
}

fn memory(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    let named = named_args(call, MEMORY_ARGS, cx)?;
    let threshold = float_arg(
        ("memory", "threshold"),
        named.get("threshold"),
        memory_rules::THRESHOLD,
        memory_rules::threshold,
        cx,
    );
    let max_range = float_arg(
        ("memory", "max_range"),
        named.get("max_range"),
        memory_rules::MAX_RANGE,
        memory_rules::max_range,
        cx,
    );
    Some(Schedule::Memory {
        threshold: threshold?,
        max_range: max_range?,
    })
}

const RAMP_FORM: &str = "ramp(start = 16, increment = 16, samples = 10000, global = 256)";
const RAMP_POSITIONAL: &str = "ramp(start, increment, samples, global)";

/// The four values of `ramp`, in their positional order.
const RAMP_NAMES: [&str; 4] = ["start", "increment", "samples", "global"];

/// `ramp(start = a, increment = b, samples = c, global = g)`, or the four values
/// positionally in that order (Megatron's `--rampup-batch-size START INCR SAMPLES
/// --global-batch-size G`); in global units. `tokens = c` instead of `samples = c`
/// climbs over tokens consumed.
fn ramp(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    let mut named = ramp_args(call, cx)?;
    let in_tokens = climbs_in_tokens(&mut named, cx)?;
    if !has_all_ramp_args(call, &named, cx) {
        return None;
    }
    let start = ramp_value(&named, "start", cx);
    let increment = ramp_value(&named, "increment", cx);
    let samples = ramp_value(&named, "samples", cx);
    let global = ramp_value(&named, "global", cx);
    let (start, increment, samples, global) = (start?, increment?, samples?, global?);
    if !stairs_reach_global(&named, start, increment, global, cx) {
        return None;
    }
    Some(Schedule::Ramp {
        start,
        increment,
        samples,
        global,
        in_tokens,
    })
}

/// The arguments of `ramp` by name, whether they were written by name or by
/// position.
fn ramp_args<'a>(call: &'a Call, cx: &mut Ctxt) -> Option<HashMap<String, &'a Value>> {
    if !call.args.iter().any(|a| matches!(a, CallArg::Plain(_))) {
        return named_args(call, RAMP_ARGS, cx);
    }
    let args = exact_args::<4>(call, RAMP_POSITIONAL, cx)?;
    let mut named = HashMap::new();
    for (name, arg) in RAMP_NAMES.iter().zip(args) {
        let CallArg::Plain(v) = arg else {
            cx.on(arg, format!("write all four values by name or all by position: `{RAMP_FORM}` or `{RAMP_POSITIONAL}`"));
            return None;
        };
        named.insert(name.to_string(), v);
    }
    Some(named)
}

/// Whether the climb counts tokens (`tokens = c`, then filed as `samples`) rather
/// than examples; `None` when both are given.
fn climbs_in_tokens(named: &mut HashMap<String, &Value>, cx: &mut Ctxt) -> Option<bool> {
    match (named.contains_key("samples"), named.remove("tokens")) {
        (true, Some(tokens)) => {
            cx.on(tokens, "`ramp`: give `samples = n` (examples consumed) or `tokens = n` (tokens consumed), not both");
            None
        }
        (false, Some(tokens)) => {
            named.insert("samples".into(), tokens);
            Some(true)
        }
        (_, None) => Some(false),
    }
}

/// Whether all four values are given; the missing ones are reported together.
fn has_all_ramp_args(call: &Call, named: &HashMap<String, &Value>, cx: &mut Ctxt) -> bool {
    let missing: Vec<String> = RAMP_NAMES
        .iter()
        .filter(|n| !named.contains_key(**n))
        .map(|n| format!("`{n}`"))
        .collect();
    if !missing.is_empty() {
        cx.at(
            call.paren.span.join(),
            format!("`ramp` needs {}: `{RAMP_FORM}`", missing.join(", ")),
        );
        return false;
    }
    true
}

/// One value of `ramp`: an integer of at least 1.
fn ramp_value(named: &HashMap<String, &Value>, name: &'static str, cx: &mut Ctxt) -> Option<usize> {
    count("ramp", name, named[name], cx)
}

/// Whether stairs of `increment` climb from `start` up to exactly `global`.
fn stairs_reach_global(
    named: &HashMap<String, &Value>,
    start: usize,
    increment: usize,
    global: usize,
    cx: &mut Ctxt,
) -> bool {
    let verdict = rule::ramp(start, increment, 1, global);
    // The engine takes `start = global` as a constant batch; the attribute's ramp
    // must climb, and says how to ask for a constant one.
    if start == global || verdict.as_ref().is_err_and(|broken| broken.arg == "start") {
        cx.on(
            named["start"],
            format!("`ramp`: `start = {start}` must be smaller than `global = {global}`; for a fixed global batch run with `--global-batch-size {global}`"),
        );
        return false;
    }
    let at = match &verdict {
        Err(broken) => named.get(broken.arg).copied(),
        Ok(()) => None,
    };
    let at = at.unwrap_or(named["increment"]);
    kept("ramp", at, (), verdict, cx).is_some()
}

/// `noise_scale(fraction = f, min = a, max = b, factor = k, hysteresis = h,
/// shrink = s)`: the global batch follows `f` (default 1.0) times the estimated
/// gradient noise scale, within `[a, b]`, by factors of `k` (default 2; 1:
/// continuously) once the target clears the next size by `h` (default 0.1),
/// shrinking only with `shrink = true`, measured every `n` steps (default
/// `model`: from a fixed model of a measurement's cost; `auto`: from its measured
/// cost, which reads the clock).
fn noise_scale(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    const FORM: &str = "noise_scale(fraction = 1.0, min = 32, max = 4096)";
    let named = named_args(call, NOISE_SCALE_ARGS, cx)?;
    let fraction = float_arg(
        ("noise_scale", "fraction"),
        named.get("fraction"),
        noise_rules::FRACTION,
        noise_rules::fraction,
        cx,
    );
    let min = required_count("noise_scale", FORM, call, &named, "min", cx);
    let max = required_count("noise_scale", FORM, call, &named, "max", cx);
    let factor = match named.get("factor") {
        None => Some(noise_rules::FACTOR),
        Some(v) => count("noise_scale", "factor", v, cx),
    };
    let hysteresis = float_arg(
        ("noise_scale", "hysteresis"),
        named.get("hysteresis"),
        noise_rules::HYSTERESIS,
        noise_rules::hysteresis,
        cx,
    );
    let shrink = match named.get("shrink") {
        None => Some(noise_rules::SHRINK),
        Some(v) => boolean("shrink", v, cx),
    };
    let every = measure_every(named.get("every").copied(), cx);
    let (fraction, min, max) = (fraction?, min?, max?);
    let (factor, hysteresis, shrink, every) = (factor?, hysteresis?, shrink?, every?);
    kept(
        "noise_scale",
        named["max"],
        (),
        adabatch_rules::batch_range(min, max),
        cx,
    )?;
    Some(Schedule::NoiseScale {
        fraction,
        min,
        max,
        factor,
        hysteresis,
        shrink,
        every,
    })
}

/// `every = model` (or absent: the rules' default), `every = auto` or `every = n`
/// with n >= 1.
fn measure_every(value: Option<&Value>, cx: &mut Ctxt) -> Option<Every> {
    use adabatch_rules::noise_scale::{EVERY_AUTO, EVERY_DEFAULT, EVERY_FORMS, EVERY_MODEL};
    let word = |w: &str| match w {
        EVERY_MODEL => Some(Every::Modeled),
        EVERY_AUTO => Some(Every::Auto),
        _ => None,
    };
    let named = |p: &Path| p.get_ident().and_then(|i| word(&i.to_string()));
    match value {
        None => word(EVERY_DEFAULT),
        Some(Value::Path(p)) if named(p).is_some() => named(p),
        Some(v @ Value::Lit(_)) => count("noise_scale", "every", v, cx).map(Every::Steps),
        Some(other) => {
            let found = other.describe();
            cx.on(
                other,
                format!("`noise_scale`: `every` takes {EVERY_FORMS}, found {found}"),
            );
            None
        }
    }
}

const GOODPUT_FORM: &str = "goodput(min = 8, max = 1024)";

/// `goodput(min = a, max = b, max_local = m, max_micro_batches = k, hysteresis =
/// h, step_time = path::to::fn)`: each step's global batch in `[a, b]` and its
/// micro-batches (at most `k`, default 8, each at most `m` per rank, default no
/// limit) of the highest goodput, changed when the gain beats `h` (default 0.05);
/// `step_time` replaces the measured step times by a `fn(StepShape) -> f64`.
fn goodput(call: &Call, cx: &mut Ctxt) -> Option<Schedule> {
    let named = named_args(call, GOODPUT_ARGS, cx)?;
    let min = required_count("goodput", GOODPUT_FORM, call, &named, "min", cx);
    let max = required_count("goodput", GOODPUT_FORM, call, &named, "max", cx);
    let max_local = match named.get("max_local") {
        None => Some(goodput_rules::MAX_LOCAL),
        Some(v) => count("goodput", "max_local", v, cx),
    };
    let max_micro_batches = match named.get("max_micro_batches") {
        None => Some(goodput_rules::MAX_MICRO_BATCHES),
        Some(v) => count("goodput", "max_micro_batches", v, cx),
    };
    let hysteresis = float_arg(
        ("goodput", "hysteresis"),
        named.get("hysteresis"),
        goodput_rules::HYSTERESIS,
        goodput_rules::hysteresis,
        cx,
    );
    let step_time = match named.get("step_time") {
        None => Some(None),
        Some(Value::Path(p)) => Some(Some(p.clone())),
        Some(other) => {
            cx.on(
                *other,
                format!(
                    "`goodput`: `step_time` takes the path of a `fn(StepShape) -> f64`, found {}",
                    other.describe()
                ),
            );
            None
        }
    };
    let (min, max, max_local, max_micro_batches) = (min?, max?, max_local?, max_micro_batches?);
    let (hysteresis, step_time) = (hysteresis?, step_time?);
    kept(
        "goodput",
        named["max"],
        (),
        adabatch_rules::batch_range(min, max),
        cx,
    )?;
    Some(Schedule::Goodput {
        min,
        max,
        max_local,
        max_micro_batches,
        hysteresis,
        step_time,
    })
}

/// A required count of `schedule`'s `call`: an integer of at least 1.
fn required_count(
    schedule: &str,
    form: &str,
    call: &Call,
    named: &HashMap<String, &Value>,
    name: &'static str,
    cx: &mut Ctxt,
) -> Option<usize> {
    match named.get(name) {
        None => {
            cx.at(
                call.paren.span.join(),
                format!("`{schedule}` needs `{name}`: `{form}`"),
            );
            None
        }
        Some(v) => count(schedule, name, v, cx),
    }
}

/// An argument of `schedule` that counts: an integer of at least 1.
fn count(schedule: &str, name: &'static str, v: &Value, cx: &mut Ctxt) -> Option<usize> {
    let n = int::<usize>(name, v, cx)?;
    kept(schedule, v, n, adabatch_rules::count(name, n), cx)
}

/// A `linear` argument: an integer of at least 1.
fn positive(what: &'static str, value: &Value, cx: &mut Ctxt) -> Option<usize> {
    count("linear", what, value, cx)
}
