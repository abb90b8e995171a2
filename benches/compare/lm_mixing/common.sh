# Sourced by run.sh and continual.sh: the three domains' tokens and one run of the
# mixture example's driver (driver.rs). Needs `out` (the results folder) and `bin`
# (the driver, target/release/examples/mixture_compare);
# defines `tok` (TOKENS_DIR, default OUT/tokens) and `train NAME FLAGS...`, which
# writes OUT/NAME.{json,jsonl,log,svg} and skips a run whose summary exists.
tok=${TOKENS_DIR:-$out/tokens}
if [[ ! -s "$tok/domains.json" ]]; then
    target/release/adabatch tokenize --output "$tok" --validation-fraction 0.02 \
        --domain en=data/en_sentences_15k.txt.gz --domain kjv=data/kjv_verses.txt.gz \
        --domain python=data/python_functions.jsonl.gz
fi
common=(--nproc-per-node 2 --quiet --report-to none --logging-steps 1
    --per-device-eval-batch-size 64)

train() { # NAME FLAGS...
    local name=$1
    shift
    [[ -s "$out/$name.json" ]] && return 0
    "$bin" "${common[@]}" --log-jsonl "$out/$name.jsonl" --plot "$out/$name.svg" \
        --output-dir "$out/run-$name" --summary-json "$out/$name.json" "$@" \
        >"$out/$name.log" 2>&1
    echo "done $name: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['steps'], 'steps, mean', round(r['mean'], 4), 'worst', round(r['worst'], 4), {k: round(v, 4) for k, v in r['final'].items()})" "$out/$name.json")"
}
