//! Predicting a batch's peak memory ([`model`]) and measuring it on the device
//! ([`device`]).

pub mod device;
pub mod model;
