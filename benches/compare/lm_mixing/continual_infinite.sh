#!/usr/bin/env bash
# Continual pretraining on the infinite schedule (Ibrahim et al. 2024; BENCHMARKS.md,
# "Continual pretraining on the infinite schedule"): phase 1 on en + kjv for P1
# tokens (default 1,200,000) warms up to 3e-3 over 2 %, cools down by a cosine over
# 40 % of the run to a third of it (1e-3) and stays there
# (--lr-scheduler-type warmup_stable_decay --lr-stable-ratio 0.333
# --lr-cooldown-ratio 0.4 --lr-decay-ratio 0): its stable-phase model. The model
# one keeps from phase 1 is that model annealed, from 1e-3 to 0 by a cosine over
# ANNEAL tokens more (default 120,000: a tenth of phase 1): `phase1-<seed>`, the
# reference of the old domains' losses. Phase 2 starts from the stable-phase
# model, not the annealed one, on python for P2 tokens (default 200,000) at the
# stable rate, with the last 20 % decaying to 0 (warmup_stable_decay
# --lr-decay-ratio 0.2), and a replay of en + kjv at 0 or 10 % of the tokens, or
# 20 % falling to 0 (--replay-ramp 0.2,0). Phase 2 starts from the weights alone
# (a fresh AdamW), so it keeps the 2 % warm-up, to the stable rate, not above it.
# POLICIES (default "replay0 replay10 ramp20-0"; also rampA-B, e.g. ramp0-20, rising;
# boundN, e.g. bound5, and boundNeM, evaluated every M steps, e.g. bound5e5;
# boundNeMlL: the share halved once within L % of the bound, not 50 %, e.g.
# bound5e5l100; boundNeMgG: each old domain's share G % of the step at the
# bound, following its drift (--replay-gain), e.g. bound5e5g6; ...sA-F: A % for
# the first F % of the steps (--replay-start), e.g. bound5e5g6s20-10; ...fA-F: A %
# from F % of the steps on (--replay-finish), e.g. bound5e5g6s20-10f0-80;
# ...hN: the bound read on the first N validation documents of each domain every
# M steps (--mixer-eval-examples, --replay-every), e.g. bound5e10g6s20-10h100;
# defaultN: --replay-bound N/100 and nothing else (the library's rule: the
# drift's share and its integral, a start, a closing), e.g. default5, read on the
# evaluations; defaultNhM on M held-out documents a domain, e.g. default5h100;
# defaultN@FLAG=VALUE,...: with the example's flags, e.g.
# default5@replay-integral=0.03;
# the boundN... policies below are the earlier rules, without the closing;
# steps@FRACTION:SHARE,..., e.g. steps@0:0,0.5:0.25,0.8:0.05, the replay share
# from each fraction of phase 2's tokens on, and steps@SPEC/SPLIT, e.g.
# steps@0:0.09/en=2,kjv=1, split so among the old domains): the replays of phase 2.
# RATES (default "1e-3"): phase 2's rates, the first the stable rate; a lower one
# (e.g. 3e-4) decays into phase 2 from the same stable model.
#
#   bash benches/compare/lm_mixing/continual_infinite.sh [SEEDS...]   # default: 1 2 3
#
# KEEP_MODELS=1: phase 2's runs save their last model and keep it (by default
# only the phase-1 models stay).
#
# Writes OUT/phase1stable-<seed>.json, OUT/phase1-<seed>.json (the annealed
# model), OUT/{replay0,replay10,ramp20-0}-lr<rate>-<seed>.json, then continual.py's
# table (whose phase-1 losses are the annealed model's).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-target/lm-infinite}
seeds=("$@")
[[ ${#seeds[@]} -gt 0 ]] || seeds=(1 2 3)
p1=${P1:-1200000}
p2=${P2:-200000}
anneal=${ANNEAL:-120000}
rates=(${RATES:-1e-3})
# Phase 2's replays: replayN (N % fixed), ramp20-0, boundN (the least replay
# that keeps each old domain within N % of its phase-1 loss: --replay-bound).
policies=(${POLICIES:-replay0 replay10 ramp20-0})
# BUDGET=N: phase 2's steps are N tokens each (--max-tokens-per-batch N
# --packed-token-budget), not 32 documents, so that replay, whose documents are
# shorter than python's, changes neither the steps nor the tokens a step.
batch=()
[[ -n "${BUDGET:-}" ]] && batch=(--max-tokens-per-batch "$BUDGET" --packed-token-budget --lr-scaling none)
bin=${BIN:-target/release/examples/mixture_compare}
mkdir -p "$out"
[[ -n "${BIN:-}" ]] ||
    { cargo build --release -p adabatch-benches --example mixture_compare && cargo build --release --bin adabatch; }
# shellcheck source=benches/compare/lm_mixing/common.sh
source benches/compare/lm_mixing/common.sh
# Stratified: phase 1 in the domains' natural proportions, and the mixture
# example's fixed shares (--mix-weights) and ramps, which need it (its default
# mixer is online).
old=(--mixer stratified --domain en="$tok/en" --domain kjv="$tok/kjv")
new_first=(--domain python="$tok/python" "${old[@]}")
for seed in "${seeds[@]}"; do
    train "phase1stable-$seed" "${old[@]}" --seed "$seed" --max-train-tokens "$p1" \
        --lr-scheduler-type warmup_stable_decay --lr-stable-ratio 0.333 \
        --lr-cooldown-ratio 0.4 --lr-decay-ratio 0 --eval-steps 100 --save-steps 1000000
    stable="$out/run-phase1stable-$seed"
    train "phase1-$seed" "${old[@]}" --init-from "$stable" --seed "$seed" \
        --max-train-tokens "$anneal" --learning-rate 1e-3 --eval-steps 25 --save-steps 1000000
    save2=0
    [[ -n "${KEEP_MODELS:-}" ]] && save2=1000000
    for rate in "${rates[@]}"; do
        phase2=(--init-from "$stable" --seed "$seed" --max-train-tokens "$p2"
            --eval-on-start --save-steps "$save2" --learning-rate "$rate"
            --lr-scheduler-type warmup_stable_decay --lr-decay-ratio 0.2 "${batch[@]}")
        for policy in "${policies[@]}"; do
            case "$policy" in
                replay*)
                    replay=${policy#replay}
                    w=$(python3 -c "print(f'python={1 - $replay / 100},en={$replay / 200},kjv={$replay / 200}')")
                    train "$policy-lr$rate-$seed" "${new_first[@]}" --mix-weights "$w" "${phase2[@]}" \
                        --eval-steps 25
                    ;;
                ramp*-*)
                    # rampA-B: A % of the tokens replayed at the start, B % at the
                    # end, linearly (ramp20-0 falls, ramp0-20 rises).
                    ramp=${policy#ramp}
                    from=$(python3 -c "print(${ramp%-*} / 100)")
                    to=$(python3 -c "print(${ramp#*-} / 100)")
                    train "$policy-lr$rate-$seed" "${new_first[@]}" --new-domain python \
                        --replay-ramp "$from,$to" "${phase2[@]}" --eval-steps 25
                    ;;
                steps@*)
                    # steps@FRACTION:SHARE,...: the replay share in steps
                    # (--replay-steps), written as stepsF-S_F-S...
                    # steps@SPEC/SPLIT: split among the old domains by
                    # --replay-split SPLIT (e.g. en=2,kjv=1), not evenly.
                    spec=${policy#steps@}
                    split=()
                    [[ "$spec" == */* ]] && split=(--replay-split "${spec#*/}") && spec=${spec%/*}
                    name=steps$(tr ':,/=' '-_+.' <<<"${policy#steps@}")
                    train "$name-lr$rate-$seed" "${new_first[@]}" --new-domain python \
                        --replay-steps "$spec" "${split[@]}" "${phase2[@]}" --eval-steps 25
                    ;;
                default*)
                    # defaultN: --replay-bound N/100 with no other replay flag (the
                    # library's rule, start and closing), read on the evaluations
                    # (every 10 steps, the example's default with the bound) against
                    # the annealed phase-1 model's validation losses; defaultNhM:
                    # read on the first M validation documents of each old domain
                    # every 10 steps instead, against that model's losses on them.
                    bound=${policy#default}
                    # defaultN@FLAG=VALUE,...: the default with the example's flags
                    # given, e.g. default5@replay-integral=0.03,replay-close-cap=0.
                    extra=()
                    if [[ "$bound" == *@* ]]; then
                        IFS=, read -ra given <<<"${bound#*@}"
                        for flag in "${given[@]}"; do extra+=("--${flag%%=*}" "${flag#*=}"); done
                        bound=${bound%%@*}
                    fi
                    reads=(--replay-reference "$(python3 -c "import json,sys; f=json.load(open(sys.argv[1]))['final']; print(','.join(f'{d}={f[d]}' for d in ('en', 'kjv')))" "$out/phase1-$seed.json")")
                    if [[ "$bound" == *h* ]]; then
                        reads=(--mixer-eval-examples "${bound#*h}" --replay-reference-model "$out/run-phase1-$seed" --eval-steps 25)
                        bound=${bound%%h*}
                    fi
                    train "$policy-lr$rate-$seed" "${new_first[@]}" --new-domain python \
                        --replay-bound "$(python3 -c "print($bound / 100)")" "${reads[@]}" "${extra[@]}" \
                        "${phase2[@]}"
                    ;;
                bound*)
                    # The least replay that keeps en and kjv within BOUND % of the
                    # annealed phase-1 model's losses, read at every evaluation
                    # (boundNeM: every M steps instead of 25).
                    reference=$(python3 -c "import json,sys; f=json.load(open(sys.argv[1]))['final']; print(','.join(f'{d}={f[d]}' for d in ('en', 'kjv')))" "$out/phase1-$seed.json")
                    bound=${policy#bound}
                    # The rule's flags, read from the end of the name: ...fA-F
                    # (--replay-finish), ...sA-F (--replay-start), ...gG
                    # (--replay-gain: the follow rule); without a gain, the doubling.
                    rule=()
                    # ...hN: read the first N validation documents of each domain
                    # (--mixer-eval-examples) every M steps of boundNeM, not the
                    # evaluations (which then come every 25 steps, as the fixed
                    # replays'), against the annealed phase-1 model's losses on them.
                    held=()
                    if [[ "$bound" == *h* ]]; then
                        held=(--mixer-eval-examples "${bound#*h}" --replay-reference-model "$out/run-phase1-$seed")
                        bound=${bound%%h*}
                    fi
                    [[ "$bound" == *f* ]] && rule+=(--replay-finish "$(python3 -c "a, f = '${bound#*f}'.split('-'); print(f'{int(a) / 100}:{int(f) / 100}')")") && bound=${bound%%f*}
                    [[ "$bound" == *s* ]] && rule+=(--replay-start "$(python3 -c "a, f = '${bound#*s}'.split('-'); print(f'{int(a) / 100}:{int(f) / 100}')")") && bound=${bound%%s*}
                    [[ "$bound" == *g* ]] && rule+=(--replay-gain "$(python3 -c "print(${bound#*g} / 100)")") && bound=${bound%%g*}
                    lower=50
                    [[ "$bound" == *l* ]] && lower=${bound#*l} && bound=${bound%%l*}
                    # The example's follow rule starts with 20 % for a tenth of the
                    # steps unless told: a name without ...sA-F means no start.
                    if [[ "${rule[*]}" == *--replay-gain* ]]; then
                        rule+=(--replay-rule follow --replay-close-cap 0)
                        [[ "${rule[*]}" == *--replay-start* ]] || rule+=(--replay-start 0:0)
                    else
                        rule+=(--replay-rule doubling --replay-close-cap 0 --replay-lower-at "$(python3 -c "print($lower / 100)")")
                    fi
                    every=25
                    [[ "$bound" == *e* ]] && every=${bound#*e} && bound=${bound%%e*}
                    reads=(--replay-reference "$reference" --eval-steps "$every")
                    [[ ${#held[@]} -gt 0 ]] && reads=("${held[@]}" --replay-every "$every" --eval-steps 25)
                    train "$policy-lr$rate-$seed" "${new_first[@]}" --new-domain python \
                        --replay-bound "$(python3 -c "print($bound / 100)")" \
                        "${rule[@]}" "${reads[@]}" "${phase2[@]}"
                    ;;
                *) echo "unknown policy $policy" >&2; exit 2 ;;
            esac
        done
    done
    # The annealed phase-1 model stays: the ...hN policies read their reference from it.
    # Phase 2's models go unless KEEP_MODELS=1 (then each run saves its last model).
    [[ -n "${KEEP_MODELS:-}" ]] ||
        find "$out"/run-{replay,ramp}*"$seed" -name '*.safetensors' -delete 2>/dev/null || true
done
python3 benches/compare/lm_mixing/continual.py "$out"
