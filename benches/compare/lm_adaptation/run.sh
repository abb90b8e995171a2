#!/usr/bin/env bash
# The adaptation table of BENCHMARKS.md: examples/language_model.rs under four
# batch policies, each for one epoch of the corpus (the same token budget), the
# same AdamW (betas 0.9, 0.95; weight decay 0.1) and learning-rate rule (peak 3e-3,
# 2 % warm-up then cosine, both over the examples consumed), on 2 CPU ranks, for
# several seeds:
#
#   small   --global-batch-size 16
#   large   --global-batch-size 64
#   ramp    the example's default: 8 -> 64 documents by 8 over the first 200,000 tokens
#   noise   --schedule noise-scale: half the gradient noise scale, 8 to 256 documents
#
# Writes one summary JSON per run into OUT (default target/lm-adaptation) and the
# table (steps and tokens to the target validation loss, final loss) to stdout.
#
#   bash benches/compare/lm_adaptation/run.sh [SEEDS...]     # default seeds: 1 2 3
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-target/lm-adaptation}
target=${TARGET_LOSS:-6.0}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3)
mkdir -p "$out"
cargo build --release --example language_model
bin=target/release/examples/language_model
declare -A flags=(
    [small]="--global-batch-size 16 --eval-steps 90"
    [large]="--global-batch-size 64 --eval-steps 22"
    [ramp]="--schedule ramp --eval-steps 40"
    [noise]="--schedule noise-scale --eval-steps 30"
)
for seed in "${seeds[@]}"; do
    for policy in small large ramp noise; do
        json="$out/$policy-$seed.json"
        [[ -s "$json" ]] && continue
        # shellcheck disable=SC2086
        "$bin" --nproc-per-node 2 --seed "$seed" --save-steps 0 --samples 0 --quiet \
            --report-to none --output-dir "$out/run-$policy-$seed" \
            --summary-json "$json" ${flags[$policy]} > "$out/$policy-$seed.log" 2>&1
        echo "done $policy seed $seed"
    done
done
python3 benches/compare/lm_adaptation/table.py "$out" "$target"
