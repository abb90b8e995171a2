//! `adabatch plot` on fixture logs (a real run with a resume mark, and its dry
//! run) writes well-formed SVG and a decodable PNG; `--plot` on a run draws its own.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{adamw_factory, dataset, temp_log, IntervalTrainer};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures")
        .join(name)
}

fn plot(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_adabatch-cli"))
        .arg("plot")
        .args(args)
        .output()
        .unwrap()
}

/// Parses the SVG and returns its text elements.
fn svg_texts(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(root.attribute("width"), Some("1400"));
    assert_eq!(root.attribute("height"), Some("1500"));
    let lines = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "polyline" || n.tag_name().name() == "path")
        .count();
    assert!(lines > 16, "{lines} lines drawn");
    doc.descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect()
}

fn png_size(path: &Path) -> (u32, u32) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    // Not blank: some pixels are not white.
    assert!(buf[..info.buffer_size()].iter().any(|&b| b < 200));
    (info.width, info.height)
}

#[test]
fn svg_of_two_runs_has_every_panel_axis_and_legend() {
    let out = temp_log("two").with_extension("svg");
    let done = plot(&[
        fixture("replay_run.jsonl").to_str().unwrap(),
        fixture("replay_dry_run.jsonl").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let texts = svg_texts(&out);
    for needed in [
        "adabatch: replay_run vs replay_dry_run",
        "replay_run",
        "replay_dry_run",
        "Global batch size",
        "Coverage (solid, left) and epoch (dashed, right)",
        "Training loss",
        "Learning rate",
        "optimisation step",
        "examples seen",
        "global batch (examples)",
        "epoch (passes over the data)",
    ] {
        assert!(
            texts.iter().any(|t| t == needed),
            "no text {needed:?} in {texts:?}"
        );
    }
}

#[test]
fn png_with_labels_decodes_at_its_size() {
    let out = temp_log("labelled").with_extension("png");
    let done = plot(&[
        fixture("replay_run.jsonl").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-l",
        "interval(5, +1)",
    ]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(png_size(&out), (1400, 1500));
}

#[test]
fn resume_marks_are_skipped() {
    let run = adabatch::report::plot::RunLog::read(&fixture("replay_run.jsonl")).unwrap();
    assert_eq!(run.steps.len(), 23);
    assert_eq!(run.examples_seen().0.last(), Some(&100.0));
}

#[test]
fn bad_invocations_fail_with_a_message() {
    let out = temp_log("bad").with_extension("gif");
    let done = plot(&[
        fixture("replay_run.jsonl").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(!done.status.success());
    assert!(String::from_utf8_lossy(&done.stderr).contains(".svg or .png"));
    let done = plot(&["missing.jsonl", "-o", "x.svg"]);
    assert!(!done.status.success());
    assert!(String::from_utf8_lossy(&done.stderr).contains("missing.jsonl"));
}

#[test]
fn a_run_draws_its_own_plot() {
    for ext in ["svg", "png"] {
        let log = temp_log("own");
        let out = log.with_extension(ext);
        let args = {
            let mut a = common::args(2, 1, 2);
            a.logging.log_jsonl = Some(log);
            a.logging.plot = Some(out.clone());
            a
        };
        adabatch::Run::new(&dataset(10, 2), &common::collate, &args)
            .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
            .unwrap();
        if ext == "svg" {
            assert!(svg_texts(&out).iter().any(|t| t == "Training loss"));
        } else {
            assert_eq!(png_size(&out), (1400, 1500));
        }
    }
}

/// A run logged every 10 steps, whose examples-seen counts are all even (2 ranks,
/// 40 examples): the plot's examples axis reaches the run's own count (120), and
/// the loss panel carries the evaluations.
#[test]
fn a_sparse_log_has_the_right_examples_axis_and_its_evaluations() {
    let log = temp_log("sparse");
    let out = log.with_extension("svg");
    let args = {
        let mut a = common::args(2, 1, 3);
        a.logging.log_jsonl = Some(log);
        a.logging.plot = Some(out.clone());
        a.logging.logging_steps = 10;
        a.eval.eval_steps = Some(10);
        a
    };
    let summary = adabatch::Run::new(&dataset(40, 2), &common::collate, &args)
        .with_eval(&dataset(8, 3))
        .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
        .unwrap()
        .summary;
    assert_eq!(summary.examples_seen, 120);
    assert!(summary.global_step < 40, "the step axis stays below 40");
    let texts = svg_texts(&out);
    let largest = texts
        .iter()
        .filter_map(|t| t.parse::<f64>().ok())
        .fold(0.0, f64::max);
    assert!(
        largest >= 100.0,
        "the examples axis ends at {largest}, not near 120"
    );
    assert!(
        texts
            .iter()
            .any(|t| t == "Loss (line: training, triangles: eval)"),
        "{texts:?}"
    );
}
