#!/usr/bin/env python3
"""Splits data/python_functions.jsonl.gz into two domains for the four-domain
mixing runs (BENCHMARKS.md, "Mixing four domains, one of them small"): `code`,
each function with its docstring taken out, and `docstrings`, those docstrings
(technical English prose, far smaller than the other domains). The two share no
text, so neither domain's held-out documents leak into the other's training.

    python3 benches/compare/lm_mixing/four_domains.py OUT_DIR

Writes OUT_DIR/code.jsonl.gz and OUT_DIR/docstrings.jsonl.gz ({"text": ...} per
line) and prints each domain's documents and characters.
"""
import ast
import gzip
import json
import sys
from pathlib import Path


def split(source):
    """(the function without its docstring, the docstring) or None if it has none."""
    tree = ast.parse(source)
    func = tree.body[0]
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    first = func.body[0] if func.body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return None
    doc = ast.get_docstring(func, clean=True)
    lines = source.splitlines()
    kept = lines[: first.lineno - 1] + lines[first.end_lineno:]
    if len(func.body) == 1:  # the docstring was the whole body
        indent = lines[first.lineno - 1][: first.col_offset]
        kept = lines[: first.lineno - 1] + [indent + "pass"] + lines[first.end_lineno:]
    return "\n".join(kept), doc


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    data = Path(__file__).resolve().parents[3] / "data" / "python_functions.jsonl.gz"
    code, docs = [], []
    with gzip.open(data, "rt") as f:
        for line in f:
            text = json.loads(line)["text"]
            try:
                parts = split(text)
            except SyntaxError:
                parts = None
            if parts is None:
                code.append(text)
                continue
            body, doc = parts
            code.append(body)
            if doc.strip():
                docs.append(doc)
    for name, texts in (("code", code), ("docstrings", docs)):
        with gzip.open(out / f"{name}.jsonl.gz", "wt") as f:
            for text in texts:
                f.write(json.dumps({"text": text}) + "\n")
        print(f"{name}: {len(texts)} documents, {sum(map(len, texts))} characters")


if __name__ == "__main__":
    main()
