#!/usr/bin/env bash
# The frontier in seconds on one GPU: examples/language_model.rs --device cuda, one
# epoch of a corpus at fixed global batches against the default (the noise scale,
# measured on its cadence) and goodput, for the example's decoder (1.3 M
# parameters) and a 28 M one (hidden 512, 8 layers, 8 heads / 4 kv), each run
# alone on the card, then the table of seconds (seconds.py).
#
#   BIN=path/to/language_model TOKENS=dir OUT=dir bash benches/compare/lm_frontier/gpu.sh [SEEDS...]
#
# TOKENS is a token directory the example prepared (the corpus it names is
# trained on); SEEDS default to 1 2; MODELS (default "small large") and POLICIES
# (default "fixed-8 fixed-16 fixed-32 fixed-64 fixed-128 noise goodput") narrow the runs;
# LIMIT is each run's time limit in seconds (default 120); DOCS the training
# documents (default 15000, the English corpus). Every run evaluates
# about 16 times an epoch, by the batch it mostly trains at, and records the
# training seconds before each evaluation, so that seconds.py reads the wall
# time to any loss. A first run (30 steps, not kept) compiles candle's kernels
# before anything is timed. DEVICE (default cuda) and EXTRA (flags added to
# every run) make a dry run on CPU: DEVICE=cpu EXTRA="--max-steps 40".
set -uo pipefail
cd "$(dirname "$0")/../../.."
bin=${BIN:?BIN: the language_model binary}
tokens=${TOKENS:?TOKENS: a prepared token directory}
out=${OUT:-target/lm-frontier-gpu}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2)
models=(${MODELS:-small large})
policies=(${POLICIES:-fixed-8 fixed-16 fixed-32 fixed-64 fixed-128 noise goodput})
limit=${LIMIT:-120}
mkdir -p "$out"
docs=${DOCS:-15000}

model_flags() {
    case "$1" in
        small) echo "" ;;
        large) echo "--hidden-size 512 --intermediate-size 1536 --num-hidden-layers 8 --num-attention-heads 8 --num-key-value-heads 4" ;;
        *) echo "unknown model $1" >&2; exit 2 ;;
    esac
}

policy_flags() {
    case "$1" in
        fixed-*)
            local b=${1#fixed-}
            echo "--global-batch-size $b --eval-steps $((docs / b / 16 + 1))"
            ;;
        noise) echo "--schedule noise-scale --eval-steps $((docs / 64 / 16 + 1))" ;;
        goodput) echo "--schedule goodput --eval-steps $((docs / 64 / 16 + 1))" ;;
        *) echo "unknown policy $1" >&2; exit 2 ;;
    esac
}

base=(--device "${DEVICE:-cuda}" --tokens-dir "$tokens" --save-steps 0 --samples 0 --quiet --report-to none --logging-steps 50)
# shellcheck disable=SC2206
common=("${base[@]}" ${EXTRA:-})

echo "warm-up (candle's kernels): 30 steps"
timeout -k 5 "$limit" "$bin" "${base[@]}" --global-batch-size 64 --max-steps 30 --eval-strategy no \
    --output-dir "$out/warm-up" >"$out/warm-up.log" 2>&1 || echo "warm-up failed: $(tail -n 3 "$out/warm-up.log")"

for seed in "${seeds[@]}"; do
    for model in "${models[@]}"; do
        mkdir -p "$out/$model"
        for policy in "${policies[@]}"; do
            json="$out/$model/$policy-$seed.json"
            [[ -s "$json" ]] && continue
            # shellcheck disable=SC2046
            timeout -k 5 "$limit" "$bin" "${common[@]}" --seed "$seed" $(model_flags "$model") $(policy_flags "$policy") \
                --log-jsonl "$out/$model/$policy-$seed.jsonl" --output-dir "$out/run" \
                --summary-json "$json" >"$out/$model/$policy-$seed.log" 2>&1
            rc=$?
            if [[ $rc -ne 0 ]]; then
                echo "$model $policy seed $seed: exit $rc: $(tail -n 2 "$out/$model/$policy-$seed.log")"
                continue
            fi
            echo "$model $policy seed $seed: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['steps'], 'steps', round(r['train_runtime'], 1), 's, final', round(r['final_eval_loss'], 4))" "$json")"
        done
    done
done
for model in "${models[@]}"; do
    echo "== $model"
    python3 benches/compare/lm_frontier/seconds.py "$out/$model"
done
