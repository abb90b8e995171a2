#!/usr/bin/env bash
# Mixing four domains, one of them small (BENCHMARKS.md, "Mixing four domains,
# one of them small"): the English sentences, the King James verses, and the
# Python functions split in two by four_domains.py, `code` (each function without
# its docstring) and `docstrings` (about 8 % of the characters, a third of a
# uniform share). One BPE of 4,096 ids over the four, 2 % of each held out; every
# step a global batch of BUDGET tokens (default 1,600); TOKENS training tokens a
# run (default 400,000); the rest as run.sh.
#
#   bash benches/compare/lm_mixing/four.sh [SEEDS...]          # default: 1 2 3
#   MIXERS="uniform odm" bash benches/compare/lm_mixing/four.sh 1
#
# A mixer is a name of --mixer, or NAME:FLAGS for a named variant, e.g.
# "aioli-smooth:--mixer aioli --aioli-round 100 --aioli-eta 3 --aioli-smoothing 0.5".
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-target/lm-four}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3)
bin=${BIN:-target/release/examples/mixture_compare}
tokenizer=${TOKENIZER_BIN:-target/release/adabatch}
mkdir -p "$out"
[[ -n "${BIN:-}" ]] ||
    { cargo build --release -p adabatch-benches --example mixture_compare && cargo build --release --bin adabatch; }
export TOKENS_DIR=${TOKENS_DIR:-$out/tokens}
if [[ ! -s "$TOKENS_DIR/domains.json" ]]; then
    python3 benches/compare/lm_mixing/four_domains.py "$out/data"
    "$tokenizer" tokenize --output "$TOKENS_DIR" --validation-fraction 0.02 \
        --domain en=data/en_sentences_15k.txt.gz --domain kjv=data/kjv_verses.txt.gz \
        --domain code="$out/data/code.jsonl.gz" --domain docstrings="$out/data/docstrings.jsonl.gz"
fi
# shellcheck source=benches/compare/lm_mixing/common.sh
source benches/compare/lm_mixing/common.sh
four=(--domain en="$tok/en" --domain kjv="$tok/kjv" --domain code="$tok/code"
    --domain docstrings="$tok/docstrings")
budget=(--max-tokens-per-batch "${BUDGET:-1600}" --packed-token-budget --lr-scaling none)
IFS=';' read -r -a mixers <<<"${MIXERS:-stratified;uniform;online;odm}"
for seed in "${seeds[@]}"; do
    for mixer in "${mixers[@]}"; do
        name=${mixer%%:*}
        if [[ "$mixer" == *:* ]]; then read -r -a flags <<<"${mixer#*:}"; else flags=(--mixer "$mixer"); fi
        train "$name-$seed" "${four[@]}" "${flags[@]}" "${budget[@]}" --seed "$seed" \
            --max-train-tokens "${TOKENS:-400000}" --eval-steps 50 --save-steps 0
    done
done
python3 benches/compare/lm_mixing/mixing.py "$out"
