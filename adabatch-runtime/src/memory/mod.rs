//! Predicting a batch's peak memory ([`model`]), measuring it on the device
//! ([`device`]), and keeping freed host memory between steps ([`host`]).

pub mod device;
pub mod host;
pub mod model;
