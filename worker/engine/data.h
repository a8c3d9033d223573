// worker/engine/data.h — the `text` JSONL format with a byte-level tokenizer, packed into
// fixed-length sequences, and the global data cursor. Sequence k of the run (k counts from 0
// over the whole run, whatever the world size) is a pure function of (seed, k): micro-batch j
// of step s holds sequences s·G + j·m … s·G + (j+1)·m − 1, so any rank that runs micro-batch
// j sees the same tokens (DESIGN.md §4: the data cursor is global). Epochs are reshuffled
// with a seeded Fisher–Yates permutation of our own (std::shuffle's algorithm is unspecified).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/status.h"

namespace tidal::engine {

// Bytes are tokens 0–255; then begin/end of document.
struct ByteTokenizer {
  static constexpr int64_t kBos = 256;
  static constexpr int64_t kEos = 257;
  static constexpr int64_t kVocabSize = 258;
  static std::vector<int64_t> Encode(const std::string& text);
};

struct MicroBatch {
  torch::Tensor inputs;   // [micro, seq] int64
  torch::Tensor targets;  // [micro, seq] int64, -100 where not in the loss
};

class PackedTextDataset {
 public:
  // Reads a JSONL file of {"text": "..."} objects. Errors name the line.
  static StatusOr<PackedTextDataset> Load(const std::string& path, int64_t max_seq_len,
                                          uint64_t seed);

  int64_t num_sequences() const { return num_sequences_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }

  // Sequences [first, first + count) of the run, stacked.
  MicroBatch Sequences(int64_t first, int64_t count);

 private:
  int64_t SequenceAt(int64_t k);  // index into the packed sequences for run position k
  std::vector<int64_t> tokens_;
  int64_t seq_len_ = 0;
  int64_t num_sequences_ = 0;
  uint64_t seed_ = 0;
  int64_t permutation_epoch_ = -1;
  std::vector<int64_t> permutation_;
};

}  // namespace tidal::engine
