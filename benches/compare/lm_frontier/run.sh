#!/usr/bin/env bash
# The batch-size frontier of BENCHMARKS.md: examples/language_model.rs over the
# three text domains of data/ (English sentences, King James verses, Python
# functions, in their natural proportions, one BPE over all; EVERY=k keeps every
# k-th document of each, default 1: all, ~3.2 M tokens), 2 % of the documents
# held out, one epoch each, on 2 CPU ranks, under
#
#   fixed-B   --global-batch-size B, for B in 8 16 32 64 128
#   ramp      8 -> 128 documents by 8 over the first third of the tokens (~20
#             tokens a document), then 128
#   noise     --schedule noise-scale: doubling 8 -> 512 at half of B_simple
#   goodput   --schedule goodput: 8 -> 512 by measured step times and B_simple
#   goodput-adamscale  the same with --lr-scaling adamscale (AdaptDL's AdamScale:
#             the noise scale of Adam-preconditioned gradients, the rate x gain^0.5,
#             no cap at one noise scale); not in the default list
#
# Every policy trains with the same AdamW (betas 0.9, 0.95; weight decay 0.1) and
# the same rule for the rate: 3e-3 at the reference global batch of 32 documents,
# scaled by sqrt(B / 32) at every batch B (`--lr-scaling sqrt --lr-reference-batch
# 32`), 2 % warm-up then cosine, both over the documents consumed. The base rate is
# the example's own default, set before these runs (at batches of 16 to 64); 32
# is the geometric middle of the fixed span.
#
# Writes OUT/<policy>-<seed>.json (the example's --summary-json) and
# OUT/<policy>-<seed>.jsonl (every step), then the table and the chart
# (frontier.py).
#
#   bash benches/compare/lm_frontier/run.sh [SEEDS...]       # default seeds: 1 2
#   POLICIES="fixed-8 ramp" bash benches/compare/lm_frontier/run.sh 1
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-target/lm-frontier}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2)
policies=(${POLICIES:-fixed-8 fixed-16 fixed-32 fixed-64 fixed-128 ramp noise goodput})
bin=${BIN:-target/release/examples/language_model}
mkdir -p "$out"
[[ -n "${BIN:-}" ]] || cargo build --release --example language_model
corpus="$out/three_domains.jsonl.gz"
[[ -s "$corpus" ]] || python3 benches/compare/lm_frontier/corpus.py "$corpus" "${EVERY:-1}"
docs=$(gzip -dc "$corpus" | wc -l)

flags_of() {
    case "$1" in
        fixed-*)
            local b=${1#fixed-}
            # About 16 evaluations an epoch.
            echo "--global-batch-size $b --eval-steps $((docs / b / 16 + 1))"
            ;;
        # Evaluations about as often in tokens as the fixed batches', by the
        # batch each policy mostly trains at.
        ramp) echo "--rampup-batch-size 8 8 $((docs * 20)) --rampup-in-tokens --global-batch-size 128 --eval-steps $((docs / 128 / 16 + 1))" ;;
        noise) echo "--schedule noise-scale --eval-steps $((docs / 64 / 16 + 1))" ;;
        goodput) echo "--schedule goodput --eval-steps $((docs / 32 / 16 + 1))" ;;
        goodput-adamscale) echo "--schedule goodput --eval-steps $((docs / 32 / 16 + 1))" ;;
        *) echo "unknown policy $1" >&2; exit 2 ;;
    esac
}

scaling_of() {
    case "$1" in
        *-adamscale) echo adamscale ;;
        *) echo sqrt ;;
    esac
}

for seed in "${seeds[@]}"; do
    for policy in "${policies[@]}"; do
        json="$out/$policy-$seed.json"
        [[ -s "$json" ]] && continue
        # shellcheck disable=SC2046
        "$bin" --nproc-per-node 2 --seed "$seed" --corpus "$corpus" --tokens-dir "$out/tokens" \
            --validation-fraction 0.02 \
            --lr-scaling "$(scaling_of "$policy")" --lr-reference-batch 32 --per-device-eval-batch-size 64 \
            --save-steps 0 --samples 0 --quiet --report-to none --logging-steps 1 \
            --log-jsonl "$out/$policy-$seed.jsonl" --plot "$out/$policy-$seed.svg" \
            --output-dir "$out/run-$policy-$seed" --summary-json "$json" \
            $(flags_of "$policy") > "$out/$policy-$seed.log" 2>&1
        echo "done $policy seed $seed: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['steps'], 'steps, final', round(r['final_eval_loss'], 4))" "$json")"
    done
done
python3 benches/compare/lm_frontier/frontier.py "$out"
