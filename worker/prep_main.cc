// tidal-prep: tokenizes a JSONL dataset once, with the model's own tokenizer and chat
// template, into a token store (worker/data/prep.h), or shows what a store will train on.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "common/environment.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/yaml_json.h"
#include "worker/data/provider.h"
#include "worker/engine/model_files.h"

namespace {

using tidal::Status;
using tidal::StatusOr;

constexpr const char* kUsage =
    "usage: tidal-prep --input URI --output URI [--format F] (--model URI | --tokenizer bytes)\n"
    "                  [--strict] [--threads N]\n"
    "       tidal-prep --config FILE.yaml [--result FILE] [--base-dir DIR]\n"
    "                  (what tidal-train or a TrainingJob would prepare, checked against the\n"
    "                  model; a TrainingJob's data phase runs this)\n"
    "       tidal-prep --inspect N --store URI (--model URI | --tokenizer bytes)\n"
    "       tidal-prep --checksum-model URI [--block-bytes N]\n"
    "                  (reads an HF model directory once and writes its block checksums,\n"
    "                  tidal.checksums.json, next to its shards: every range a worker then\n"
    "                  reads of them is verified)\n"
    "  --input      a JSONL object: /path, file:///path or s3://bucket/key\n"
    "  --format     text | alpaca | messages (default messages)\n"
    "  --output     where the store goes: <output>/<content hash> (file:// or s3://)\n"
    "  --model      an HF model directory holding tokenizer.json (+ tokenizer_config.json with\n"
    "               the chat template)\n"
    "  --tokenizer bytes  the byte tokenizer (Tidal's random-initialised presets)\n"
    "  --strict     a malformed record is fatal (default: skipped and reported with file:line)\n"
    "  --threads    tokenizing threads (default: every core)\n"
    "  --inspect N  print the store's first N samples as JSON lines: ids, loss mask, and the\n"
    "               decoded text with what the loss ignores between « »\n"
    "  --result FILE  (with --config) the outcome as one JSON object, also on failure: the\n"
    "               store and its counts, or the error and whether the spec must change\n"
    "               (a TrainingJob's prep pod writes its termination message)\n"
    "  --base-dir   (with --config) resolve relative paths there (default: the file's folder)\n"
    "  --block-bytes (with --checksum-model) bytes per checksum block (default 1 MiB; a rank\n"
    "               reads whole blocks, so smaller blocks read less beyond its own ranges)\n"
    "S3 settings come from AWS_* environment variables and TIDAL_S3_SECRET_DIR.\n";

struct Args {
  std::string input, output, format = "messages", model, tokenizer, config, store, result, base_dir,
                             checksum_model;
  bool strict = false;
  int threads = 0;
  std::optional<uint64_t> inspect;
  uint64_t block_bytes = tidal::engine::ModelChecksums::kDefaultBlockBytes;
};

StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return tidal::InvalidArgument("help");
    if (flag == "--strict") {
      args.strict = true;
      continue;
    }
    if (i + 1 >= argc) return tidal::InvalidArgument(flag + ": missing value");
    const std::string value = argv[++i];
    if (flag == "--input")
      args.input = value;
    else if (flag == "--output")
      args.output = value;
    else if (flag == "--format")
      args.format = value;
    else if (flag == "--model")
      args.model = value;
    else if (flag == "--tokenizer")
      args.tokenizer = value;
    else if (flag == "--config")
      args.config = value;
    else if (flag == "--store")
      args.store = value;
    else if (flag == "--result")
      args.result = value;
    else if (flag == "--base-dir")
      args.base_dir = value;
    else if (flag == "--checksum-model")
      args.checksum_model = value;
    else if (flag == "--threads") {
      TIDAL_ASSIGN_OR_RETURN(args.threads, tidal::ParseIntFlag<int>(flag, value, 1));
    } else if (flag == "--block-bytes") {
      TIDAL_ASSIGN_OR_RETURN(args.block_bytes, tidal::ParseIntFlag<uint64_t>(flag, value, 4096));
    } else if (flag == "--inspect") {
      TIDAL_ASSIGN_OR_RETURN(args.inspect, tidal::ParseIntFlag<uint64_t>(flag, value, 1));
    } else {
      return tidal::InvalidArgument("unknown flag " + flag);
    }
  }
  if (!args.tokenizer.empty() && args.tokenizer != "bytes")
    return tidal::InvalidArgument("--tokenizer: expected bytes, got \"" + args.tokenizer + "\"");
  if (!args.checksum_model.empty()) return args;
  if (args.inspect) {
    if (args.store.empty()) return tidal::InvalidArgument("--inspect needs --store URI");
  } else if (args.config.empty() && (args.input.empty() || args.output.empty())) {
    return tidal::InvalidArgument("give --config FILE, or --input URI and --output URI");
  }
  if (args.config.empty() && !(args.result.empty() && args.base_dir.empty()))
    return tidal::InvalidArgument("--result and --base-dir go with --config");
  if (!args.inspect && args.config.empty() && args.model.empty() == args.tokenizer.empty())
    return tidal::InvalidArgument("give exactly one of --model URI or --tokenizer bytes");
  return args;
}

std::string Resolve(const std::string& uri) {
  if (uri.empty() || uri.rfind("s3://", 0) == 0 || uri.rfind("file://", 0) == 0) return uri;
  return std::filesystem::absolute(uri).lexically_normal().string();
}

StatusOr<tidal::objstore::S3Options> S3For(std::initializer_list<std::string> uris) {
  const auto env = tidal::EnvironmentMap();
  const auto secret = env.find("TIDAL_S3_SECRET_DIR");
  for (const std::string& uri : uris)
    if (uri.rfind("s3://", 0) == 0)
      return tidal::objstore::S3OptionsFromEnv(secret == env.end() ? "" : secret->second, env);
  return tidal::objstore::S3Options{};
}

// Errors that only a change of the spec (or of the data or model it names) can cure; any
// other (an unreachable store, a damaged object) may pass on a retry.
bool SpecMustChange(const Status& status) {
  return status.code() == tidal::StatusCode::kInvalidArgument ||
         status.code() == tidal::StatusCode::kNotFound ||
         status.code() == tidal::StatusCode::kFailedPrecondition;
}

int Fail(const Status& status) {
  std::fprintf(stderr, "tidal-prep: %s\n", status.message().c_str());
  return SpecMustChange(status) ? 2 : 1;
}

// --result: one JSON object, at most 4096 bytes (what Kubernetes keeps of a termination
// message); a long error is cut, the object stays valid.
Status WriteResult(const std::string& path, nlohmann::json result) {
  if (path.empty()) return tidal::OkStatus();
  const auto replace = nlohmann::json::error_handler_t::replace;  // user bytes in an error
  std::string text = result.dump(-1, ' ', false, replace);
  if (text.size() > 4000 && result.contains("error")) {
    std::string error = result["error"];
    result["error"] = error.substr(0, 3000) + " …";  // a character cut in two becomes U+FFFD
    text = result.dump(-1, ' ', false, replace);
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return tidal::Unavailable("--result: cannot write " + path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) return tidal::Unavailable("--result: cannot write " + path);
  return tidal::OkStatus();
}

int FailWithResult(const Status& status, const std::string& result_path) {
  if (Status w = WriteResult(
          result_path, {{"error", status.message()}, {"invalidSpec", SpecMustChange(status)}});
      !w.ok())
    std::fprintf(stderr, "tidal-prep: %s\n", w.message().c_str());
  return Fail(status);
}

void PrintResult(const tidal::data::PrepResult& r) {
  const auto& m = r.manifest;
  nlohmann::json line = {{"store", r.store_uri},
                         {"reused", r.reused},
                         {"samples", m.samples},
                         {"tokens", m.tokens},
                         {"trained_tokens", m.trained_tokens},
                         {"tokenizer", m.tokenizer.description},
                         {"report", m.report}};
  std::printf("%s\n", line.dump().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) {
    if (args.status().message() != "help")
      std::fprintf(stderr, "tidal-prep: %s\n", args.status().message().c_str());
    std::fputs(kUsage, stderr);
    return args.status().message() == "help" ? 0 : 2;
  }
  const std::string model = Resolve(args->model);

  if (!args->checksum_model.empty()) {
    std::string uri = Resolve(args->checksum_model);
    if (uri.find("://") == std::string::npos) uri = "file://" + uri;
    auto s3 = S3For({uri});
    if (!s3.ok()) return Fail(s3.status());
    tidal::data::StoreDataProvider provider(*s3);
    auto files = provider.OpenModel(uri);
    if (!files.ok()) return Fail(files.status());
    auto last = std::chrono::steady_clock::now();
    const auto start = last;
    auto sums = tidal::engine::ComputeModelChecksums(
        **files, args->block_bytes, [&](uint64_t done, uint64_t total) {
          const auto now = std::chrono::steady_clock::now();
          if (now - last < std::chrono::seconds(2) && done < total) return;
          last = now;
          const double seconds = std::chrono::duration<double>(now - start).count();
          tidal::LogInfo(
              "checksumming model",
              {{"model", uri},
               {"bytes", done},
               {"total_bytes", total},
               {"percent", std::round(1000.0 * done / std::max<uint64_t>(total, 1)) / 10},
               {"mb_per_s", std::round(done / 1e6 / std::max(seconds, 1e-9))}});
        });
    if (!sums.ok()) return Fail(sums.status());
    auto store = tidal::objstore::OpenObjectStore(uri, *s3);
    if (!store.ok()) return Fail(store.status());
    if (Status put = (*store)->Put(tidal::engine::ModelChecksums::kFileName, sums->ToJson());
        !put.ok())
      return Fail(put);
    uint64_t bytes = 0;
    for (const auto& [name, file] : sums->files) bytes += file.size;
    std::printf(
        "%s\n",
        nlohmann::json({{"checksums", (*files)->Describe(tidal::engine::ModelChecksums::kFileName)},
                        {"files", sums->files.size()},
                        {"bytes", bytes},
                        {"blockBytes", sums->block_bytes}})
            .dump()
            .c_str());
    return 0;
  }

  if (!args->config.empty()) {  // what a run of this config would prepare, and the checks
    const std::string& result_path = args->result;
    auto doc = tidal::ReadYamlFile(args->config);
    if (!doc.ok()) return FailWithResult(doc.status(), result_path);
    auto config = tidal::engine::TrainConfigFromJson(
        *doc, args->base_dir.empty()
                  ? std::filesystem::absolute(args->config).parent_path().string()
                  : args->base_dir);
    if (!config.ok()) return FailWithResult(config.status(), result_path);
    auto s3 = S3For({config->dataset.uri, config->dataset.prepared_uri, config->model.uri});
    if (!s3.ok()) return FailWithResult(s3.status(), result_path);
    tidal::data::StoreDataProvider provider(*s3);
    provider.set_progress(tidal::data::LogPrepProgress());
    auto prepared = provider.PrepareAndCheck(*config);
    if (!prepared.ok()) return FailWithResult(prepared.status(), result_path);
    PrintResult(*prepared);
    const auto& m = prepared->manifest;
    if (Status w = WriteResult(result_path, {{"store", prepared->store_uri},
                                             {"reused", prepared->reused},
                                             {"samples", m.samples},
                                             {"tokens", m.tokens},
                                             {"trainedTokens", m.trained_tokens},
                                             {"contentHash", m.content_hash},
                                             {"tokenizer", m.tokenizer.description}});
        !w.ok())
      return Fail(w);
    return 0;
  }

  auto s3 = S3For({args->input, args->output, args->store, model});
  if (!s3.ok()) return Fail(s3.status());
  auto encoder =
      model.empty()
          ? StatusOr<std::unique_ptr<tidal::data::TextEncoder>>(tidal::data::TextEncoder::Bytes())
          : tidal::data::TextEncoder::FromModelDirectory(model, *s3);
  if (!encoder.ok()) return Fail(encoder.status());

  if (args->inspect) {
    auto samples = tidal::data::InspectStore(Resolve(args->store), *args->inspect, **encoder, *s3);
    if (!samples.ok()) return Fail(samples.status());
    for (const auto& sample : *samples) std::printf("%s\n", sample.dump().c_str());
    return 0;
  }

  tidal::data::PrepOptions options;
  options.input_uri = Resolve(args->input);
  options.output_uri = Resolve(args->output);
  options.format = args->format;
  options.strict = args->strict;
  options.threads = args->threads;
  options.progress = tidal::data::LogPrepProgress();
  auto result = tidal::data::Prepare(options, **encoder, *s3);
  if (!result.ok()) return Fail(result.status());
  PrintResult(*result);
  return 0;
}
