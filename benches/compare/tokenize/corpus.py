"""Parquet shards of the repository's three text domains (English sentences, King
James verses, Python functions), repeated `copies` times, in a text column called
`content` beside an `id` column, with a null, an empty and a whitespace-only text
every 1,000 rows: the corpus both prepares read.

    python corpus.py OUT_DIR COPIES [ROWS_PER_SHARD]
"""
import gzip
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def texts(data: Path):
    with gzip.open(data / "en_sentences_15k.txt.gz", "rt", encoding="utf-8") as f:
        yield from (line.rstrip("\n") for line in f)
    with gzip.open(data / "kjv_verses.txt.gz", "rt", encoding="utf-8") as f:
        yield from (line.rstrip("\n") for line in f)
    with gzip.open(data / "python_functions.jsonl.gz", "rt", encoding="utf-8") as f:
        yield from (json.loads(line)["text"] for line in f)


def main():
    out, copies = Path(sys.argv[1]), int(sys.argv[2])
    rows_per_shard = int(sys.argv[3]) if len(sys.argv) > 3 else 50_000
    data = Path(__file__).resolve().parents[3] / "data"
    base = list(texts(data))
    rows = []
    for copy in range(copies):
        for i, text in enumerate(base):
            n = len(rows)
            rows.append(None if n % 1000 == 7 else "" if n % 1000 == 8 else " \n" if n % 1000 == 9 else text)
    out.mkdir(parents=True, exist_ok=True)
    for shard, start in enumerate(range(0, len(rows), rows_per_shard)):
        part = rows[start : start + rows_per_shard]
        table = pa.table({"id": pa.array(range(start, start + len(part)), pa.int64()), "content": pa.array(part, pa.string())})
        pq.write_table(table, out / f"train-{shard:05d}.parquet", row_group_size=10_000, compression="snappy")
    print(f"{out}: {len(rows)} rows, {sum(len(t or '') for t in rows) / 1e6:.1f} MB of text")


if __name__ == "__main__":
    main()
