//! `--report-to tensorboard` event files, read back by a reader written here from
//! the format's description (independent of the writer): every record's length,
//! both masked CRC32Cs, the first event's file version, and the scalars of every
//! logged step under TensorBoard's tags.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;

use adabatch::ReportTo;
use common::{adamw_factory, dataset, read_log, temp_log, IntervalTrainer};

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit.
fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82f6_3b78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn masked(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    // The spec: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[test]
fn crc32c_test_vectors() {
    // RFC 3720 (iSCSI), appendix B.4, the CRC TFRecord framing uses.
    assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
    assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    let ascending: Vec<u8> = (0..32).collect();
    assert_eq!(crc32c(&ascending), 0x46dd_794e);
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
}

/// The records of a TFRecord file, with lengths and checksums checked.
fn records(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        assert!(bytes.len() - at >= 12, "truncated record header at {at}");
        let len_bytes = &bytes[at..at + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
        assert_eq!(len_crc, masked(len_bytes), "length checksum at {at}");
        let data = &bytes[at + 12..at + 12 + len];
        let data_crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
        assert_eq!(data_crc, masked(data), "data checksum at {at}");
        out.push(data);
        at += 16 + len;
    }
    out
}

/// A protobuf field: number and value (varint, 64-bit, bytes or 32-bit).
#[derive(Debug)]
enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

fn varint(buf: &[u8], at: &mut usize) -> u64 {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = buf[*at];
        *at += 1;
        value |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            return value;
        }
    }
    panic!("varint too long");
}

fn fields(buf: &[u8]) -> Vec<(u64, Field<'_>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let key = varint(buf, &mut at);
        let field = match key & 7 {
            0 => Field::Varint(varint(buf, &mut at)),
            1 => {
                at += 8;
                Field::Fixed64(u64::from_le_bytes(buf[at - 8..at].try_into().unwrap()))
            }
            2 => {
                let len = varint(buf, &mut at) as usize;
                at += len;
                Field::Bytes(&buf[at - len..at])
            }
            5 => {
                at += 4;
                Field::Fixed32(u32::from_le_bytes(buf[at - 4..at].try_into().unwrap()))
            }
            wire => panic!("unexpected wire type {wire}"),
        };
        out.push((key >> 3, field));
    }
    out
}

/// One decoded `Event`.
#[derive(Debug, Default)]
struct Event {
    wall_time: f64,
    step: i64,
    file_version: Option<String>,
    scalars: Vec<(String, f32)>,
}

fn decode_event(buf: &[u8]) -> Event {
    let mut event = Event::default();
    for (number, field) in fields(buf) {
        match (number, field) {
            (1, Field::Fixed64(bits)) => event.wall_time = f64::from_bits(bits),
            (2, Field::Varint(v)) => event.step = v as i64,
            (3, Field::Bytes(b)) => event.file_version = Some(String::from_utf8(b.into()).unwrap()),
            (5, Field::Bytes(summary)) => {
                for (n, value) in fields(summary) {
                    let (1, Field::Bytes(value)) = (n, value) else {
                        panic!("Summary field {n}");
                    };
                    let mut tag = None;
                    let mut simple = None;
                    for (k, f) in fields(value) {
                        match (k, f) {
                            (1, Field::Bytes(t)) => {
                                tag = Some(String::from_utf8(t.into()).unwrap())
                            }
                            (2, Field::Fixed32(bits)) => simple = Some(f32::from_bits(bits)),
                            other => panic!("Summary.Value field {other:?}"),
                        }
                    }
                    event
                        .scalars
                        .push((tag.expect("a tag"), simple.expect("a simple_value")));
                }
            }
            other => panic!("Event field {other:?}"),
        }
    }
    event
}

fn read_events(dir: &Path) -> Vec<Event> {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .collect();
    assert_eq!(files.len(), 1, "one event file in {}", dir.display());
    let bytes = std::fs::read(&files[0]).unwrap();
    records(&bytes).into_iter().map(decode_event).collect()
}

fn run_with_tensorboard(dir: &Path, world: usize, dry_run: bool) -> Vec<adabatch::StepLog> {
    let log = temp_log("tensorboard");
    let args = {
        let mut a = common::args(world, 1, 3);
        a.logging.report_to = vec![ReportTo::Tensorboard];
        a.logging.logging_dir = Some(dir.to_path_buf());
        a.logging.log_jsonl = Some(log.clone());
        a.logging.logging_steps = 2;
        a.launch.dry_run = dry_run;
        a
    };
    let data = dataset(12, 1);
    adabatch::Run::new(&data, &common::collate, &args)
        .launch(adamw_factory(|model, opt| IntervalTrainer { model, opt }))
        .unwrap();
    read_log(&log)
}

#[test]
fn event_files_round_trip_with_hf_and_adabatch_tags() {
    for world in [1, 2] {
        let dir = temp_log("tb").with_extension("");
        let logged = run_with_tensorboard(&dir, world, false);
        let events = read_events(&dir);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        assert!(events[0].scalars.is_empty());
        assert!(events[0].wall_time > 1.5e9, "wall time in seconds");
        let steps = &events[1..];
        assert_eq!(steps.len(), logged.len(), "one event per logged step");
        for (event, entry) in steps.iter().zip(&logged) {
            assert_eq!(event.step, entry.step as i64);
            let values: BTreeMap<&str, f32> = event
                .scalars
                .iter()
                .map(|(t, v)| (t.as_str(), *v))
                .collect();
            assert_eq!(values["train/loss"], entry.loss as f32);
            assert_eq!(values["train/grad_norm"], entry.grad_norm as f32);
            assert_eq!(values["train/learning_rate"], entry.learning_rate as f32);
            assert_eq!(values["train/epoch"], entry.epoch as f32);
            assert_eq!(values["train/global_batch"], entry.global_batch as f32);
            assert_eq!(values["train/train_coverage"], entry.train_coverage as f32);
            assert_eq!(values.len(), 6, "{values:?}");
        }
    }
}

#[test]
fn dry_run_event_files_have_no_loss() {
    let dir = temp_log("tb-dry").with_extension("");
    let logged = run_with_tensorboard(&dir, 1, true);
    let events = read_events(&dir);
    assert_eq!(events.len(), logged.len() + 1);
    for event in &events[1..] {
        let tags: Vec<&str> = event.scalars.iter().map(|(t, _)| t.as_str()).collect();
        assert!(!tags.contains(&"train/loss"), "{tags:?}");
        assert!(tags.contains(&"train/global_batch"), "{tags:?}");
    }
}

/// The official reader, where the Python `tensorboard` package is installed
/// (`pip install tensorboard`); skipped, saying so, where it is not.
#[test]
fn official_tensorboard_reader_loads_the_scalars() {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import tensorboard"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: the Python tensorboard package is not installed");
        return;
    }
    let dir = temp_log("tb-official").with_extension("");
    let logged = run_with_tensorboard(&dir, 1, false);
    let script = r#"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
tags = acc.Tags()["scalars"]
print(",".join(sorted(tags)))
print(",".join(str(e.step) for e in acc.Scalars("train/loss")))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let tags = lines.next().unwrap();
    for tag in [
        "train/loss",
        "train/learning_rate",
        "train/epoch",
        "train/grad_norm",
        "train/global_batch",
        "train/train_coverage",
    ] {
        assert!(tags.split(',').any(|t| t == tag), "{tag} not in {tags}");
    }
    let steps: Vec<String> = logged.iter().map(|s| s.step.to_string()).collect();
    assert_eq!(lines.next().unwrap(), steps.join(","));
}
