#!/usr/bin/env python3
"""Reads a safetensors file the engine wrote with the safetensors package (the reference
implementation of the format) and writes every tensor back as float32, so the caller can
compare values without trusting its own reader for the dtype under test.

  tools/venv/bin/python3 tests/hf/safetensors_roundtrip.py IN OUT

Prints {"dtypes": {name: "bfloat16"|...}, "shapes": {name: [...]}, "metadata": {...}}."""
import json
import sys

from safetensors import safe_open
from safetensors.torch import load_file, save_file


def main(path, out):
    tensors = load_file(path)
    with safe_open(path, "pt") as f:
        metadata = f.metadata() or {}
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, out)
    print(json.dumps({"dtypes": {k: str(v.dtype).removeprefix("torch.") for k, v in tensors.items()},
                      "shapes": {k: list(v.shape) for k, v in tensors.items()},
                      "metadata": metadata}))


if __name__ == "__main__":
    main(*sys.argv[1:])
