//! TensorBoard event files (`--report-to tensorboard`), written without TensorFlow.
//!
//! An event file `events.out.tfevents.{secs}.{host}.{pid}.{n}` is a sequence of
//! TFRecords:
//!
//! ```text
//! u64 length (little endian) | u32 masked CRC32C of those 8 bytes
//! length bytes of data       | u32 masked CRC32C of the data
//! ```
//!
//! where `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8`. Each record's data is
//! one protobuf `tensorflow.Event`; the first says `file_version: "brain.Event:2"`,
//! the others carry a `Summary` of scalar values (`Summary.Value{tag, simple_value}`),
//! the form TensorBoard's scalar dashboard reads.
//!
//! The three messages are declared here with `prost`'s derive rather than compiled
//! from TensorFlow's `.proto` files: that needs no `protoc` at build time, and the
//! few fields used are stable parts of the format. Only the fields written are
//! declared; protobuf readers skip the rest. `oneof` members (`Event.what`,
//! `Summary.Value.value`) are plain optional fields, the same on the wire.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use crate::error::{Error, FileOp, Result};
use crate::report::record::StepLog;

/// `tensorflow.Event` (tensorflow/core/util/event.proto), the fields adabatch writes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    /// Global step of the values.
    #[prost(int64, tag = "2")]
    pub step: i64,
    /// `oneof what`: the file's format version (first event only).
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    /// `oneof what`: scalar values.
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
}

/// `tensorflow.Summary` (tensorflow/core/framework/summary.proto).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    /// The values.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value`, a scalar.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    /// The chart's name, e.g. `train/loss`.
    #[prost(string, tag = "1")]
    pub tag: String,
    /// `oneof value`: the scalar. Optional so that 0.0 is still written (a proto3
    /// default would be left out, and the reader would see no value).
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// The checksum of the record framing: CRC32C, rotated and offset so that a CRC of
/// data that holds CRCs stays well distributed.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its checksum, the data, its checksum.
pub fn encode_record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// The scalars of one logged step under TensorBoard's tags: Hugging Face's
/// (`train/loss`, `train/learning_rate`, `train/epoch`, `train/grad_norm`) and
/// adabatch's (`train/global_batch`, `train/train_coverage`, and with memory-aware
/// batches `train/predicted_memory`, `train/measured_memory`). Values that are
/// unknown (NaN, e.g. the loss of a dry run) are left out. With several sources,
/// each source's `train/<source>_loss`, `train/<source>_tokens` and
/// `mix/<source>_weight`.
pub fn step_scalars(entry: &StepLog) -> Vec<(String, f64)> {
    let mut values: Vec<(String, f64)> = [
        ("train/loss", entry.loss),
        ("train/grad_norm", entry.grad_norm),
        ("train/learning_rate", entry.learning_rate),
        ("train/epoch", entry.epoch),
        ("train/global_batch", entry.global_batch as f64),
        ("train/train_coverage", entry.train_coverage),
    ]
    .into_iter()
    .map(|(tag, v)| (tag.to_string(), v))
    .collect();
    if let Some(p) = entry.predicted_memory {
        values.push(("train/predicted_memory".into(), p));
    }
    if let Some(m) = entry.measured_memory {
        values.push(("train/measured_memory".into(), m as f64));
    }
    let sources = &entry.sources;
    for (name, loss) in sources.source_loss.iter().flatten() {
        values.push((format!("train/{name}_loss"), loss.unwrap_or(f64::NAN)));
    }
    for (name, tokens) in sources.source_tokens.iter().flatten() {
        values.push((format!("train/{name}_tokens"), *tokens));
    }
    for (name, weight) in sources.mix_weights.iter().flatten() {
        values.push((format!("mix/{name}_weight"), *weight));
    }
    if let Some(diagnostics) = &sources.mixer {
        flatten_numbers("mixer", diagnostics, &mut values);
    }
    values.retain(|(_, v)| v.is_finite());
    values
}

/// The numbers of a JSON value as scalars, tagged by their path (`mixer/law/en/kjv`).
fn flatten_numbers(tag: &str, value: &serde_json::Value, out: &mut Vec<(String, f64)>) {
    match value {
        serde_json::Value::Number(n) => out.extend(n.as_f64().map(|x| (tag.to_string(), x))),
        serde_json::Value::Object(map) => {
            for (key, inner) in map {
                flatten_numbers(&format!("{tag}/{key}"), inner, out);
            }
        }
        _ => {}
    }
}

/// Writes one event file; rank 0 owns it.
pub struct EventWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

fn wall_time() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl EventWriter {
    /// A new event file in `dir` (created if needed), named as TensorFlow names
    /// them so that TensorBoard finds it: `events.out.tfevents.{secs}.{host}.{pid}.{n}`.
    pub fn create(dir: &Path) -> Result<Self> {
        static FILES: AtomicUsize = AtomicUsize::new(0);
        std::fs::create_dir_all(dir).map_err(Error::io(FileOp::CreateDir, dir))?;
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty() && !h.contains(['/', '\\']))
            .unwrap_or_else(|| "localhost".into());
        let now = wall_time();
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}.{}",
            now as u64,
            std::process::id(),
            FILES.fetch_add(1, Ordering::Relaxed)
        ));
        let file = File::create(&path).map_err(Error::io(FileOp::Write, path.clone()))?;
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
        };
        writer.write_event(&Event {
            wall_time: now,
            step: 0,
            file_version: Some("brain.Event:2".into()),
            summary: None,
        })?;
        Ok(writer)
    }

    /// The file written.
    #[cfg(feature = "internals")]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one event and flushes it (TensorBoard reads files while they grow).
    pub fn write_event(&mut self, event: &Event) -> Result<()> {
        let record = encode_record(&event.encode_to_vec());
        self.out
            .write_all(&record)
            .and_then(|()| self.out.flush())
            .map_err(Error::io(FileOp::Write, self.path.clone()))
    }

    /// Writes scalars at `step`.
    pub fn write_scalars(&mut self, step: usize, values: &[(&str, f64)]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        self.write_event(&Event {
            wall_time: wall_time(),
            step: step as i64,
            file_version: None,
            summary: Some(Summary {
                value: values
                    .iter()
                    .map(|&(tag, v)| SummaryValue {
                        tag: tag.into(),
                        simple_value: Some(v as f32),
                    })
                    .collect(),
            }),
        })
    }

    /// Writes one logged step's scalars ([`step_scalars`]).
    pub fn write_step(&mut self, entry: &StepLog) -> Result<()> {
        let tags = step_scalars(entry);
        let values: Vec<(&str, f64)> = tags.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        self.write_scalars(entry.step, &values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mixers_diagnostics_become_scalars_by_their_path() {
        let mut out = Vec::new();
        let diagnostics = serde_json::json!({
            "exploration": 0.25,
            "rewards": {"en": 2.0, "kjv": null},
            "law": {"en": {"en": 0.4, "kjv": 0.1}},
        });
        flatten_numbers("mixer", &diagnostics, &mut out);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let want = [
            ("mixer/exploration", 0.25),
            ("mixer/law/en/en", 0.4),
            ("mixer/law/en/kjv", 0.1),
            ("mixer/rewards/en", 2.0),
        ];
        assert_eq!(out, want.map(|(t, x)| (t.to_string(), x)));
    }

    #[test]
    fn crc32c_test_vectors() {
        // RFC 3720, appendix B.4.
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c::crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn record_framing() {
        let record = encode_record(b"abc");
        assert_eq!(record.len(), 8 + 4 + 3 + 4);
        assert_eq!(&record[..8], &3u64.to_le_bytes());
        assert_eq!(&record[12..15], b"abc");
        let data_crc = u32::from_le_bytes(record[15..19].try_into().unwrap());
        assert_eq!(data_crc, masked_crc32c(b"abc"));
    }

    #[test]
    fn zero_is_still_a_value() {
        let v = SummaryValue {
            tag: "t".into(),
            simple_value: Some(0.0),
        };
        // tag (field 1, 3 bytes) + simple_value (field 2, fixed32): 3 + 5 bytes.
        assert_eq!(v.encode_to_vec().len(), 8);
    }
}
