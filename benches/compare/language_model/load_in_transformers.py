"""Loads the directory examples/language_model.rs saves into transformers.

    python3 benches/compare/language_model/load_in_transformers.py [OUTPUT_DIR [TOKENS_DIR]]

(defaults: adabatch_output/language_model, adabatch_output/lm-tokens; needs torch
and transformers, e.g. the venv benches/compare/llama/run.sh makes). It loads the
model with LlamaForCausalLM.from_pretrained and the tokenizer from tokenizer.json,
computes the mean next-token loss over the validation documents (each document
alone, as the packed rows' block-diagonal mask has it; a document longer than the
model's context in windows of it, as adabatch cuts it into pieces), and prints the
greedy continuation of the validation documents' first words, to set beside the
example's own figures.
"""

import sys

import numpy as np
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1] if len(sys.argv) > 1 else "adabatch_output/language_model"
tokens = sys.argv[2] if len(sys.argv) > 2 else "adabatch_output/lm-tokens"

model = LlamaForCausalLM.from_pretrained(out)
model.eval()
tokenizer = PreTrainedTokenizerFast(tokenizer_file=f"{out}/tokenizer.json")
eos = model.config.eos_token_id
context = model.config.max_position_embeddings
ids = np.fromfile(f"{tokens}/validation.bin", dtype=np.uint16).astype(np.int64)

total, count, prompts = 0.0, 0, []
start = 0
with torch.no_grad():
    for end in np.where(ids == eos)[0]:
        doc = ids[start : end + 1]
        start = end + 1
        if len(doc) < 2:
            continue
        if len(prompts) < 3:
            prompts.append(doc[:3])
        # adabatch's pieces: the last token of a piece predicts the next piece's first.
        for offset in range(0, len(doc) - 1, context):
            inputs = torch.tensor(doc[offset : offset + context])[None]
            targets = torch.tensor(doc[offset + 1 : offset + context + 1])[None]
            logits = model(inputs).logits[:, : targets.shape[1]]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
            )
            total += loss.item()
            count += targets.shape[1]
print(f"transformers: validation loss {total / count:.4f} over {count} targets, perplexity {np.exp(total / count):.1f}")
for prompt in prompts:
    out_ids = model.generate(torch.tensor(prompt)[None], max_new_tokens=40, do_sample=False, eos_token_id=eos)
    print("greedy:", tokenizer.decode(out_ids[0], skip_special_tokens=True))
