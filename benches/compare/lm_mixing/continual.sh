#!/usr/bin/env bash
# Continual pretraining with a phase 1 long enough that the old domains are near
# convergence (BENCHMARKS.md, "Continual pretraining: a longer phase 1"): for each
# seed, phase 1 on en + kjv for P1 tokens (default 1,200,000: about two passes over
# the English sentences), then phase 2 from its weights on python for P2 tokens
# (default 200,000) at each phase-2 peak rate of RATES (default "1e-3 3e-4": a
# third and a tenth of phase 1's 3e-3, re-warmed over 2 % of the tokens and
# re-decayed by the cosine over phase 2) with a replay of en + kjv at 0 and 10 %
# of the tokens (halves each), and with the online mixer over all three whose
# old domains are capped at 10 % of each step (--new-domain python
# --replay-budget 0.1), and with a replay of 10 % in all that rises from 0 to
# 20 % of the tokens over phase 2, or falls from 20 to 0 (--replay-ramp). The
# same driver, tokens and settings as run.sh.
#
#   bash benches/compare/lm_mixing/continual.sh [SEEDS...]     # default: 1 2 3
#
# Writes OUT/phase1-<seed>.json, OUT/replay<P>-lr<rate>-<seed>.json and
# OUT/online-budget10-lr<rate>-<seed>.json, then the table (continual.py).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-target/lm-continual}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3)
p1=${P1:-1200000}
p2=${P2:-200000}
rates=(${RATES:-1e-3 3e-4})
bin=${BIN:-target/release/examples/mixture_compare}
mkdir -p "$out"
[[ -n "${BIN:-}" ]] ||
    { cargo build --release -p adabatch-benches --example mixture_compare && cargo build --release --bin adabatch; }
# shellcheck source=benches/compare/lm_mixing/common.sh
source benches/compare/lm_mixing/common.sh
new_first=(--domain python="$tok/python" --domain en="$tok/en" --domain kjv="$tok/kjv")
for seed in "${seeds[@]}"; do
    train "phase1-$seed" --mixer stratified --domain en="$tok/en" --domain kjv="$tok/kjv" --seed "$seed" \
        --max-train-tokens "$p1" --eval-steps 100 --save-steps 1000000
    for rate in "${rates[@]}"; do
        for replay in 0 10; do
            w=$(python3 -c "print(f'python={1 - $replay / 100},en={$replay / 200},kjv={$replay / 200}')")
            train "replay$replay-lr$rate-$seed" "${new_first[@]}" \
                --init-from "$out/run-phase1-$seed" --mixer stratified --mix-weights "$w" --seed "$seed" \
                --max-train-tokens "$p2" --eval-steps 25 --eval-on-start --save-steps 0 \
                --learning-rate "$rate"
        done
        train "online-budget10-lr$rate-$seed" "${new_first[@]}" \
            --init-from "$out/run-phase1-$seed" --mixer online --new-domain python \
            --replay-budget 0.1 --seed "$seed" --max-train-tokens "$p2" --eval-steps 25 \
            --eval-on-start --save-steps 0 --learning-rate "$rate"
        # The same 10 % in all, most of it late (0 % of the tokens at the start
        # rising to 20 % at the end), or most of it early (20 % falling to 0):
        # --replay-ramp, adabatch::CurriculumMixer.
        # And all of it in the first half: 40 % falling to 0 at half way
        # (--replay-ramp 0.4,0,0.5).
        for ramp in 0,0.2:ramp0-20 0.2,0:ramp20-0 0.4,0,0.5:ramp40-0-half; do
            train "${ramp#*:}-lr$rate-$seed" "${new_first[@]}" \
                --init-from "$out/run-phase1-$seed" --mixer stratified --new-domain python --replay-ramp "${ramp%:*}" \
                --seed "$seed" --max-train-tokens "$p2" --eval-steps 25 --eval-on-start \
                --save-steps 0 --learning-rate "$rate"
        done
    done
    # Only the final weights of phase 1 are needed (by the runs above).
    find "$out"/run-{replay,online}*"-$seed" -name '*.safetensors' -delete 2>/dev/null || true
done
python3 benches/compare/lm_mixing/continual.py "$out"
