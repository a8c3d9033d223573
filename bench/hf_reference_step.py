#!/usr/bin/env python3
"""The baseline users compare Tidal with: transformers' model of the same shape (Llama, Qwen2,
Qwen3, DeepSeek-V2/V3: built from the config.json that `engine_step_bench --hf-config-out`
writes for the preset) with a PEFT LoRA adapter and torch.optim.AdamW, one training step timed
the way bench/engine_step_bench times the engine's (same batch, sequence, precision, LoRA rank
and targets, dropout 0, gradient clipping, same thread count on CPU). Random weights: nothing is
downloaded.

  tools/venv/bin/python3 bench/hf_reference_step.py --config CONFIG_JSON --preset NAME \\
      --batch 4 --seq 128 [--device cpu|cuda] [--precision fp32|bf16] [--rank 16] \\
      [--targets q_proj,v_proj]

Prints one JSON line with the same fields as engine_step_bench."""
import argparse
import json
import resource
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

ALL_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, help="the preset's config.json")
    p.add_argument("--preset", default="tiny", help="its name, for the output line")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--targets", default=ALL_TARGETS)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    attn = "sdpa"
    fields = json.load(open(a.config))
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).to(dtype)
    targets = a.targets.split(",")
    model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0,
                                             target_modules=targets, task_type="CAUSAL_LM"))
    model.train()
    trainable = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(1)
    times = []
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, config.vocab_size, (a.batch, a.seq), generator=gen).to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()  # the engine's step also ends with its loss on the host
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    peak = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    base = sum(q.numel() for q in model.parameters() if not q.requires_grad)
    print(json.dumps({
        "impl": "transformers+peft", "preset": a.preset, "device": a.device,
        "precision": a.precision, "batch": a.batch, "seq": a.seq, "lora_rank": a.rank,
        "targets": targets, "seconds_per_step": median, "tokens_per_s": a.batch * a.seq / median,
        "base_params": base, "layers": config.num_hidden_layers, "hidden": config.hidden_size,
        "trainable_params": sum(q.numel() for q in trainable), "peak_bytes": peak,
        "threads": torch.get_num_threads(), "last_loss": loss_value}))


if __name__ == "__main__":
    main()
