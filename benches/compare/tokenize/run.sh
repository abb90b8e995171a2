#!/usr/bin/env bash
# `adabatch tokenize` (feature `parquet`) against the nanoGPT-style Python prepare
# (pyarrow batches -> tokenizers' encode_batch -> numpy uint16, prepare.py) on the
# same Parquet shards and the same tokenizer.json: the token bytes must be equal;
# tokens/s and peak RSS of each, on a corpus (corpus.py, COPIES copies of the
# repository's three domains) and on the same corpus four times over.
#
#   benches/compare/tokenize/run.sh [COPIES]      (default 4)
#
# Needs python3 (a venv with pyarrow, tokenizers and numpy is made under
# ~/.cache/adabatch/tokenize-venv) and /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/../../.."
copies=${1:-4}
venv=${ADABATCH_TOKENIZE_VENV:-$HOME/.cache/adabatch/tokenize-venv}
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import pyarrow, tokenizers, numpy" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet pyarrow tokenizers numpy
fi
py="$venv/bin/python"
work=${TOKENIZE_COMPARE_DIR:-$(mktemp -d)}
cargo build --release --quiet --features parquet --bin adabatch
bin="${CARGO_TARGET_DIR:-target}/release/adabatch"
here=benches/compare/tokenize
"$py" "$here/corpus.py" "$work/x1" "$copies"
"$py" "$here/corpus.py" "$work/x4" "$((4 * copies))"
# One tokenizer for both: a BPE of 4,096 ids trained by adabatch on the first corpus.
"$bin" tokenize "$work/x1" --text-column content --vocab-size 4096 -q -o "$work/tok" >/dev/null

# Wall seconds and peak RSS (MB) of a command, from /usr/bin/time.
measure() {
    local log="$work/time.log"
    /usr/bin/time -v "$@" >/dev/null 2>"$log"
    local wall rss
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$log" |
        awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
    rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$log")
    echo "$wall $((rss / 1024))"
}

printf '| corpus | tokens | adabatch s | Python s | adabatch tokens/s | Python tokens/s | ratio | adabatch peak MB | Python peak MB | same bytes |\n'
printf '|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n'
for size in x1 x4; do
    rm -rf "$work/out-$size"
    read -r a_wall a_rss < <(measure "$bin" tokenize "$work/$size" --text-column content \
        --tokenizer "$work/tok/tokenizer.json" --validation-fraction 0 -q -o "$work/out-$size")
    read -r p_wall p_rss < <(measure "$py" "$here/prepare.py" "$work/$size" "$work/tok/tokenizer.json" "$work/py-$size.bin")
    tokens=$(( $(stat -c %s "$work/py-$size.bin") / 2 ))
    same=no
    cmp -s "$work/out-$size/train.bin" "$work/py-$size.bin" && same=yes
    awk -v c="$size" -v t="$tokens" -v a="$a_wall" -v p="$p_wall" -v ar="$a_rss" -v pr="$p_rss" -v s="$same" \
        'BEGIN { printf "| %s | %d | %.2f | %.2f | %.0f | %.0f | %.2f | %d | %d | %s |\n", c, t, a, p, t / a, t / p, p / a, ar, pr, s }'
done
