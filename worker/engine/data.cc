// worker/engine/data.cc
#include "worker/engine/data.h"

#include <algorithm>

namespace tidal::engine {

MicroBatch Collate(std::span<const PackedRow> rows) {
  const int64_t micro = static_cast<int64_t>(rows.size());
  int64_t seq = 1;
  bool packed = false;
  for (const PackedRow& row : rows) {
    seq = std::max<int64_t>(seq, static_cast<int64_t>(row.tokens.size()));
    packed = packed || (!row.documents.empty() && row.documents.back() > 0);
  }
  MicroBatch batch;
  batch.inputs = torch::zeros({micro, seq}, torch::kInt64);
  batch.targets = torch::full({micro, seq}, -100, torch::kInt64);
  batch.positions = torch::zeros({micro, seq}, torch::kInt64);
  auto documents = torch::full({micro, seq}, -1, torch::kInt64);
  auto* in = batch.inputs.data_ptr<int64_t>();
  auto* target = batch.targets.data_ptr<int64_t>();
  auto* position = batch.positions.data_ptr<int64_t>();
  auto* document = documents.data_ptr<int64_t>();
  for (int64_t r = 0; r < micro; ++r) {
    const PackedRow& row = rows[static_cast<size_t>(r)];
    const int64_t n = static_cast<int64_t>(row.tokens.size());
    batch.tokens += n;
    for (int64_t t = 0; t < seq; ++t) {
      const int64_t at = r * seq + t;
      if (t < n) {
        in[at] = row.tokens[t];
        target[at] = row.targets[t];
        position[at] = row.positions[t];
        document[at] = row.documents[t];
        batch.target_tokens += row.targets[t] != -100;
      } else {
        position[at] = t;  // padding: positions go on, its targets are ignored
      }
    }
  }
  if (packed) {
    // Padding keeps document -1 of its own, after every real token: real queries never see it.
    auto same = documents.unsqueeze(2) == documents.unsqueeze(1);
    auto causal = torch::ones({seq, seq}, torch::kBool).tril();
    batch.attention = (same & causal).unsqueeze(1);
  }
  return batch;
}

}  // namespace tidal::engine
