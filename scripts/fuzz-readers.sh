#!/usr/bin/env bash
# The readers of untrusted bytes (a checkpoint's files, a token directory's, a
# weights file, a corpus to tokenize, a run's log, a sharded model's index, a
# model's config.json, the rendezvous's hello, Parquet and Arrow corpora) under
# thousands of damaged or arbitrary inputs each: the property tests of
# tests/it/fuzz.rs and the unit properties of adabatch-runtime's rendezvous and
# corpus readers, which the test commands run with a few dozen.
#
#   scripts/fuzz-readers.sh            # 2000 cases per reader
#   ADABATCH_FUZZ_CASES=20000 scripts/fuzz-readers.sh
#
# A failure prints the smallest input proptest found; add it to the test's
# regression cases and fix the reader.
set -euo pipefail
cd "$(dirname "$0")/.."
export ADABATCH_FUZZ_CASES="${ADABATCH_FUZZ_CASES:-2000}"
cargo test -p adabatch-tests --test it fuzz:: -- --test-threads 2
cargo test -p adabatch-runtime --lib dist::rendezvous -- --test-threads 2
cargo test -p adabatch-runtime --features parquet --lib data::corpus -- --test-threads 2
