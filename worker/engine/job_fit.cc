#include "worker/engine/job_fit.h"

#include <algorithm>

#include "common/log.h"

namespace tidal::engine {

using nlohmann::json;

Status CheckLoraFitsModel(const LoraSpec& lora, const ModelConfig& model) {
  auto targeted = [&](const char* m) {
    return std::find(lora.target_modules.begin(), lora.target_modules.end(), m) !=
           lora.target_modules.end();
  };
  if (model.moe.n_routed_experts > 0) {
    // The routed experts' adapters as PEFT makes them (ParamWrapper on transformers 5's fused
    // gate_up_proj / down_proj): gate and up are one parameter, and no dropout.
    if (targeted("gate_proj") != targeted("up_proj"))
      return InvalidArgument(
          "spec.lora.targetModules: gate_proj and up_proj of a mixture-of-experts model are one "
          "fused parameter of the routed experts (gate_up_proj); list both or neither");
    if (lora.dropout > 0 && (targeted("gate_proj") || targeted("down_proj")))
      return InvalidArgument(
          "spec.lora.dropout: " + json(lora.dropout).dump() +
          " — the routed experts' adapters (gate_proj/up_proj/down_proj on a mixture-of-experts "
          "model) take no dropout, as in PEFT; set 0 or target the attention only");
  }
  for (const std::string& m : lora.target_modules) {
    auto shapes = model.ProjectionShapes(m);
    // The routed experts' gate and up are one [2·inter, hidden] adapter at rank 2r.
    const bool fused = model.moe.n_routed_experts > 0 && (m == "gate_proj" || m == "up_proj");
    const int64_t rank = fused ? 2 * lora.rank : lora.rank;
    const std::string what = fused ? "the routed experts' gate_up_proj (gate_proj + up_proj)" : m;
    if (fused && !shapes.empty()) shapes = {{2 * shapes[0].first, shapes[0].second}};
    if (shapes.empty()) {
      std::string has;
      for (const auto& t : model.LoraTargets()) has += (has.empty() ? "" : ", ") + t;
      return InvalidArgument("spec.lora.targetModules: " + m + " is not a module of this " +
                             model.model_type + " model (its projections: " + has + ")");
    }
    for (const auto& [out, in] : shapes)
      if (rank > std::min(out, in))
        return InvalidArgument("spec.lora.rank: " + std::to_string(lora.rank) +
                               (fused ? " (" + std::to_string(rank) + " fused)" : std::string()) +
                               " exceeds the smaller side of " + what + " (" + std::to_string(out) +
                               " × " + std::to_string(in) + ") in this model; use a rank <= " +
                               std::to_string(std::min(out, in) / (fused ? 2 : 1)) + " or leave " +
                               m + " out of targetModules");
  }
  return OkStatus();
}

Status CheckTokenizerFitsModel(const TokenizerFacts& tokenizer, const ModelConfig& model,
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
  // config.json's bos_token_id only seeds generation; training begins documents with the
  // tokenizer's. They differ in real pairs: DeepSeek-R1-Distill-Qwen keeps Qwen2.5's config
  // (151643) under DeepSeek's tokenizer (<｜begin▁of▁sentence｜>, 151646). Said, not refused.
  if (tokenizer.bos_id && model.bos_token_id && *tokenizer.bos_id != *model.bos_token_id)
    LogWarn(
        "the data's tokenizer begins documents with another id than config.json's "
        "bos_token_id; training uses the tokenizer's",
        {{"tokenizer", tokenizer.description},
         {"tokenizer_bos_id", *tokenizer.bos_id},
         {"model", model_name},
         {"config_bos_token_id", *model.bos_token_id}});
  if (tokenizer.eos_id && !model.eos_token_ids.empty() &&
      std::find(model.eos_token_ids.begin(), model.eos_token_ids.end(), *tokenizer.eos_id) ==
          model.eos_token_ids.end())
    return InvalidArgument("spec.dataset: " + side + " ends documents with id " +
                           std::to_string(*tokenizer.eos_id) + " but " + other +
                           " has eos_token_id " + nlohmann::json(model.eos_token_ids).dump());
  return OkStatus();
}

Status CheckJobFitsModel(const TrainConfig& config, const ModelConfig& model,
                         const TokenizerFacts& tokenizer) {
  TIDAL_RETURN_IF_ERROR(CheckLoraFitsModel(config.lora, model));
  TIDAL_RETURN_IF_ERROR(CheckTokenizerFitsModel(
      tokenizer, model,
      config.model.uri.empty() ? "preset " + config.model.preset : config.model.uri));
  if (config.dataset.max_seq_len > model.max_position_embeddings)
    return InvalidArgument("spec.dataset.maxSeqLen: " + std::to_string(config.dataset.max_seq_len) +
                           " exceeds the model's max_position_embeddings " +
                           std::to_string(model.max_position_embeddings));
  return OkStatus();
}

}  // namespace tidal::engine
