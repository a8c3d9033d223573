#!/usr/bin/env python3
"""The baseline users compare Tidal with: transformers' LlamaForCausalLM with a PEFT LoRA
adapter and torch.optim.AdamW, one training step timed the way bench/engine_step_bench times
the engine's (same preset shape, batch, sequence, precision, LoRA rank and targets, dropout 0,
gradient clipping, same thread count on CPU). Random weights: nothing is downloaded.

  tools/venv/bin/python3 bench/hf_reference_step.py --preset tiny --batch 4 --seq 128 \\
      [--device cpu|cuda] [--precision fp32|bf16] [--rank 16] [--targets q_proj,v_proj]

Prints one JSON line with the same fields as engine_step_bench."""
import argparse
import json
import resource
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

# Keep in step with worker/engine/model_config.cc (PresetModelConfig).
PRESETS = {
    "tiny": dict(vocab_size=512, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=True,
                 rms_norm_eps=1e-6, max_position_embeddings=1024),
    "small": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, tie_word_embeddings=True,
                  rms_norm_eps=1e-6, max_position_embeddings=2048),
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, tie_word_embeddings=False,
               rms_norm_eps=1e-5, max_position_embeddings=2048),
    "7b": dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008,
               num_hidden_layers=30, num_attention_heads=32, num_key_value_heads=32,
               tie_word_embeddings=False, rms_norm_eps=1e-6, max_position_embeddings=4096),
}
ALL_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
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
    config = LlamaConfig(**PRESETS[a.preset], attn_implementation=attn)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
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
