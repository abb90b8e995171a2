"""The engine-overhead MLP's epoch in PyTorch, on the data, initial weights and
batches adabatch used (exported by `ENGINE_OVERHEAD_EXPORT=<dir>` from
benches/engine_overhead.rs): 64 -> 256 -> 256 -> 10 with ReLU, mean cross-entropy,
torch.optim.AdamW with candle's defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight
decay 0.01), one CPU thread. Checks that the epoch ends where adabatch's did, then
prints the median wall time of an epoch over ROUNDS fresh runs, as JSON.

Usage: python torch_adamw.py EXPORT_DIR [ROUNDS]
"""

import json
import statistics
import sys
import time

import torch
from safetensors.torch import load_file

torch.set_num_threads(1)
export = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
tensors = load_file(f"{export}/mlp.safetensors")
features, labels = tensors["features"], tensors["labels"]


def fresh():
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )
    with torch.no_grad():
        for i, layer in zip((1, 2, 3), (model[0], model[2], model[4])):
            layer.weight.copy_(tensors[f"fc{i}.weight"])
            layer.bias.copy_(tensors[f"fc{i}.bias"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    return model, opt


def epoch(model, opt, batches):
    loss = None
    for idx in batches:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(features[idx]), labels[idx])
        loss.backward()
        opt.step()
    return loss.item()


results = {}
for batch_size in (64, 8):
    batches = [torch.tensor(b) for b in json.load(open(f"{export}/batches_{batch_size}.json"))]
    model, opt = fresh()
    last = epoch(model, opt, batches)
    final = load_file(f"{export}/final_{batch_size}.safetensors")
    ours = [final[f"fc{i}.{k}"] for i in (1, 2, 3) for k in ("weight", "bias")]
    theirs = [p.detach() for p in model.parameters()]
    diff = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    adabatch_last = json.load(open(f"{export}/final_{batch_size}.json"))["last_loss"]
    times = []
    for _ in range(rounds):
        model, opt = fresh()
        start = time.perf_counter()
        epoch(model, opt, batches)
        times.append(time.perf_counter() - start)
    results[batch_size] = {
        "torch_epoch_ms": 1000 * statistics.median(times),
        "torch_last_loss": last,
        "adabatch_last_loss": adabatch_last,
        "max_weight_difference": diff,
    }
print(json.dumps(results, indent=1))
