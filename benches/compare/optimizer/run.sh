#!/usr/bin/env bash
# The engine-overhead MLP's epoch: adabatch's engine with candle's AdamW and with
# adabatch's fused AdamW (benches/engine_overhead.rs), and PyTorch with
# torch.optim.AdamW on the same data, weights and batches (torch_adamw.py), one CPU
# thread each. The adabatch rounds run twice: with the engine's default heap (freed
# memory kept for the next step) and with --release-freed-memory. Installs PyTorch
# into a virtual environment under the cache (its PyPI wheel brings its CUDA
# libraries: about 5 GB on disk).
# Usage: benches/compare/optimizer/run.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds=${1:-7}
venv=${ADABATCH_TORCH_VENV:-$HOME/.cache/adabatch/torch-venv}
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, safetensors" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet torch safetensors
fi
cargo build --release --quiet -p adabatch-benches --bench engine_overhead
bench=$(ls -t target/release/deps/engine_overhead-* | grep -v '\.d$' | head -n 1)
export_dir=$(mktemp -d)
ENGINE_OVERHEAD_EXPORT="$export_dir" "$bench" --bench
# One process per batch size and heap: glibc's default heap adapts to what ran
# before in the process.
for b in 64 8; do
    echo "== adabatch, batch $b, keeping freed memory (the engine's default)"
    ENGINE_OVERHEAD_BATCH_SIZE=$b RAYON_NUM_THREADS=1 ENGINE_OVERHEAD_OPTIMIZER="$rounds" "$bench" --bench
    echo "== adabatch, batch $b, --release-freed-memory (glibc's default heap)"
    ENGINE_OVERHEAD_RELEASE_FREED=1 ENGINE_OVERHEAD_BATCH_SIZE=$b RAYON_NUM_THREADS=1 ENGINE_OVERHEAD_OPTIMIZER="$rounds" "$bench" --bench
done
echo "== PyTorch"
"$venv/bin/python" benches/compare/optimizer/torch_adamw.py "$export_dir" "$rounds"
