"""The adaptation table from run.sh's summaries: OUT/<policy>-<seed>.json.

    python3 table.py OUT [TARGET_LOSS]

Steps and tokens to the target validation loss are interpolated linearly between
the two evaluations around the first crossing ("n/a" for a run that never reaches
it: the mean is then over the runs that did, and the reached column says how many).
"""

import glob
import json
import statistics as st
import sys

out = sys.argv[1]
target = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0


def crossing(evals):
    prev = None
    for e in evals:
        if e["eval_loss"] <= target:
            if prev is None:
                return e["step"], e["tokens"]
            f = (prev["eval_loss"] - target) / (prev["eval_loss"] - e["eval_loss"])
            return (prev["step"] + f * (e["step"] - prev["step"]), prev["tokens"] + f * (e["tokens"] - prev["tokens"]))
        prev = e
    return None


rows, unigram = {}, None
for path in sorted(glob.glob(f"{out}/*.json")):
    policy, seed = path.rsplit("/", 1)[1][:-5].rsplit("-", 1)
    r = json.load(open(path))
    unigram = r["unigram_loss"]
    rows.setdefault(policy, []).append((crossing(r["evaluations"]), r["final_eval_loss"], r["steps"], r["tokens_per_second"]))


def mean_sd(values, fmt):
    if not values:
        return "n/a"
    sd = st.stdev(values) if len(values) > 1 else 0.0
    return f"{format(st.mean(values), fmt)} ± {format(sd, fmt)}"


print(f"target validation loss {target} nats (perplexity {2.718281828 ** target:.0f}); unigram baseline {unigram:.3f}")
print("| policy | runs reaching the target | steps to target | tokens to target (thousands) | final validation loss | optimizer steps | tokens/s |")
print("|---|---:|---:|---:|---:|---:|---:|")
for policy in ["small", "large", "ramp", "noise"]:
    rs = rows.get(policy, [])
    if not rs:
        continue
    hits = [c for c, *_ in rs if c]
    print(
        f"| {policy} | {len(hits)}/{len(rs)} | {mean_sd([h[0] for h in hits], '.0f')} | "
        f"{mean_sd([h[1] / 1e3 for h in hits], '.0f')} | {mean_sd([r[1] for r in rs], '.3f')} | "
        f"{mean_sd([r[2] for r in rs], '.0f')} | {mean_sd([r[3] for r in rs], '.0f')} |"
    )
