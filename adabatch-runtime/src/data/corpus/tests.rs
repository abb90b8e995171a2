//! The readers against the texts they were written from: kept in order, nulls and
//! empty texts counted apart, and each bad input a typed error naming its file.

use std::path::PathBuf;

use super::*;

/// A fresh folder of this test process.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("adabatch-corpus-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The texts of every test corpus: kept ones, a null (`None`), an empty and a
/// whitespace-only text, texts with leading and trailing spaces (kept as they are).
fn texts() -> Vec<Option<String>> {
    let mut texts: Vec<Option<String>> = (0..50)
        .map(|i| Some(format!(" document {i}: the cat sat on mat {} ", i * 7)))
        .collect();
    texts[3] = None;
    texts[10] = Some(String::new());
    texts[11] = Some(" \t ".into());
    texts[30] = None;
    texts
}

fn kept(texts: &[Option<String>]) -> Vec<String> {
    texts
        .iter()
        .flatten()
        .filter(|t| !t.trim().is_empty())
        .cloned()
        .collect()
}

fn read_all(inputs: &[PathBuf], column: &str) -> (Vec<String>, Skipped) {
    let corpus = Corpus::open(inputs, column).unwrap();
    let mut all = Vec::new();
    let skipped = corpus
        .read(|first, batch| {
            assert_eq!(first, all.len(), "batches in order");
            all.extend(batch);
            Ok(ControlFlow::Continue(()))
        })
        .unwrap();
    (all, skipped)
}

#[test]
fn json_lines_keep_texts_and_count_nulls_and_empty_ones() {
    let dir = temp_dir("jsonl");
    let path = dir.join("c.jsonl");
    let lines: Vec<String> = texts()
        .iter()
        .map(|t| serde_json::json!({ "id": 1, "body": t }).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let (all, skipped) = read_all(std::slice::from_ref(&path), "body");
    assert_eq!(all, kept(&texts()));
    assert_eq!(skipped, Skipped { null: 2, empty: 2 });
    // The column named wrong: the line and the column in the message.
    let err = Corpus::open(std::slice::from_ref(&path), "text")
        .and_then(|c| c.documents())
        .unwrap_err();
    assert!(
        err.to_string().contains("line 1: no string field \"text\""),
        "{err}"
    );
    std::fs::write(&path, "{\"text\": 5}\n").unwrap();
    let err = Corpus::open(&[path], "text")
        .and_then(|c| c.documents())
        .unwrap_err();
    assert!(
        err.to_string().contains("is a number, not a string"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_folder_is_its_corpus_files_in_name_order() {
    let dir = temp_dir("folder");
    std::fs::write(dir.join("b.txt"), "second\n").unwrap();
    std::fs::write(dir.join("a.txt"), "first\n\n").unwrap();
    std::fs::write(dir.join("notes.md"), "not a corpus file\n").unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    let (all, skipped) = read_all(std::slice::from_ref(&dir), "text");
    assert_eq!(all, ["first", "second"]);
    assert_eq!(skipped, Skipped { null: 0, empty: 1 });
    let empty = dir.join("sub");
    let err = Corpus::open(std::slice::from_ref(&empty), "text").unwrap_err();
    assert!(err.to_string().contains("holds no corpus file"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(not(feature = "parquet"))]
#[test]
fn parquet_without_the_feature_says_which_feature_reads_it() {
    let dir = temp_dir("nofeature");
    let path = dir.join("train-00000-of-00001.parquet");
    std::fs::write(&path, b"PAR1").unwrap();
    let err = Corpus::open(&[path], "text").unwrap_err();
    assert!(err.to_string().contains("`parquet` feature"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[cfg(feature = "parquet")]
mod hub {
    use std::path::Path;
    use std::sync::Arc;

    use arrow_array::types::Int32Type;
    use arrow_array::{
        ArrayRef, DictionaryArray, Int64Array, LargeStringArray, RecordBatch, StringArray,
        StringViewArray,
    };
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    use proptest::prelude::*;

    use super::*;

    /// `texts` as a record batch: an id column, then `column` of `data_type`.
    fn batch(texts: &[Option<String>], column: &str, data_type: &DataType) -> RecordBatch {
        let refs: Vec<Option<&str>> = texts.iter().map(Option::as_deref).collect();
        let text: ArrayRef = match data_type {
            DataType::Utf8 => Arc::new(StringArray::from(refs)),
            DataType::LargeUtf8 => Arc::new(LargeStringArray::from(refs)),
            DataType::Utf8View => Arc::new(StringViewArray::from(refs)),
            _ => Arc::new(refs.into_iter().collect::<DictionaryArray<Int32Type>>()),
        };
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..texts.len() as i64));
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(column, text.data_type().clone(), true),
        ]);
        RecordBatch::try_new(Arc::new(schema), vec![ids, text]).unwrap()
    }

    /// A Parquet file of `texts`, row groups of 7 rows.
    fn write_parquet(path: &Path, texts: &[Option<String>], column: &str, data_type: &DataType) {
        let batch = batch(texts, column, data_type);
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(7))
            .build();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    /// An Arrow IPC stream (as `datasets`' save_to_disk writes) or file.
    fn write_arrow(path: &Path, texts: &[Option<String>], column: &str, stream: bool) {
        let batch = batch(texts, column, &DataType::Utf8);
        let file = std::fs::File::create(path).unwrap();
        if stream {
            let mut writer =
                arrow_ipc::writer::StreamWriter::try_new(file, &batch.schema()).unwrap();
            for part in [batch.slice(0, 20), batch.slice(20, batch.num_rows() - 20)] {
                writer.write(&part).unwrap();
            }
            writer.finish().unwrap();
        } else {
            let mut writer = arrow_ipc::writer::FileWriter::try_new(file, &batch.schema()).unwrap();
            writer.write(&batch).unwrap();
            writer.finish().unwrap();
        }
    }

    #[test]
    fn parquet_shards_of_every_text_type_read_in_order() {
        let dir = temp_dir("parquet");
        let all = texts();
        for data_type in [
            DataType::Utf8,
            DataType::LargeUtf8,
            DataType::Utf8View,
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
        ] {
            // Two shards, named so that the second sorts first on the disk's order.
            write_parquet(
                &dir.join("train-00001-of-00002.parquet"),
                &all[25..],
                "content",
                &data_type,
            );
            write_parquet(
                &dir.join("train-00000-of-00002.parquet"),
                &all[..25],
                "content",
                &data_type,
            );
            let (read, skipped) = read_all(std::slice::from_ref(&dir), "content");
            assert_eq!(read, kept(&all), "{data_type}");
            assert_eq!(skipped, Skipped { null: 2, empty: 2 }, "{data_type}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_datasets_folder_and_an_arrow_file_read_in_order() {
        let dir = temp_dir("arrow");
        let all = texts();
        write_arrow(
            &dir.join("data-00000-of-00002.arrow"),
            &all[..30],
            "text",
            true,
        );
        write_arrow(
            &dir.join("data-00001-of-00002.arrow"),
            &all[30..],
            "text",
            true,
        );
        std::fs::write(dir.join("dataset_info.json"), "{}").unwrap();
        std::fs::write(dir.join("state.json"), "{}").unwrap();
        let (read, skipped) = read_all(std::slice::from_ref(&dir), "text");
        assert_eq!(read, kept(&all));
        assert_eq!(skipped, Skipped { null: 2, empty: 2 });
        let file = dir.join("whole.arrow");
        write_arrow(&file, &all, "text", false);
        assert_eq!(read_all(&[file], "text").0, kept(&all));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn zstd_json_lines_read_across_frames() {
        let dir = temp_dir("zstd");
        let path = dir.join("c.jsonl.zst");
        let line = |i: usize| format!("{{\"text\": \"line {i}\"}}\n");
        let (first, second): (String, String) =
            ((0..100).map(line).collect(), (100..150).map(line).collect());
        let mut bytes = ruzstd::encoding::compress_to_vec(
            first.as_bytes(),
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        bytes.extend(ruzstd::encoding::compress_to_vec(
            second.as_bytes(),
            ruzstd::encoding::CompressionLevel::Fastest,
        ));
        std::fs::write(&path, bytes).unwrap();
        let (read, _) = read_all(&[path], "text");
        assert_eq!(read.len(), 150);
        assert_eq!(read[149], "line 149");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_shards_and_columns_are_errors_naming_the_file() {
        let dir = temp_dir("bad");
        let good = dir.join("good.parquet");
        write_parquet(&good, &texts(), "content", &DataType::Utf8);
        // A missing column: the file, the column, the columns it has.
        let err = Corpus::open(std::slice::from_ref(&good), "text").unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("good.parquet")
                && message.contains("\"text\"")
                && message.contains("id, content"),
            "{message}"
        );
        // A column that is not text: its type.
        let err = Corpus::open(std::slice::from_ref(&good), "id").unwrap_err();
        assert!(err.to_string().contains("Int64, not text"), "{err}");
        // A cut file: its footer is gone.
        let bytes = std::fs::read(&good).unwrap();
        let cut = dir.join("cut.parquet");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let err = Corpus::open(std::slice::from_ref(&cut), "content").unwrap_err();
        assert!(err.to_string().contains("cut.parquet"), "{err}");
        // Damage inside the data, footer intact: the row group is named, at read.
        let mut damaged = bytes.clone();
        for byte in &mut damaged[4..bytes.len() / 3] {
            *byte = 0xA5;
        }
        let path = dir.join("damaged.parquet");
        std::fs::write(&path, damaged).unwrap();
        let err = Corpus::open(std::slice::from_ref(&path), "content")
            .and_then(|c| c.documents())
            .unwrap_err();
        assert!(
            err.to_string().contains("damaged.parquet") && err.to_string().contains("row group 0"),
            "{err}"
        );
        // An Arrow file that is not one.
        let arrow = dir.join("x.arrow");
        std::fs::write(&arrow, b"not arrow at all").unwrap();
        let err = Corpus::open(&[arrow], "text").unwrap_err();
        assert!(err.to_string().contains("x.arrow"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Cases of the damaged-file properties: a few here (the CI runs this module),
    /// thousands from `scripts/fuzz-readers.sh` (`ADABATCH_FUZZ_CASES`).
    fn fuzz_cases() -> u32 {
        std::env::var("ADABATCH_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(12)
    }

    /// One damage to a file's bytes, positions taken modulo its length (as
    /// tests/it/fuzz.rs damages the other readers' files).
    #[derive(Debug, Clone)]
    enum Damage {
        Flip(usize, u8),
        Cut(usize),
        Insert(usize, Vec<u8>),
        Repeat(usize, usize),
    }

    /// A file's new contents: the seed damaged a few times, or arbitrary bytes.
    #[derive(Debug, Clone)]
    enum Contents {
        Damaged(Vec<Damage>),
        Arbitrary(Vec<u8>),
    }

    fn contents() -> impl Strategy<Value = Contents> {
        let damage = prop_oneof![
            4 => (any::<usize>(), 1..=255u8).prop_map(|(at, mask)| Damage::Flip(at, mask)),
            1 => any::<usize>().prop_map(Damage::Cut),
            1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
                .prop_map(|(at, bytes)| Damage::Insert(at, bytes)),
            1 => (any::<usize>(), 1..64usize).prop_map(|(at, len)| Damage::Repeat(at, len)),
        ];
        prop_oneof![
            4 => prop::collection::vec(damage, 1..6).prop_map(Contents::Damaged),
            1 => prop::collection::vec(any::<u8>(), 0..512).prop_map(Contents::Arbitrary),
        ]
    }

    fn apply(original: &[u8], contents: &Contents) -> Vec<u8> {
        let damages = match contents {
            Contents::Arbitrary(bytes) => return bytes.clone(),
            Contents::Damaged(damages) => damages,
        };
        let mut bytes = original.to_vec();
        for damage in damages {
            let len = bytes.len();
            if len == 0 {
                break;
            }
            match damage {
                Damage::Flip(at, mask) => bytes[at % len] ^= mask,
                Damage::Cut(at) => bytes.truncate(at % len + 1),
                Damage::Insert(at, new) => {
                    let at = at % len + 1;
                    bytes.splice(at..at, new.iter().copied());
                }
                Damage::Repeat(at, n) => {
                    let at = at % len;
                    let chunk = bytes[at..(at + n).min(len)].to_vec();
                    bytes.splice(at..at, chunk);
                }
            }
        }
        bytes
    }

    /// A Parquet file (snappy, dictionary-encoded, row groups of 7 rows), an Arrow
    /// IPC stream and an Arrow IPC file of the test texts, in column `content`.
    fn columnar_seeds() -> &'static Path {
        static SEEDS: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        SEEDS.get_or_init(|| {
            let dir = temp_dir("fuzz-seeds");
            let batch = batch(&texts(), "content", &DataType::Utf8);
            let props = WriterProperties::builder()
                .set_compression(parquet::basic::Compression::SNAPPY)
                .set_max_row_group_row_count(Some(7))
                .build();
            let file = std::fs::File::create(dir.join("seed.parquet")).unwrap();
            let mut writer = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
            writer.write(&batch).unwrap();
            writer.close().unwrap();
            write_arrow(&dir.join("stream.arrow"), &texts(), "content", true);
            write_arrow(&dir.join("file.arrow"), &texts(), "content", false);
            dir
        })
    }

    /// Opens and reads the seed `name`, damaged: its texts, or an error naming it.
    fn read_damaged(name: &str, contents: &Contents) -> Result<(), TestCaseError> {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let case = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let original = std::fs::read(columnar_seeds().join(name)).unwrap();
        let dir = temp_dir(&format!("fuzz-{case}"));
        let path = dir.join(name);
        std::fs::write(&path, apply(&original, contents)).unwrap();
        let read = Corpus::open(std::slice::from_ref(&path), "content").and_then(|c| c.documents());
        std::fs::remove_dir_all(&dir).ok();
        match read {
            Err(e) => {
                let named = e.to_string().contains(&path.display().to_string());
                prop_assert!(named, "{name}: the error does not name it: {}", e.report());
            }
            // Neither format's magic and structure come from arbitrary bytes.
            Ok(_) => prop_assert!(
                !matches!(contents, Contents::Arbitrary(_)),
                "{name}: arbitrary bytes were accepted"
            ),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: fuzz_cases(),
            // The files are fresh each case; nothing to persist but the inputs.
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn a_damaged_parquet_file_never_panics(contents in contents()) {
            read_damaged("seed.parquet", &contents)?;
        }

        #[test]
        fn a_damaged_arrow_stream_never_panics(contents in contents()) {
            read_damaged("stream.arrow", &contents)?;
        }

        #[test]
        fn a_damaged_arrow_file_never_panics(contents in contents()) {
            read_damaged("file.arrow", &contents)?;
        }
    }

    /// Found by `a_damaged_arrow_file_never_panics` and
    /// `a_damaged_arrow_stream_never_panics`: a zero byte inserted into an Arrow IPC
    /// file, or a chunk of a stream repeated, made arrow-ipc slice a buffer past
    /// the end of its body and panic; found by `a_damaged_parquet_file_never_panics`:
    /// one flipped byte made the parquet crate overflow a sum of definition
    /// levels (a panic where overflow is checked). Each is an error naming the
    /// file.
    #[test]
    fn files_their_readers_panicked_on_are_refused_naming_them() {
        for (name, damage) in [
            ("file.arrow", Damage::Insert(383, vec![0])),
            ("stream.arrow", Damage::Repeat(271, 46)),
            ("seed.parquet", Damage::Flip(4573, 9)),
        ] {
            let original = std::fs::read(columnar_seeds().join(name)).unwrap();
            let dir = temp_dir(&format!("regression-{name}"));
            let path = dir.join(name);
            std::fs::write(&path, apply(&original, &Contents::Damaged(vec![damage]))).unwrap();
            let err = Corpus::open(std::slice::from_ref(&path), "content")
                .and_then(|c| c.documents())
                .unwrap_err();
            let named = err.to_string().contains(&path.display().to_string());
            assert!(named, "{err}");
            std::fs::remove_dir_all(&dir).ok();
        }
    }
}
