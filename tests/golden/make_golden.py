#!/usr/bin/env python3
"""Writes a golden case for the engine: an HF-layout model directory produced by an
independent PyTorch implementation (bench/reference_step.py's nn.Module, which follows
transformers' LlamaForCausalLM conventions), a batch of tokens, and the logits PyTorch
computes for them. tests/integration/golden_test.cc loads the directory with the engine and
must reproduce the logits.

The safetensors file is written here from the format's definition (8-byte little-endian
header length, JSON header, raw data), not by the engine's writer.
  tools/venv/bin/python3 tests/golden/make_golden.py OUT_DIR"""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import reference_step as ref  # noqa: E402

DTYPES = {torch.float32: "F32", torch.int64: "I64", torch.bfloat16: "BF16"}


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        data = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1234)
    c = dict(vocab=300, hidden=96, inter=160, layers=2, heads=6, kv_heads=2, tied=True)
    model = ref.Model(c)
    with torch.no_grad():  # non-trivial norm weights, so their use is checked too
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    names = {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    for i in range(c["layers"]):
        for m in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[f"layers.{i}.{m}.weight"] = f"model.layers.{i}.self_attn.{m}.weight"
        for m in ("gate_proj", "up_proj", "down_proj"):
            names[f"layers.{i}.{m}.weight"] = f"model.layers.{i}.mlp.{m}.weight"
        for m in ("input_layernorm", "post_attention_layernorm"):
            names[f"layers.{i}.{m}.weight"] = f"model.layers.{i}.{m}.weight"
    state = {names[k]: v for k, v in model.state_dict().items()}
    write_safetensors(os.path.join(out, "model.safetensors"), state)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "vocab_size": c["vocab"], "hidden_size": c["hidden"], "intermediate_size": c["inter"],
              "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
              "num_key_value_heads": c["kv_heads"], "max_position_embeddings": 128,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)

    tokens = torch.randint(0, c["vocab"], (2, 17))
    with torch.no_grad():
        logits = model.logits(tokens)
    write_safetensors(os.path.join(out, "golden.safetensors"), {"tokens": tokens, "logits": logits})


if __name__ == "__main__":
    main(sys.argv[1])
