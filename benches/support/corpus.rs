//! The English corpus of `data/` (15,000 sentences, one a line), as text: the
//! workload of the benchmarks that train on real sentences.

use std::io::Read;

/// The corpus's text, unzipped from `data/en_sentences_15k.txt.gz`.
pub fn english_sentences() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../data/en_sentences_15k.txt.gz"
    );
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    text
}
