// worker/engine/data.h — the collate step: rows of a token store (row_source.h,
// made by tidal-prep and read by the prefetching loader) into one micro-batch's tensors, and
// the check that the store's tokenizer fits the model. The only place data meets LibTorch.
//
// A packed row holds several documents: positions restart at 0 for each, and the attention
// mask is causal within a document and closed across documents, so a document's loss is the
// same packed or alone.
#pragma once

#include <cstdint>
#include <span>

#include <torch/torch.h>

#include "common/status.h"
#include "worker/engine/model_config.h"
#include "worker/engine/row_source.h"

namespace tidal::engine {

struct MicroBatch {
  torch::Tensor inputs;     // [micro, seq] int64
  torch::Tensor targets;    // [micro, seq] int64, -100 where not in the loss
  torch::Tensor positions;  // [micro, seq] int64, from 0 in every document
  // [micro, 1, seq, seq] bool, true where a query may attend to a key; undefined when every
  // row is one document (plain causal attention).
  torch::Tensor attention;
  int64_t tokens = 0;         // real (not padding) tokens
  int64_t target_tokens = 0;  // tokens in the loss
};

// `seq` is the longest row (rows are padded to it: inputs 0, targets -100).
MicroBatch Collate(std::span<const PackedRow> rows);

}  // namespace tidal::engine
