//! `reweight`, `oom` and `lr_scaling`: the keys whose value is one name of a few.

/// `reweight` values.
pub const REWEIGHTS: &[&str] = &["sample_count", "token_count", "none"];
/// `oom` values.
pub const OOMS: &[&str] = &["fail", "halve", "split_retry", "skip"];
/// `lr_scaling` values.
pub const LR_SCALINGS: &[&str] = &["none", "linear", "sqrt"];

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
}
