//! `reweight`, `oom` and `lr_scaling`: the keys whose value is one name of a few.

use super::values::choice;
use crate::ctxt::Ctxt;
use crate::parse::Value;

/// `reweight` values.
pub const REWEIGHTS: &[&str] = &["sample_count", "token_count", "none"];
/// `oom` values.
pub const OOMS: &[&str] = &["fail", "halve", "split_retry", "skip"];
/// `lr_scaling` values.
pub const LR_SCALINGS: &[&str] = &["none", "linear", "sqrt", "adamscale"];

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

/// `lr_scaling = ...`
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LrScaling {
    /// `none`
    Off,
    /// `linear`
    Linear,
    /// `sqrt`
    Sqrt,
    /// `adamscale`
    AdamScale,
}

/// Reads `reweight = ...`.
pub fn reweight(value: &Value, cx: &mut Ctxt) -> Option<Reweight> {
    choice("reweight", value, REWEIGHTS, cx).map(|c| match c {
        "sample_count" => Reweight::SampleCount,
        "token_count" => Reweight::TokenCount,
        _ => Reweight::RankMean,
    })
}

/// Reads `oom = ...`.
pub fn oom(value: &Value, cx: &mut Ctxt) -> Option<Oom> {
    choice("oom", value, OOMS, cx).map(|c| match c {
        "fail" => Oom::Fail,
        "halve" => Oom::Halve,
        "split_retry" => Oom::SplitRetry,
        _ => Oom::Skip,
    })
}

/// Reads `lr_scaling = ...`.
pub fn lr_scaling(value: &Value, cx: &mut Ctxt) -> Option<LrScaling> {
    choice("lr_scaling", value, LR_SCALINGS, cx).map(|c| match c {
        "none" => LrScaling::Off,
        "linear" => LrScaling::Linear,
        "sqrt" => LrScaling::Sqrt,
        _ => LrScaling::AdamScale,
    })
}
