#!/usr/bin/env python3
"""Writes examples/data/sample.jsonl: a small synthetic instruction-style corpus in the `text`
format (one {"text": ...} object per line). Synthetic so that it ships with no licence
questions and is learnable by the `tiny` preset in a few hundred steps; deterministic (seeded),
so regenerating it gives the same bytes."""
import json
import random
import sys

rng = random.Random(20261123)
NAMES = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Ken", "Dennis", "Leslie", "Radia"]
THINGS = ["cluster", "GPU", "checkpoint", "model", "dataset", "operator", "pod", "node", "job", "shard"]
VERBS = ["trains", "scales", "restores", "watches", "shards", "saves", "loads", "schedules"]
ADJ = ["elastic", "sharded", "frozen", "idle", "busy", "durable", "fast", "small"]
COLOURS = ["red", "green", "blue", "amber", "violet", "silver"]


def arithmetic():
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    op = rng.choice(["plus", "minus", "times"])
    value = {"plus": a + b, "minus": a - b, "times": a * b}[op]
    return f"### Instruction:\nWhat is {a} {op} {b}?\n### Response:\n{a} {op} {b} is {value}."


def sentence():
    return (f"The {rng.choice(ADJ)} {rng.choice(THINGS)} {rng.choice(VERBS)} the "
            f"{rng.choice(ADJ)} {rng.choice(THINGS)}.")


def story():
    name = rng.choice(NAMES)
    thing = rng.choice(THINGS)
    return (f"### Instruction:\nTell me about {name} and the {thing}.\n### Response:\n"
            f"{name} has a {rng.choice(COLOURS)} {thing}. " + " ".join(sentence() for _ in range(3)))


def counting():
    start = rng.randint(0, 50)
    n = rng.randint(4, 9)
    return ("### Instruction:\nCount from {} to {}.\n### Response:\n".format(start, start + n - 1)
            + ", ".join(str(start + i) for i in range(n)) + ".")


def main(path, target_bytes=400_000):
    size = 0
    with open(path, "w", encoding="utf-8") as out:
        while size < target_bytes:
            text = rng.choice([arithmetic, story, counting, sentence])()
            line = json.dumps({"text": text}) + "\n"
            out.write(line)
            size += len(line)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/data/sample.jsonl")
