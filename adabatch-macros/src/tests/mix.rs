//! `mix = ...`: its forms and the checks of their arguments.

use syn::parse_quote;

use super::{assert_error, one};
use crate::spec::{Mix, PolicyValue, Warmup};

fn mix(args: crate::parse::AttrArgs) -> Mix {
    match one(args) {
        PolicyValue::Mix(m) => m,
        other => panic!("not a mix: {other:?}"),
    }
}

#[test]
fn mix_forms() {
    assert_eq!(
        mix(parse_quote!(mix = fixed(new = 0.75, replay = 1))),
        Mix::Fixed(vec![("new".into(), 0.75), ("replay".into(), 1.0)])
    );
    // The measured best (adabatch_rules::mixer): 1.5 nats, 40 % of the run first.
    let default = Mix::Online {
        temperature: 1.5,
        floor: 0.05,
        smoothing: 0.9,
        warmup: Warmup::Fraction(0.4),
    };
    assert_eq!(mix(parse_quote!(mix = online)), default);
    assert_eq!(mix(parse_quote!(mix = online())), default);
    assert_eq!(
        mix(parse_quote!(mix = online(floor = 0.2, temperature = 0.5))),
        Mix::Online {
            temperature: 0.5,
            floor: 0.2,
            smoothing: 0.9,
            warmup: Warmup::Fraction(0.4),
        }
    );
    assert_eq!(
        mix(parse_quote!(mix = online(warmup = 100))),
        Mix::Online {
            temperature: 1.5,
            floor: 0.05,
            smoothing: 0.9,
            warmup: Warmup::Steps(100),
        }
    );
    assert_eq!(
        mix(parse_quote!(mix = online(warmup = 0.25, temperature = 1.0))),
        Mix::Online {
            temperature: 1.0,
            floor: 0.05,
            smoothing: 0.9,
            warmup: Warmup::Fraction(0.25),
        }
    );
}

/// `pike`: the defaults of `adabatch_rules::pike`; `tau` asks for
/// Balanced-PiKE.
#[test]
fn pike_forms() {
    let default = Mix::Pike {
        t0: 10,
        numbers: [0.03, 0.03, 0.1, 0.8],
        tau: None,
    };
    assert_eq!(mix(parse_quote!(mix = pike)), default);
    assert_eq!(mix(parse_quote!(mix = pike())), default);
    assert_eq!(
        mix(parse_quote!(mix = pike(t0 = 3, zeta1 = 0, tau = 2.0))),
        Mix::Pike {
            t0: 3,
            numbers: [0.0, 0.03, 0.1, 0.8],
            tau: Some(2.0),
        }
    );
}

#[test]
fn mix_mistakes() {
    assert_error(parse_quote!(mix = pike(t0 = 0)), "`t0` must be at least 1");
    assert_error(
        parse_quote!(mix = pike(zeta2 = -1.0)),
        "`zeta2 = -1` must be at least 0",
    );
    assert_error(parse_quote!(mix = pike(tilt = 1.0)), "tilt");
    assert_error(parse_quote!(mix = fixed), "needs a weight per source");
    assert_error(parse_quote!(mix = fixed()), "needs a weight per source");
    assert_error(parse_quote!(mix = fixed(0.5)), "by name");
    assert_error(
        parse_quote!(mix = fixed(a = 1, a = 2)),
        "duplicate source `a`",
    );
    assert_error(parse_quote!(mix = fixed(a = 0, b = 0)), "all weights are 0");
    assert_error(
        parse_quote!(mix = fixed(a = "x")),
        "expected a number for `a`",
    );
    assert_error(
        parse_quote!(mix = online(floor = 2.0)),
        "`floor = 2` must be in [0, 1]",
    );
    assert_error(parse_quote!(mix = online(smoothing = 1)), "in [0, 1)");
    assert_error(parse_quote!(mix = online(temperature = 0)), "positive");
    assert_error(
        parse_quote!(mix = online(warmup = -3)),
        "expected a non-negative integer for `warmup`",
    );
    assert_error(
        parse_quote!(mix = online(warmup = 2.5)),
        "`warmup = 2.5` must be in [0, 1]",
    );
    assert_error(
        parse_quote!(mix = online(warmpu = 10)),
        "did you mean `warmup`",
    );
    assert_error(
        parse_quote!(mix = online(temprature = 1)),
        "did you mean `temperature`",
    );
    assert_error(parse_quote!(mix = onlin), "did you mean `online`");
    assert_error(parse_quote!(mix = fixd(a = 1)), "did you mean `fixed`");
    assert_error(parse_quote!(mix = 3), "invalid `mix`");
    assert_error(parse_quote!(mx = online), "did you mean `mix`");
}
