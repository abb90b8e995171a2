//! What a user implements or builds: the model, the data, the trainer and its
//! seeded parameters, callbacks; token files as datasets and their collates.

pub mod callback;
pub mod data;
#[cfg(feature = "tokenizers")]
pub mod domains;
pub mod loss;
pub mod sources;
pub mod token_batches;
pub mod train_model;
pub mod trainer;
pub mod weights;
