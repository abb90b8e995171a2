#!/usr/bin/env bash
# The readers of untrusted bytes (a checkpoint's files, a token directory's, a
# weights file) under thousands of damaged or arbitrary inputs each: the
# property tests of tests/it/fuzz.rs, which the test command runs with a few dozen.
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
