"""Tables of the mixing runs (run.sh): per-domain validation loss (nats per
token) for every mixer at one token budget, mean ± standard deviation over the
seeds, the goal's verdict; then the continual-pretraining table.

    python3 benches/compare/lm_mixing/mixing.py target/lm-mixing
"""
import json
import statistics
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "target/lm-mixing")
MIXERS = ["stratified", "stratified28", "uniform", "online", "odm", "aioli", "aioli-smooth", "aioli-worst",
          "aioli-held", "aioli-held-worst", "aioli-held-worst1", "aioli-held-smooth"]


def load(name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def pm(values, digits=3):
    if not values:
        return "–"
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def token_shares(name):
    """Each domain's share of the tokens trained, from the step log."""
    totals = {}
    path = out / f"{name}.jsonl"
    if not path.exists():
        return {}
    for line in path.open():
        row = json.loads(line)
        for k, v in (row.get("source_tokens") or {}).items():
            totals[k] = totals.get(k, 0.0) + v
    whole = sum(totals.values()) or 1.0
    return {k: v / whole for k, v in totals.items()}


def mixer_names():
    """The known mixers in their order, then any other NAME-SEED.json (a NAME:FLAGS
    variant of run.sh or four.sh), the continual runs left out."""
    found = {f.stem.rsplit("-", 1)[0] for f in out.glob("*-[0-9].json")}
    found = {n for n in found if not n.startswith(("phase1", "replay"))}
    return [m for m in MIXERS if m in found] + sorted(found - set(MIXERS))


def seeds_of(m):
    return sorted(int(f.stem.rsplit("-", 1)[1]) for f in out.glob(f"{m}-[0-9].json"))


def mixer_table():
    names = mixer_names()
    runs = {m: [r for r in (load(f"{m}-{s}") for s in range(1, 10)) if r] for m in names}
    runs = {m: r for m, r in runs.items() if r}
    if not runs:
        return
    domains = list(next(iter(runs.values()))[0]["final"].keys())
    seeds = min(len(r) for r in runs.values())
    print(f"{seeds} seed(s) per mixer; validation loss in nats per token\n")
    head = "| mixer | " + " | ".join(domains) + " | mean | worst | steps | tokens trained (" + " / ".join(domains) + ") |"
    print(head)
    print("|---" * (len(domains) + 5) + "|")
    for m, rs in runs.items():
        cells = [pm([r["final"][d] for r in rs]) for d in domains]
        shares = [token_shares(f"{m}-{s}") for s in range(1, len(rs) + 1)]
        share = " / ".join(
            f"{100 * statistics.fmean(s.get(d, 0) for s in shares):.0f} %" for d in domains
        )
        print(
            f"| {m} | " + " | ".join(cells)
            + f" | {pm([r['mean'] for r in rs])} | {pm([r['worst'] for r in rs])}"
            + f" | {statistics.fmean(r['steps'] for r in rs):.0f} | {share} |"
        )
    for baseline, why, slack in (
        ("stratified", "size proportions, as many documents or tokens a step as the others", 0.0),
        ("stratified28", "at 28 documents a step: about the others' tokens a step", 0.0),
        ("uniform", "the bar of the issue: a mean within 0.01 of uniform's", 0.01),
    ):
        base = runs.get(baseline)
        if not base:
            continue
        b_worst = statistics.fmean(r["worst"] for r in base)
        b_mean = statistics.fmean(r["mean"] for r in base)
        print(
            f"\nThe goal against {baseline} ({why}): an online mixer below its "
            f"worst domain ({b_worst:.4f}) and at most {slack} above its mean ({b_mean:.4f}).\n"
        )
        print("| mixer | worst − baseline's | mean − baseline's | wins on worst (seeds) | meets the goal |")
        print("|---|---:|---:|---:|---|")
        for m in runs:
            if m == baseline or m.startswith("stratified"):
                continue
            rs = runs.get(m)
            if not rs:
                continue
            worst = statistics.fmean(r["worst"] for r in rs)
            mean = statistics.fmean(r["mean"] for r in rs)
            # Seed by seed, on the seeds both ran.
            paired = [(load(f"{m}-{k}"), load(f"{baseline}-{k}")) for k in seeds_of(m) if load(f"{baseline}-{k}")]
            wins = sum(1 for r, b in paired if r["worst"] < b["worst"])
            ok = worst < b_worst and mean <= b_mean + slack + 1e-9
            print(
                f"| {m} | {worst - b_worst:+.4f} | {mean - b_mean:+.4f} | {wins} of {len(paired)} | {'yes' if ok else 'no'} |"
            )
        if slack:
            per_seed_table(runs, baseline, slack)


def per_seed_table(runs, baseline, slack):
    """The bar seed by seed: worst domain below the baseline's, mean within slack."""
    print(f"\nSeed by seed against {baseline} (worst − its, mean − its; ✓ where the worst is lower and the mean within {slack}):\n")
    print("| mixer | " + " | ".join(f"seed {k}" for k in seeds_of(baseline)) + " | seeds meeting the bar |")
    print("|---" * (len(seeds_of(baseline)) + 2) + "|")
    for m in runs:
        if m == baseline or m.startswith("stratified"):
            continue
        cells, met, ran = [], 0, 0
        for k in seeds_of(baseline):
            r, b = load(f"{m}-{k}"), load(f"{baseline}-{k}")
            if not r:
                cells.append("–")
                continue
            ran += 1
            ok = r["worst"] < b["worst"] and r["mean"] <= b["mean"] + slack + 1e-9
            met += ok
            cells.append(f"{r['worst'] - b['worst']:+.4f}, {r['mean'] - b['mean']:+.4f}{' ✓' if ok else ''}")
        print(f"| {m} | " + " | ".join(cells) + f" | {met} of {ran} |")


def continual_table():
    phase1 = sorted(out.glob("phase1-*.json"))
    if not phase1:
        return
    seed = phase1[0].stem.split("-")[1]
    before = json.loads(phase1[0].read_text())["final"]
    old = list(before.keys())
    names = [(f"replay {p} %", f"replay{p}-{seed}") for p in (0, 5, 10)]
    names.append(("online mixer", f"replay-online-{seed}"))
    names += [(f"replay {p} %, rate 1e-3", f"replay{p}-lr1e-3-{seed}") for p in (0, 10)]
    runs = [(n, f, load(f)) for n, f in names]
    runs = [(n, f, r) for n, f, r in runs if r]
    if not runs:
        return
    alone = {
        "3e-3": (load(f"replay0-{seed}") or {}).get("final", {}).get("python"),
        "1e-3": (load(f"replay0-lr1e-3-{seed}") or {}).get("final", {}).get("python"),
    }
    print(
        f"\nContinual pretraining (seed {seed}): phase 1 on {' + '.join(old)}, then python "
        "with a replay of the old domains. Old domains before phase 2: "
        + ", ".join(f"{d} {before[d]:.4f}" for d in old)
        + ".\n"
    )
    print(
        "| phase 2 | replay share of tokens | steps | "
        + " | ".join(f"{d} (change)" for d in old)
        + " | python | python vs replay 0 % at its rate |"
    )
    print("|---" * (len(old) + 5) + "|")
    for name, file, r in runs:
        shares = token_shares(file)
        replay = sum(v for k, v in shares.items() if k != "python")
        cells = [f"{r['final'][d]:.4f} ({100 * (r['final'][d] / before[d] - 1):+.1f} %)" for d in old]
        base = alone["1e-3" if "1e-3" in name else "3e-3"]
        vs = f"{100 * (r['final']['python'] / base - 1):+.1f} %" if base else "–"
        print(
            f"| {name} | {100 * replay:.1f} % | {r['steps']} | " + " | ".join(cells)
            + f" | {r['final']['python']:.4f} | {vs} |"
        )


mixer_table()
continual_table()
