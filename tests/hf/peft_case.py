#!/usr/bin/env python3
"""One case for the engine's Hugging Face oracle test (tests/integration/hf_oracle_test.cc):
a random tiny model of one family from transformers — LlamaForCausalLM (with RoPE scaling,
biases, head_dim), Qwen2ForCausalLM, Qwen3ForCausalLM, DeepseekV2ForCausalLM and
DeepseekV3ForCausalLM (latent attention, mixture of experts) — with a LoRA adapter from PEFT whose
A and B are both random (B != 0, so the adapter changes the outputs), run forward and
backward on a batch whose labels have ignored positions. Writes, under OUT:

  base/             the model, as transformers' save_pretrained writes it (config.json and
                    model.safetensors, by the safetensors package; with max_shard_size, shards
                    and model.safetensors.index.json; save_dtype fp32, bf16 or fp16)
  adapter/          the adapter, as PEFT's save_pretrained writes it
  expected.safetensors
      tokens  I64 [batch, seq]   input ids
      targets I64 [batch, seq]   the next token at each position, -100 where not in the loss
                                 (labels shifted left, as transformers' loss shifts them)
      logits  F32 [batch, seq, vocab]
      loss    F32 []             transformers' mean cross-entropy over the counted tokens
      grad.<engine name of a LoRA weight>  F32   d loss / d weight, from PEFT's modules
      choices.<layer>  I64 [batch*seq, k]  a MoE layer's chosen experts per token, ascending
                                          (what transformers' router returned)

  tools/venv/bin/python3 tests/hf/peft_case.py OUT '{"family": "qwen3", "tie": true, ...}'

Everything here is transformers' and PEFT's own code; nothing is reimplemented."""
import copy
import json
import os
import sys

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config,
                          DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
            "qwen3": (Qwen3Config, Qwen3ForCausalLM),
            "deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM),
            "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM)}

DEFAULTS = {
    "family": "llama", "rope": None,  # rope: rope_parameters beyond rope_theta, e.g. llama3
    "head_dim": None, "attention_bias": None, "mlp_bias": None, "max_positions": 64,
    "vocab": 96, "hidden": 64, "intermediate": 112, "layers": 2, "heads": 4, "kv_heads": 2,
    "tie": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "seed": 0,
    "rank": 4, "alpha": 8, "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                       "up_proj", "down_proj"],
    "batch": 2, "seq": 12,
    # deepseek_v2 / deepseek_v3: config keys passed as they are (q_lora_rank, kv_lora_rank,
    # qk_nope_head_dim, n_routed_experts, topk_method, n_group, ...).
    "deepseek": {},
    # DeepSeek-V3's FP8 checkpoints: the decoder projections stored as float8_e4m3fn with a
    # weight_scale_inv per 128 × 128 block, loaded back by transformers' own FP8
    # dequantization for the expected values.
    "fp8": False,
    "save_dtype": "float32", "max_shard_size": "50GB",  # e.g. "bfloat16", "40KB" (sharded)
}


def quantize_fp8(directory, model_class):
    """Rewrites the saved model's decoder projections in FP8 with per-block scales, as
    DeepSeek-V3's checkpoints are, and returns transformers' model loaded from it
    (FineGrainedFP8Config(dequantize=True))."""
    from safetensors.torch import load_file
    from transformers import FineGrainedFP8Config
    path = os.path.join(directory, "model.safetensors")
    tensors, out = load_file(path), {}
    for name, w in tensors.items():
        # (A shape the blocks do not divide stays as it is: transformers' dequantization
        # needs whole blocks; the engine's own handles partial ones, tests/unit/engine.)
        if (".layers." in name and "_proj" in name and name.endswith(".weight") and w.dim() == 2
                and w.shape[0] % 128 == 0 and w.shape[1] % 128 == 0):
            rows, cols = w.shape
            blocks = w.float().reshape(rows // 128, 128, cols // 128, 128)
            scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
            out[name] = (blocks / scale[:, None, :, None]).reshape(rows, cols).to(torch.float8_e4m3fn)
            out[name + "_scale_inv"] = scale.contiguous()
        else:
            out[name] = w
    save_file(out, path, metadata={"format": "pt"})
    config_path = os.path.join(directory, "config.json")
    config = json.load(open(config_path))
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                     "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    json.dump(config, open(config_path, "w"), indent=2)
    return model_class.from_pretrained(
        directory, quantization_config=FineGrainedFP8Config(dequantize=True),
        dtype=torch.float32, attn_implementation="eager").eval()


def main(out, case_json):
    case = dict(DEFAULTS, **json.loads(case_json))
    torch.manual_seed(case["seed"])
    config_class, model_class = FAMILIES[case["family"]]
    extra = {}
    for key in ("head_dim", "attention_bias", "mlp_bias"):
        if case[key] is not None:
            extra[key] = case[key]
    extra.update(case["deepseek"])
    rope = {"rope_type": "default", "rope_theta": case["rope_theta"]}
    rope.update(case["rope"] or {})
    config = config_class(
        vocab_size=case["vocab"], hidden_size=case["hidden"],
        intermediate_size=case["intermediate"], num_hidden_layers=case["layers"],
        num_attention_heads=case["heads"], num_key_value_heads=case["kv_heads"],
        tie_word_embeddings=case["tie"], rope_parameters=rope,
        rms_norm_eps=case["rms_norm_eps"], max_position_embeddings=case["max_positions"],
        initializer_range=0.1, attn_implementation="eager", **extra)
    base = model_class(config).float().eval()
    # Biases and norm weights start at 0 and 1: random ones make them count.
    with torch.no_grad():
        for name, p in base.named_parameters():
            if name.endswith(".bias") or name.endswith("_norm.weight") or "layernorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
        # DeepSeek-V3's routing correction is a buffer, zero at first: make it choose.
        for name, b in base.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)
    save_dtype = getattr(torch, case["save_dtype"])
    if save_dtype != torch.float32:
        # Stored in 16 bits: round the weights first, so that the fp32 model computing the
        # expected values has exactly the weights the engine reads back.
        with torch.no_grad():
            for p in base.parameters():
                p.copy_(p.to(save_dtype).float())
    copy.deepcopy(base).to(save_dtype).save_pretrained(
        os.path.join(out, "base"), safe_serialization=True, max_shard_size=case["max_shard_size"])
    if case["fp8"]:
        base = quantize_fp8(os.path.join(out, "base"), model_class)

    lora = LoraConfig(r=case["rank"], lora_alpha=case["alpha"], lora_dropout=0.0,
                      target_modules=case["targets"], bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)
    # PEFT starts B at zero; a random B makes the adapter part of every output and gradient.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(os.path.join(out, "adapter"))

    batch, seq = case["batch"], case["seq"]
    tokens = torch.randint(0, case["vocab"], (batch, seq))
    labels = tokens.clone()
    labels[0, 3:5] = -100  # positions outside the loss (a prompt, padding)
    labels[1, 7] = -100
    choices = {}

    def keep_choice(layer):
        def hook(module, inputs, output):
            choices[layer] = output[2].detach().sort(dim=-1).values.contiguous()
        return hook
    for layer, block in enumerate(base.model.layers):
        router = getattr(block.mlp, "gate", None)
        if router is not None and not isinstance(router, torch.nn.Linear):
            router.register_forward_hook(keep_choice(layer))
    result = model(input_ids=tokens, labels=labels)
    result.loss.backward()

    targets = torch.full_like(labels, -100)
    targets[:, :-1] = labels[:, 1:]
    expected = {"tokens": tokens, "targets": targets,
                "logits": result.logits.detach().float().contiguous(),
                "loss": result.loss.detach().float().reshape(())}
    for layer, chosen in choices.items():
        expected[f"choices.{layer}"] = chosen.to(torch.int64)
    wrapped = 0
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
        #   → model.layers.0.self_attn.q_proj.lora_A.weight (the engine's HF-style name)
        engine = name.removeprefix("base_model.model.").replace(".default.", ".")
        expected["grad." + engine] = p.grad.detach().float().contiguous()
        wrapped += 1
    save_file(expected, os.path.join(out, "expected.safetensors"))
    print(json.dumps({"family": case["family"], "lora_weights": wrapped, "loss": result.loss.item(),
                      "transformers": __import__("transformers").__version__,
                      "peft": __import__("peft").__version__}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "{}")
