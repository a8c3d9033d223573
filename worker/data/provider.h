// worker/data/provider.h — the DataProvider that tidal-train and tidal-worker hand their
// sessions: spec.dataset resolved to a token store (tidal-prep's, run first when the uri names
// JSONL), the model's tokenizer checked against it, and a RowLoader over it.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "api/train_config.h"
#include "worker/data/prep.h"
#include "worker/engine/row_source.h"
#include "worker/objstore/object_store.h"

namespace tidal::data {

class StoreDataProvider : public engine::DataProvider {
 public:
  explicit StoreDataProvider(objstore::S3Options s3) : s3_(std::move(s3)) {}
  // Logs prep progress (tidal-train, tidal-worker): (bytes done, total, samples, tokens).
  void set_progress(std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> progress) {
    progress_ = std::move(progress);
  }

  Status Prepare(const engine::TrainConfig& config) override;
  // A TrainingJob's data phase (tidal-prep --config): Prepare, then everything of the spec
  // only the model can check (engine::CheckJobFitsModel) against the model's config.json on
  // spec.model.uri (file:// or s3://) or the preset — before any worker is created.
  StatusOr<PrepResult> PrepareAndCheck(const engine::TrainConfig& config);
  StatusOr<std::unique_ptr<engine::RowSource>> Open(const engine::TrainConfig& config,
                                                    int rank) override;
  // A local path, or a file:// or s3:// prefix read by range (with this provider's S3 options).
  StatusOr<std::unique_ptr<engine::ModelFiles>> OpenModel(const std::string& uri) override;

 private:
  StatusOr<PrepResult> Resolve(const engine::TrainConfig& config, bool lookup_only);
  objstore::S3Options s3_;
  std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> progress_;
  // The last Resolve's encoder: the next one takes its tokenizer if tokenizer.json is the same
  // (rank 0 resolves in Prepare and again in Open; tidal-train's single process a third time).
  std::mutex encoder_mutex_;
  std::shared_ptr<const TextEncoder> encoder_;
};

// The tokenizer spec.dataset asks for: the model's own (model.uri's tokenizer.json), or the
// byte tokenizer for a preset or when spec.dataset.tokenizer is "bytes" — refused for a model
// that has a tokenizer of its own. Errors name the fields. `previous`: as
// TextEncoder::FromModelDirectory's.
StatusOr<std::unique_ptr<TextEncoder>> EncoderFor(const engine::TrainConfig& config,
                                                  const objstore::S3Options& s3,
                                                  const TextEncoder* previous = nullptr);

// A progress callback that logs tidal-prep's progress as JSON lines (percent, samples, tokens,
// tokens/s, ETA) at most every two seconds, and once at the end.
std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> LogPrepProgress();

// Where spec.dataset.uri's JSONL is prepared: spec.dataset.preparedUri, else <its
// folder>/.tidal-tokens.
std::string PreparedBase(const engine::DatasetSpec& dataset);

}  // namespace tidal::data
