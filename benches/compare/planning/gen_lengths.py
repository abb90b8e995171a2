"""Writes per-example token/word/char lengths for the planning benchmark.

Examples are sentences of the corpus (one per line) drawn uniformly *with
replacement* by a seeded NumPy generator (`numpy.random.default_rng(seed)`).
Per example:
  - char  = number of Unicode characters of the sentence,
  - word  = number of whitespace-separated words,
  - token = ceil(UTF-8 bytes / 4), at least 1: a tokenizer-free proxy (about 4
            bytes per subword token for English BPE vocabularies).
dynabatch reads all three; adabatch uses the token lengths.

Output: TSV with a header line `token\tword\tchar`, one example per line.
"""

import argparse
import gzip
import time

import numpy as np


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("-n", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args()

    start = time.perf_counter()
    opener = gzip.open if args.corpus.endswith(".gz") else open
    with opener(args.corpus, "rt", encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f]
    sentences = [s for s in sentences if s.strip()]
    tokens = np.array([max(1, -(-len(s.encode("utf-8")) // 4)) for s in sentences], dtype=np.int64)
    words = np.array([len(s.split()) for s in sentences], dtype=np.int64)
    chars = np.array([len(s) for s in sentences], dtype=np.int64)

    rng = np.random.default_rng(args.seed)
    pick = rng.integers(0, len(sentences), size=args.n)
    table = np.stack([tokens[pick], words[pick], chars[pick]], axis=1)
    with open(args.out, "w", encoding="ascii") as f:
        f.write("token\tword\tchar\n")
        np.savetxt(f, table, fmt="%d", delimiter="\t")
    print(
        f"wrote {args.n} examples from {len(sentences)} sentences to {args.out} "
        f"(tokens: min {table[:, 0].min()}, mean {table[:, 0].mean():.1f}, max {table[:, 0].max()}) "
        f"in {time.perf_counter() - start:.1f}s"
    )


if __name__ == "__main__":
    main()
