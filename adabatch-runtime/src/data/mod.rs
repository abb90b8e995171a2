//! Which examples go into which step: the global-batch sampler, its seeded
//! constant-memory permutations, length-aware epochs and the step planner that
//! drives both with the schedule; several sources mixed per step; token files read
//! as windows or documents, and written from a corpus (`tokenizers` feature; the
//! Hub's Parquet and Arrow files with `parquet`).

#[cfg(feature = "tokenizers")]
mod cached_bpe;
#[cfg(feature = "tokenizers")]
pub mod corpus;
pub mod length;
pub mod mixture;
pub mod permutation;
pub mod planner;
pub mod sampler;
pub mod source_spec;
pub mod token_files;
#[cfg(feature = "tokenizers")]
pub mod tokenize;
