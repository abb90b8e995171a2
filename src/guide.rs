//! The guide: how adabatch works and how to use it, one chapter per module.
//!
//! Each chapter is a Markdown file under `docs/guide/` in the repository (readable
//! there as well), included here so that its code blocks are doctests: they compile
//! with `cargo test --workspace`.
//!
//! | chapter | what it covers |
//! |---|---|
//! | [`getting_started`] | the two commands, the quickstart program, the examples, the flags worth knowing |
//! | [`attribute`] | `#[adaptive_trainer(...)]`: its grammar, every key, the fields, what it generates |
//! | [`semantics`] | global batches, `drop_last`, reweighting, coverage and epochs, exactness across ranks, OOM |
//! | [`data`] | datasets and collates; language-model data: tokenizing, token files, packing, domains |
//! | [`mixing`] | several sources in one run: the allocator, mixers, domains in tokens, continual pretraining |
//! | [`adaptation`] | schedules and ramps, the gradient noise scale, goodput, memory-aware batches, what to pick |
//! | [`checkpoints`] | checkpoints, exact resume, output directories, weights in and out, preemption |
//! | [`seeing_a_run`] | the dry run, the JSONL log, TensorBoard, plots |
//! | [`porting`] | porting a candle-transformers model |
//! | [`gpu`] | CUDA and NCCL |

#[doc = include_str!("../docs/guide/getting_started.md")]
pub mod getting_started {}

#[doc = include_str!("../docs/guide/attribute.md")]
pub mod attribute {}

#[doc = include_str!("../docs/guide/semantics.md")]
pub mod semantics {}

#[doc = include_str!("../docs/guide/data.md")]
pub mod data {}

#[doc = include_str!("../docs/guide/mixing.md")]
pub mod mixing {}

#[doc = include_str!("../docs/guide/adaptation.md")]
pub mod adaptation {}

#[doc = include_str!("../docs/guide/checkpoints.md")]
pub mod checkpoints {}

#[doc = include_str!("../docs/guide/seeing_a_run.md")]
pub mod seeing_a_run {}

#[doc = include_str!("../docs/porting.md")]
pub mod porting {}

#[doc = include_str!("../docs/guide/gpu.md")]
pub mod gpu {}
