//! The controllers: what decides the next step's batch size, learning rate and
//! mixing weights.

pub mod goodput;
pub mod lr;
pub mod mixer;
pub mod noise_scale;
pub mod ramp;
pub mod schedule;
