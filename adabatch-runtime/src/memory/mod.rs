//! Predicting a batch's peak memory ([`memory_model`]), measuring it on the device
//! ([`device_memory`]), and keeping freed host memory between steps ([`host`]).

pub mod device_memory;
pub mod host;
pub mod memory_model;
