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
python3 - "$out" "$target" <<'PY'
import json, sys, glob, statistics as st
out, target = sys.argv[1], float(sys.argv[2])
rows = {}
for path in sorted(glob.glob(f"{out}/*.json")):
    policy, seed = path.rsplit("/", 1)[1][:-5].rsplit("-", 1)
    r = json.load(open(path))
    hit = next((e for e in r["evaluations"] if e["eval_loss"] <= target), None)
    rows.setdefault(policy, []).append((hit["step"] if hit else None, hit["tokens"] if hit else None, r["final_eval_loss"], r["steps"], r["tokens_per_second"]))
print(f"target validation loss {target} nats; unigram baseline {r['unigram_loss']:.3f}")
print("| policy | seeds | steps to target | tokens to target | final val loss | steps | tokens/s |")
print("|---|---:|---:|---:|---:|---:|---:|")
fmt = lambda v, f: "n/a" if v is None else format(v, f)
for policy in ["small", "large", "ramp", "noise"]:
    rs = rows.get(policy, [])
    if not rs:
        continue
    mean = lambda i: None if any(x[i] is None for x in rs) else st.mean(x[i] for x in rs)
    sd = lambda i: 0.0 if len(rs) < 2 or any(x[i] is None for x in rs) else st.stdev(x[i] for x in rs)
    print(f"| {policy} | {len(rs)} | {fmt(mean(0), '.0f')} ± {sd(0):.0f} | {fmt(mean(1), '.3g')} | {fmt(mean(2), '.3f')} ± {sd(2):.3f} | {fmt(mean(3), '.0f')} | {fmt(mean(4), '.0f')} |")
PY
