#!/usr/bin/env bash
# adabatch's Llama (adabatch::models::llama) against transformers' LlamaForCausalLM
# (eager attention, float32) on one CPU thread each: the same initial weights,
# byte-token batches of the shared English corpus and AdamW hyper-parameters.
# benches/llama_compare.rs exports the inputs, trains 50 steps through adabatch's
# engine and times a plain training step; torch_llama.py checks the initial logits
# (1e-5) and the 50 per-step losses (1e-4 relative), times the same step, and
# prints the table. Installs torch, safetensors and transformers into a virtual
# environment under the cache if it is not there (torch's wheel brings its CUDA
# libraries: several GB on disk).
# Usage: benches/compare/llama/run.sh [TIMED_STEPS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
timed=${1:-30}
venv=${ADABATCH_TORCH_VENV:-$HOME/.cache/adabatch/torch-venv}
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, safetensors, transformers" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch safetensors transformers
fi
export_dir=$(mktemp -d)
trap 'rm -rf "$export_dir"' EXIT
cargo build --release --quiet -p adabatch-benches --bench llama_compare
bench=$(ls -t "${CARGO_TARGET_DIR:-target}"/release/deps/llama_compare-* | grep -v '\.d$' | head -n 1)
echo "== adabatch (RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1)"
LLAMA_COMPARE_EXPORT="$export_dir" LLAMA_COMPARE_TIMED="$timed" \
    RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1 "$bench" --bench
echo "== PyTorch (torch.set_num_threads(1))"
OMP_NUM_THREADS=1 "$venv/bin/python" benches/compare/llama/torch_llama.py "$export_dir" "$timed"
