#!/usr/bin/env python3
"""Loads an exported PEFT adapter the way PEFT does and computes logits with it, independently
of the engine: the base model is bench/reference_step.py's nn.Module (transformers'
LlamaForCausalLM conventions) filled from the base HF directory by name (strict), each
target module is wrapped as PEFT's lora.Linear computes (base(x) + B(A(x)) * lora_alpha / r),
and adapter_model.safetensors is mapped onto the wrappers by PEFT's key rule (strip
"base_model.model.", the rest is the HF module path). Every adapter key must land on a wrapper
and every wrapper must get both halves.

  /usr/bin/python3 peft_logits.py BASE_DIR ADAPTER_DIR TOKENS.safetensors OUT.safetensors

Reads "tokens" (I64 [batch, seq]); writes "logits" (F32 [batch, seq, vocab]). Exits non-zero
with a message on anything it cannot map."""
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "golden"))
import reference_step as ref  # noqa: E402
from make_golden import write_safetensors  # noqa: E402

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).float() if e["dtype"] != "I64" else t.reshape(e["shape"])
    return out


def hf_to_ref(path):
    """An HF module path (model.layers.0.self_attn.q_proj) → reference_step's (layers.0.q_proj)."""
    parts = path.split(".")
    if parts[0] != "model":
        raise KeyError(path)
    parts = [p for p in parts[1:] if p not in ("self_attn", "mlp")]
    return ".".join(parts)


def main(base_dir, adapter_dir, tokens_path, out_path):
    with open(os.path.join(base_dir, "config.json")) as f:
        hf = json.load(f)
    if hf.get("rope_theta", 10000.0) != 10000.0 or hf.get("rms_norm_eps", 1e-6) != 1e-6:
        sys.exit("the reference model implements rope_theta 10000 and rms_norm_eps 1e-6 only")
    if not hf.get("tie_word_embeddings", False):
        sys.exit("the reference model implements tied embeddings only")
    c = dict(vocab=hf["vocab_size"], hidden=hf["hidden_size"], inter=hf["intermediate_size"],
             layers=hf["num_hidden_layers"], heads=hf["num_attention_heads"],
             kv_heads=hf["num_key_value_heads"], tied=True)
    model = ref.Model(c)
    base = read_safetensors(os.path.join(base_dir, "model.safetensors"))
    model.load_state_dict({hf_to_ref(k[: -len(".weight")]) + ".weight": v for k, v in base.items()},
                          strict=True)

    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        config = json.load(f)
    if config.get("peft_type") != "LORA" or config.get("use_rslora") or config.get("use_dora"):
        sys.exit("adapter_config.json: expected a plain LoRA adapter")
    r, alpha = config["r"], config["lora_alpha"]
    wrapped = {}
    for layer in model.layers:
        for name in config["target_modules"]:
            lora = ref.LoraLinear(getattr(layer, name), r, alpha, 0.0)
            setattr(layer, name, lora)
    for path, module in model.named_modules():
        if isinstance(module, ref.LoraLinear):
            wrapped[path] = {"A": None, "B": None, "module": module}

    prefix = "base_model.model."
    for key, tensor in read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors")).items():
        if not key.startswith(prefix):
            sys.exit(f"{key}: expected the {prefix} prefix of PEFT's saved keys")
        module_path, half, weight = key[len(prefix):].rsplit(".", 2)
        if weight != "weight" or half not in ("lora_A", "lora_B"):
            sys.exit(f"{key}: not a LoRA weight")
        target = wrapped.get(hf_to_ref(module_path))
        if target is None:
            sys.exit(f"{key}: no target module at {module_path}")
        linear = getattr(target["module"], half)
        if tuple(linear.weight.shape) != tuple(tensor.shape):
            sys.exit(f"{key}: shape {tuple(tensor.shape)}, the module expects {tuple(linear.weight.shape)}")
        with torch.no_grad():
            linear.weight.copy_(tensor)
        target[half[-1]] = True
    for path, halves in wrapped.items():
        if not (halves["A"] and halves["B"]):
            sys.exit(f"{path}: the adapter file lacks its lora_A or lora_B")

    tokens = read_safetensors(tokens_path)["tokens"]
    model.eval()
    with torch.no_grad():
        logits = model.logits(tokens)
    write_safetensors(out_path, {"logits": logits})
    print(json.dumps({"wrapped_modules": len(wrapped), "r": r, "lora_alpha": alpha}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
