#!/usr/bin/env python3
"""Replays a run's noise-scale measurements offline at other cadences and horizons.

Input: the JSONL log of a run that measured at every step (`--noise-scale-every 1`
with `--log-gradient-noise-scale` or a noise-scale schedule), whose step records
carry `noise_measurement` (|G|^2 and tr Sigma of that step's small batches).

For a cadence of every k-th step (averaged over the k phases) and a horizon of at
least m measurements, it runs the engine's estimator (moving averages decaying by
beta per step, by at most 1 - 1/m per measurement, bias-corrected; B_simple their
ratio) and compares it, at every step of the window, with a centred reference: the
ratio of the summed measurements within +-H steps. Prints the mean log-ratio
(negative: the estimate trails) and its root mean square.

    python3 benches/compare/lm_frontier/horizon.py RUN.jsonl [--from 100 --to 600]
"""
import argparse
import json
import math


def measurements(path):
    rows = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            m = record.get("noise_measurement")
            if m and "step" in record and "event" not in record:
                rows[record["step"]] = (m["squared_norm"], m["trace"])
    return rows


def reference(rows, step, half):
    window = [rows[s] for s in range(step - half, step + half + 1) if s in rows]
    norm = sum(n for n, _ in window)
    return sum(t for _, t in window) / norm if norm > 0 else None


def replay(rows, every, horizon, beta, phase):
    """The estimate after every step when only every `every`-th step measures."""
    steps = sorted(rows)
    norm = trace = 0.0
    previous = None
    due = steps[0] + phase
    out = {}
    for step in steps:
        if step >= due:
            gap = 1 if previous is None else step - previous
            decay = max(beta**gap, min(1 - 1 / horizon, beta))
            norm = decay * norm + (1 - decay) * rows[step][0]
            trace = decay * trace + (1 - decay) * rows[step][1]
            previous, due = step, step + every
        if previous is not None and norm > 0:
            out[step] = trace / norm
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--from", dest="first", type=int, default=100)
    parser.add_argument("--to", dest="last", type=int, default=600)
    parser.add_argument("--half-window", type=int, default=25)
    parser.add_argument("--beta", type=float, default=0.95)
    parser.add_argument("--every", default="1,3,4,6,13")
    parser.add_argument("--horizons", default="8,4")
    args = parser.parse_args()
    rows = measurements(args.log)
    if len(rows) < 2:
        raise SystemExit(f"{args.log}: fewer than two steps with a noise_measurement")
    truth = {s: reference(rows, s, args.half_window) for s in rows}
    print(f"{len(rows)} measured steps; steps {args.first}-{args.last}, reference +-{args.half_window}")
    print("| every | horizon (measurements) | mean log(estimate / reference) | its spread over phases | rms |")
    print("|---:|---:|---:|---|---:|")
    for every in map(int, args.every.split(",")):
        for horizon in map(int, args.horizons.split(",")):
            biases, rms = [], []
            for phase in range(every):
                est = replay(rows, every, horizon, args.beta, phase)
                # A window whose |G|^2 sums to no more than 0 has no reference.
                errs = [math.log(est[s] / truth[s]) for s in est
                        if args.first <= s <= args.last and truth[s] and truth[s] > 0]
                biases.append(sum(errs) / len(errs))
                rms.append(math.sqrt(sum(e * e for e in errs) / len(errs)))
            print(f"| {every} | {horizon} | {sum(biases) / len(biases):+.3f} | "
                  f"{min(biases):+.2f} to {max(biases):+.2f} | {sum(rms) / len(rms):.3f} |")


if __name__ == "__main__":
    main()
