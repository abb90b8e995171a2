//! The controllers: what decides the next step's batch size and learning rate.

pub mod lr;
pub mod noise_scale;
pub mod ramp;
pub mod schedule;
