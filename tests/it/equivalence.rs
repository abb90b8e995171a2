//! The engine against a plain candle loop: one epoch of the same seeded MLP on the
//! same data with AdamW and the same global batches must give the same step losses
//! and the same final weights. This is the check `benches/engine_overhead.rs` runs
//! before timing (the same code, `benches/support/engine_mlp.rs`, at a smaller size), so that
//! `cargo test` runs it too.

const FEATURES: usize = 16;
const HIDDEN: usize = 32;
const CLASSES: usize = 10;
const EXAMPLES: usize = 300;
const SEED: u64 = 1234;
const LEARNING_RATE: f64 = 1e-3;
const BATCH_SIZES: [usize; 3] = [64, 8, 7];

#[path = "../../benches/support/engine_mlp.rs"]
mod engine_mlp;
use engine_mlp::{check_equivalence, dataset};

#[test]
fn engine_matches_a_hand_written_candle_loop() {
    let data = dataset();
    for batch_size in BATCH_SIZES {
        check_equivalence(&data, batch_size);
    }
}
