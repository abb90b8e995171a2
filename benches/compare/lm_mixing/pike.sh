#!/usr/bin/env bash
# PiKE against uniform and the online mixer (BENCHMARKS.md, "PiKE on the mixing
# protocol"): the runs of run.sh (three domains) and four.sh (four, one of them
# small) at 1,600 tokens a step, 400,000 training tokens, 2 CPU ranks, with
# --mixer uniform, online (the example's default: 1.5 nats after 40 % of the
# run), pike (adabatch::PikeMixer::default()) and pike-fair
# (PikeMixer::fair(3)), every seed given (default 1-6; PiKE's defaults were
# chosen on seeds 1 and 2 of three domains). Then the tables (mixing.py):
# the bar seed by seed against uniform.
#
#   bash benches/compare/lm_mixing/pike.sh [SEEDS...]
#   OUT3=target/lm-pike3 OUT4=target/lm-pike4 bash benches/compare/lm_mixing/pike.sh 1 2 3 4 5 6
set -euo pipefail
cd "$(dirname "$0")/../../.."
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3 4 5 6)
[[ -n "${BIN:-}" ]] ||
    { cargo build --release -p adabatch-benches --example mixture_compare && cargo build --release --bin adabatch; }
export BIN=${BIN:-target/release/examples/mixture_compare}
mixers="uniform;online;pike;pike-fair"
MIXERS="$mixers" BUDGET=1600 CONTINUAL=0 OUT=${OUT3:-target/lm-pike3} \
    bash benches/compare/lm_mixing/run.sh "${seeds[@]}"
MIXERS="$mixers" OUT=${OUT4:-target/lm-pike4} bash benches/compare/lm_mixing/four.sh "${seeds[@]}"
