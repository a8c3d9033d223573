"""The Hugging Face `tokenizers` oracle of tests/integration/data/tokenizer_oracle_test.cc.

  tokenizer_oracle.py encode TOKENIZER_JSON STRINGS_JSONL OUT_JSONL
      For each line {"b64": bytes} of STRINGS_JSONL: the bytes decoded as Python does
      (utf-8, errors='replace'), encoded with and without special tokens, and decoded back.
      Offsets are turned from characters into UTF-8 byte positions of the decoded string.
  tokenizer_oracle.py bench TOKENIZER_JSON DOCS_JSONL OUT_JSON
      bench/tokenizer_bench's baseline: encodes every document of DOCS_JSONL (one JSON string a
      line) without special tokens on one thread, the fastest of encode_batch (serial: run with
      RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false) and a loop of encode, best of a few
      rounds; writes the seconds and the ids.
  tokenizer_oracle.py train OUT_DIR
      Trains small tokenizers (tokenizers' own BpeTrainer, fixed corpus, deterministic) whose
      pipelines use components the shipped files do not: a SentencePiece-style BPE with byte
      fallback (Prepend + Replace normalizers, ByteFallback/Fuse/Strip decoders), Metaspace and
      Digits pre-tokenizers with NFKC, NFC with ByteLevel (prefix space, GPT-2 regex) and added
      tokens with lstrip/rstrip/single_word, and Split behaviours.
  tokenizer_oracle.py convert SENTENCEPIECE_MODEL LEGACY OUT_JSON
      The tokenizer.json transformers makes of a SentencePiece .model (LlamaTokenizer's
      converter: BPE with byte fallback, Metaspace, ByteFallback/Fuse/Strip decoders, a BOS
      template), as the LLaMA-2 and Mistral repositories ship it. LEGACY 1 gives the
      prepend-always scheme of the older files, 0 the prepend-first one of the newer.
"""
import base64
import json
import os
import sys


def byte_positions(text):
    positions = [0]
    for ch in text:
        positions.append(positions[-1] + len(ch.encode("utf-8")))
    return positions


def encode(tokenizer_path, strings_path, out_path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    with open(strings_path, encoding="utf-8") as f, open(out_path, "w", encoding="utf-8") as out:
        for line in f:
            raw = base64.b64decode(json.loads(line)["b64"])
            text = raw.decode("utf-8", errors="replace")
            positions = byte_positions(text)
            with_special = tokenizer.encode(text, add_special_tokens=True)
            plain = tokenizer.encode(text, add_special_tokens=False)
            b64 = lambda s: base64.b64encode(s.encode("utf-8")).decode("ascii")
            record = {
                "text_b64": b64(text),
                "ids": with_special.ids,
                "ids_plain": plain.ids,
                "offsets": [[positions[s], positions[e]] for s, e in with_special.offsets],
                "decoded": b64(tokenizer.decode(with_special.ids, skip_special_tokens=False)),
                "decoded_skip": b64(tokenizer.decode(with_special.ids, skip_special_tokens=True)),
                "decoded_plain": b64(tokenizer.decode(plain.ids, skip_special_tokens=False)),
            }
            out.write(json.dumps(record) + "\n")


def training_corpus():
    import random

    rng = random.Random(1234)
    words = (
        "the quick brown fox jumps over lazy dog tokenizer merges vocabulary training "
        "def return class struct int main void print self None True False while for "
        "数据 模型 训练 東京 こんにちは カタカナ 한국어 안녕하세요 café naïve résumé "
        "123 4567 ３４５ ² ½ Ⅻ hello_world world hello"
    ).split()
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 14)
        sep = rng.choice([" ", " ", " ", "  ", "\t", "\n", "-", ", ", ". "])
        lines.append(sep.join(rng.choice(words) for _ in range(n)))
    return lines


def train(out_dir):
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)

    os.makedirs(out_dir, exist_ok=True)
    corpus = training_corpus()
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]

    def build(name, model, normalizer, pre_tokenizer, decoder, post, vocab_size, bytes_in_vocab,
              added=(), special=()):
        tokenizer = Tokenizer(model)
        if normalizer is not None:
            tokenizer.normalizer = normalizer
        if pre_tokenizer is not None:
            tokenizer.pre_tokenizer = pre_tokenizer
        alphabet = pre_tokenizers.ByteLevel.alphabet() if name.endswith("bytelevel") else []
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                      initial_alphabet=alphabet, show_progress=False)
        tokenizer.train_from_iterator(corpus, trainer=trainer)
        data = json.loads(tokenizer.to_str())
        if bytes_in_vocab:  # SentencePiece's <0xXX> pieces live in the model's vocabulary
            vocab = data["model"]["vocab"]
            for token in byte_tokens:
                if token not in vocab:
                    vocab[token] = len(vocab)
        tokenizer = Tokenizer.from_str(json.dumps(data))
        if decoder is not None:
            tokenizer.decoder = decoder
        if post is not None:
            tokenizer.post_processor = post
        if added:
            tokenizer.add_tokens(list(added))
        if special:
            tokenizer.add_special_tokens(list(special))
        tokenizer.save(os.path.join(out_dir, name + ".json"))

    template = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1),
                                                                                   ("</s>", 2)])
    # LLaMA-2 / Mistral as converted by transformers (legacy SentencePiece BPE).
    build("sentencepiece_bpe",
          models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True),
          normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
          None,
          decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                             decoders.Strip(" ", 1, 0)]),
          processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)]),
          400, True)
    # Newer SentencePiece conversions: Metaspace pre-tokenizer (prepend first), digits split.
    build("metaspace_digits_nfkc",
          models.BPE(unk_token="<unk>", byte_fallback=True),
          normalizers.NFKC(),
          pre_tokenizers.Sequence([pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
                                   pre_tokenizers.Digits(individual_digits=True)]),
          decoders.Sequence([decoders.Metaspace(replacement="▁", prepend_scheme="first"),
                             decoders.ByteFallback(), decoders.Fuse()]),
          template, 500, True, special=[AddedToken("<mask>", lstrip=True, rstrip=False)])
    build("nfc_added_tokens_bytelevel",
          models.BPE(),
          normalizers.NFC(),
          pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]),
          decoders.ByteLevel(),
          processors.Sequence([processors.ByteLevel(trim_offsets=True), template]),
          700, False,
          added=[AddedToken("hello_world", single_word=True, normalized=True),
                 AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False)],
          special=[AddedToken("<|sep|>", normalized=False)])
    build("split_behaviours_bytelevel",
          models.BPE(),
          normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\d{4,}"), "#")]),
          pre_tokenizers.Sequence([
              pre_tokenizers.Split(Regex(r"\s+"), "removed"),
              pre_tokenizers.Split("-", "merged_with_next"),
              pre_tokenizers.Split(Regex(r"[.,!?]"), "merged_with_previous"),
              pre_tokenizers.Split(Regex(r"\p{L}+"), "contiguous", invert=True),
              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
          decoders.ByteLevel(),
          None, 700, False)


def bench(tokenizer_path, docs_path, out_path):
    import time

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    with open(docs_path, encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    tokenizer.encode_batch(docs[:8], add_special_tokens=False)  # warm up
    best, method, ids = float("inf"), "", None
    for _ in range(3):
        start = time.perf_counter()
        encodings = tokenizer.encode_batch(docs, add_special_tokens=False)
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best, method, ids = elapsed, "encode_batch (1 thread)", [e.ids for e in encodings]
        start = time.perf_counter()
        encodings = [tokenizer.encode(d, add_special_tokens=False) for d in docs]
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best, method, ids = elapsed, "encode loop", [e.ids for e in encodings]
    with open(out_path, "w", encoding="utf-8") as out:
        json.dump({"seconds": best, "method": method, "ids": ids}, out)


def convert(model_path, legacy, out_path):
    import shutil
    import tempfile

    from transformers import LlamaTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(model_path, os.path.join(tmp, "tokenizer.model"))
        tokenizer = LlamaTokenizer.from_pretrained(tmp, legacy=legacy == "1", add_bos_token=True)
        if len(tokenizer) < 1000:
            sys.exit(f"{model_path}: converted to only {len(tokenizer)} tokens")
        tokenizer.backend_tokenizer.save(out_path)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "encode":
        encode(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 5 and sys.argv[1] == "bench":
        bench(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 5 and sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 3 and sys.argv[1] == "train":
        train(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
