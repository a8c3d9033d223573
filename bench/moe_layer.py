#!/usr/bin/env python3
"""The reference half of bench/moe_layer.sh: transformers' own mixture-of-experts layer
(DeepseekV2Moe / DeepseekV3MoE, built by DeepseekV2ForCausalLM / DeepseekV3ForCausalLM, so with
the experts implementation transformers picks by default), forward + backward to the tokens
(the experts frozen, as under LoRA), CPU fp32.

  moe_layer.py make DIR --family deepseek_v2|deepseek_v3 [--hidden H --experts E ...]
      writes DIR/config.json, DIR/weights.safetensors (the layer's weights in the checkpoint's
      per-expert names, and the tokens)
  moe_layer.py time DIR --iters N --threads T
      prints {"seconds_per_iter", "implementation"} and writes DIR/reference.safetensors
      (output, the tokens' gradient) for the engine to be checked against"""
import argparse
import json
import os
import time

import torch
from safetensors.torch import load_file, save_file
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,
                          DeepseekV3ForCausalLM)

FAMILIES = {"deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM),
            "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM)}


def build(config_dict, implementation=None):
    config_class, model_class = FAMILIES[config_dict["model_type"]]
    config = config_class(**{k: v for k, v in config_dict.items() if k != "model_type"})
    extra = {"experts_implementation": implementation} if implementation else {}
    model = model_class._from_config(config, **extra).float().eval()
    return model.model.layers[0].mlp, config


def make(args):
    torch.manual_seed(0)
    v3 = args.family == "deepseek_v3"
    config = {
        "model_type": args.family, "vocab_size": 64, "hidden_size": args.hidden,
        "intermediate_size": args.hidden, "num_hidden_layers": 1, "num_attention_heads": 8,
        "num_key_value_heads": 8, "q_lora_rank": None, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32,
        "n_routed_experts": args.experts, "num_experts_per_tok": args.top_k,
        "n_shared_experts": args.shared, "moe_intermediate_size": args.moe_intermediate,
        "first_k_dense_replace": 0, "initializer_range": 0.02,
        "topk_method": "noaux_tc" if v3 else "greedy",
        "n_group": 8 if v3 else 1, "topk_group": 4 if v3 else 1,
        "norm_topk_prob": v3, "routed_scaling_factor": 2.5 if v3 else 1.0,
    }
    os.makedirs(args.dir, exist_ok=True)
    moe, hf_config = build(config)
    hf_config.to_json_file(os.path.join(args.dir, "config.json"))
    weights = {}
    with torch.no_grad():
        if v3:
            moe.gate.e_score_correction_bias.copy_(torch.randn(args.experts) * 0.01)
        weights["gate.weight"] = moe.gate.weight
        if v3:
            weights["gate.e_score_correction_bias"] = moe.gate.e_score_correction_bias
        inter = args.moe_intermediate
        for e in range(args.experts):  # the checkpoint's per-expert layout
            weights[f"experts.{e}.gate_proj.weight"] = moe.experts.gate_up_proj[e, :inter]
            weights[f"experts.{e}.up_proj.weight"] = moe.experts.gate_up_proj[e, inter:]
            weights[f"experts.{e}.down_proj.weight"] = moe.experts.down_proj[e]
        for name in ("gate_proj", "up_proj", "down_proj"):
            weights[f"shared_experts.{name}.weight"] = getattr(moe.shared_experts, name).weight
        weights["tokens"] = torch.randn(args.tokens, args.hidden)
    save_file({k: v.detach().contiguous() for k, v in weights.items()},
              os.path.join(args.dir, "weights.safetensors"))


def time_it(args):
    torch.set_num_threads(args.threads)
    config = json.load(open(os.path.join(args.dir, "config.json")))
    weights = load_file(os.path.join(args.dir, "weights.safetensors"))
    moe, hf_config = build(config, args.implementation)
    inter = config["moe_intermediate_size"]
    with torch.no_grad():
        moe.gate.weight.copy_(weights["gate.weight"])
        if "gate.e_score_correction_bias" in weights:
            moe.gate.e_score_correction_bias.copy_(weights["gate.e_score_correction_bias"])
        for e in range(config["n_routed_experts"]):
            moe.experts.gate_up_proj[e, :inter].copy_(weights[f"experts.{e}.gate_proj.weight"])
            moe.experts.gate_up_proj[e, inter:].copy_(weights[f"experts.{e}.up_proj.weight"])
            moe.experts.down_proj[e].copy_(weights[f"experts.{e}.down_proj.weight"])
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(moe.shared_experts, name).weight.copy_(weights[f"shared_experts.{name}.weight"])
    for p in moe.parameters():
        p.requires_grad_(False)
    tokens = weights["tokens"].unsqueeze(0)

    def once():
        x = tokens.clone().requires_grad_(True)
        out = moe(x)
        out.sum().backward()
        return out, x.grad

    out, grad = once()  # warm-up, and the values the engine must reproduce
    start = time.perf_counter()
    for _ in range(args.iters):
        once()
    seconds = (time.perf_counter() - start) / args.iters
    save_file({"output": out.detach().squeeze(0).contiguous(),
               "grad": grad.squeeze(0).contiguous()},
              os.path.join(args.dir, "reference.safetensors"))
    print(json.dumps({"seconds_per_iter": seconds, "threads": args.threads,
                      "implementation": hf_config._experts_implementation}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["make", "time"])
    parser.add_argument("dir")
    parser.add_argument("--family", default="deepseek_v2")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=6)
    parser.add_argument("--shared", type=int, default=2)
    parser.add_argument("--moe-intermediate", type=int, default=704)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--implementation", default=None,
                        help="transformers' experts_implementation (default: its own choice)")
    args = parser.parse_args()
    make(args) if args.mode == "make" else time_it(args)
