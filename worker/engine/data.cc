// worker/engine/data.cc
#include "worker/engine/data.h"

#include <algorithm>

namespace tidal::engine {

MicroBatch Collate(std::span<const data::PackedRow> rows) {
  const int64_t micro = static_cast<int64_t>(rows.size());
  int64_t seq = 1;
  bool packed = false;
  for (const data::PackedRow& row : rows) {
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
    const data::PackedRow& row = rows[static_cast<size_t>(r)];
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

Status CheckTokenizerFitsModel(const data::StoreTokenizer& tokenizer, const ModelConfig& model,
                               const std::string& model_name) {
  const std::string side = "the data's tokenizer (" + tokenizer.description + ")";
  const std::string other = "the model " + model_name + " (config.json vocab_size " +
                            std::to_string(model.vocab_size) + ")";
  if (static_cast<int64_t>(tokenizer.max_id) >= model.vocab_size)
    return InvalidArgument("spec.dataset: " + side + " produced token id " +
                           std::to_string(tokenizer.max_id) + ", which " + other +
                           " has no embedding for: the tokenizer does not fit the model");
  if (static_cast<int64_t>(tokenizer.vocab_size) > model.vocab_size)
    return InvalidArgument("spec.dataset: " + side + " has " +
                           std::to_string(tokenizer.vocab_size) + " ids but " + other +
                           " embeds only " + std::to_string(model.vocab_size) +
                           ": the tokenizer does not fit the model");
  if (tokenizer.bos_id && model.bos_token_id && *tokenizer.bos_id != *model.bos_token_id)
    return InvalidArgument("spec.dataset: " + side + " begins documents with id " +
                           std::to_string(*tokenizer.bos_id) + " but " + other +
                           " has bos_token_id " + std::to_string(*model.bos_token_id));
  if (tokenizer.eos_id && !model.eos_token_ids.empty() &&
      std::find(model.eos_token_ids.begin(), model.eos_token_ids.end(), *tokenizer.eos_id) ==
          model.eos_token_ids.end())
    return InvalidArgument("spec.dataset: " + side + " ends documents with id " +
                           std::to_string(*tokenizer.eos_id) + " but " + other +
                           " has eos_token_id " + nlohmann::json(model.eos_token_ids).dump());
  return OkStatus();
}

}  // namespace tidal::engine
