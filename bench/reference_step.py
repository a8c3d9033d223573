#!/usr/bin/env python3
"""The baseline for bench/step_time_vs_python.sh: the same LLaMA-style model and LoRA as
worker/engine, written the way a PyTorch user writes it (nn.Module, PEFT-style LoRA wrapper,
torch.optim.AdamW, clip_grad_norm_), timed on the same batch shape and thread count.

Run with tools/venv's torch (the same LibTorch the engine links):
  tools/venv/bin/python3 bench/reference_step.py --preset tiny --batch 4 --seq 128 --steps 10
Prints one JSON line: {"preset", "seconds_per_step", "tokens_per_s", ...}."""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    # Keep in step with api/model_config.cc.
    "tiny": dict(vocab=512, hidden=192, inter=512, layers=4, heads=6, kv_heads=2, tied=True),
    "small": dict(vocab=32000, hidden=768, inter=2048, layers=12, heads=12, kv_heads=4, tied=True),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class LoraLinear(nn.Module):
    """What PEFT's lora.Linear computes: base(x) + B(A(dropout(x))) * alpha / r."""

    def __init__(self, base, r, alpha, dropout):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(dropout)
        self.scale = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(self.dropout(x))) * self.scale


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, kv = c["hidden"], c["kv_heads"] * (c["hidden"] // c["heads"])
        self.c = c
        self.input_layernorm = RMSNorm(h)
        self.post_attention_layernorm = RMSNorm(h)
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, kv, bias=False)
        self.v_proj = nn.Linear(h, kv, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)
        self.gate_proj = nn.Linear(h, c["inter"], bias=False)
        self.up_proj = nn.Linear(h, c["inter"], bias=False)
        self.down_proj = nn.Linear(c["inter"], h, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        heads, kv_heads = self.c["heads"], self.c["kv_heads"]
        d = self.c["hidden"] // heads
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, heads, d).transpose(1, 2)
        k = self.k_proj(h).view(b, t, kv_heads, d).transpose(1, 2)
        v = self.v_proj(h).view(b, t, kv_heads, d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d)
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")).float(), dim=-1).to(q.dtype)
        attn = (probs @ v).transpose(1, 2).reshape(b, t, heads * d)
        x = x + self.o_proj(attn)
        m = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(m)) * self.up_proj(m))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"])
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def logits(self, tokens):
        t = tokens.shape[1]
        d = self.c["hidden"] // self.c["heads"]
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
        freqs = torch.outer(torch.arange(t).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, emb.cos(), emb.sin(), mask)
        return F.linear(self.norm(x), self.embed_tokens.weight)

    def forward(self, tokens, targets):
        logits = self.logits(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Model(PRESETS[args.preset])
    for p in model.parameters():
        p.requires_grad_(False)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    for layer in model.layers:
        for name in targets:
            setattr(layer, name, LoraLinear(getattr(layer, name), args.rank, 2 * args.rank, 0.05))
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-3, weight_decay=0.0)
    vocab = PRESETS[args.preset]["vocab"]
    times = []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, min(vocab, 258), (args.batch, args.seq + 1))
        start = time.perf_counter()
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    print(json.dumps({"impl": "python", "preset": args.preset, "seconds_per_step": median,
                      "tokens_per_s": args.batch * args.seq / median,
                      "threads": torch.get_num_threads(), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
