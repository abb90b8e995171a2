"""The language-model example's packed training replayed in transformers.

    python3 torch_packed.py init DIR          # DIR/init: LlamaForCausalLM weights + config.json
    LM_SHAPE=512,1536,8,8,4 python3 torch_packed.py init DIR   # another shape
    python3 torch_packed.py replay DIR [DEVICE]

`init` builds transformers' LlamaForCausalLM in the example's shape (vocabulary from
DIR/tokens/tokens.json), seeded, and saves it for `language_model --init-from`.
`replay` reads the example's log (DIR/run.jsonl, written with --log-indices and
--logging-steps 1): every step's documents, rank by rank, and its learning rate.
It packs each rank's documents as PackedCollate does (pieces of at most seq_len,
first fit, positions restarting per piece, a block-diagonal causal mask, targets
the next token of the same document), trains the same steps with torch's AdamW
(betas (0.9, 0.95), weight decay 0.1 but on biases and norms, HF's split), the loss the mean over all
target tokens of the step, and prints both runs' losses side by side, the largest
relative difference, and each side's target tokens per second over all the steps
(adabatch's run time from DIR/summary.json, its whole training loop; torch's from
setting the learning rate to the optimizer step, the batches built beforehand).
"""

import json
import os
import sys
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

SEQ_LEN = 128


def shape():
    """The decoder's shape: the example's (hidden 128, MLP 384, 4 layers, 4 heads,
    2 kv heads), or LM_SHAPE="hidden,intermediate,layers,heads,kv_heads" (the
    flags --hidden-size ... --num-key-value-heads of the example)."""
    given = os.environ.get("LM_SHAPE")
    return [int(v) for v in given.split(",")] if given else [128, 384, 4, 4, 2]


def config(tokens):
    info = json.load(open(f"{tokens}/tokens.json"))
    hidden, intermediate, layers, heads, kv_heads = shape()
    return LlamaConfig(
        vocab_size=info["vocab_size"],
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=SEQ_LEN,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=info["eos_id"],
        eos_token_id=info["eos_id"],
        attn_implementation="eager",
    ), info


def documents(tokens, info):
    ids = np.fromfile(f"{tokens}/train.bin", dtype=np.uint16 if info["width_bytes"] == 2 else np.uint32)
    ends = np.where(ids == info["eos_id"])[0]
    docs, start = [], 0
    for end in ends:
        if end > start:
            docs.append(ids[start : end + 1].astype(np.int64))
        start = end + 1
    return docs


def pack(docs, seq_len, pad):
    """First-fit packing of the documents' pieces, as adabatch's PackedCollate."""
    rows, fill = [], []
    for d, doc in enumerate(docs):
        for offset in range(0, len(doc), seq_len):
            piece = (d, offset, min(seq_len, len(doc) - offset))
            for r, f in enumerate(fill):
                if f + piece[2] <= seq_len:
                    rows[r].append(piece)
                    fill[r] += piece[2]
                    break
            else:
                rows.append([piece])
                fill.append(piece[2])
    n = len(rows)
    ids = np.full((n, seq_len), pad, dtype=np.int64)
    targets = np.full((n, seq_len), -100, dtype=np.int64)
    positions = np.zeros((n, seq_len), dtype=np.int64)
    segments = np.zeros((n, seq_len), dtype=np.int64)
    for r, row in enumerate(rows):
        c = 0
        for s, (d, offset, length) in enumerate(row):
            doc = docs[d]
            ids[r, c : c + length] = doc[offset : offset + length]
            nxt = doc[offset + 1 : offset + length + 1]
            targets[r, c : c + len(nxt)] = nxt
            positions[r, c : c + length] = np.arange(length)
            segments[r, c : c + length] = s
            c += length
        segments[r, c:] = len(row)  # padding: one more segment
    same = segments[:, :, None] == segments[:, None, :]
    causal = np.tril(np.ones((seq_len, seq_len), dtype=bool))[None]
    allowed = torch.from_numpy(same & causal)
    mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return [torch.from_numpy(a) for a in (ids, targets, positions)] + [mask[:, None]]


def optimizer(model):
    decay = [p for n, p in model.named_parameters() if not ("norm" in n or n.endswith(".bias"))]
    no_decay = [p for n, p in model.named_parameters() if "norm" in n or n.endswith(".bias")]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=0.0, betas=(0.9, 0.95), eps=1e-8,
    )


def replay(directory, device):
    tokens = f"{directory}/tokens"
    cfg, info = config(tokens)
    docs = documents(tokens, info)
    model = LlamaForCausalLM.from_pretrained(f"{directory}/init", attn_implementation="eager").to(device)
    model.train()
    opt = optimizer(model)
    log = [json.loads(line) for line in open(f"{directory}/run.jsonl")]
    log = [r for r in log if "indices" in r]
    steps = [
        ([[t.to(device) for t in pack([docs[i] for i in rank], SEQ_LEN, info["eos_id"])] for rank in r["indices"] if rank], r)
        for r in log
    ]
    losses, times, targets_per_step = [], [], []
    for ranks, record in steps:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = record["learning_rate"]
        opt.zero_grad()
        count = sum(int((t != -100).sum()) for _, t, _, _ in ranks)
        total = 0.0
        for ids, targets, positions, mask in ranks:
            logits = model(input_ids=ids, position_ids=positions, attention_mask=mask).logits
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100, reduction="sum"
            ) / count
            loss.backward()
            total += loss.item()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(total)
        targets_per_step.append(count)
    summary = json.load(open(f"{directory}/summary.json"))
    print("| step | global batch | target tokens | adabatch loss | transformers loss | relative difference |")
    print("|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for (_, record), mine, count in zip(steps, losses, targets_per_step):
        rel = abs(record["loss"] - mine) / abs(mine)
        worst = max(worst, rel)
        if record["step"] % 10 == 0 or record["step"] <= 3:
            print(f"| {record['step']} | {record['global_batch']} | {count} | {record['loss']:.6f} | {mine:.6f} | {rel:.1e} |")
    ours = sum(targets_per_step) / summary["train_runtime"]
    theirs = sum(targets_per_step) / sum(times)
    print(f"largest relative loss difference over {len(losses)} steps: {worst:.2e}")
    print(f"target tokens/s over all {len(losses)} steps: adabatch {ours:.0f}, transformers {theirs:.0f} (ratio {ours / theirs:.2f}x)")


def init(directory):
    cfg, _ = config(f"{directory}/tokens")
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(f"{directory}/init")


if __name__ == "__main__":
    command, directory = sys.argv[1], sys.argv[2]
    if command == "init":
        init(directory)
    else:
        replay(directory, sys.argv[3] if len(sys.argv) > 3 else "cpu")
