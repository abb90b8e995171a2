"""Times dynabatch's batch planning: the construction of
`dynabatch.sampler.DynaBatchSampler` (sort by token length, then the
regressor-guided sizing loop, then smoothing), on the first `--n` examples of a
lengths TSV written by gen_lengths.py. dynabatch's code runs unmodified; tqdm's
progress bar is switched off with TQDM_DISABLE=1 (set by run.sh, and here).

Prints one JSON object per size (and writes them to --out when given).
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402


def load(path, n):
    table = np.loadtxt(path, dtype=np.int64, delimiter="\t", skiprows=1, max_rows=n, ndmin=2)
    if len(table) < n:
        sys.exit(f"{path} holds {len(table)} examples, fewer than {n}")
    # DynaBatchSampler documents Python lists (`list[int]`).
    return table[:, 0].tolist(), table[:, 1].tolist(), table[:, 2].tolist()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", required=True)
    parser.add_argument("--n", type=int, nargs="+", default=[1_000_000], help="prefix sizes to time")
    parser.add_argument("--repeat", type=int, default=1, help="timed constructions per size (median reported)")
    parser.add_argument("--min-batch-size", type=int, default=32)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--max-batch-range", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument("--out")
    args = parser.parse_args()

    import dynabatch
    import xgboost
    from dynabatch.regressor import get_regressor
    from dynabatch.sampler import DynaBatchSampler

    # Load the regressor once outside the timing (dynabatch caches it per process).
    get_regressor()

    results = []
    for n in args.n:
        tokens, words, chars = load(args.lengths, n)
        times, cpu_times = [], []
        sampler = None
        for _ in range(args.repeat):
            start, cpu_start = time.perf_counter(), time.process_time()
            sampler = DynaBatchSampler(
                token_lengths=tokens,
                word_lengths=words,
                char_lengths=chars,
                min_batch_size=args.min_batch_size,
                shuffle=True,
                threshold=args.threshold,
                max_batch_range=args.max_batch_range,
                shuffle_seed=args.seed,
                keep_batch_size_even=False,
                friendly_batch_size=False,
                dynamic_batch_mode=True,
            )
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
        batches = list(iter(sampler))  # one epoch's order (shuffles the batches)
        flat = np.fromiter((i for b in batches for i in b), dtype=np.int64)
        covered = len(flat) == n and bool(np.all(np.bincount(flat, minlength=n) == 1))
        sizes = [len(b) for b in batches]
        result = {
            "side": "dynabatch",
            "version": dynabatch.__version__,
            "xgboost": xgboost.__version__,
            "n": n,
            "seconds": statistics.median(times),
            "seconds_all": times,
            # CPU time of this process (all its threads: XGBoost predicts on every core).
            "cpu_seconds": statistics.median(cpu_times),
            "batches": len(batches),
            "mean_batch_size": n / len(batches),
            "first_batch_size": len(sampler.batches[0]),
            "max_batch_size": max(sizes),
            "covers_each_example_once": covered,
            "min_batch_size": args.min_batch_size,
            "threshold": args.threshold,
            "max_batch_range": args.max_batch_range,
            "smooth_batches": sampler.smooth_batches,
            "smooth_batches_max_diff": sampler.smooth_batches_max_diff,
            "shuffle_keep_first_n": sampler.shuffle_keep_first_n,
        }
        print(json.dumps(result), flush=True)
        results.append(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
