#!/usr/bin/env bash
# The language-model example against transformers on the same packed batches: the
# corpus tokenized (`adabatch tokenize`, the example's defaults), a seeded
# LlamaForCausalLM of the example's shape saved as the initial weights, STEPS steps
# of examples/language_model.rs from them (its default token ramp, --log-indices),
# then torch_packed.py replays the logged steps in transformers (eager attention, a
# block-diagonal 4-D mask) and prints the losses side by side and tokens/s.
# Usage: benches/compare/language_model/run.sh [STEPS [DEVICE]]   (DEVICE: cpu, cuda)
# Threads: adabatch's 2 ranks and torch's intra-op threads both take every core.
set -euo pipefail
cd "$(dirname "$0")/../../.."
steps=${1:-50}
device=${2:-cpu}
venv=${ADABATCH_TORCH_VENV:-$HOME/.cache/adabatch/torch-venv}
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, safetensors, transformers" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch safetensors transformers
fi
dir=${LM_COMPARE_DIR:-$(mktemp -d)}
features=()
[[ "$device" == cuda ]] && features=(--features cuda)
cargo build --release --quiet "${features[@]}" --example language_model --bin adabatch
target=${CARGO_TARGET_DIR:-target}
"$target/release/adabatch" tokenize data/en_sentences_15k.txt.gz -o "$dir/tokens"
"$venv/bin/python" benches/compare/language_model/torch_packed.py init "$dir"
"$target/release/examples/language_model" --nproc-per-node 2 --device "$device" --schedule ramp \
    --tokens-dir "$dir/tokens" --init-from "$dir/init" --max-steps "$steps" \
    --logging-steps 1 --log-jsonl "$dir/run.jsonl" --log-indices --quiet \
    --eval-strategy no --save-steps 0 --samples 0 --report-to none \
    --output-dir "$dir/out" --plot "$dir/loss.svg" --summary-json "$dir/summary.json"
"$venv/bin/python" benches/compare/language_model/torch_packed.py replay "$dir" "$device"
