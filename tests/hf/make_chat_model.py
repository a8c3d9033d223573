"""Writes a small random LlamaForCausalLM with transformers into an HF directory, with the
tokenizer.json and tokenizer_config.json of a real model beside it: what a user points
spec.model.uri at, shrunk to run on a CPU in seconds.

usage: make_chat_model.py OUT_DIR TOKENIZER_DIR [--vocab N] [--bos ID] [--eos ID]
"""

import argparse
import shutil

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("tokenizer_dir")
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--bos", type=int, default=None)
    p.add_argument("--eos", type=int, default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         bos_token_id=a.bos, eos_token_id=a.eos)
    LlamaForCausalLM(config).save_pretrained(a.out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{a.tokenizer_dir}/{name}", f"{a.out}/{name}")


if __name__ == "__main__":
    main()
