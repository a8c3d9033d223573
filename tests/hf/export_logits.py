#!/usr/bin/env python3
"""Logits of what tidal-export wrote, computed by the libraries a user loads it with
(tests/integration/export_test.cc compares them with the engine's):

  adapter BASE_DIR ADAPTER_DIR TOKENS OUT   transformers loads BASE_DIR, PEFT's
                                            PeftModel.from_pretrained applies ADAPTER_DIR
  merged MODEL_DIR TOKENS OUT               AutoModelForCausalLM.from_pretrained(MODEL_DIR)

Several of these, separated by "--", run in one process (the libraries load once: about 4 s
of the tests' time each). TOKENS is a safetensors file with "tokens" (I64 [batch, seq]); OUT gets "logits"
(F32 [batch, seq, vocab]). Prints a JSON line with what was loaded. Loading refuses weights it
cannot place: transformers reports missing or unexpected keys, and PEFT must have wrapped every
adapter tensor it was given."""
import json
import sys

import torch
from peft import PeftModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM


def load_base(path):
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                       output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys",
                                                        "mismatched_keys")}
    if bad:
        sys.exit(f"transformers could not load {path} cleanly: {bad}")
    return model.eval()


def main(mode, *args):
    if mode == "adapter":
        base_dir, adapter_dir, tokens_path, out = args
        model = PeftModel.from_pretrained(load_base(base_dir), adapter_dir).eval()
        with safe_open(f"{adapter_dir}/adapter_model.safetensors", "pt") as f:
            given = len(list(f.keys()))
        loaded = sum(1 for n, _ in model.named_parameters() if ".lora_" in n)
        if loaded != given:
            sys.exit(f"PEFT placed {loaded} LoRA weights of the {given} in the adapter file")
        report = {"lora_weights": loaded}
    elif mode == "merged":
        model_dir, tokens_path, out = args
        model = load_base(model_dir)
        report = {"parameters": sum(p.numel() for p in model.parameters())}
    else:
        sys.exit(f"unknown mode {mode!r}: expected adapter or merged")
    tokens = load_file(tokens_path)["tokens"]
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float().contiguous()
    save_file({"logits": logits}, out)
    print(json.dumps(report))


if __name__ == "__main__":
    job = []
    for arg in sys.argv[1:] + ["--"]:
        if arg != "--":
            job.append(arg)
        elif job:
            main(*job)
            job = []
