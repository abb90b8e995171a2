#!/usr/bin/env python3
"""PyTorch reference for `gpu_check bench`: the same transformer classifier, data,
batch schedule and optimizer, so samples/s can be compared on the same GPU.

    python benches/compare/torch_transformer.py --data CORPUS [--plan plan.json] [--device cuda]

Model (identical to examples/gpu_check/transformer.rs): bytes as tokens
(vocabulary 256 + a padding id), learned token and position embeddings, `layers`
pre-norm blocks (LayerNorm, multi-head self-attention with a key-padding mask,
residual; LayerNorm, Linear 4d, GELU (tanh), Linear d, residual), a final
LayerNorm, mean pooling over real tokens, a linear head over 2 classes (does the
sentence contain a comma). f32, AdamW (lr 3e-4, weight decay 0.01), mean
cross-entropy over the batch.

Batches: with `--plan` (written by `gpu_check bench --plan-out`), exactly the
adabatch run's batches in the same order; otherwise a seeded shuffle with the same
schedule: `per_device_train_batch_size` for steps 1..20, +16 every 20 steps, at
most 256 (adabatch's `interval(20, +16)`), the last batch of an epoch partial.

Like the adabatch engine, each step reads the loss back to the host once (one
synchronisation per step). The attention is written out (matmul, softmax, matmul)
as in the candle model; `--sdpa` uses `F.scaled_dot_product_attention` instead
(what a PyTorch user would likely write), `--compile` wraps the model in
`torch.compile`. Prints one JSON object.
"""

import argparse
import json
import math
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD = 256
VOCAB = 257
CLASSES = 2
EVERY = 20
GROW = 16
MAX_BATCH = 256


class Block(nn.Module):
    def __init__(self, d, heads, sdpa):
        super().__init__()
        self.heads = heads
        self.sdpa = sdpa
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def attention(self, x, bias):
        b, t, d = x.shape
        h = self.heads
        dh = d // h
        q, k, v = self.qkv(x).reshape(b, t, 3, h, dh).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(dh)) + bias
            out = torch.softmax(scores, dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, d))

    def forward(self, x, bias):
        x = x + self.attention(self.ln1(x), bias)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Transformer(nn.Module):
    def __init__(self, d_model, layers, heads, max_len, sdpa):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, sdpa) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, CLASSES)

    def forward(self, ids, bias, mask):
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        for block in self.blocks:
            x = block(x, bias)
        x = self.ln_f(x)
        pooled = (x * mask).sum(1) / mask.sum(1)
        return self.head(pooled)


def load(path, max_len):
    examples = []
    with open(path, "rb") as f:
        for line in f:
            # Like Rust's str::lines: drop one "\n", then one "\r".
            line = line[:-1] if line.endswith(b"\n") else line
            line = line[:-1] if line.endswith(b"\r") else line
            if all(c in b" \t\n\x0c\r" for c in line):  # blank: skipped as in gpu_check
                continue
            examples.append((line[:max_len], 1 if b"," in line else 0))
    if not examples:
        sys.exit(f"{path}: no sentences")
    return examples


def collate(items, device):
    b = len(items)
    t = max(1, max(len(tokens) for tokens, _ in items))
    ids = torch.full((b, t), PAD, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.float32)
    for row, (tokens, _) in enumerate(items):
        n = len(tokens)
        ids[row, :n] = torch.frombuffer(bytearray(tokens), dtype=torch.uint8).long()
        mask[row, :n] = 1.0
    bias = ((1.0 - mask) * -1e9).reshape(b, 1, 1, t)
    labels = torch.tensor([label for _, label in items], dtype=torch.long)
    return (
        ids.to(device, non_blocking=True),
        bias.to(device, non_blocking=True),
        mask.reshape(b, t, 1).to(device, non_blocking=True),
        labels.to(device, non_blocking=True),
    )


def schedule_batches(n, steps, initial, seed):
    """adabatch's interval(20, +16) with max 256, drop_last = false, one rank."""
    rng = random.Random(seed)
    order, cursor, size = [], n, initial
    for step in range(1, steps + 1):
        if cursor >= n:
            order = list(range(n))
            rng.shuffle(order)
            cursor = 0
        batch = order[cursor : cursor + size]
        cursor += len(batch)
        yield batch
        if step % EVERY == 0:
            size = min(size + GROW, MAX_BATCH)


def train(model, opt, data, batches, device, sync_loss=True):
    examples = tokens = 0
    losses = []
    for indices in batches:
        items = [data[i] for i in indices]
        ids, bias, mask, labels = collate(items, device)
        logits = model(ids, bias, mask)
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if sync_loss:
            losses.append(loss.item())
        examples += len(items)
        tokens += sum(len(t) for t, _ in items)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return examples, tokens, losses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--plan", help="batches from `gpu_check bench --plan-out`")
    p.add_argument("--device", default="cuda")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--per-device-train-batch-size", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--tf32", action="store_true", help="allow TF32 in f32 matmuls")
    p.add_argument("--sdpa", action="store_true", help="F.scaled_dot_product_attention")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--no-sync-loss", action="store_true", help="do not read the loss every step")
    a = p.parse_args()

    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    data = load(a.data, a.max_len)

    def fresh():
        model = Transformer(a.d_model, a.layers, a.heads, a.max_len, a.sdpa).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=a.learning_rate, weight_decay=0.01)
        return (torch.compile(model) if a.compile else model), opt, model

    if a.plan:
        with open(a.plan) as f:
            timed = json.load(f)["steps"]
        source = "plan"
    else:
        timed = list(schedule_batches(len(data), a.steps, a.per_device_train_batch_size, a.seed))
        source = "schedule"
    warm = list(schedule_batches(len(data), a.warmup_steps, a.per_device_train_batch_size, a.seed + 1))

    if warm:
        model, opt, _ = fresh()
        train(model, opt, data, warm, device)
    model, opt, raw = fresh()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    examples, tokens, losses = train(model, opt, data, timed, device, not a.no_sync_loss)
    wall = time.perf_counter() - start
    padded = sum(len(b) * max(len(data[i][0]) for i in b) for b in timed)
    print(
        json.dumps(
            {
                "bench": "transformer_classifier",
                "impl": "pytorch",
                "torch": torch.__version__,
                "device": str(device),
                "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                "params": sum(p.numel() for p in raw.parameters()),
                "config": {"d_model": a.d_model, "layers": a.layers, "heads": a.heads, "max_len": a.max_len},
                "batches_from": source,
                "tf32": a.tf32,
                "sdpa": a.sdpa,
                "compile": a.compile,
                "steps": len(timed),
                "warmup_steps": len(warm),
                "examples": examples,
                "train_runtime_s": wall,
                "samples_per_s": examples / wall,
                "tokens_per_s": tokens / wall,
                "padded_tokens_per_s": padded / wall,
                "train_loss": sum(losses) / len(losses) if losses else None,
                "last_loss": losses[-1] if losses else None,
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            }
        )
    )


if __name__ == "__main__":
    main()
