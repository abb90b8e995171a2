#!/usr/bin/env bash
# One lent GPU session's checks, in priority order, each under its own time limit, so
# that a failure or a hang costs one step and not the device time of the rest.
#
#   scripts/gpu-session.sh CARRY OUT [STEP...]
#
# CARRY holds what scripts/build-gpu-check.sh packed (gpu_check.xz, gpu-tests.xz,
# language_model.xz), the benchmark corpus (corpus.txt) and the language model's
# tokens (lm-tokens/). Every step's output goes to OUT/<step>.log and a line per step
# (name, exit status, seconds) to OUT/steps.tsv. With STEP names, only those run.
# Runs on the GPU machine, from the repository root (docs/guide/gpu.md).
set -uo pipefail

carry="$(cd "$1" && pwd)"
out="$2"
shift 2
mkdir -p "$out"
wanted=" $* "

PY=/opt/torch/.venv/bin/python
SP=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
B=/tmp/adabatch
mkdir -p $B
# Only the binaries carried (a session may carry only what its steps need).
for bin in gpu_check gpu-tests language_model; do
    [[ -x $B/$bin || ! -f "$carry/$bin.xz" ]] || { xz -dc "$carry/$bin.xz" >$B/$bin && chmod +x $B/$bin; }
done
ln -sf "$SP/nvidia/nccl/lib/libnccl.so.2" $B/libnccl.so
# Appended, so the driver's libcuda.so.1 stays reachable.
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:$SP/nvidia/nccl/lib:$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
D="$carry/corpus.txt"
L=/tmp/lm
mkdir -p $L
# Without carried tokens the first language-model run prepares them from the
# example's default corpus (its BPE trains in seconds on the GPU machine's cores).
[[ -d $L/tokens || ! -d "$carry/lm-tokens" ]] || cp -r "$carry/lm-tokens" $L/tokens

# step NAME SECONDS COMMAND...: runs COMMAND under a time limit when NAME is wanted.
step() {
    local name="$1" limit="$2"
    shift 2
    [[ "$wanted" == "  " || "$wanted" == *" $name "* ]] || return 0
    local start=$SECONDS
    echo "== $name (limit ${limit}s): $*"
    timeout -k 5 "$limit" bash -c "$*" >"$out/$name.log" 2>&1
    local rc=$?
    printf '%s\t%s\t%ss\n' "$name" "$rc" "$((SECONDS - start))" | tee -a "$out/steps.tsv"
    tail -n 25 "$out/$name.log"
}

step env 60 "nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv; \
    echo LD_LIBRARY_PATH=\$LD_LIBRARY_PATH; \
    $PY -m pip show nvidia-nccl-cu13 nvidia-cublas nvidia-cuda-runtime 2>/dev/null | grep -E '^(Name|Version)'; \
    ldd $B/gpu_check | grep -E 'not found|cuda|cublas|curand|nccl|nvrtc'"
step torch-nccl 90 "$PY -c '
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR=\"127.0.0.1\", MASTER_PORT=\"29533\")
dist.init_process_group(\"nccl\", rank=0, world_size=1)
x = torch.ones(4, device=\"cuda\"); dist.all_reduce(x); print(\"torch nccl all_reduce\", x.tolist())
dist.destroy_process_group()'"
# The kernels first: what a session with a GPU must check before anything else.
step kernels 120 "$B/gpu_check kernels"
step replay 120 "$B/gpu_check replay"
step nccl 120 "NCCL_DEBUG=WARN $B/gpu_check nccl"
step memory 120 "$B/gpu_check memory --data $D"
step oom 120 "$B/gpu_check oom --data $D"
step lm-cuda 180 "$B/language_model --device cuda --tokens-dir $L/tokens --output-dir $L/run \
    --max-steps 30 --logging-steps 1 --seed 5 --log-jsonl $L/cuda.jsonl --eval-strategy no \
    --save-steps 0 --samples 0 --report-to none --quiet; cp $L/cuda.jsonl $out/lm-cuda.jsonl"
step lm-torch 240 "$PY benches/compare/language_model/torch_packed.py init $L && \
    $B/language_model --device cuda --schedule ramp --tokens-dir $L/tokens --init-from $L/init \
    --max-steps 60 --logging-steps 1 --log-jsonl $L/run.jsonl --log-indices --quiet \
    --eval-strategy no --save-steps 0 --samples 0 --report-to none --output-dir $L/out \
    --summary-json $L/summary.json && $PY benches/compare/language_model/torch_packed.py replay $L cuda"
step bench 180 "$B/gpu_check bench --data $D --plan-out /tmp/plan.json && \
    $PY benches/compare/torch_transformer.py --data $D --plan /tmp/plan.json"
step gpu-tests 240 "$B/gpu-tests --include-ignored --test-threads 1"
step bench-bf16 120 "$B/gpu_check bench --data $D --bf16"
step breakdown 120 "$B/gpu_check breakdown --data $D"
step batching 180 "$B/gpu_check batching --data $D"
step bench-tf32 180 "$B/gpu_check bench --data $D --tf32 --plan-out /tmp/plan.json && \
    $PY benches/compare/torch_transformer.py --data $D --plan /tmp/plan.json --tf32 && \
    $PY benches/compare/torch_transformer.py --data $D --plan /tmp/plan.json --sdpa --tf32"
step lm-goodput 180 "$B/language_model --device cuda --schedule goodput --tokens-dir $L/tokens \
    --output-dir $L/goodput --logging-steps 1 --log-jsonl $L/goodput.jsonl --save-steps 0 \
    --samples 0 --report-to none --summary-json $L/goodput-summary.json --quiet; \
    cp $L/goodput.jsonl $L/goodput-summary.json $out/"
step lm-fixed 180 "for b in 8 32 128 512; do $B/language_model --device cuda --global-batch-size \$b \
    --max-steps 40 --tokens-dir $L/tokens --output-dir $L/fixed-\$b --eval-strategy no --save-steps 0 \
    --samples 0 --report-to none --quiet --summary-json $L/fixed-\$b.json && cat $L/fixed-\$b.json; echo; done"
step lm-epoch 240 "for b in 16 32 64 128; do $B/language_model --device cuda --global-batch-size \$b \
    --tokens-dir $L/tokens --output-dir $L/epoch-\$b --save-steps 0 --samples 0 --report-to none \
    --quiet --summary-json $L/epoch-\$b.json > /dev/null && cp $L/epoch-\$b.json $out/; done"
# The default (noise scale on its modeled cadence) twice on CUDA: the logs must be
# bit-identical but for the throughput (the reproducible default's issue).
step repro 180 "for r in a b; do $B/language_model --device cuda --tokens-dir $L/tokens --output-dir $L/repro-\$r \
    --max-steps 200 --logging-steps 1 --seed 3 --log-jsonl $L/repro-\$r.jsonl --eval-strategy no --save-steps 0 \
    --samples 0 --report-to none --quiet || exit 1; done; \
    strip() { sed -E 's/\"(examples_per_s|train_seconds)\":[^,}]*//g' \$1; }; \
    if cmp -s <(strip $L/repro-a.jsonl) <(strip $L/repro-b.jsonl); then echo 'two CUDA runs of the default: bit-identical'; \
    else echo 'two CUDA runs of the default DIFFER'; diff <(strip $L/repro-a.jsonl) <(strip $L/repro-b.jsonl) | head -n 4; exit 1; fi; \
    grep -c '\"micro_batches\":2' $L/repro-a.jsonl"
# Speed of the fused CUDA kernels (adabatch-nn, benches/compare/gpu_speed.sh): the
# classifier against PyTorch, the 1.3 M and 28 M decoders against transformers,
# kernels off and on, bf16 with them on, after a warm-up.
step speed ${SPEED_LIMIT:-330} "B=$B L=$L D=$D PY=$PY bash benches/compare/gpu_speed.sh"
# The frontier in seconds (benches/compare/lm_frontier/gpu.sh): one epoch of the
# carried tokens' corpus, the 1.3 M and 28 M decoders, fixed batches of 16 to 128
# against the default and goodput, FRONTIER_SEEDS (default 1 2), each run alone on
# the card after a warm-up; the runs' files come back as one archive.
step frontier ${FRONTIER_LIMIT:-480} "BIN=$B/language_model TOKENS=$L/tokens OUT=/tmp/frontier LIMIT=120 \
    bash benches/compare/lm_frontier/gpu.sh ${FRONTIER_SEEDS:-1 2}; \
    tar -C /tmp --exclude run --exclude warm-up -czf $out/frontier.tar.gz frontier"
exit 0
