// tidal-prep: tokenizes a JSONL dataset once, with the model's own tokenizer and chat
// template, into a token store (worker/data/prep.h), or shows what a store will train on.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "common/environment.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/yaml_json.h"
#include "worker/data/provider.h"

namespace {

using tidal::Status;
using tidal::StatusOr;

constexpr const char* kUsage =
    "usage: tidal-prep --input URI --output URI [--format F] (--model URI | --tokenizer bytes)\n"
    "                  [--strict] [--threads N]\n"
    "       tidal-prep --config FILE.yaml      (what tidal-train or a TrainingJob would prepare)\n"
    "       tidal-prep --inspect N --store URI (--model URI | --tokenizer bytes)\n"
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
    "S3 settings come from AWS_* environment variables.\n";

struct Args {
  std::string input, output, format = "messages", model, tokenizer, config, store;
  bool strict = false;
  int threads = 0;
  std::optional<uint64_t> inspect;
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
    else if (flag == "--threads") {
      TIDAL_ASSIGN_OR_RETURN(args.threads, tidal::ParseIntFlag<int>(flag, value, 1));
    } else if (flag == "--inspect") {
      TIDAL_ASSIGN_OR_RETURN(args.inspect, tidal::ParseIntFlag<uint64_t>(flag, value, 1));
    } else {
      return tidal::InvalidArgument("unknown flag " + flag);
    }
  }
  if (!args.tokenizer.empty() && args.tokenizer != "bytes")
    return tidal::InvalidArgument("--tokenizer: expected bytes, got \"" + args.tokenizer + "\"");
  if (args.inspect) {
    if (args.store.empty()) return tidal::InvalidArgument("--inspect needs --store URI");
  } else if (args.config.empty() && (args.input.empty() || args.output.empty())) {
    return tidal::InvalidArgument("give --config FILE, or --input URI and --output URI");
  }
  if (!args.inspect && args.config.empty() && args.model.empty() == args.tokenizer.empty())
    return tidal::InvalidArgument("give exactly one of --model URI or --tokenizer bytes");
  return args;
}

std::string Resolve(const std::string& uri) {
  if (uri.empty() || uri.rfind("s3://", 0) == 0 || uri.rfind("file://", 0) == 0) return uri;
  return std::filesystem::absolute(uri).lexically_normal().string();
}

StatusOr<tidal::objstore::S3Options> S3For(std::initializer_list<std::string> uris) {
  for (const std::string& uri : uris)
    if (uri.rfind("s3://", 0) == 0)
      return tidal::objstore::S3OptionsFromEnv("", tidal::EnvironmentMap());
  return tidal::objstore::S3Options{};
}

int Fail(const Status& status) {
  std::fprintf(stderr, "tidal-prep: %s\n", status.message().c_str());
  return status.code() == tidal::StatusCode::kInvalidArgument ? 2 : 1;
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

  if (!args->config.empty()) {  // what a run of this config would prepare, and the checks
    auto doc = tidal::ReadYamlFile(args->config);
    if (!doc.ok()) return Fail(doc.status());
    auto config = tidal::engine::TrainConfigFromJson(
        *doc, std::filesystem::absolute(args->config).parent_path().string());
    if (!config.ok()) return Fail(config.status());
    auto s3 = S3For({config->dataset.uri, config->dataset.prepared_uri, config->model.uri});
    if (!s3.ok()) return Fail(s3.status());
    tidal::data::StoreDataProvider provider(*s3);
    provider.set_progress(tidal::data::LogPrepProgress());
    if (Status s = provider.Prepare(*config); !s.ok()) return Fail(s);
    std::printf("%s\n", nlohmann::json({{"prepared", config->dataset.uri}}).dump().c_str());
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
