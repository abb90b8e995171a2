#!/usr/bin/env bash
# The noise scale's per-step cost at a fixed batch, one CPU rank: 200 steps of
# examples/language_model.rs at a global batch of 8 documents without measuring
# (fixed), measuring on the automatic cadence (default), and measuring every step
# (every1: each step split in two, what the example's default did before the
# cadence); three interleaved rounds; ms per step from each run's train_runtime.
#
#   bash benches/compare/noise_cadence/per_step.sh BIN TOKENS_DIR OUT
#
# BIN: a built language_model (target/release/examples/language_model); TOKENS_DIR:
# a token directory it prepared (its --tokens-dir).
set -euo pipefail
bin=$1; tok=$2; out=$3
mkdir -p $out
common="--tokens-dir $tok --max-steps 200 --eval-strategy no --save-steps 0 --samples 0 --report-to none --quiet --logging-steps 50"
for round in 1 2 3; do
  for v in fixed default every1; do
    case $v in
      fixed) flags="--global-batch-size 8";;
      default) flags="--global-batch-size 8 --log-gradient-noise-scale";;
      every1) flags="--global-batch-size 8 --log-gradient-noise-scale --noise-scale-every 1";;
    esac
    $bin $common $flags --output-dir $out/run --summary-json $out/$v-$round.json --log-jsonl $out/$v-$round.jsonl > /dev/null 2>&1
  done
done
python3 - "$out" <<'PY'
import json, sys, statistics as st
out = sys.argv[1]
t = {}
for v in ["fixed", "default", "every1"]:
    rs = [json.load(open(f"{out}/{v}-{r}.json")) for r in (1, 2, 3)]
    t[v] = [r["train_runtime"] / r["steps"] * 1000 for r in rs]
    batches = set()
    for r in (1, 2, 3):
        for line in open(f"{out}/{v}-{r}.jsonl"):
            e = json.loads(line)
            if "global_batch" in e:
                batches.add(e["global_batch"])
    print(f"{v}: ms/step {[round(x, 1) for x in t[v]]} mean {st.mean(t[v]):.1f}; global batches logged {sorted(batches)}")
for v in ["default", "every1"]:
    print(f"{v} / fixed: {st.mean(t[v]) / st.mean(t['fixed']):.3f}")
PY
