#!/usr/bin/env bash
# The fused CUDA kernels' speed (adabatch-nn; scripts/gpu-session.sh's `speed`
# step): the classifier bench against PyTorch, and the 1.3 M and 28 M decoders
# against transformers on the same packed batches (240 steps of 64 documents,
# torch_packed.py replay), with the kernels off and on, and --bf16 with them on;
# the 1.3 M decoder's run with the kernels on twice, whose logs must be
# bit-identical (losses, gradient norms, batches). A warm-up run first, so that
# candle's PTX compiling is not timed.
#
#   B=/tmp/adabatch L=/tmp/lm D=corpus.txt PY=python3 bash benches/compare/gpu_speed.sh
#
# B holds gpu_check and language_model, L/tokens the language model's tokens, D the
# classifier's corpus. Prints one line per run and the transformers comparisons.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${B:?} ${L:?} ${D:?} ${PY:?}"
steps=${STEPS:-240}

"$B/language_model" --device cuda --tokens-dir "$L/tokens" --output-dir "$L/warm" --max-steps 5 \
    --eval-strategy no --save-steps 0 --samples 0 --report-to none --quiet >/dev/null

for k in 0 1; do
    echo "classifier, kernels=$k: $(ADABATCH_CUDA_KERNELS=$k "$B/gpu_check" bench --data "$D" \
        --plan-out "/tmp/plan-$k.json" | tail -n 1)"
done
"$PY" benches/compare/torch_transformer.py --data "$D" --plan /tmp/plan-1.json | tail -n 2

for model in small:128,384,4,4,2 large:512,1536,8,8,4; do
    name=${model%%:*}
    shape=${model#*:}
    dir="$L/speed-$name"
    mkdir -p "$dir"
    ln -sfn "$L/tokens" "$dir/tokens"
    IFS=, read -r hidden intermediate layers heads kv <<<"$shape"
    flags=(--hidden-size "$hidden" --intermediate-size "$intermediate" --num-hidden-layers "$layers"
        --num-attention-heads "$heads" --num-key-value-heads "$kv")
    LM_SHAPE=$shape "$PY" benches/compare/language_model/torch_packed.py init "$dir"
    runs="off:0: on:1: bf16:1:--bf16"
    [[ $name == small ]] && runs="$runs again:1:"
    for run in $runs; do
        IFS=: read -r label k extra <<<"$run"
        ADABATCH_CUDA_KERNELS=$k "$B/language_model" --device cuda --tokens-dir "$L/tokens" \
            "${flags[@]}" --init-from "$dir/init" --global-batch-size 64 --max-steps "$steps" \
            --logging-steps 1 --log-jsonl "$dir/run-$label.jsonl" --log-indices --eval-strategy no \
            --save-steps 0 --samples 0 --report-to none --quiet --output-dir "$dir/out-$label" \
            --summary-json "$dir/summary-$label.json" ${extra:+"$extra"} >/dev/null
        echo "$name $label: $("$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); print("train_runtime", s["train_runtime"])' "$dir/summary-$label.json")"
    done
    if [[ -f "$dir/run-again.jsonl" ]]; then
        # The same run twice: every field but the throughput must match.
        strip() { sed -E 's/"(examples_per_s|train_seconds)":[^,}]*//g' "$1"; }
        if cmp -s <(strip "$dir/run-on.jsonl") <(strip "$dir/run-again.jsonl"); then
            echo "$name: two runs with the kernels on are bit-identical ($(wc -l <"$dir/run-on.jsonl") steps)"
        else
            echo "$name: two runs with the kernels on DIFFER"
            diff <(strip "$dir/run-on.jsonl") <(strip "$dir/run-again.jsonl") | head -n 4
        fi
    fi
    # transformers on the batches of the run with the kernels on (f32).
    cp "$dir/run-on.jsonl" "$dir/run.jsonl"
    cp "$dir/summary-on.json" "$dir/summary.json"
    "$PY" benches/compare/language_model/torch_packed.py replay "$dir" cuda | tail -n 2
done
