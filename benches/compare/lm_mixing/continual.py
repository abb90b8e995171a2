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
    print("| phase-2 rate | replay | old domains' tokens trained (largest seed) | old domains' change (mean ± sd) | worst seed, worst old domain | python | python vs no replay at that rate | steps |")
    print("|---|---|---|---|---|---|---|---|")
    rates = sorted({p.stem.split("-lr")[1].rsplit("-", 1)[0] for p in out.glob("replay*-lr*-*.json")}, key=float, reverse=True)
    for rate in rates:
        for replay, prefix in ((0, "replay0"), (10, "replay10"), ("online ≤ 10", "online-budget10"), ("0 → 20 (ramp)", "ramp0-20"), ("20 → 0 (ramp)", "ramp20-0"), ("40 → 0 over the first half", "ramp40-0-half"), ("bounded at 5", "bound5")):
            changes, worst, vs, steps, shares, new = {d: [] for d in old}, [], [], [], [], []
            for seed in seeds:
                path = out / f"{prefix}-lr{rate}-{seed}.json"
                base = out / f"replay0-lr{rate}-{seed}.json"
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
                    vs.append(100 * (run["final"]["python"] / b - 1))
            if not steps:
                continue
            cells = ", ".join(f"{d} {pm(changes[d])}" for d in old)
            trained = f"{100 * max(shares):.1f} %" if shares else "–"
            print(f"| {rate} | {replay} % | {trained} | {cells} | {max(worst):+.1f} % | {statistics.fmean(new):.3f} | {pm(vs) if vs else '–'} | {statistics.fmean(steps):.0f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
