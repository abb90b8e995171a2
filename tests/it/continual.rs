//! The continual-learning protocol of `examples/continual_replay.rs` on the real
//! digits: without replay task A collapses; a 50-example memory at 25 % of every
//! batch keeps it (the bars: A < 0.3 without, A >= 0.6 and B >= 0.85 with;
//! an independent NumPy run of the protocol gives 0.00 and 0.81). One seed, both
//! bars with margin: 5 seeds measure 0.003 ± 0.003 and 0.862 ± 0.016
//! (BENCHMARKS.md).

// Not `continual` (this module's own name): the protocol shared with the example.
#[path = "../../examples/support/continual.rs"]
mod protocol;

use crate::digits;
use adabatch::TrainingArgs;
use protocol::{run, Mix, Protocol};

fn protocol(replay_memory: usize, ranks: usize) -> Protocol {
    Protocol {
        replay_memory,
        mix: Mix::Fixed(0.25),
        args: {
            let mut args = TrainingArgs::default();
            args.length.num_train_epochs = 20;
            args.batch.global_batch_size = Some(32);
            args.lr.learning_rate = 0.1;
            args.launch.nproc_per_node = ranks;
            args.data.seed = Some(0);
            args.logging.quiet = true;
            args
        },
    }
}

#[test]
fn replay_keeps_task_a_that_plain_training_forgets() {
    let data = digits::read_digits(&digits::default_path()).unwrap();
    assert_eq!(data.len(), 1797);
    let without = run(data.clone(), &protocol(0, 1)).unwrap();
    assert!(
        without.task_a_after_phase_1 > 0.9,
        "{}",
        without.task_a_after_phase_1
    );
    assert!(
        without.task_a < 0.3,
        "without replay A = {}",
        without.task_a
    );
    assert!(without.task_b > 0.85, "B = {}", without.task_b);
    let with = run(data.clone(), &protocol(50, 2)).unwrap();
    assert!(with.task_a >= 0.6, "with replay A = {}", with.task_a);
    assert!(with.task_b >= 0.85, "with replay B = {}", with.task_b);
    assert_eq!(with.source_sizes.1, 50);
    // A quarter of phase 2's examples came from the memory.
    let share = with.replay_examples_used() as f64 / with.phase_2.examples_seen as f64;
    assert!((share - 0.25).abs() < 0.01, "replay share {share}");
}

/// The online mixer on the same protocol keeps task A too (5 seeds: 0.887 ± 0.011).
#[test]
fn the_online_mixer_keeps_task_a() {
    let data = digits::read_digits(&digits::default_path()).unwrap();
    let online = Protocol {
        mix: Mix::Online,
        ..protocol(50, 1)
    };
    let outcome = run(data, &online).unwrap();
    assert!(outcome.task_a >= 0.6, "online A = {}", outcome.task_a);
    assert!(outcome.task_b >= 0.85, "online B = {}", outcome.task_b);
    assert!(outcome.replay_examples_used() > 0);
}

/// `--mix-weights` reaches phase 2 only, each phase saves into its own folder, and
/// `--resume-from-checkpoint latest` resumes whichever phase has checkpoints (a
/// finished phase 1 trains nothing again).
#[test]
fn each_phase_has_its_folder_and_resumes() {
    let data = digits::read_digits(&digits::default_path()).unwrap();
    let out = crate::common::temp_log("continual").with_extension("");
    let mut saving = protocol(50, 1);
    saving.args.length.num_train_epochs = 2;
    saving.args.save.save_steps = 20;
    saving.args.save.output_dir = out.clone();
    saving.args.data.mix_weights = vec!["new=0.5".into(), "replay=0.5".into()];
    let first = run(data.clone(), &saving).unwrap();
    for phase in ["phase-1", "phase-2"] {
        let saved = adabatch::train::checkpoint::complete_checkpoints(&out.join(phase)).unwrap();
        assert!(!saved.is_empty(), "{phase} saved nothing");
    }
    // Half of phase 2's examples came from the memory, as the flag asked.
    let share = first.replay_examples_used() as f64 / first.phase_2.examples_seen as f64;
    assert!((share - 0.5).abs() < 0.02, "replay share {share}");
    let mut resumed = saving.clone();
    resumed.args.save.resume_from_checkpoint = Some("latest".into());
    let again = run(data, &resumed).unwrap();
    assert_eq!(again.phase_2.global_step, first.phase_2.global_step);
    assert_eq!(again.task_a.to_bits(), first.task_a.to_bits());
}
