#include "worker/data/provider.h"

#include <chrono>
#include <cmath>
#include <optional>

#include "common/log.h"
#include "worker/data/loader.h"
#include "worker/engine/job_fit.h"
#include "worker/engine/model_config.h"

namespace tidal::data {

std::function<void(uint64_t, uint64_t, uint64_t, uint64_t)> LogPrepProgress() {
  using Clock = std::chrono::steady_clock;
  struct State {
    Clock::time_point start = Clock::now();
    std::optional<Clock::time_point> last;
  };
  auto state = std::make_shared<State>();
  return [state](uint64_t done, uint64_t total, uint64_t samples, uint64_t tokens) {
    const auto now = Clock::now();
    if (done < total && state->last && now - *state->last < std::chrono::seconds(2)) return;
    state->last = now;
    const double seconds = std::chrono::duration<double>(now - state->start).count();
    const double fraction = total ? static_cast<double>(done) / static_cast<double>(total) : 1;
    LogInfo("tokenizing the dataset",
            {{"percent", std::round(1000 * fraction) / 10},
             {"samples", samples},
             {"tokens", tokens},
             {"tokens_per_s", seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0},
             {"eta_seconds", fraction > 0 ? seconds * (1 - fraction) / fraction : 0.0}});
  };
}

std::string PreparedBase(const engine::DatasetSpec& dataset) {
  if (!dataset.prepared_uri.empty()) return dataset.prepared_uri;
  auto where = SplitObjectUri(dataset.uri);
  return (where.ok() ? where->first : dataset.uri) + "/.tidal-tokens";
}

StatusOr<std::unique_ptr<TextEncoder>> EncoderFor(const engine::TrainConfig& config,
                                                  const objstore::S3Options& s3,
                                                  const TextEncoder* previous) {
  const std::string& model = config.model.uri;
  const std::string& tokenizer = config.dataset.tokenizer;
  if (!tokenizer.empty() && tokenizer != "bytes") {
    if (!model.empty())
      return InvalidArgument("spec.dataset.tokenizer: " + tokenizer +
                             ": a tokenizer directory is for a preset (random-initialised) "
                             "model; spec.model.uri " +
                             model + " brings its own");
    auto encoder = TextEncoder::FromModelDirectory(tokenizer, s3, previous);
    if (!encoder.ok())
      return Status(encoder.status().code(),
                    "spec.dataset.tokenizer: " + encoder.status().message());
    return encoder;
  }
  if (model.empty()) return TextEncoder::Bytes();  // a random-initialised preset
  auto encoder = TextEncoder::FromModelDirectory(model, s3, previous);
  if (config.dataset.tokenizer == "bytes") {
    if (encoder.ok())
      return InvalidArgument("spec.dataset.tokenizer: bytes, but spec.model.uri " + model +
                             " has its own tokenizer (" + (*encoder)->Facts().description +
                             "): byte ids mean nothing to that model; remove "
                             "spec.dataset.tokenizer to train with the model's tokenizer");
    if (encoder.status().code() != StatusCode::kNotFound) return encoder.status();
    return TextEncoder::Bytes();
  }
  if (!encoder.ok())
    return Status(encoder.status().code(), "spec.model.uri: " + encoder.status().message());
  return encoder;
}

StatusOr<PrepResult> StoreDataProvider::Resolve(const engine::TrainConfig& config,
                                                bool lookup_only) {
  std::shared_ptr<const TextEncoder> encoder;
  {
    std::shared_ptr<const TextEncoder> previous;
    {
      std::lock_guard<std::mutex> lock(encoder_mutex_);
      previous = encoder_;
    }
    TIDAL_ASSIGN_OR_RETURN(encoder, EncoderFor(config, s3_, previous.get()));
    std::lock_guard<std::mutex> lock(encoder_mutex_);
    encoder_ = encoder;
  }
  TIDAL_ASSIGN_OR_RETURN(bool is_store, IsTokenStore(config.dataset.uri, s3_));
  PrepResult result;
  if (is_store) {
    TIDAL_ASSIGN_OR_RETURN(auto store, objstore::OpenObjectStore(config.dataset.uri, s3_));
    TIDAL_ASSIGN_OR_RETURN(auto manifest, ReadStoreManifest(*store));
    if (!manifest)
      return NotFound("spec.dataset.uri: " + config.dataset.uri + " lost its manifest.json");
    result.store_uri = config.dataset.uri;
    result.reused = true;
    result.manifest = std::move(*manifest);
  } else {
    PrepOptions options;
    options.input_uri = config.dataset.uri;
    options.format = config.dataset.format;
    options.output_uri = PreparedBase(config.dataset);
    options.strict = config.dataset.strict;
    options.lookup_only = lookup_only;
    options.progress = progress_;
    TIDAL_ASSIGN_OR_RETURN(result, data::Prepare(options, *encoder, s3_));
  }
  // The rows must be in the model's tokens: the store's tokenizer is the one the model names.
  const engine::TokenizerFacts& used = result.manifest.tokenizer;
  const engine::TokenizerFacts wanted = encoder->Facts();
  if (used.fingerprint != wanted.fingerprint)
    return InvalidArgument(
        "spec.dataset.uri: the token store " + result.store_uri + " was tokenized with " +
        used.description + " (" + used.kind + ", fingerprint " + used.fingerprint +
        ") but the model " +
        (config.model.uri.empty() ? "preset " + config.model.preset : config.model.uri) + " uses " +
        wanted.description + " (fingerprint " + wanted.fingerprint +
        "): prepare the data with the model's tokenizer");
  if (result.manifest.source_format != config.dataset.format)
    return InvalidArgument("spec.dataset.format: " + config.dataset.format +
                           ", but the token store " + result.store_uri + " holds " +
                           result.manifest.source_format + " records");
  return result;
}

namespace {

// An HF model directory under an object store prefix (file:// or s3://), read by range.
class ObjectStoreModelFiles : public engine::ModelFiles {
 public:
  explicit ObjectStoreModelFiles(std::unique_ptr<objstore::ObjectStore> store)
      : store_(std::move(store)) {}
  std::string Describe(const std::string& name) const override {
    return store_->uri() + "/" + name;
  }
  StatusOr<std::string> Read(const std::string& name) override { return store_->Get(name); }
  StatusOr<uint64_t> Size(const std::string& name) override { return store_->Size(name); }
  Status ReadRange(const std::string& name, uint64_t offset, uint64_t length, char* dest) override {
    return store_->GetRangeInto(name, offset, length, dest).WithContext(Describe(name));
  }

 private:
  std::unique_ptr<objstore::ObjectStore> store_;
};

}  // namespace

StatusOr<std::unique_ptr<engine::ModelFiles>> StoreDataProvider::OpenModel(const std::string& uri) {
  if (uri.find("://") == std::string::npos) return engine::LocalModelFiles(uri);
  TIDAL_ASSIGN_OR_RETURN(auto store, objstore::OpenObjectStore(uri, s3_));
  return std::unique_ptr<engine::ModelFiles>(new ObjectStoreModelFiles(std::move(store)));
}

Status StoreDataProvider::Prepare(const engine::TrainConfig& config) {
  return Resolve(config, /*lookup_only=*/false).status();
}

StatusOr<PrepResult> StoreDataProvider::PrepareAndCheck(const engine::TrainConfig& config) {
  TIDAL_ASSIGN_OR_RETURN(PrepResult prepared, Resolve(config, /*lookup_only=*/false));
  engine::ModelConfig model;
  if (config.model.uri.empty()) {
    TIDAL_ASSIGN_OR_RETURN(model, engine::PresetModelConfig(config.model.preset));
  } else {
    auto read = [&]() -> StatusOr<engine::ModelConfig> {
      TIDAL_ASSIGN_OR_RETURN(auto store, objstore::OpenObjectStore(config.model.uri, s3_));
      TIDAL_ASSIGN_OR_RETURN(std::string text, store->Get("config.json"));
      const auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (json.is_discarded()) return InvalidArgument("config.json is not valid JSON");
      return engine::ModelConfigFromHfJson(json);
    };
    auto read_model = read();
    if (!read_model.ok())
      return Status(read_model.status().code(),
                    "spec.model.uri: " + config.model.uri + ": " + read_model.status().message());
    model = std::move(*read_model);
  }
  TIDAL_RETURN_IF_ERROR(engine::CheckJobFitsModel(config, model, prepared.manifest.tokenizer));
  return prepared;
}

StatusOr<std::unique_ptr<engine::RowSource>> StoreDataProvider::Open(
    const engine::TrainConfig& config, int rank) {
  TIDAL_ASSIGN_OR_RETURN(PrepResult prepared, Resolve(config, /*lookup_only=*/rank != 0));
  TIDAL_ASSIGN_OR_RETURN(auto store, objstore::OpenObjectStore(prepared.store_uri, s3_));
  PackingOptions packing;
  packing.seq_len = config.dataset.max_seq_len;
  packing.overlong = config.dataset.overlong == "drop" ? Overlong::kDrop : Overlong::kTruncate;
  packing.pack = config.dataset.packing;
  packing.seed = config.optimization.seed;
  CacheOptions cache;
  cache.dir = config.dataset.cache_dir;
  cache.max_bytes = static_cast<uint64_t>(config.dataset.cache_max_mib) << 20;
  LoaderOptions loader;
  loader.lookahead = config.dataset.lookahead;
  TIDAL_ASSIGN_OR_RETURN(auto rows, RowLoader::Open(std::move(store), packing, cache, loader));
  const PackingPlan& plan = rows->plan();
  if (rank == 0)
    LogInfo("training rows",
            {{"store", prepared.store_uri},
             {"samples", rows->manifest().samples},
             {"rows", plan.rows()},
             {"row_tokens", packing.seq_len},
             {"utilisation", std::round(1000 * plan.Utilisation(packing.seq_len)) / 1000},
             {"truncated", plan.truncated},
             {"dropped", plan.dropped},
             {"too_short", plan.too_short}});
  return std::unique_ptr<engine::RowSource>(std::move(rows));
}

}  // namespace tidal::data
