// tests/unit/data/tokenizer_test.cc — worker/data/tokenizer on tiny hand-written tokenizer.json
// documents (no Python): each component's behaviour, and the errors for what is not supported
// or malformed. tests/integration/data/tokenizer_oracle_test.cc compares with HF on real files.
#include "worker/data/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/data/tokenizer_internal.h"

namespace tidal::data {
namespace {

using nlohmann::json;

// A byte-level BPE: "h e l l o" merge to "hello", "Ġ w o r l d" to "Ġworld".
json ByteLevelJson() {
  json vocab = json::object();
  int id = 0;
  for (const char* t :
       {"h", "e", "l",  "o",  "w",    "r",     "d",  "Ġ",  "1",    "2",  "3",      "4",  "ä",
        "Ã", "¤", "he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld", "Ġworld", "12", "123"}) {
    vocab[t] = id++;
  }
  return {{"version", "1.0"},
          {"added_tokens",
           json::array({{{"id", 26}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                        {{"id", 27},
                         {"content", "<mask>"},
                         {"special", false},
                         {"lstrip", true},
                         {"normalized", false}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array(
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", "\\p{N}{1,3}| ?\\p{L}+|\\s+"}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {26}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", json::array({"h e", "l l", "he ll", "hell o", json::array({"Ġ", "w"}), "o r",
                                    "Ġw or", "l d", "Ġwor ld", "1 2", "12 3"})}}}};
}

Tokenizer MustLoad(const json& document) {
  auto tokenizer = Tokenizer::FromJson(document.dump());
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  return std::move(tokenizer).value();
}

std::string LoadError(const json& document) {
  auto tokenizer = Tokenizer::FromJson(document.dump());
  EXPECT_FALSE(tokenizer.ok());
  if (tokenizer.ok()) return "";
  EXPECT_EQ(tokenizer.status().code(), StatusCode::kInvalidArgument);
  return tokenizer.status().message();
}

TEST(TokenizerTest, ByteLevelBpeMergesByRankAndAddsTemplateBos) {
  const Tokenizer tokenizer = MustLoad(ByteLevelJson());
  const Encoding encoding = tokenizer.Encode("hello world", /*add_special_tokens=*/true);
  EXPECT_EQ(encoding.ids, (std::vector<uint32_t>{26, 18, 23}));
  using Offsets = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(encoding.offsets, (Offsets{{0, 0}, {0, 5}, {5, 11}}));
  EXPECT_EQ(tokenizer.EncodeIds("hello world", false), (std::vector<uint32_t>{18, 23}));
}

TEST(TokenizerTest, DigitsSplitInRunsOfThreeAndMerge) {
  const Tokenizer tokenizer = MustLoad(ByteLevelJson());
  EXPECT_EQ(tokenizer.EncodeIds("12341", false), (std::vector<uint32_t>{25, 11, 8}));
}

TEST(TokenizerTest, MultiByteCharacterTokensCoverTheWholeCharacter) {
  const Tokenizer tokenizer = MustLoad(ByteLevelJson());
  // "ä" is C3 A4: byte tokens "Ã" and "¤", both with the character's offsets.
  const Encoding encoding = tokenizer.Encode("\xC3\xA4", false);
  EXPECT_EQ(encoding.ids, (std::vector<uint32_t>{13, 14}));
  using Offsets = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(encoding.offsets, (Offsets{{0, 2}, {0, 2}}));
  EXPECT_EQ(tokenizer.Decode(encoding.ids, false), "\xC3\xA4");
}

TEST(TokenizerTest, AddedTokensMatchBeforeSplittingAndLstripTakesSpaces) {
  const Tokenizer tokenizer = MustLoad(ByteLevelJson());
  const Encoding encoding = tokenizer.Encode("hello  <mask><s>", false);
  EXPECT_EQ(encoding.ids, (std::vector<uint32_t>{18, 27, 26}));
  using Offsets = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(encoding.offsets, (Offsets{{0, 5}, {5, 13}, {13, 16}}));
  EXPECT_EQ(tokenizer.Decode(encoding.ids, /*skip_special_tokens=*/true), "hello<mask>");
  EXPECT_EQ(tokenizer.Decode(encoding.ids, /*skip_special_tokens=*/false), "hello<mask><s>");
}

TEST(TokenizerTest, InvalidUtf8BecomesReplacementCharacterWithOriginalOffsets) {
  const Tokenizer tokenizer = MustLoad(ByteLevelJson());
  // "he" + invalid E4 B8 (one maximal subpart) + "h": U+FFFD has no byte tokens in this vocab
  // (EF BF BD), so only offsets of the surrounding tokens are checked.
  const Encoding encoding = tokenizer.Encode("he\xE4\xB8h", false);
  ASSERT_FALSE(encoding.ids.empty());
  EXPECT_EQ(encoding.ids.front(), 15u);
  EXPECT_EQ(encoding.offsets.front(), (std::pair<uint32_t, uint32_t>{0, 2}));
  EXPECT_EQ(encoding.offsets.back(), (std::pair<uint32_t, uint32_t>{4, 5}));
}

TEST(TokenizerTest, LookupsAndDescription) {
  const Tokenizer tokenizer = MustLoad(ByteLevelJson());
  EXPECT_EQ(tokenizer.TokenToId("hello"), 18u);
  EXPECT_EQ(tokenizer.TokenToId("<s>"), 26u);
  EXPECT_EQ(tokenizer.TokenToId("nope"), std::nullopt);
  EXPECT_EQ(tokenizer.IdToToken(23), "Ġworld");
  EXPECT_EQ(tokenizer.IdToToken(27), "<mask>");
  EXPECT_EQ(tokenizer.IdToToken(1000), std::nullopt);
  EXPECT_EQ(tokenizer.vocab_size(), 28u);
  EXPECT_TRUE(tokenizer.IsSpecial(26));
  EXPECT_FALSE(tokenizer.IsSpecial(27));
  EXPECT_FALSE(tokenizer.IsSpecial(18));
  EXPECT_EQ(tokenizer.Describe(), "BPE (byte-level), 28 ids, 2 added tokens");
}

TEST(TokenizerTest, EncodeIsSafeFromManyThreadsAtOnce) {
  const Tokenizer tokenizer = MustLoad(ByteLevelJson());
  const std::vector<uint32_t> expected = tokenizer.EncodeIds("hello world 123 hello", false);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        if (tokenizer.EncodeIds("hello world 123 hello", false) != expected) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, (std::vector<int>{0, 0, 0, 0}));
}

// A SentencePiece-style BPE: Prepend + Replace normalizers, byte fallback, unk fusing.
json SentencePieceJson() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"▁", 2}, {"h", 3}, {"i", 4}, {"▁h", 5}, {"▁hi", 6}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 7 + b;
  }
  return {
      {"added_tokens",
       json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
                    {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}}})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array({{{"type", "Prepend"}, {"prepend", "▁"}},
                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}})}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"unk_token", "<unk>"},
        {"byte_fallback", true},
        {"fuse_unk", true},
        {"merges", json::array({"▁ h", "▁h i"})}}}};
}

TEST(TokenizerTest, SentencePieceStyleUsesByteFallbackAndDecodesBack) {
  const Tokenizer tokenizer = MustLoad(SentencePieceJson());
  const Encoding encoding = tokenizer.Encode("hi h\xC3\xA9", false);
  // ▁hi ▁h <0xC3> <0xA9>
  EXPECT_EQ(encoding.ids, (std::vector<uint32_t>{6, 5, 7 + 0xC3, 7 + 0xA9}));
  using Offsets = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(encoding.offsets, (Offsets{{0, 2}, {2, 4}, {4, 6}, {4, 6}}));
  EXPECT_EQ(tokenizer.Decode(encoding.ids, true), "hi h\xC3\xA9");
  EXPECT_EQ(tokenizer.Describe(), "BPE (byte fallback), 263 ids, 2 added tokens");
}

TEST(TokenizerTest, MetaspacePreTokenizerAndDecoder) {
  json document = SentencePieceJson();
  document["normalizer"] = {{"type", "NFKC"}};
  document["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  document["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}};
  const Tokenizer tokenizer = MustLoad(document);
  // NFKC turns the fullwidth "ｈｉ" into "hi".
  EXPECT_EQ(tokenizer.EncodeIds("hi \xEF\xBD\x88\xEF\xBD\x89", false),
            (std::vector<uint32_t>{6, 6}));
  EXPECT_EQ(tokenizer.Decode(std::vector<uint32_t>{6, 6}, false), "hi hi");
}

TEST(TokenizerTest, DigitsPreTokenizerIsolatesEachDigit) {
  json document = SentencePieceJson();
  document["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
  const Tokenizer tokenizer = MustLoad(document);
  // "▁12": ▁ then byte fallback for "1" and "2", each its own word.
  EXPECT_EQ(tokenizer.EncodeIds("12", false), (std::vector<uint32_t>{2, 7 + '1', 7 + '2'}));
}

// Characters a b c - with merges that join across every boundary a split could leave, so the
// ids show where the pre-tokenizer cut "a-b--c".
json SplitJson(const json& pre_tokenizer) {
  return {{"pre_tokenizer", pre_tokenizer},
          {"model",
           {{"type", "BPE"},
            {"vocab",
             {{"a", 0},
              {"b", 1},
              {"c", 2},
              {"-", 3},
              {"a-", 4},
              {"-b", 5},
              {"--", 6},
              {"-c", 7},
              {"b-", 8}}},
            {"merges", json::array({"a -", "- b", "- -", "- c", "b -"})}}}};
}

TEST(TokenizerTest, SplitBehavioursCutWhereHfDoes) {
  struct Case {
    const char* behavior;
    bool invert;
    std::vector<uint32_t> ids;
  };
  const std::vector<Case> cases = {
      {"Removed", false, {0, 1, 2}},
      {"Isolated", false, {0, 3, 1, 3, 3, 2}},
      {"MergedWithPrevious", false, {4, 8, 3, 2}},
      {"MergedWithNext", false, {0, 5, 3, 7}},
      {"Contiguous", false, {0, 3, 1, 6, 2}},
      {"Removed", true, {3, 3, 3}},
  };
  for (const Case& c : cases) {
    for (const json& pattern : {json{{"String", "-"}}, json{{"Regex", "-"}}}) {
      const Tokenizer tokenizer = MustLoad(SplitJson({{"type", "Split"},
                                                      {"pattern", pattern},
                                                      {"behavior", c.behavior},
                                                      {"invert", c.invert}}));
      EXPECT_EQ(tokenizer.EncodeIds("a-b--c", false), c.ids)
          << c.behavior << (c.invert ? " inverted" : "") << " " << pattern.dump();
    }
  }
}

TEST(TokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json document = {{"model",
                    {{"type", "BPE"},
                     {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}}},
                     {"merges", json::array({"a b"})}}}};
  EXPECT_EQ(MustLoad(document).EncodeIds("abc", false), (std::vector<uint32_t>{3, 2}));
  document["model"]["ignore_merges"] = true;
  EXPECT_EQ(MustLoad(document).EncodeIds("abc", false), (std::vector<uint32_t>{4}));
}

TEST(TokenizerTest, UnknownCharactersBecomeUnkFusedWhenAsked) {
  json document = {{"model",
                    {{"type", "BPE"},
                     {"vocab", {{"<unk>", 0}, {"a", 1}}},
                     {"unk_token", "<unk>"},
                     {"merges", json::array()}}}};
  const Encoding separate = MustLoad(document).Encode("axya", false);
  EXPECT_EQ(separate.ids, (std::vector<uint32_t>{1, 0, 0, 1}));
  document["model"]["fuse_unk"] = true;
  const Encoding fused = MustLoad(document).Encode("axya", false);
  EXPECT_EQ(fused.ids, (std::vector<uint32_t>{1, 0, 1}));
  using Offsets = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(fused.offsets, (Offsets{{0, 1}, {1, 3}, {3, 4}}));
}

TEST(TokenizerTest, ByteFallbackDecoderTurnsIncompleteBytesIntoReplacementCharacters) {
  const Tokenizer tokenizer = MustLoad(SentencePieceJson());
  EXPECT_EQ(tokenizer.Decode(std::vector<uint32_t>{7 + 0xC3, 6}, false), "\xEF\xBF\xBD hi");
}

TEST(TokenizerTest, SingleWordAddedTokensMatchOnlyAsWholeWordsAndRstripTakesSpaces) {
  json document = ByteLevelJson();
  document["added_tokens"].push_back({{"id", 28},
                                      {"content", "hel"},
                                      {"single_word", true},
                                      {"rstrip", true},
                                      {"normalized", false}});
  const Tokenizer tokenizer = MustLoad(document);
  const Encoding encoding = tokenizer.Encode("hel  h", false);
  EXPECT_EQ(encoding.ids, (std::vector<uint32_t>{28, 0}));
  using Offsets = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(encoding.offsets, (Offsets{{0, 5}, {5, 6}}));
  EXPECT_EQ(tokenizer.EncodeIds("hello", false), (std::vector<uint32_t>{18}));
}

TEST(TokenizerTest, ByteLevelPostProcessorTrimsSpacesFromOffsets) {
  json document = ByteLevelJson();
  document["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"}, {"trim_offsets", true}}, document["post_processor"]})}};
  const Encoding encoding = MustLoad(document).Encode("hello world", true);
  EXPECT_EQ(encoding.ids, (std::vector<uint32_t>{26, 18, 23}));
  using Offsets = std::vector<std::pair<uint32_t, uint32_t>>;
  EXPECT_EQ(encoding.offsets, (Offsets{{0, 0}, {0, 5}, {6, 11}}));
}

TEST(TokenizerTest, RegexesHaveOnigurumasUnicodeMeaning) {
  using tokenizer_internal::Regex;
  auto find = [](const char* pattern, std::string_view text) {
    auto regex = Regex::Compile(pattern);
    EXPECT_TRUE(regex.ok()) << pattern;
    std::vector<std::pair<uint32_t, uint32_t>> matches;
    (*regex)->FindAll(text, matches);
    return matches;
  };
  using Matches = std::vector<std::pair<uint32_t, uint32_t>>;
  // U+1E030 is a letter since Unicode 15 (PCRE2 10.42 has Unicode 14; Oniguruma 16).
  EXPECT_EQ(find("\\p{L}+",
                 "a\xF0\x9E\x80\xB0"
                 "b"),
            (Matches{{0, 6}}));
  // \s has U+0085 as in Oniguruma, and \S excludes it.
  EXPECT_EQ(find("\\s+", "a\xC2\x85 b"), (Matches{{1, 4}}));
  EXPECT_EQ(find("\\S+",
                 "a\xC2\x85"
                 "b"),
            (Matches{{0, 1}, {3, 4}}));
  EXPECT_EQ(find("[^\\s\\p{L}]+", "a\xC2\x85!"), (Matches{{3, 4}}));
  // \h is a hex digit.
  EXPECT_EQ(find("\\h+", "xyz 0fA9 g"), (Matches{{4, 8}}));
  // Case-insensitive contractions fold the long s as Oniguruma does.
  EXPECT_EQ(find("(?i:'s)", "it'\xC5\xBF"), (Matches{{2, 5}}));
}

TEST(TokenizerTest, InvalidUtf8IsReplacedAsPythonDoes) {
  auto sanitize = [](std::string_view input) {
    std::string output;
    std::vector<uint32_t> positions;
    return tokenizer_internal::SanitizeUtf8(input, &output, &positions) ? output
                                                                        : std::string(input);
  };
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(sanitize("ok"), "ok");
  EXPECT_EQ(sanitize("\xE4\xB8"), fffd);                    // one maximal subpart
  EXPECT_EQ(sanitize("\xED\xA0\x80"), fffd + fffd + fffd);  // a surrogate: three
  EXPECT_EQ(sanitize("\xC0\xAF"), fffd + fffd);             // overlong: two
  EXPECT_EQ(sanitize("\xF0\x9F\x98"
                     "a"),
            fffd + "a");                                               // truncated emoji
  EXPECT_EQ(sanitize("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // above U+10FFFF
}

TEST(TokenizerTest, UnsupportedComponentsAreNamedWithTheSupportedOnes) {
  json document = ByteLevelJson();
  document["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_EQ(LoadError(document),
            "tokenizer.json: pre_tokenizer type \"Whitespace\" is not supported (supported: "
            "Split, ByteLevel, Digits, Metaspace, Sequence)");
  document = ByteLevelJson();
  document["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(LoadError(document).find("normalizer type \"Lowercase\" is not supported"),
            std::string::npos);
  document = ByteLevelJson();
  document["decoder"] = {{"type", "WordPiece"}};
  EXPECT_NE(LoadError(document).find("decoder type \"WordPiece\" is not supported"),
            std::string::npos);
  document = ByteLevelJson();
  document["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_NE(LoadError(document).find("post_processor type \"BertProcessing\" is not supported"),
            std::string::npos);
  document = ByteLevelJson();
  document["model"]["type"] = "WordPiece";
  EXPECT_EQ(LoadError(document),
            "tokenizer.json: model type \"WordPiece\" is not supported (supported: BPE)");
  document = ByteLevelJson();
  document["model"]["type"] = "Unigram";
  EXPECT_NE(LoadError(document).find("model type \"Unigram\""), std::string::npos);
}

TEST(TokenizerTest, MalformedDocumentsAreInvalidArgumentsNamingTheField) {
  EXPECT_NE(LoadError(json()).find("must be an object"), std::string::npos);
  auto bad_json = Tokenizer::FromJson("{\"model\": ");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.status().message().find("not valid JSON"), std::string::npos);

  json document = ByteLevelJson();
  document["model"].erase("vocab");
  EXPECT_EQ(LoadError(document), "tokenizer.json: model.vocab is missing");

  document = ByteLevelJson();
  document["model"]["merges"].push_back("h zz");
  EXPECT_EQ(LoadError(document), "model.merges[11]: token \"zz\" is not in model.vocab");

  document = ByteLevelJson();
  document["model"]["merges"].push_back("h o");
  EXPECT_EQ(LoadError(document), "model.merges[11]: merged token \"ho\" is not in model.vocab");

  document = ByteLevelJson();
  document["model"]["merges"].push_back("a b c");
  EXPECT_NE(LoadError(document).find("model.merges[11]"), std::string::npos);

  document = ByteLevelJson();
  document["post_processor"]["special_tokens"]["<s>"]["ids"] = {999};
  EXPECT_EQ(LoadError(document),
            "tokenizer.json: post_processor.special_tokens id 999 is not below the vocabulary "
            "size 28");

  document = ByteLevelJson();
  document["model"]["vocab"]["bad"] = -1;
  EXPECT_NE(LoadError(document).find("model.vocab[\"bad\"]"), std::string::npos);

  document = ByteLevelJson();
  document["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}};
  EXPECT_NE(LoadError(document).find("pre_tokenizer.pretokenizers[0].pattern"), std::string::npos);

  document = ByteLevelJson();
  document["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  EXPECT_NE(LoadError(document).find("behavior \"Sideways\""), std::string::npos);

  auto missing = Tokenizer::FromFile("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace tidal::data
