#!/usr/bin/env bash
# Mixing three text domains for a small decoder (BENCHMARKS.md, "Mixing domains
# for a language model"): the mixture example's run through its driver
# (driver.rs, `mixture_compare`) over the English sentences, the
# King James verses and the Python functions of data/, one byte-level BPE of
# 4,096 ids over their training documents, 2 % of each held out, 2 CPU ranks,
# a global batch of 32 documents, AdamW at 3e-3 (2 % warm-up, cosine over the
# tokens), every run TOKENS training tokens (default 400,000).
#
# 1. Mixers, for each seed: stratified (shares of tokens = shares of the
#    training tokens), uniform (a third each), online (adabatch::OnlineMixer),
#    odm (adabatch::Exp3Mixer, Online Data Mixing); and stratified28, stratified
#    at 28 documents a step (rate referenced at 28), which trains about as many
#    tokens a step as the other mixers do at 32 (stratified's share of the long
#    Python documents makes its steps of 32 documents ~15 % larger in tokens, so
#    it would take fewer, larger steps on the same budget).
# 2. Continual pretraining (seed 1 by default): phase 1 on en + kjv (P1 tokens,
#    default 300,000), then phase 2 from its weights on python with a replay of
#    en + kjv at 0, 5 and 10 % of the tokens (halves each), and with the online
#    mixer steering all three (P2 tokens, default 200,000); phase 2 at the base
#    rate 3e-3, and (P2_LOW=1, the default) also 0 and 10 % replay at 1e-3.
#
# Writes OUT/<run>.json (the driver's --summary-json) and OUT/<run>.jsonl,
# then the tables (mixing.py).
#
# BUDGET=N: every step a global batch of N tokens instead (--max-tokens-per-batch
# N --packed-token-budget: as many documents as fit, so every mixer trains the
# same tokens a step; the rate not rescaled by the documents a step), no
# stratified28 (nothing to match).
#
#   bash benches/compare/lm_mixing/run.sh [SEEDS...]        # default: 1 2 3
#   MIXERS="odm" CONTINUAL=0 bash benches/compare/lm_mixing/run.sh 1
#   MIXERS="uniform aioli-held aioli-held-worst" BUDGET=1600 CONTINUAL=0 bash benches/compare/lm_mixing/run.sh
#   MIXERS="online-w100:--mixer online --online-warmup-steps 100" BUDGET=1600 CONTINUAL=0 bash benches/compare/lm_mixing/run.sh
#   BUDGET=1600 CONTINUAL=0 OUT=target/lm-mixing-tokens bash benches/compare/lm_mixing/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-target/lm-mixing}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3)
default_mixers="stratified uniform online odm stratified28"
batch=()
if [[ -n "${BUDGET:-}" ]]; then
    default_mixers="stratified uniform online odm"
    batch=(--max-tokens-per-batch "$BUDGET" --packed-token-budget --lr-scaling none)
fi
# Names separated by spaces, or by ';' where one is NAME:FLAGS (as four.sh).
if [[ "${MIXERS:-}" == *";"* || "${MIXERS:-}" == *":"* ]]; then
    IFS=';' read -r -a mixers <<<"$MIXERS"
else
    read -r -a mixers <<<"${MIXERS:-$default_mixers}"
fi
tokens=${TOKENS:-400000}
bin=${BIN:-target/release/examples/mixture_compare}
mkdir -p "$out"
[[ -n "${BIN:-}" ]] ||
    { cargo build --release -p adabatch-benches --example mixture_compare && cargo build --release --bin adabatch; }
# shellcheck source=benches/compare/lm_mixing/common.sh
source benches/compare/lm_mixing/common.sh
three=(--domain en="$tok/en" --domain kjv="$tok/kjv" --domain python="$tok/python")
for seed in "${seeds[@]}"; do
    for mixer in "${mixers[@]}"; do
        case "$mixer" in
            stratified28) flags=(--mixer stratified --global-batch-size 28 --lr-reference-batch 28) ;;
            # Aioli read on held-out losses (HELD_OUT validation documents of each
            # domain, default 32), with the paper's objective or a soft worst domain.
            aioli-held) flags=(--mixer aioli --aioli-held-out --mixer-eval-examples "${HELD_OUT:-32}") ;;
            aioli-held-worst) flags=(--mixer aioli --aioli-held-out --mixer-eval-examples "${HELD_OUT:-32}"
                --aioli-worst-temperature 0.5) ;;
            aioli-held-worst1) flags=(--mixer aioli --aioli-held-out --mixer-eval-examples "${HELD_OUT:-32}"
                --aioli-worst-temperature 1) ;;
            aioli-held-smooth) flags=(--mixer aioli --aioli-held-out --mixer-eval-examples "${HELD_OUT:-32}"
                --aioli-round 100 --aioli-eta 3 --aioli-smoothing 0.5) ;;
            *:*) read -r -a flags <<<"${mixer#*:}" ;;
            *) flags=(--mixer "$mixer") ;;
        esac
        train "${mixer%%:*}-$seed" "${three[@]}" "${flags[@]}" "${batch[@]}" --seed "$seed" \
            --max-train-tokens "$tokens" --eval-steps 50 --save-steps 0
    done
done

if [[ "${CONTINUAL:-1}" != 0 ]]; then
    seed=${CONTINUAL_SEED:-1}
    p1=${P1:-300000}
    p2=${P2:-200000}
    train "phase1-$seed" --mixer stratified --domain en="$tok/en" --domain kjv="$tok/kjv" --seed "$seed" \
        --max-train-tokens "$p1" --eval-steps 50 --save-steps 1000000
    new_first=(--domain python="$tok/python" --domain en="$tok/en" --domain kjv="$tok/kjv")
    for replay in 0 5 10; do
        w=$(python3 -c "print(f'python={1 - $replay / 100},en={$replay / 200},kjv={$replay / 200}')")
        train "replay$replay-$seed" "${new_first[@]}" --init-from "$out/run-phase1-$seed" \
            --mixer stratified --mix-weights "$w" --seed "$seed" --max-train-tokens "$p2" --eval-steps 25 \
            --eval-on-start --save-steps 0
    done
    train "replay-online-$seed" "${new_first[@]}" --init-from "$out/run-phase1-$seed" \
        --mixer online --seed "$seed" --max-train-tokens "$p2" --eval-steps 25 \
        --eval-on-start --save-steps 0
    if [[ "${P2_LOW:-1}" != 0 ]]; then
        for replay in 0 10; do
            w=$(python3 -c "print(f'python={1 - $replay / 100},en={$replay / 200},kjv={$replay / 200}')")
            train "replay$replay-lr1e-3-$seed" "${new_first[@]}" --init-from "$out/run-phase1-$seed" \
                --mixer stratified --mix-weights "$w" --seed "$seed" --max-train-tokens "$p2" --eval-steps 25 \
                --eval-on-start --save-steps 0 --learning-rate 1e-3
        done
    fi
fi
python3 benches/compare/lm_mixing/mixing.py "$out"
