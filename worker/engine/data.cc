// worker/engine/data.cc
#include "worker/engine/data.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "worker/engine/model.h"

namespace tidal::engine {

std::vector<int64_t> ByteTokenizer::Encode(const std::string& text) {
  std::vector<int64_t> ids;
  ids.reserve(text.size() + 2);
  ids.push_back(kBos);
  for (unsigned char c : text) ids.push_back(c);
  ids.push_back(kEos);
  return ids;
}

StatusOr<PackedTextDataset> PackedTextDataset::Load(const std::string& path, int64_t max_seq_len,
                                                    uint64_t seed) {
  std::ifstream in(path);
  if (!in) return NotFound("spec.dataset.uri: cannot open " + path);
  PackedTextDataset ds;
  ds.seq_len_ = max_seq_len;
  ds.seed_ = seed;
  std::string line;
  int64_t line_no = 0, documents = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument("spec.dataset.uri: " + path + " line " + std::to_string(line_no) +
                             ": not valid JSON (" + e.what() + ")");
    }
    if (!doc.is_object() || !doc.contains("text") || !doc["text"].is_string())
      return InvalidArgument("spec.dataset.uri: " + path + " line " + std::to_string(line_no) +
                             ": format text expects an object with a string field \"text\"");
    auto ids = ByteTokenizer::Encode(doc["text"].get<std::string>());
    ds.tokens_.insert(ds.tokens_.end(), ids.begin(), ids.end());
    ++documents;
  }
  // Non-overlapping windows of seq+1 tokens: inputs are the first seq, targets the last seq.
  ds.num_sequences_ = static_cast<int64_t>(ds.tokens_.size()) / (max_seq_len + 1);
  if (ds.num_sequences_ == 0)
    return InvalidArgument("spec.dataset.uri: " + path + " holds " + std::to_string(documents) +
                           " documents, " + std::to_string(ds.tokens_.size()) +
                           " tokens: not enough for one sequence of maxSeqLen " +
                           std::to_string(max_seq_len) + " + 1");
  return ds;
}

int64_t PackedTextDataset::SequenceAt(int64_t k) {
  const int64_t epoch = k / num_sequences_;
  if (epoch != permutation_epoch_) {
    permutation_.resize(num_sequences_);
    for (int64_t i = 0; i < num_sequences_; ++i) permutation_[i] = i;
    uint64_t state = MixSeed(seed_, static_cast<uint64_t>(epoch) + 0x5eed);
    for (int64_t i = num_sequences_ - 1; i > 0; --i) {
      state = MixSeed(state, static_cast<uint64_t>(i));
      // Modulo bias is below 2^-40 for any realistic dataset size; determinism is what matters.
      const int64_t j = static_cast<int64_t>(state % static_cast<uint64_t>(i + 1));
      std::swap(permutation_[i], permutation_[j]);
    }
    permutation_epoch_ = epoch;
  }
  return permutation_[k % num_sequences_];
}

MicroBatch PackedTextDataset::Sequences(int64_t first, int64_t count) {
  auto window = torch::empty({count, seq_len_ + 1}, torch::kInt64);
  auto* out = window.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t seq = SequenceAt(first + i);
    std::copy_n(tokens_.begin() + seq * (seq_len_ + 1), seq_len_ + 1, out + i * (seq_len_ + 1));
  }
  return {window.narrow(1, 0, seq_len_).contiguous(), window.narrow(1, 1, seq_len_).contiguous()};
}

}  // namespace tidal::engine
