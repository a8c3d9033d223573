// worker/engine/job_fit.h — what of a TrainingJob's spec only the model can check: the LoRA
// targets and rank against the model's projections, the data's tokenizer against its
// embedding, maxSeqLen against its positions. The spec's own rules are api/train_config.h's.
#pragma once

#include <string>

#include "api/train_config.h"
#include "common/status.h"
#include "worker/engine/model_config.h"
#include "worker/engine/row_source.h"

namespace tidal::engine {

// A target module the model does not have (k_proj under DeepSeek's latent attention) would
// leave the adapter smaller than asked: refused naming it and the model's projections. A
// LoRA rank above the smaller side of a targeted projection (out × in) adds parameters and
// memory but no capacity: the update B·A cannot have a higher rank. Refused naming
// spec.lora.rank and the module, before anything is allocated.
Status CheckLoraFitsModel(const LoraSpec& lora, const ModelConfig& model);

// The data's tokenizer fits the model: no id at or beyond config.json's vocab_size, no more
// ids than the embedding table, BOS/EOS as config.json has them. Errors name both sides.
Status CheckTokenizerFitsModel(const TokenizerFacts& tokenizer, const ModelConfig& model,
                               const std::string& model_name);

// Everything of the spec that only the model can check, before anything is allocated: the
// LoRA rank, the tokenizer, maxSeqLen against max_position_embeddings. What the trainer checks
// before step 0 and a TrainingJob's data phase checks before any worker is created.
Status CheckJobFitsModel(const TrainConfig& config, const ModelConfig& model,
                         const TokenizerFacts& tokenizer);

}  // namespace tidal::engine
