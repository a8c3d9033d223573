"""Writes the demo's chat data and tokenizer (committed; run again only to change them):

  examples/data/chat.jsonl          `messages` records: a small calculator assistant, with
                                    system prompts and multi-turn conversations, deterministic
  examples/chat-tokenizer/          a 512-id byte-level BPE tokenizer trained on that data with
                                    HF tokenizers' own trainer, and a ChatML chat template (the
                                    format of Qwen2 and its DeepSeek-R1 distills)

The demo trains the random-initialised `tiny` preset (512 embeddings) on it, so `make demo` runs
real chat data through tidal-prep, the chat template and the loss mask on a laptop CPU.

usage: tools/venv/bin/python3 tools/make_demo_chat.py
"""

import json
import os
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def conversation(rng):
    systems = ["You are a calculator. Answer with the result only.",
               "You are a careful math tutor.", None]
    system = rng.choice(systems)
    messages = [{"role": "system", "content": system}] if system else []
    for _ in range(rng.choice([1, 1, 2, 3])):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice(["+", "-", "*"])
        result = {"+": a + b, "-": a - b, "*": a * b}[op]
        ask = rng.choice(["What is {a} {op} {b}?", "Compute {a} {op} {b}.",
                          "{a} {op} {b} = ?"]).format(a=a, op=op, b=b)
        answer = (f"{result}" if system and "result only" in system
                  else f"{a} {op} {b} = {result}.")
        messages += [{"role": "user", "content": ask},
                     {"role": "assistant", "content": answer}]
    return {"messages": messages}


def main():
    rng = random.Random(2026)
    records = [conversation(rng) for _ in range(3000)]
    data = os.path.join(ROOT, "examples/data/chat.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = (m["content"] for r in records for m in r["messages"])
    tok.train_from_iterator(list(texts) + ["system", "user", "assistant"], trainer=trainer)
    out = os.path.join(ROOT, "examples/chat-tokenizer")
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
              "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "add_bos_token": False, "model_max_length": 1024, "chat_template": CHATML}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    print(f"{len(records)} conversations, tokenizer of {tok.get_vocab_size()} ids")


if __name__ == "__main__":
    main()
