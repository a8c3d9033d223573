// api/train_config.cc — typed, validated view of the spec. Every error collected
// names its field path; all of them are reported together.
#include "api/train_config.h"

#include <algorithm>
#include <limits>
#include <set>

#include "api/spec_limits.h"
#include "api/spec_section.h"
#include "common/log.h"

namespace tidal::engine {
namespace {

using nlohmann::json;
using spec::Section;

// Every projection some supported family has, in PEFT's names; CheckLoraFitsModel then
// refuses one the model at hand does not have.
const std::set<std::string> kTargetModules = {
    "q_proj",   "k_proj",    "v_proj",   "o_proj",   "gate_proj",
    "up_proj",  "down_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
    "kv_b_proj"};
// Sections of a TrainingJob spec that other components own (DESIGN.md §2).
const std::set<std::string> kForeignSections = {"replicas",      "elastic", "checkpoint", "anomaly",
                                                "restartPolicy", "suspend", "worker"};

}  // namespace

const std::set<std::string>& LoraTargetNames() { return kTargetModules; }

StatusOr<std::string> LocalPathFromUri(const std::string& uri, const std::string& base_dir,
                                       const std::string& field) {
  std::string path = uri;
  if (uri.rfind("file://", 0) == 0) {
    path = uri.substr(7);
  } else if (auto scheme = uri.find("://"); scheme != std::string::npos) {
    return InvalidArgument(field + ": scheme \"" + uri.substr(0, scheme) +
                           "\" is not supported by the local engine yet (use a path or file://)");
  }
  if (path.empty()) return InvalidArgument(field + ": empty path");
  if (path[0] != '/' && !base_dir.empty()) path = base_dir + "/" + path;
  return path;
}

Status TrainConfig::ValidateForWorldSize(int world_size) const {
  if (world_size < 1)
    return InvalidArgument("world size must be >= 1, got " + std::to_string(world_size));
  // Overflow-free: microBatchSize × world size can exceed int64 for values the spec's bounds
  // refuse, and this runs on whatever a caller built.
  const int64_t micro = optimization.micro_batch_size, global = optimization.global_batch_size;
  if (micro < 1 || global % micro != 0 || (global / micro) % world_size != 0) {
    const __int128 per_step = static_cast<__int128>(micro) * world_size;
    const std::string product = per_step > std::numeric_limits<int64_t>::max()
                                    ? std::string("more than 2^63")
                                    : std::to_string(static_cast<int64_t>(per_step));
    return InvalidArgument(
        "spec.optimization.globalBatchSize: " + std::to_string(optimization.global_batch_size) +
        " is not divisible by microBatchSize × world size = " +
        std::to_string(optimization.micro_batch_size) + " × " + std::to_string(world_size) + " = " +
        product +
        " (gradient accumulation must be a whole number; choose a world size that divides it)");
  }
  const GradientCompressionSpec& gc = optimization.gradient_compression;
  if (gc.enabled() && gc.groups > 0) {
    const int64_t micro_batches = global / micro;
    if (gc.groups % world_size != 0 || micro_batches % gc.groups != 0)
      return InvalidArgument(
          "spec.optimization.gradientCompression.groups: " + std::to_string(gc.groups) +
          " must be a multiple of the world size " + std::to_string(world_size) +
          " and divide globalBatchSize / microBatchSize = " + std::to_string(micro_batches) +
          " (each rank compresses whole groups of whole micro-batches)");
  }
  return OkStatus();
}

StatusOr<TrainConfig> TrainConfigFromJson(const json& input, const std::string& base_dir) {
  if (!input.is_object()) return InvalidArgument("config: expected a mapping at the top level");
  std::vector<std::string> errors;
  TrainConfig c;
  const json* spec = &input;
  if (input.contains("kind") || input.contains("apiVersion")) {
    const json kind = input.contains("kind") ? input["kind"] : json();
    if (!kind.is_string() || kind.get<std::string>() != "TrainingJob")
      return InvalidArgument("kind: expected TrainingJob, got " + kind.dump());
    if (!input.contains("spec") || !input["spec"].is_object())
      return InvalidArgument("spec: missing (a TrainingJob needs a spec)");
    spec = &input["spec"];
    if (input.contains("metadata") && input["metadata"].is_object()) {
      const json& metadata = input["metadata"];
      if (metadata.contains("name") && metadata["name"].is_string())
        c.name = metadata["name"].get<std::string>();
      if (metadata.contains("namespace") && metadata["namespace"].is_string())
        c.namespace_ = metadata["namespace"].get<std::string>();
    }
  }
  {
    Section root(*spec, "spec", errors);  // reports unknown top-level fields when it closes
    for (const auto& s : kForeignSections) root.Known(s);
    for (const char* s : {"model", "dataset", "lora", "optimization"}) root.Known(s);
    ReadEngineSections(*spec, base_dir, c, errors);
  }
  if (!errors.empty()) {
    std::string message = "invalid config (" + std::to_string(errors.size()) + " problem" +
                          (errors.size() > 1 ? "s" : "") + "):";
    for (const auto& e : errors) message += "\n  " + spec::OneLine(e);
    return InvalidArgument(message);
  }
  return c;
}

void ReadEngineSections(const json& spec_json, const std::string& base_dir, TrainConfig& c,
                        std::vector<std::string>& errors) {
  const json* spec = &spec_json;
  {
    Section model(*spec, "model", "spec", errors);
    model.String("uri", c.model.uri);
    model.String("preset", c.model.preset);
    model.Seed("seed", c.model.init_seed);
    if (c.model.uri.empty() == c.model.preset.empty())
      model.Error("", "set exactly one of uri (an HF-layout directory) or preset (" +
                          std::string("tiny | small | 1b | 7b)"));
    if (!c.model.preset.empty()) {
      const std::vector<std::string> presets = PresetNames();
      if (std::find(presets.begin(), presets.end(), c.model.preset) == presets.end())
        model.Error("preset", UnknownPreset(c.model.preset).message());
    }
    // A local path resolves against the config's folder; s3:// stays as it is (read by range).
    if (!c.model.uri.empty() && !c.model.uri.starts_with("s3://")) {
      auto path = LocalPathFromUri(c.model.uri, base_dir, "spec.model.uri");
      if (!path.ok())
        errors.push_back(path.status().message());
      else
        c.model.uri = *path;
    }
  }
  {
    Section dataset(*spec, "dataset", "spec", errors);
    if (!dataset.present()) dataset.Error("", "missing (need at least dataset.uri)");
    dataset.String("uri", c.dataset.uri);
    dataset.String("format", c.dataset.format);
    dataset.Int("maxSeqLen", c.dataset.max_seq_len);
    dataset.String("tokenizer", c.dataset.tokenizer);
    dataset.String("preparedUri", c.dataset.prepared_uri);
    dataset.String("overlong", c.dataset.overlong);
    dataset.Bool("packing", c.dataset.packing);
    dataset.Bool("strict", c.dataset.strict);
    if (dataset.present() && c.dataset.uri.empty()) dataset.Error("uri", "missing");
    // Local paths resolve against the config's folder; s3:// stays as it is.
    for (auto [key, uri] :
         {std::pair{"uri", &c.dataset.uri}, std::pair{"preparedUri", &c.dataset.prepared_uri},
          std::pair{"tokenizer", &c.dataset.tokenizer}}) {
      if (uri->empty() || uri->starts_with("s3://") || *uri == "bytes") continue;
      auto path = LocalPathFromUri(*uri, base_dir, std::string("spec.dataset.") + key);
      if (!path.ok())
        errors.push_back(path.status().message());
      else
        *uri = *path;
    }
    dataset.OneOf("format", c.dataset.format, {"text", "alpaca", "messages"});
    dataset.OneOf("overlong", c.dataset.overlong, {"truncate", "drop"});
    if (dataset.present()) {
      dataset.Known("loader");
      Section loader(*dataset.node(), "loader", "spec.dataset", errors);
      loader.Int("lookahead", c.dataset.lookahead);
      loader.String("cacheDir", c.dataset.cache_dir);
      loader.Int("cacheMaxMiB", c.dataset.cache_max_mib);
      loader.Int("warmupPercent", c.dataset.warmup_percent);
      loader.InRange("lookahead", c.dataset.lookahead, 1, 100000);
      loader.InRange("cacheMaxMiB", c.dataset.cache_max_mib, 1, int64_t{1} << 30);
      loader.InRange("warmupPercent", c.dataset.warmup_percent, 0, 100);
    }
    dataset.InRange("maxSeqLen", c.dataset.max_seq_len, 2, spec::kMaxSeqLen);
  }
  {
    Section lora(*spec, "lora", "spec", errors);
    lora.Int("rank", c.lora.rank);
    lora.Number("alpha", c.lora.alpha);
    lora.Number("dropout", c.lora.dropout);
    if (const json* targets = lora.Field("targetModules")) {
      if (!targets->is_array() || targets->empty()) {
        lora.Error("targetModules", "expected a non-empty list of module names");
      } else {
        c.lora.target_modules.clear();
        for (size_t i = 0; i < targets->size(); ++i) {
          const json& t = (*targets)[i];
          const std::string field = "targetModules[" + std::to_string(i) + "]";
          if (!t.is_string()) {
            lora.Error(field, "expected a string");
          } else if (!kTargetModules.count(t.get<std::string>())) {
            lora.Error(field, "unknown module \"" + t.get<std::string>() +
                                  "\" (expected q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                  "up_proj, down_proj, or under DeepSeek's latent attention "
                                  "q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj)");
          } else if (std::find(c.lora.target_modules.begin(), c.lora.target_modules.end(),
                               t.get<std::string>()) != c.lora.target_modules.end()) {
            lora.Error(field, "duplicate module \"" + t.get<std::string>() + "\"");
          } else {
            c.lora.target_modules.push_back(t.get<std::string>());
          }
        }
      }
    }
    lora.InRange("rank", c.lora.rank, 1, spec::kMaxLoraRank);
    if (!(c.lora.alpha > 0)) lora.Error("alpha", "must be > 0");
    if (!(c.lora.dropout >= 0 && c.lora.dropout < 1)) lora.Error("dropout", "must be in [0, 1)");
  }
  {
    auto& o = c.optimization;
    Section opt(*spec, "optimization", "spec", errors);
    int64_t stage = o.zero_stage;
    opt.Int("zeroStage", stage);
    o.zero_stage = static_cast<int>(stage);
    opt.String("offloadOptimizer", o.offload_optimizer);
    opt.String("precision", o.precision);
    opt.Int("globalBatchSize", o.global_batch_size);
    opt.IntOrAuto("microBatchSize", o.micro_batch_size, o.micro_batch_auto);
    // The loss and the gradient are those of microBatchSize 1 (every sequence's token mean,
    // averaged over the global batch), whatever size the engine then runs at.
    if (o.micro_batch_auto) o.micro_batch_size = 1;
    opt.Number("memoryTargetPercent", o.memory_target_percent);
    if (!(o.memory_target_percent > 0 && o.memory_target_percent <= 100))
      opt.Error("memoryTargetPercent",
                "must be in (0, 100], got " + json(o.memory_target_percent).dump());
    opt.Number("learningRate", o.learning_rate);
    opt.Number("minLRRatio", o.min_lr_ratio);
    opt.Number("weightDecay", o.weight_decay);
    opt.Number("beta1", o.beta1);
    opt.Number("beta2", o.beta2);
    opt.Number("eps", o.eps);
    opt.Number("gradClip", o.grad_clip);
    opt.Int("maxSteps", o.max_steps);
    opt.Seed("seed", o.seed);
    if (stage < 0 || stage > 3)
      opt.Error("zeroStage", "must be 0, 1, 2 or 3, got " + std::to_string(stage));
    opt.OneOf("offloadOptimizer", o.offload_optimizer, {"none", "cpu"});
    opt.OneOf("precision", o.precision, {"bf16", "fp16", "fp32"});
    opt.InRange("globalBatchSize", o.global_batch_size, 1, spec::kMaxGlobalBatchSize);
    opt.InRange("microBatchSize", o.micro_batch_size, 1, spec::kMaxMicroBatchSize);
    opt.InRange("maxSteps", o.max_steps, 1, spec::kMaxSteps);
    if (!(o.learning_rate > 0)) opt.Error("learningRate", "must be > 0");
    if (!(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1)) opt.Error("minLRRatio", "must be in [0, 1]");
    if (!(o.weight_decay >= 0)) opt.Error("weightDecay", "must be >= 0");
    if (!(o.beta1 >= 0 && o.beta1 < 1)) opt.Error("beta1", "must be in [0, 1)");
    if (!(o.beta2 >= 0 && o.beta2 < 1)) opt.Error("beta2", "must be in [0, 1)");
    if (!(o.eps > 0)) opt.Error("eps", "must be > 0");
    if (!(o.grad_clip >= 0)) opt.Error("gradClip", "must be >= 0 (0 disables clipping)");
    if (o.global_batch_size >= 1 && o.micro_batch_size >= 1 &&
        o.global_batch_size % o.micro_batch_size != 0)
      opt.Error("globalBatchSize", "must be a multiple of microBatchSize (" +
                                       std::to_string(o.micro_batch_size) + ")");
    {
      static const json kEmpty = json::object();
      Section warmup(opt.node() ? *opt.node() : kEmpty, "warmup", opt.path(), errors);
      opt.Known("warmup");
      warmup.Int("steps", o.warmup.steps);
      warmup.Bool("adaptive", o.warmup.adaptive);
      warmup.Int("window", o.warmup.window);
      warmup.Number("cvThreshold", o.warmup.cv_threshold);
      if (const json* extra = warmup.Field("maxExtraSteps")) {
        if (extra->is_number_integer() && extra->get<int64_t>() >= 0 &&
            extra->get<int64_t>() <= spec::kMaxSteps)
          o.warmup.max_extra_steps = extra->get<int64_t>();
        else
          warmup.Error("maxExtraSteps", "expected an integer in [0, " +
                                            std::to_string(spec::kMaxSteps) + "], got " +
                                            extra->dump());
      }
      warmup.InRange("steps", o.warmup.steps, 0, spec::kMaxSteps);
      warmup.InRange("window", o.warmup.window, 2, spec::kMaxWarmupWindow);
      if (!(o.warmup.cv_threshold > 0)) warmup.Error("cvThreshold", "must be > 0");
    }
    {
      static const json kEmpty = json::object();
      auto& gc = o.gradient_compression;
      Section compression(opt.node() ? *opt.node() : kEmpty, "gradientCompression", opt.path(),
                          errors);
      opt.Known("gradientCompression");
      compression.String("method", gc.method);
      compression.Number("ratio", gc.ratio);
      compression.Int("warmupSteps", gc.warmup_steps);
      compression.Int("groups", gc.groups);
      compression.OneOf("method", gc.method, {"none", "topk"});
      if (!(gc.ratio > 0 && gc.ratio <= 1))
        compression.Error("ratio",
                          "must be in (0, 1] (the share of each block's gradient "
                          "entries sent), got " +
                              json(gc.ratio).dump());
      compression.InRange("warmupSteps", gc.warmup_steps, 0, spec::kMaxSteps);
      compression.InRange("groups", gc.groups, 0, spec::kMaxGpus);
      // Stage 3 reduce-scatters each block's gradient inside backward, micro-batch by
      // micro-batch, and keeps only this rank's 1/W of the trainable weights: a residual is the
      // whole block's (every rank's error is spread over all of it), so keeping one would undo
      // the partition stage 3 exists for, and a selection per micro-batch would send more than
      // the one per step stages 0-2 make.
      if (gc.enabled() && stage == 3)
        compression.Error("method",
                          "topk needs zeroStage 0, 1 or 2: at stage 3 the gradient is "
                          "reduce-scattered inside backward, one micro-batch at a time, and each "
                          "rank keeps only its shard, while error feedback needs every rank's "
                          "whole-block residual (set zeroStage: 2, or method: none)");
    }
  }
}

std::vector<std::string> PresetNames() {
  return {"tiny",
          "small",
          "1b",
          "7b",
          "r1-distill-qwen-7b",
          "r1-distill-llama-8b",
          "r1-0528-qwen3-8b",
          "deepseek-v2-lite"};
}

Status UnknownPreset(const std::string& name) {
  std::string known;
  for (const auto& n : PresetNames()) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgument("unknown model preset \"" + name + "\" (expected one of: " + known + ")");
}

}  // namespace tidal::engine
