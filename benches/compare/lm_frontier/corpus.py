"""The frontier's corpus: the three text domains of data/ as one JSONL file, a
document per line ({"text": ...}), in their natural proportions (every document
of each, in file order: English sentences, King James verses, Python functions).

    python3 corpus.py OUT.jsonl.gz [EVERY]

With EVERY = k, every k-th document of each domain only (a smaller corpus in the
same proportions).
"""

import gzip
import json
import sys
from pathlib import Path

data = Path(__file__).resolve().parents[3] / "data"
every = int(sys.argv[2]) if len(sys.argv) > 2 else 1
count = 0
index = 0


def keep():
    global index
    index += 1
    return (index - 1) % every == 0


with gzip.open(sys.argv[1], "wt", encoding="utf-8") as out:
    for name in ["en_sentences_15k.txt.gz", "kjv_verses.txt.gz"]:
        for line in gzip.open(data / name, "rt", encoding="utf-8"):
            line = line.rstrip("\n")
            if line.strip() and keep():
                out.write(json.dumps({"text": line}) + "\n")
                count += 1
    for line in gzip.open(data / "python_functions.jsonl.gz", "rt", encoding="utf-8"):
        if keep():
            out.write(json.dumps({"text": json.loads(line)["text"]}) + "\n")
            count += 1
print(f"{count} documents in {sys.argv[1]}")
