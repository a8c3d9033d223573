// worker/export_main.cc — `tidal-export`: a checkpoint as a Hugging Face PEFT adapter, or merged
// into its base model as a plain HF model directory.
//   tidal-export --checkpoint URI [--step N] --out DEST [--base-model NAME]
//   tidal-export --merge --checkpoint URI [--step N] --out DIR [--base-model DIR]
//                [--dtype fp32|bf16|fp16] [--max-shard-bytes B]
// Prints one JSON line saying what it wrote on stdout; errors on stderr, exit 2 for bad usage.
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/environment.h"
#include "common/flags.h"
#include "worker/checkpoint/merge_export.h"
#include "worker/checkpoint/peft_export.h"
#include "worker/checkpoint/repository.h"
#include "worker/objstore/object_store.h"

namespace {

using tidal::Status;
using tidal::StatusOr;

constexpr const char* kUsage =
    "usage: tidal-export --checkpoint URI [--step N] --out DEST [--base-model NAME]\n"
    "       tidal-export --merge --checkpoint URI [--step N] --out DIR [--base-model DIR]\n"
    "                    [--dtype fp32|bf16|fp16] [--max-shard-bytes B]\n"
    "  --checkpoint  where the checkpoints are (file:///dir, /dir, s3://bucket/prefix; S3\n"
    "                settings from AWS_* env vars)\n"
    "  --step        the checkpoint to export (default: the newest usable one)\n"
    "  --out         adapter: a directory or store URI for adapter_model.safetensors and\n"
    "                adapter_config.json; --merge: a directory for the merged HF model\n"
    "  --base-model  adapter: base_model_name_or_path to record (default: the model the job\n"
    "                trained on); --merge: the base model's HF directory, when it moved\n"
    "  --merge       fold the adapter into the base weights (W + alpha/r * B A)\n"
    "  --dtype       merged weights' dtype (default: the base model's; fp32 for a preset)\n"
    "  --max-shard-bytes  split merged weights into shards of at most B bytes (default 5e9)\n";

struct Args {
  std::string checkpoint, out;
  std::optional<int64_t> step;
  std::optional<std::string> base_model;
  bool merge = false;
  tidal::checkpoint::MergeOptions merge_options;
};

StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args args;
  bool dtype_given = false, shard_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return tidal::InvalidArgument("help");
    if (flag == "--merge") {
      args.merge = true;
      continue;
    }
    if (i + 1 >= argc) return tidal::InvalidArgument(flag + ": missing value");
    const std::string value = argv[++i];
    if (flag == "--checkpoint") {
      args.checkpoint = value;
    } else if (flag == "--out") {
      args.out = value;
    } else if (flag == "--step") {
      TIDAL_ASSIGN_OR_RETURN(args.step, tidal::ParseIntFlag<int64_t>(flag, value, 0));
    } else if (flag == "--base-model") {
      args.base_model = value;
    } else if (flag == "--dtype") {
      args.merge_options.dtype = value;
      dtype_given = true;
    } else if (flag == "--max-shard-bytes") {
      TIDAL_ASSIGN_OR_RETURN(args.merge_options.max_shard_bytes,
                             tidal::ParseIntFlag<int64_t>(flag, value, 1));
      shard_given = true;
    } else {
      return tidal::InvalidArgument("unknown flag " + flag);
    }
  }
  if (args.checkpoint.empty()) return tidal::InvalidArgument("--checkpoint is required");
  if (args.out.empty()) return tidal::InvalidArgument("--out is required");
  if (!args.merge && (dtype_given || shard_given))
    return tidal::InvalidArgument("--dtype/--max-shard-bytes: only with --merge");
  if (args.merge && args.out.find("://") != std::string::npos && args.out.rfind("file://", 0) != 0)
    return tidal::InvalidArgument("--out: --merge writes a local directory, got \"" + args.out +
                                  "\"");
  if (args.merge) args.merge_options.base_uri = args.base_model;
  return args;
}

StatusOr<tidal::objstore::S3Options> S3For(const std::string& uri) {
  if (uri.rfind("s3://", 0) != 0) return tidal::objstore::S3Options{};
  return tidal::objstore::S3OptionsFromEnv("", tidal::EnvironmentMap());
}

StatusOr<nlohmann::json> Run(const Args& args) {
  TIDAL_ASSIGN_OR_RETURN(auto s3, S3For(args.checkpoint));
  TIDAL_ASSIGN_OR_RETURN(auto store, tidal::objstore::OpenObjectStore(args.checkpoint, s3));
  tidal::checkpoint::Repository repo(*store);
  if (args.merge) {
    std::string dir = args.out;
    if (dir.rfind("file://", 0) == 0) dir = dir.substr(7);
    TIDAL_ASSIGN_OR_RETURN(
        auto report, tidal::checkpoint::ExportMerged(repo, args.step, dir, args.merge_options));
    return nlohmann::json{{"merged", dir},
                          {"step", report.step},
                          {"tensors", report.tensors},
                          {"adaptedWeights", report.merged},
                          {"bytes", report.bytes},
                          {"dtype", report.dtype}};
  }
  TIDAL_ASSIGN_OR_RETURN(auto out_s3, S3For(args.out));
  TIDAL_ASSIGN_OR_RETURN(auto out, tidal::objstore::OpenObjectStore(args.out, out_s3));
  TIDAL_ASSIGN_OR_RETURN(auto exported, tidal::checkpoint::ExportPeftAdapter(repo, args.step, *out,
                                                                             "", args.base_model));
  return nlohmann::json{{"adapter", out->uri()},
                        {"step", exported.step},
                        {"tensors", exported.tensors},
                        {"bytes", exported.bytes}};
}

}  // namespace

int main(int argc, char** argv) {
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) {
    const bool help = args.status().message() == "help";
    if (!help) std::fprintf(stderr, "tidal-export: %s\n", args.status().message().c_str());
    std::fputs(kUsage, stderr);
    return help ? 0 : 2;
  }
  auto result = Run(*args);
  if (!result.ok()) {
    std::fprintf(stderr, "tidal-export: %s\n", result.status().message().c_str());
    return result.status().code() == tidal::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("%s\n", result->dump().c_str());
  return 0;
}
