"""The nanoGPT-style prepare users run today: pyarrow record batches of the text
column -> `tokenizers`' encode_batch -> each document's ids then the EOS id -> numpy
uint16, appended to one file. Nulls and empty or whitespace-only texts are skipped,
as adabatch skips them.

    python prepare.py SHARD_DIR TOKENIZER_JSON OUT_FILE [EOS]
"""
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from tokenizers import Tokenizer


def main():
    shards, tokenizer_path, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    eos = sys.argv[4] if len(sys.argv) > 4 else "<|endoftext|>"
    tokenizer = Tokenizer.from_file(tokenizer_path)
    eos_id = tokenizer.token_to_id(eos)
    tokens = 0
    with open(out, "wb") as f:
        for shard in sorted(shards.glob("*.parquet")):
            for batch in pq.ParquetFile(shard).iter_batches(batch_size=1024, columns=["content"]):
                texts = [t for t in batch.column(0).to_pylist() if t is not None and t.strip()]
                ids = []
                for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
                    ids.extend(encoding.ids)
                    ids.append(eos_id)
                np.asarray(ids, dtype=np.uint16).tofile(f)
                tokens += len(ids)
    print(f"{tokens} tokens")


if __name__ == "__main__":
    main()
