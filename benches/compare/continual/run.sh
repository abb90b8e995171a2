#!/usr/bin/env bash
# Continual learning on the digits (examples/continual_replay.rs): task A (0-4), then
# task B (5-9) with and without a replay memory; 5 seeds; SGD 0.1, global batch 32,
# 20 epochs per task. Prints the table in BENCHMARKS.md, and checks that 2 ranks
# give the same per-source batches and losses as 1.
# Usage: benches/compare/continual/run.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../../.."
cargo build --release --quiet --example continual_replay
bin=$PWD/target/release/examples/continual_replay
out=${1:-$(mktemp -d)}
mkdir -p "$out"
runs=("none:0:0:fixed" "fixed25-50:50:0.25:fixed" "fixed50-50:50:0.5:fixed" "fixed25-200:200:0.25:fixed" "online-50:50:0:online")
for seed in 0 1 2 3 4; do
    for run in "${runs[@]}"; do
        IFS=: read -r name memory fraction mix <<< "$run"
        "$bin" --quiet --seed "$seed" --replay-memory "$memory" --replay-fraction "$fraction" \
            --mix "$mix" --summary-json "$out/$name-$seed.json" > /dev/null
    done
done
"$bin" --quiet --seed 0 --replay-memory 50 --log-jsonl "$out/one.jsonl" > /dev/null
"$bin" --quiet --seed 0 --replay-memory 50 --nproc-per-node 2 --log-jsonl "$out/two.jsonl" > /dev/null
python3 - "$out" <<'PY'
import json, statistics as st, sys
out = sys.argv[1]
print("| phase 2 | replay memory | replay share | task A accuracy | task B accuracy | replay examples used |")
print("|---|---|---|---|---|---|")
for name, label, memory, share in [("none", "no replay", 0, "–"), ("fixed25-50", "fixed", 50, "25 %"),
                                   ("fixed50-50", "fixed", 50, "50 %"), ("fixed25-200", "fixed", 200, "25 %"),
                                   ("online-50", "online", 50, "from the losses")]:
    rows = [json.load(open(f"{out}/{name}-{s}.json")) for s in range(5)]
    a = [r["task_a_accuracy"] for r in rows]
    b = [r["task_b_accuracy"] for r in rows]
    used = st.mean(r["replay_examples_used"] for r in rows)
    print(f"| {label} | {memory} | {share} | {st.mean(a):.3f} ± {st.stdev(a):.3f} | {st.mean(b):.3f} ± {st.stdev(b):.3f} | {used:.0f} |")
rows = lambda f: [json.loads(l) for l in open(f) if '"event"' not in l]
one, two = rows(f"{out}/one.jsonl"), rows(f"{out}/two.jsonl")
assert len(one) == len(two)
same = all(x["source_indices"] == y["source_indices"] for x, y in zip(one, two))
diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(one, two))
print(f"\n2 ranks vs 1: same per-source batches on all {len(one)} steps: {same}; largest loss difference {diff:.2e}")
PY
