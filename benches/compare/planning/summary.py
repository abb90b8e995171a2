"""Prints a table of the planning benchmark and the ratio
dynabatch_seconds / adabatch_seconds at every size both sides were timed on."""

import json
import sys


def main():
    ada_path, dyn_path = sys.argv[1:3]
    with open(ada_path) as f:
        ada = [json.loads(line) for line in f if line.strip()]
    with open(dyn_path) as f:
        dyn = json.load(f)
    dyn_by_n = {r["n"]: r for r in dyn}
    print(f"{'n':>9}  {'side / model':<30} {'seconds':>10} {'ratio':>10} {'batches':>8} {'mean size':>9} {'covered':>7}")
    for n in sorted({r["n"] for r in ada} | set(dyn_by_n)):
        d = dyn_by_n.get(n)
        if d:
            print(
                f"{n:>9}  {'dynabatch ' + d['version']:<30} {d['seconds']:>10.3f} {'':>10} "
                f"{d['batches']:>8} {d['mean_batch_size']:>9.1f} {str(d['covers_each_example_once']):>7}"
            )
        for a in (r for r in ada if r["n"] == n):
            ratio = f"{d['seconds'] / a['seconds']:.0f}x" if d else "-"
            print(
                f"{n:>9}  {'adabatch ' + a['model']:<30} {a['seconds']:>10.4f} {ratio:>10} "
                f"{a['batches']:>8} {a['mean_batch_size']:>9.1f} {str(a['covers_each_example_once']):>7}"
            )
    print("ratio = dynabatch seconds / adabatch seconds (median of the adabatch repetitions), same n")


if __name__ == "__main__":
    main()
