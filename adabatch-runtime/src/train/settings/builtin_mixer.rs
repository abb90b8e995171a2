//! The mixer the attribute's `mix = ..` asks the engine for.

use crate::config::policy::MixSpec;
use crate::error::{Result, SettingsError};

/// The mixer `mix = ..` asks the engine for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum BuiltinMixer {
    /// `mix = online(temperature, floor, smoothing, warmup)`.
    Online(f64, f64, f64, crate::adapt::mixer::MixWarmup),
    /// `mix = custom(path)`.
    Custom(crate::adapt::mixer::MixFn),
    /// `mix = pike(t0, zeta1, zeta2, floor, smoothing, tau)`.
    Pike(usize, [f64; 4], Option<f64>),
}

impl BuiltinMixer {
    /// The engine's own mixer the policy's `mix` asks for, if any; its arguments
    /// checked by the rules the attribute checks (a spec built by hand may break
    /// them).
    pub(super) fn of(mix: &MixSpec) -> Result<Option<Self>> {
        Ok(match *mix {
            MixSpec::Online {
                temperature,
                floor,
                smoothing,
                warmup,
            } => {
                adabatch_rules::mixer::check(temperature, floor, smoothing)
                    .map_err(|broken| SettingsError::mixer_rule("online", broken))?;
                if let crate::adapt::mixer::MixWarmup::Fraction(f) = warmup {
                    adabatch_rules::mixer::warmup_fraction(f)
                        .map_err(|broken| SettingsError::mixer_rule("online", broken))?;
                }
                Some(BuiltinMixer::Online(temperature, floor, smoothing, warmup))
            }
            MixSpec::Custom(f) => Some(BuiltinMixer::Custom(f)),
            MixSpec::Pike {
                t0,
                zeta1,
                zeta2,
                floor,
                smoothing,
                tau,
            } => {
                let numbers = (zeta1, zeta2, floor, smoothing);
                adabatch_rules::pike::check(t0, numbers, tau.unwrap_or(0.0))
                    .map_err(|broken| SettingsError::mixer_rule("pike", broken))?;
                Some(BuiltinMixer::Pike(
                    t0,
                    [zeta1, zeta2, floor, smoothing],
                    tau,
                ))
            }
            MixSpec::Dataset | MixSpec::Fixed(_) => None,
        })
    }

    pub(crate) fn build(self) -> Box<dyn crate::adapt::mixer::Mixer> {
        match self {
            BuiltinMixer::Online(t, f, s, warmup) => {
                // A fraction was checked in `of`.
                let mixer = crate::adapt::mixer::OnlineMixer::checked(t, f, s);
                Box::new(mixer.with_checked_warmup(warmup))
            }
            BuiltinMixer::Custom(f) => Box::new(crate::adapt::mixer::FnMixer(f)),
            BuiltinMixer::Pike(t0, numbers, tau) => {
                Box::new(crate::adapt::pike::PikeMixer::checked(t0, numbers, tau))
            }
        }
    }

    /// The key that asked for it, for messages.
    pub(crate) fn key(self) -> &'static str {
        match self {
            BuiltinMixer::Online(..) => "mix = online(..)",
            BuiltinMixer::Custom(_) => "mix = custom(..)",
            BuiltinMixer::Pike(..) => "mix = pike(..)",
        }
    }
}
