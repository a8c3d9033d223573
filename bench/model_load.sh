#!/usr/bin/env bash
# Loading a sharded HF checkpoint into ZeRO-3 at 4 ranks (tidal-train --nproc 4, one step): each
# rank reads only its share of the weights — by range, verified against tidal.checksums.json —
# and its bytes read, time and throughput (the "model loaded" log line) are set against `dd` of
# the same files in the same run (both from the page cache once the files were written; the
# machine's disk is not measured here), and each rank's peak host memory (VmHWM) with what the
# load added to it, as a fraction of the model. Default: a Llama-shaped 0.9 B model in bf16 (~1.8 GB,
# shards of 500 MB), written by bench/model_load.py.
#   bench/model_load.sh [BUILD_DIR]        (RANKS=4 HIDDEN=2048 LAYERS=16)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
ranks=${RANKS:-4}
python=$here/../tools/venv/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" - "$work/model" "${HIDDEN:-2048}" "${LAYERS:-16}" <<'PY'
import json, os, sys
import torch
from safetensors.torch import save_file
out, hidden, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out)
inter, vocab, heads, kv = hidden * 11 // 4, 32000, hidden // 128, max(1, hidden // 512)
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
          "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
          "num_attention_heads": heads, "num_key_value_heads": kv, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 2048, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
json.dump(config, open(f"{out}/config.json", "w"))
g = torch.Generator().manual_seed(0)
def t(*shape): return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)
tensors = {"model.embed_tokens.weight": t(vocab, hidden), "model.norm.weight": t(hidden),
           "lm_head.weight": t(vocab, hidden)}
d = hidden // heads
for l in range(layers):
    p = f"model.layers.{l}."
    tensors |= {p + "input_layernorm.weight": t(hidden), p + "post_attention_layernorm.weight": t(hidden),
                p + "self_attn.q_proj.weight": t(hidden, hidden), p + "self_attn.k_proj.weight": t(kv * d, hidden),
                p + "self_attn.v_proj.weight": t(kv * d, hidden), p + "self_attn.o_proj.weight": t(hidden, hidden),
                p + "mlp.gate_proj.weight": t(inter, hidden), p + "mlp.up_proj.weight": t(inter, hidden),
                p + "mlp.down_proj.weight": t(hidden, inter)}
shards, current, size, limit = [], {}, 0, 500 * 2**20
for name, tensor in tensors.items():
    if current and size + tensor.numel() * 2 > limit:
        shards.append(current); current, size = {}, 0
    current[name] = tensor; size += tensor.numel() * 2
shards.append(current)
weight_map = {}
for i, shard in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, f"{out}/{file}", metadata={"format": "pt"})
    weight_map |= {name: file for name in shard}
json.dump({"metadata": {}, "weight_map": weight_map}, open(f"{out}/model.safetensors.index.json", "w"))
PY
"$build/worker/tidal-prep" --checksum-model "$work/model" > /dev/null 2>&1
total=$(cat "$work"/model/*.safetensors | wc -c)
dd_start=$(date +%s.%N)
for f in "$work"/model/*.safetensors; do dd if="$f" of=/dev/null bs=4M status=none; done
dd_seconds=$(echo "$(date +%s.%N) - $dd_start" | bc)
cat > "$work/job.yaml" <<YAML
model: {uri: $work/model}
dataset: {uri: $here/../examples/data/sample.jsonl, format: text, maxSeqLen: 16, tokenizer: bytes, preparedUri: $work/tokens}
lora: {rank: 4, alpha: 8, targetModules: [q_proj, v_proj]}
optimization: {zeroStage: 3, precision: bf16, globalBatchSize: $ranks, microBatchSize: 1, learningRate: 1.0e-4, maxSteps: 1}
YAML
"$build/worker/tidal-train" --config "$work/job.yaml" --nproc "$ranks" > /dev/null 2> "$work/log"
"$python" - "$work/log" "$total" "$dd_seconds" "$ranks" <<'PY'
import json, sys
log, total, dd_seconds, ranks = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
loads = [json.loads(l) for l in open(log) if '"model loaded"' in l]
assert len(loads) == ranks, f"{len(loads)} 'model loaded' lines of {ranks} ranks"
dd_rate = total / dd_seconds / 1e6
for l in loads:
    rate = l["bytes_read"] / l["seconds"] / 1e6
    print(f"rank: read {l['bytes_read'] / 1e6:.0f} MB = {l['bytes_read'] / total:.3f} of the model "
          f"({total / 1e6:.0f} MB) in {l['seconds']:.2f} s, {rate:.0f} MB/s verified "
          f"= {rate / dd_rate:.2f} × dd ({dd_rate:.0f} MB/s), resident {l['resident_param_bytes'] / 1e6:.0f} MB")
    # Host memory while loading: the rank's peak RSS, and what the load added to the process.
    if l["peak_rss_bytes"] < 0 or l["rss_before_load_bytes"] < 0:
        print("  host memory: not readable here (/proc/self/status)")
        continue
    grown = l["peak_rss_bytes"] - l["rss_before_load_bytes"]
    since = "during the load" if l["peak_rss_since_load"] else "of the process (peak not reset)"
    print(f"  host memory: peak RSS {since} {l['peak_rss_bytes'] / 1e6:.0f} MB "
          f"= {l['peak_rss_bytes'] / total:.2f} of the model; the load (ZeRO slices + read "
          f"buffers) {grown / 1e6:.0f} MB above the process's {l['rss_before_load_bytes'] / 1e6:.0f}"
          f" MB before it = {grown / total:.3f} of the model")
PY
