//! The controllers: what decides the next step's batch size and learning rate.

pub mod lr;
pub mod ramp;
pub mod schedule;
