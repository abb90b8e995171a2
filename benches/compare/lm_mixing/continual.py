"""The table of continual.sh: for each phase-2 rate and replay share, every old
domain's final loss against its loss at the end of phase 1 (mean ± sd over the
seeds, and the worst seed), and the new domain against the run without replay at
the same rate.

    python3 benches/compare/lm_mixing/continual.py OUT
"""

import json
import statistics
import sys
from pathlib import Path


def pm(values):
    if len(values) < 2:
        return f"{values[0]:+.1f} %"
    return f"{statistics.fmean(values):+.1f} ± {statistics.stdev(values):.1f} %"


def replay_share(log: Path, old):
    """The old domains' share of the tokens a run trained (its `source_tokens`)."""
    if not log.exists():
        return None
    totals = {}
    for line in log.read_text().splitlines():
        for name, tokens in json.loads(line).get("source_tokens", {}).items():
            totals[name] = totals.get(name, 0.0) + tokens
    everything = sum(totals.values())
    return sum(totals.get(d, 0.0) for d in old) / everything if everything else None


def main(out: Path) -> None:
    phase1 = {p.stem.split("-")[1]: json.loads(p.read_text()) for p in out.glob("phase1-*.json")}
    if not phase1:
        sys.exit(f"no phase1-*.json in {out}")
    seeds = sorted(phase1)
    old = list(next(iter(phase1.values()))["final"].keys())
    print(f"{len(seeds)} seed(s); old domains at the end of phase 1 (mean over seeds): "
          + ", ".join(f"{d} {statistics.fmean(phase1[s]['final'][d] for s in seeds):.4f}" for d in old))
    print()
    print("| phase-2 rate | replay | seeds | old domains' tokens trained (mean, largest) | old domains' change (mean ± sd) | worst seed, worst old domain | python | python vs 10 % on the same seed | steps |")
    print("|---|---|---:|---|---|---|---|---|---|")
    runs = [p for p in out.glob("*-lr*-*.json") if not p.stem.startswith("phase1")]
    rates = sorted({p.stem.split("-lr")[1].rsplit("-", 1)[0] for p in runs}, key=float, reverse=True)
    policies = sorted({p.stem.split("-lr")[0] for p in runs}, key=order)
    for rate in rates:
        for prefix in policies:
            changes, worst, vs, steps, shares, new = {d: [] for d in old}, [], [], [], [], []
            for seed in seeds:
                path = out / f"{prefix}-lr{rate}-{seed}.json"
                base = out / f"replay10-lr{rate}-{seed}.json"
                if not path.exists():
                    continue
                run = json.loads(path.read_text())
                steps.append(run["steps"])
                new.append(run["final"]["python"])
                trained = replay_share(out / f"{prefix}-lr{rate}-{seed}.jsonl", old)
                if trained is not None:
                    shares.append(trained)
                seed_changes = [100 * (run["final"][d] / phase1[seed]["final"][d] - 1) for d in old]
                for d, c in zip(old, seed_changes):
                    changes[d].append(c)
                worst.append(max(seed_changes))
                if base.exists():
                    b = json.loads(base.read_text())["final"]["python"]
                    vs.append(run["final"]["python"] - b)
            if not steps:
                continue
            cells = ", ".join(f"{d} {pm(changes[d])}" for d in old)
            trained = f"{100 * statistics.fmean(shares):.1f} %, {100 * max(shares):.1f} %" if shares else "–"
            versus = ", ".join(f"{v:+.3f}" for v in vs) if vs else "–"
            print(f"| {rate} | {label(prefix)} | {len(steps)} | {trained} | {cells} | {max(worst):+.1f} % | {statistics.fmean(new):.3f} | {versus} | {statistics.fmean(steps):.0f} |")


def label(policy: str) -> str:
    """replay10: 10 %; ramp20-0: 20 → 0 % (ramp); bound5e5: bounded at 5 %, read every 5 steps
    (bound5e5l100: halved within 100 % of the bound; bound5e5g6: each old domain's share 6 % at
    the bound, following its drift; ...s20-10: 20 % for the first 10 % of the steps; ...f0-80: 0 %
    from 80 % of them); steps0-0_0.5-0.25: the share in steps."""
    if policy.startswith("replay"):
        return f"{policy[6:]} %"
    if policy.startswith("ramp"):
        return f"{policy[4:].replace('-', ' → ', 1)} % (ramp)"
    if policy.startswith("bound"):
        rest, _, finish = policy[5:].partition("f")
        rest, _, start = rest.partition("s")
        rest, _, gain = rest.partition("g")
        rest, _, lower = rest.partition("l")
        bound, _, every = rest.partition("e")
        lowered = f", halved within {lower} % of it" if lower else ""
        fixed = "".join(
            f", {share} % {where} {fraction} % of the steps"
            for (share, _, fraction), where in ((start.partition("-"), "for the first"), (finish.partition("-"), "from"))
            if share
        )
        if gain:
            return f"following the drift, {gain} % a domain at {bound} %, read every {every or 25} steps{fixed}"
        return f"bounded at {bound} %, read every {every or 25} steps{lowered}{fixed}"
    if policy.startswith("steps"):
        # steps0-0_0.5-0.25_0.8-0+en.2_kjv.1: 0 from 0, 25 % from 0.5, 0 from 0.8.
        spec, _, split = policy[5:].partition("+")
        parts = [p.split("-") for p in spec.split("_")]
        cells = ", ".join(f"{100 * float(r):g} % from {float(f):g}" for f, r in parts)
        return f"in steps: {cells}" + (f" (split {split.replace('.', '=').replace('_', ':')})" if split else "")
    return policy


def order(policy: str):
    """Fixed replays, then ramps, then bounds (others last), each by name."""
    kinds = ("replay", "ramp", "bound")
    return next((i for i, k in enumerate(kinds) if policy.startswith(k)), len(kinds)), policy


if __name__ == "__main__":
    main(Path(sys.argv[1]))
