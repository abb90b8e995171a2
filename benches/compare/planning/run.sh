#!/usr/bin/env bash
# Batch-planning benchmark: adabatch (`LengthIndex::new` + `plan_epoch`, memory
# mode) vs dynabatch 0.2.23 (`DynaBatchSampler(...)` construction) on the same
# 1,000,000 example lengths. See RESULTS.md.
#
#   bash benches/compare/planning/run.sh
#
# Environment (all optional):
#   N=1000000            examples generated (sampled with replacement from the corpus)
#   DYNABATCH_N="1000000"  sizes (prefixes of the lengths file) dynabatch is timed on;
#                        the full 1M takes ~20-30 min on a 2-core machine, so for a
#                        quick check use e.g. DYNABATCH_N="100000". adabatch is timed on
#                        the same sizes and on N; ratios are only printed at equal sizes.
#   REPEAT=7             adabatch repetitions (median reported); dynabatch runs once per size
#   PYTHON=python3       interpreter for the venv
#   CORPUS=<one sentence per line, optionally gzipped>   (default: data/en_sentences_15k.txt.gz)
#   RESULTS=benches/compare/planning/results   where the JSON results go
#
# Python environment: dynabatch's package `__init__` imports torch, transformers
# and datasets (for its DataLoader/Trainer helpers), but batch planning only
# uses numpy, pandas, xgboost and tqdm. torch from PyPI pulls several GB of CUDA
# wheels, so dynabatch is installed with --no-deps plus its planning
# dependencies (numpy, pandas, xgboost>=3.2, tqdm, scikit-learn), and
# benches/compare/planning/stubs/ (minimal import stubs for torch, transformers and
# datasets, never called while planning) is put first on PYTHONPATH. The timed
# code, dynabatch/sampler.py and dynabatch/regressor.py, is dynabatch's own,
# unmodified.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
cd "$ROOT"

N=${N:-1000000}
DYNABATCH_N=${DYNABATCH_N:-1000000}
REPEAT=${REPEAT:-7}
PYTHON=${PYTHON:-python3}
CORPUS=${CORPUS:-$ROOT/data/en_sentences_15k.txt.gz}
VENV=benches/compare/planning/.venv
LENGTHS=benches/compare/planning/lengths.tsv
RESULTS=${RESULTS:-benches/compare/planning/results}
# Same plan parameters on both sides.
BASELINE=32      # dynabatch min_batch_size
THRESHOLD=0.9    # dynabatch's documented default (build_dynabatch_dataloader); the sampler's own default is 0.7
MAX_RANGE=4.0    # dynabatch max_batch_range
MAX_GROWTH=0.2   # dynabatch smooth_batches=True, smooth_batches_max_diff=0.2 (its defaults)
KEEP_FIRST=5     # dynabatch shuffle_keep_first_n default
SEED=21          # dynabatch shuffle_seed default

echo "== python environment ($VENV)"
if ! "$VENV/bin/python" -c "import dynabatch, numpy, pandas, xgboost, tqdm, sklearn" 2>/dev/null; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet --no-deps "dynabatch==0.2.23"
    "$VENV/bin/pip" install --quiet numpy pandas "xgboost>=3.2" tqdm scikit-learn
fi
"$VENV/bin/pip" list 2>/dev/null | grep -i -E '^(dynabatch|numpy|pandas|xgboost|tqdm|scikit-learn) '

echo "== lengths ($LENGTHS)"
if [ ! -s "$LENGTHS" ] || [ "$(($(wc -l < "$LENGTHS") - 1))" -ne "$N" ]; then
    "$VENV/bin/python" benches/compare/planning/gen_lengths.py --corpus "$CORPUS" --out "$LENGTHS" -n "$N"
fi

mkdir -p "$RESULTS"

echo "== adabatch (cargo bench -p adabatch-benches --bench planning)"
# shellcheck disable=SC2086 # DYNABATCH_N is a list of sizes
ADA_N=$(printf '%s\n' $DYNABATCH_N "$N" | sort -n -u | tr '\n' ' ')
# shellcheck disable=SC2086
cargo bench --quiet -p adabatch-benches --bench planning -- \
    --lengths "$LENGTHS" --n $ADA_N --repeat "$REPEAT" \
    --baseline-size "$BASELINE" --threshold "$THRESHOLD" --max-range "$MAX_RANGE" \
    --max-growth "$MAX_GROWTH" --keep-first "$KEEP_FIRST" --seed "$SEED" \
    | tee "$RESULTS/adabatch.jsonl"

echo "== dynabatch (DynaBatchSampler construction; tqdm off)"
# shellcheck disable=SC2086
PYTHONPATH="$HERE/stubs" TQDM_DISABLE=1 "$VENV/bin/python" benches/compare/planning/dynabatch_plan.py \
    --lengths "$LENGTHS" --n $DYNABATCH_N \
    --min-batch-size "$BASELINE" --threshold "$THRESHOLD" --max-batch-range "$MAX_RANGE" \
    --seed "$SEED" --out "$RESULTS/dynabatch.json"

echo "== summary"
"$VENV/bin/python" benches/compare/planning/summary.py "$RESULTS/adabatch.jsonl" "$RESULTS/dynabatch.json"
