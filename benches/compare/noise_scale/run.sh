#!/usr/bin/env bash
# The digits with schedule = noise_scale(0.5, 16, 512) beside fixed global batches of
# 32, 128 and 512: 5 seeds, 2 ranks, 10 epochs, AdamW at 3e-3, test split evaluated
# every 5 steps. Prints steps and examples to 95 % test accuracy and the final
# accuracy, as tabled in BENCHMARKS.md.  Usage: benches/compare/noise_scale/run.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release --quiet --example noise_scale
bin=$PWD/target/release/examples/noise_scale
out=${1:-$(mktemp -d)}
mkdir -p "$out"
common=(--nproc-per-node 2 --num-train-epochs 10 --learning-rate 0.003 --target-accuracy 0.95 --quiet)
for seed in 0 1 2 3 4; do
    "$bin" "${common[@]}" --seed "$seed" --summary-json "$out/noise-$seed.json" --log-jsonl "$out/noise-$seed.jsonl" > /dev/null
    for g in 32 128 512; do
        "$bin" "${common[@]}" --seed "$seed" --global-batch-size "$g" \
            --summary-json "$out/fixed$g-$seed.json" --log-jsonl "$out/fixed$g-$seed.jsonl" > /dev/null
    done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
out = sys.argv[1]
print("| run | reached 95 % | steps to 95 % | examples to 95 % | final accuracy | steps in 10 epochs |")
print("|---|---|---|---|---|---|")
for name, label in [("noise", "noise_scale(0.5, 16, 512)"), ("fixed32", "fixed 32"),
                    ("fixed128", "fixed 128"), ("fixed512", "fixed 512")]:
    rows = [json.load(open(f"{out}/{name}-{s}.json")) for s in range(5)]
    hit = [r for r in rows if r["reached_at_step"] is not None]
    mean = lambda xs: f"{st.mean(xs):.0f}" if xs else "–"
    acc = [r["final_test_accuracy"] for r in rows]
    print(f"| {label} | {len(hit)}/5 | {mean([r['reached_at_step'] for r in hit])} "
          f"| {mean([r['reached_after_examples'] for r in hit])} "
          f"| {st.mean(acc):.3f} ± {st.stdev(acc):.3f} | {mean([r['global_step'] for r in rows])} |")
PY
echo "logs in $out (draw one: cargo run --release -- plot $out/noise-0.jsonl $out/fixed32-0.jsonl -o runs.svg)"
