"""The PyTorch side of benches/compare/llama/run.sh: transformers'
`LlamaForCausalLM` (eager attention, float32) on the weights, batches and AdamW
settings adabatch used (exported by benches/llama_compare.rs into EXPORT_DIR).

First, tiny Llama (biases), Mistral and Qwen2 models (families/) must give
adabatch's logits, plain and packed, through transformers' Auto classes. Then for
each case it checks that
- the initial logits on the first batch match adabatch's within 1e-5 (absolute),
- 50 steps of torch.optim.AdamW (the same lr, betas, eps and weight decay on every
  parameter) give adabatch's per-step losses within 1e-4 (relative),
then times a training step (zero_grad, forward, mean next-token cross-entropy,
backward, step, loss.item()) on one thread: STEPS steps replayed, then TIMED more,
the median of every step after the first, in wall time and in the process's CPU
time (which leaves out other processes on a shared machine). Prints one JSON object per case and a
summary table with adabatch's figures (rust_timing.json) beside PyTorch's.

Usage: python torch_llama.py EXPORT_DIR [TIMED]
"""

import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
export = sys.argv[1]
timed = int(sys.argv[2]) if len(sys.argv) > 2 else 30


def load(case_dir):
    model, info = LlamaForCausalLM.from_pretrained(
        f"{case_dir}/init", attn_implementation="eager", dtype=torch.float32,
        output_loading_info=True)
    unexpected = info["unexpected_keys"]
    missing = [k for k in info["missing_keys"]
               if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    assert not missing and not unexpected, (missing, unexpected)
    model.train()
    return model


def step(model, opt, ids):
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=ids[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return loss.item()


def run(case):
    case_dir = f"{export}/{case}"
    data = load_file(f"{case_dir}/batches.safetensors")
    batches, ours_logits = data["batches"], data["initial_logits"]
    spec = json.load(open(f"{case_dir}/losses.json"))
    hyper = spec["adamw"]
    model = load(case_dir)
    with torch.no_grad():
        logits = model(input_ids=batches[0]).logits
    logits_diff = (logits - ours_logits).abs().max().item()
    assert logits_diff < 1e-5, f"{case}: initial logits differ by {logits_diff}"

    opt = torch.optim.AdamW(model.parameters(), lr=hyper["lr"], betas=tuple(hyper["betas"]),
                            eps=hyper["eps"], weight_decay=hyper["weight_decay"])
    steps = len(spec["losses"])
    losses, wall, cpu = [], [], []
    for i in range(steps + timed):
        start, start_cpu = time.perf_counter(), time.process_time()
        loss = step(model, opt, batches[i % steps])
        if i > 0:
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        if i < steps:
            losses.append(loss)
    rel = [abs(a - b) / abs(b) for a, b in zip(spec["losses"], losses)]
    worst = max(range(steps), key=lambda i: rel[i])
    assert rel[worst] < 1e-4, (
        f"{case}: step {worst + 1}: adabatch {spec['losses'][worst]} vs torch {losses[worst]}")
    rust = json.load(open(f"{case_dir}/rust_timing.json"))
    torch_step, torch_cpu = statistics.median(wall), statistics.median(cpu)
    result = {
        "case": case,
        "parameters": sum(p.numel() for p in model.parameters()),
        "initial_logits_max_abs_diff": logits_diff,
        "loss_max_rel_diff": rel[worst],
        "loss_first_last": [losses[0], losses[steps - 1]],
        "torch_step_ms": torch_step * 1e3,
        "torch_step_cpu_ms": torch_cpu * 1e3,
        "adabatch_step_ms": rust["median_step_s"] * 1e3,
        "adabatch_step_cpu_ms": rust["median_step_cpu_s"] * 1e3,
        "adabatch_engine_steps_per_s": rust["engine_steps_per_s"],
        "ratio_wall": torch_step / rust["median_step_s"],
        "ratio_cpu": torch_cpu / rust["median_step_cpu_s"],
    }
    print(json.dumps(result))
    return result


def check_families():
    """Tiny trained Llama (biases), Mistral (head width 16, sliding window 5) and
    Qwen2 (q/k/v biases, tied) models load into transformers' Auto classes with
    adabatch's logits, plain and with two packed documents in a row (transformers
    finds the documents from position ids that restart)."""
    for name in ("llama_bias", "mistral", "qwen2"):
        d = f"{export}/families/{name}"
        model, info = AutoModelForCausalLM.from_pretrained(
            d, attn_implementation="eager", dtype=torch.float32, output_loading_info=True)
        assert not any(info.values()), (name, info)
        check = load_file(f"{d}/check.safetensors")
        ids, positions = check["input_ids"], check["position_ids"]
        with torch.no_grad():
            plain = model(input_ids=ids, use_cache=False).logits
            packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        diffs = ((plain - check["logits"]).abs().max().item(),
                 (packed - check["packed_logits"]).abs().max().item())
        print(json.dumps({"family": name, "class": type(model).__name__,
                          "logits_max_abs_diff": diffs[0],
                          "packed_logits_max_abs_diff": diffs[1]}))
        assert max(diffs) < 1e-5, (name, diffs)


print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
      f"threads {torch.get_num_threads()}", file=sys.stderr)
check_families()
results = [run(case) for case in json.load(open(f"{export}/cases.json"))]
print()
print("| case | parameters | initial logits max abs diff | per-step loss max rel diff "
      "| adabatch step, ms (CPU / wall) | PyTorch step, ms (CPU / wall) "
      "| adabatch / PyTorch steps/s (CPU / wall) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for r in results:
    print(f"| `{r['case']}` | {r['parameters']:,} | {r['initial_logits_max_abs_diff']:.1e} "
          f"| {r['loss_max_rel_diff']:.1e} "
          f"| {r['adabatch_step_cpu_ms']:.1f} / {r['adabatch_step_ms']:.1f} "
          f"| {r['torch_step_cpu_ms']:.1f} / {r['torch_step_ms']:.1f} "
          f"| {r['ratio_cpu']:.2f}x / {r['ratio_wall']:.2f}x |")
