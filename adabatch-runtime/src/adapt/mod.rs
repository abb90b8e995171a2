//! The policies: the rules that decide a step's batch size, learning rate and
//! mixing weights (schedules and ramps, the noise-scale estimator, goodput,
//! mixers). They hold no run: the controllers of `train::control` apply them
//! after each step, in one order.

pub mod aioli;
pub mod bounded_replay;
pub mod goodput;
pub mod lr;
pub mod mixer;
pub mod noise_cadence;
pub mod noise_scale;
pub mod pike;
pub mod ramp;
pub mod replay_budget;
pub mod schedule;
