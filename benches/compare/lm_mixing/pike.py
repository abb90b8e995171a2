"""PiKE's tables (pike.sh): for each folder, every mixer's validation losses
(mean of the domains, worst domain, and the pooled held-out documents, the
validation set read as one mix), seed by seed against uniform and the online
mixer, the seeds PiKE's defaults were chosen on marked; then what measuring
cost: each PiKE run's measuring steps, their seconds beyond a plain step's
(from the run's own log), as a share of the run's training seconds.

    python3 benches/compare/lm_mixing/pike.py target/lm-pike3 target/lm-pike4
"""
import json
import re
import statistics
import sys
from pathlib import Path

# The seeds a default was chosen on, by the folder's domains (lm-pike3*: three,
# lm-pike4*: four): ζ, the floor and the smoothing on seeds 1 and 2 of three;
# the variance's log-space average after seed 1 of four had starved English.
TUNED = {"lm-pike3": {1, 2}, "lm-pike4": {1}}
MIXERS = ["uniform", "online", "pike", "pike-fair"]


def load(out, name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def pm(values):
    if not values:
        return "–"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f}"


def seeds(out, m):
    return sorted(int(f.stem.rsplit("-", 1)[1]) for f in out.glob(f"{m}-[0-9].json"))


def figures(r):
    return {"mean": r["mean"], "worst": r["worst"], "pooled": r["eval_loss"]}


def tables(out):
    tuned = TUNED.get(out.name[: len("lm-pike3")], set())
    runs = {m: {k: load(out, f"{m}-{k}") for k in seeds(out, m)} for m in MIXERS}
    print(f"\n## {out}\n")
    print("| mixer | seeds | mean | worst | pooled held-out |")
    print("|---|---:|---|---|---|")
    for m, rs in runs.items():
        if rs:
            f = [figures(r) for r in rs.values()]
            print(f"| {m} | {len(f)} | {pm([x['mean'] for x in f])} | {pm([x['worst'] for x in f])} "
                  f"| {pm([x['pooled'] for x in f])} |")
    for base in ("uniform", "online"):
        print(f"\nAgainst {base}, seed by seed (mean, worst, pooled; † the seeds PiKE's defaults were chosen on):\n")
        print("| mixer | " + " | ".join(f"seed {k}{' †' if k in tuned else ''}" for k in range(1, 7))
              + " | mean below (not tuned on) | worst below, mean within 0.01 (not tuned on) |")
        print("|---" * 9 + "|")
        for m in ("pike", "pike-fair"):
            cells, below, fair, n = [], 0, 0, 0
            for k in range(1, 7):
                r, b = runs[m].get(k), runs[base].get(k)
                if not (r and b):
                    cells.append("–")
                    continue
                d = {key: figures(r)[key] - figures(b)[key] for key in ("mean", "worst", "pooled")}
                cells.append(f"{d['mean']:+.3f}, {d['worst']:+.3f}, {d['pooled']:+.3f}")
                if k not in tuned:
                    n += 1
                    below += d["mean"] < 0
                    fair += d["worst"] < 0 and d["mean"] <= 0.01
            print(f"| {m} | " + " | ".join(cells) + f" | {below} of {n} | {fair} of {n} |")
    cost(out)


def cost(out):
    rows = []
    for m in ("pike", "pike-fair"):
        for k in seeds(out, m):
            log = (out / f"{m}-{k}.log").read_text()
            hit = re.search(r"(\d+) measuring steps, ([0-9.]+) s", log)
            steps = load(out, f"{m}-{k}")["steps"]
            jsonl = (out / f"{m}-{k}.jsonl").read_text().splitlines()
            train = [json.loads(x)["train_seconds"] for x in jsonl if '"train_seconds"' in x][-1]
            if hit:
                n, s = int(hit.group(1)), float(hit.group(2))
                plain = (train - s) / (steps - n)
                rows.append((s - n * plain) / (train - (s - n * plain)))
    if rows:
        print(f"\nMeasuring's cost beyond plain steps, share of a run without it: {pm([100 * r for r in rows])} % "
              f"({len(rows)} runs)")


for folder in sys.argv[1:] or ["target/lm-pike3", "target/lm-pike4"]:
    tables(Path(folder))
