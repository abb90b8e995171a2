//! Plain settings a user chooses: the run's [`args::TrainingArgs`] and the trainer's
//! compile-time [`policy::TrainerPolicy`].

pub mod args;
pub mod hf_argv;
pub mod policy;
