// tests/unit/data/jinja_test.cc — the Jinja interpreter behind chat templates, feature by
// feature, against the output Jinja2 gives for the same template under transformers' settings
// (trim_blocks, lstrip_blocks, loopcontrols). No Python here.
#include "worker/data/jinja.h"

#include <gtest/gtest.h>

#include "worker/data/chat_template.h"

namespace tidal::data::jinja {
namespace {

using nlohmann::json;

std::string Render(const std::string& source, const json& context = json::object()) {
  auto t = Template::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + t.status().message();
  auto r = t->Render(context);
  if (!r.ok()) return "RENDER ERROR: " + r.status().message();
  return *r;
}

Status RenderError(const std::string& source, const json& context = json::object()) {
  auto t = Template::Parse(source);
  if (!t.ok()) return t.status();
  auto r = t->Render(context);
  if (r.ok()) return OkStatus();
  return r.status();
}

// RenderError under a step budget of its own.
Status RenderErrorWithin(const std::string& source, int64_t max_steps) {
  auto t = Template::Parse(source);
  if (!t.ok()) return t.status();
  auto r = t->RenderWithSpans({}, RenderLimits{.max_steps = max_steps});
  if (r.ok()) return OkStatus();
  return r.status();
}

TEST(JinjaTest, LiteralsAndOutput) {
  EXPECT_EQ(Render("{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 2.5 }}{{ true }}{{ none }}"), "ab12.5TrueNone");
  EXPECT_EQ(Render("{{ [1, 'x', none] }}{{ {'k': 1} }}"), "[1, 'x', None]{'k': 1}");
  EXPECT_EQ(Render("{{ 'it''s' }}{{ 'a\\nb' }}"),
            "its"
            "a\nb");
  EXPECT_EQ(Render("{{ 1.0 }} {{ 1e-5 }} {{ 10 / 4 }} {{ 10 // 4 }} {{ -7 % 3 }}"),
            "1.0 1e-05 2.5 2 2");
}

TEST(JinjaTest, ArithmeticConcatAndComparison) {
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }} {{ 'a' ~ 1 ~ none }}"),
            "7 9 1024 a1None");
  EXPECT_EQ(Render("{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1] + [2] }}"),
            "True True True [1, 2]");
  EXPECT_EQ(Render("{{ 'b' in 'abc' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }}"),
            "True True True");
  EXPECT_EQ(Render("{{ not 0 and 'x' or 'y' }} {{ 0 or '' or 'z' }}"), "x z");
  EXPECT_EQ(Render("{{ 'yes' if 1 > 0 else 'no' }}{{ 'never' if false }}"), "yes");
}

TEST(JinjaTest, SubscriptsSlicesAndAttributes) {
  json ctx = {{"m", {{"role", "user"}, {"content", "héllo"}}}, {"xs", {1, 2, 3, 4}}};
  EXPECT_EQ(Render("{{ m.role }} {{ m['content'] }} {{ m.missing }}|", ctx), "user héllo |");
  EXPECT_EQ(Render("{{ xs[-1] }} {{ xs[1:3] }} {{ xs[::-1] }} {{ xs[:-1] }} {{ xs[10] }}|", ctx),
            "4 [2, 3] [4, 3, 2, 1] [1, 2, 3] |");
  EXPECT_EQ(Render("{{ m.content[1] }}{{ m.content[::-1] }}{{ m.content|length }}", ctx),
            "éolléh5");
}

TEST(JinjaTest, StringMethods) {
  EXPECT_EQ(Render("{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\nA\\n'.lstrip('\\n') }}"),
            "x|a|A\n");
  EXPECT_EQ(Render("{{ 'a</think>b'.split('</think>')[-1] }} {{ 'a b  c'.split() }}"),
            "b ['a', 'b', 'c']");
  EXPECT_EQ(Render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }}"), "True True");
  EXPECT_EQ(Render("{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'hello world'.title() }}"),
            "ABabHello World");
  EXPECT_EQ(Render("{{ 'aXa'.replace('a', 'b') }} {{ '{} and {name}'.format(1, name='n') }}"),
            "bXb 1 and n");
}

TEST(JinjaTest, DictMethods) {
  json ctx = {{"d", {{"a", 1}, {"b", 2}}}};
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "a=1;b=2;");
  EXPECT_EQ(
      Render("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }} {{ d.keys()|list }}", ctx),
      "1 None 0 ['a', 'b']");
}

TEST(JinjaTest, Filters) {
  json ctx = {{"ms",
               {{{"role", "user"}, {"content", "u1"}},
                {{"role", "assistant"}, {"content", "a1"}},
                {{"role", "user"}, {"content", "u2"}}}}};
  EXPECT_EQ(
      Render("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}",
             ctx),
      "u1,u2");
  EXPECT_EQ(Render("{{ ms|rejectattr('role', 'eq', 'user')|list|length }}", ctx), "1");
  EXPECT_EQ(Render("{{ ms|first|attr('role') }} {{ (ms|last).content }}", ctx), "user u2");
  EXPECT_EQ(
      Render("{{ ' x '|trim }}|{{ 'ab'|upper }}|{{ 'AB'|lower }}|{{ 'hi there'|capitalize }}"),
      "x|AB|ab|Hi there");
  EXPECT_EQ(Render("{{ undefined_thing|default('d') }} {{ ''|default('e', true) }} {{ 3|string }}"),
            "d e 3");
  EXPECT_EQ(
      Render("{{ '7'|int + 1 }} {{ 'x'|int }} {{ 2.7|int }} {{ -3|abs }} {{ 2.567|round(2) }}"),
      "8 0 2 3 2.57");
  EXPECT_EQ(Render("{{ ['a', 'b']|join }} {{ [3, 1, 2]|sort }} {{ [1, 1, 2]|unique|list }}"),
            "ab [1, 2, 3] [1, 2]");
  EXPECT_EQ(Render("{{ 'a\\nb'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}"), "a\n  b|  a\n  b");
  EXPECT_EQ(Render("{{ {'a': 1}|items|list }} {{ 'x'|replace('x', 'y') }}"), "[('a', 1)] y");
}

TEST(JinjaTest, ToJsonMatchesPythonJsonDumps) {
  json ctx = {
      {"v",
       {{"name", "f"}, {"args", {1, 2.5, true, nullptr, "é\"\n"}}, {"empty", json::object()}}}};
  EXPECT_EQ(Render("{{ v|tojson }}", ctx),
            "{\"args\": [1, 2.5, true, null, \"é\\\"\\n\"], \"empty\": {}, \"name\": \"f\"}");
  EXPECT_EQ(Render("{{ {'a': [1]}|tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(Render("{{ '<b>'|tojson }}"), "\"<b>\"");  // no HTML escaping, as transformers
}

TEST(JinjaTest, Tests) {
  json ctx = {{"s", "x"},           {"n", 1},      {"f", 1.5}, {"d", json::object()},
              {"l", json::array()}, {"z", nullptr}};
  EXPECT_EQ(Render("{{ s is string }}{{ n is number }}{{ n is integer }}{{ f is float }}"
                   "{{ d is mapping }}{{ l is iterable }}{{ s is sequence }}{{ z is none }}",
                   ctx),
            "TrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(
      Render("{{ q is defined }}{{ q is undefined }}{{ s is not none }}{{ n is odd }}"
             "{{ n is equalto 1 }}{{ 'x' is in ['x'] }}{{ true is boolean }}{{ false is false }}",
             ctx),
      "FalseTrueTrueTrueTrueTrueTrueTrue");
}

TEST(JinjaTest, ForLoopVariablesElseAndLoopControls) {
  EXPECT_EQ(
      Render("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
             "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
      "103TrueFalse3;212FalseFalse3;321FalseTrue3;");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "013");
  EXPECT_EQ(Render("{% for x in range(5) if x is odd %}{{ x }}{{ loop.length }}{% endfor %}"),
            "1232");
  EXPECT_EQ(Render("{% for x in [1, 2] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}"),
            "-2;1-;");
  // `loop` is the innermost loop's; an outer one is reached through a variable.
  EXPECT_EQ(Render("{% for x in 'ab' %}{% for y in 'cd' %}{{ loop.index }}{% endfor %}"
                   "{% endfor %}"),
            "1212");
  EXPECT_EQ(Render("{% for x in 'ab' %}{% set outer = loop %}{% for y in 'cd' %}"
                   "{{ outer.index }}{{ loop.index }};{% endfor %}{% endfor %}"),
            "11;12;21;22;");
}

TEST(JinjaTest, SetInsideLoopDoesNotLeakButNamespaceDoes) {
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(Render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = i %}"
                   "{% endfor %}{{ ns.x }}"),
            "2");
  EXPECT_EQ(Render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  EXPECT_EQ(Render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Render("{% set block %}in {{ 1 }}{% endset %}[{{ block }}]"), "[in 1]");
}

TEST(JinjaTest, MacrosWithDefaultsAndCall) {
  EXPECT_EQ(Render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}"),
            "Hi A! Hi B? Hi C.");
  EXPECT_EQ(Render("{% macro wrap() %}<{{ caller() }}>{% endmacro %}"
                   "{% call wrap() %}inner{% endcall %}"),
            "<inner>");
}

TEST(JinjaTest, WhitespaceControlAsTransformersConfiguresJinja) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(Render("{% if true %}\n    yes\n    {% endif %}\nafter"), "    yes\nafter");
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("x\n  {{- 'y' -}}\n  z"), "xyz");
  EXPECT_EQ(Render("{# comment #}\nline\n   {# indented comment #}\nend"), "line\nend");
  EXPECT_EQ(Render("a {% if true %}b{% endif %} c"), "a b c");  // mid-line: no lstrip
  EXPECT_EQ(Render("{{ 'v' }}\n"), "v");  // one trailing newline of the source is dropped
  EXPECT_EQ(Render("  {%+ if true %}k{% endif %}"), "  k");
  EXPECT_EQ(Render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
  EXPECT_EQ(Render("{% filter upper %}abc{% endfilter %}"), "ABC");
}

TEST(JinjaTest, UndefinedRendersEmptyIsFalsyAndFailsWhenUsed) {
  EXPECT_EQ(Render("[{{ nothing }}]{% if nothing %}t{% else %}f{% endif %}"), "[]f");
  EXPECT_EQ(Render("{{ nothing|length }}{% for x in nothing %}x{% endfor %}"), "0");
  Status s = RenderError("line one\n{{ nothing.attr }}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("template line 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'nothing' is undefined"), std::string::npos) << s.message();
  s = RenderError("\n\n{{ nothing + 'x' }}");
  EXPECT_NE(s.message().find("template line 3"), std::string::npos) << s.message();
}

TEST(JinjaTest, ErrorsNameTheTemplateLine) {
  Status s = RenderError("{% for x in y %}\n{% endif %}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("template line 2"), std::string::npos) << s.message();
  s = RenderError("ok\n{{ 'a' + 1 }}");
  EXPECT_NE(s.message().find("template line 2"), std::string::npos) << s.message();
  s = RenderError("{{ x|no_such_filter }}");
  EXPECT_NE(s.message().find("no filter named 'no_such_filter'"), std::string::npos);
  s = RenderError("{% include 'other.html' %}");
  EXPECT_NE(s.message().find("unsupported tag 'include'"), std::string::npos);
  EXPECT_FALSE(RenderError("{{ 1 / 0 }}").ok());
  EXPECT_FALSE(RenderError("{{ [].append(1) }}").ok());  // the immutable sandbox
  EXPECT_FALSE(RenderError("{% set n = 5 %}{% set n.x = 1 %}").ok());
  EXPECT_FALSE(RenderError("{{ 'unterminated }}").ok());
  EXPECT_FALSE(RenderError("{% if %}").ok());
}

TEST(JinjaTest, RaiseExceptionCarriesTheTemplatesMessage) {
  Status s = RenderError("a\n{{ raise_exception('Roles must alternate!') }}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Roles must alternate!"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("template line 2"), std::string::npos) << s.message();
}

TEST(JinjaTest, HostileTemplatesEndInErrorsNotCrashes) {
  std::string deep(5000, '(');
  EXPECT_FALSE(RenderError("{{ " + deep + " }}").ok());
  std::string nested;
  for (int i = 0; i < 500; ++i) nested += "{% if true %}";
  EXPECT_FALSE(RenderError(nested).ok());
  EXPECT_FALSE(RenderError("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").ok());
  EXPECT_NE(RenderError("{{ range(100000000)|length }}").message().find("range too big"),
            std::string::npos);
  // 10^10 iterations end at the step budget: a budget of 10'000 here, as the budget and not its
  // size is what this checks (TheStepBudgetCountsStatementsIterationsAndCalls checks the
  // default). The default's 5'000'000 steps of these loops take 0.4 s and 2 s in the ordinary
  // build, 12 s and 110 s under AddressSanitizer.
  for (const char* body : {"", "{{ loop.index }}"}) {
    Status endless =
        RenderErrorWithin(std::string("{% for a in range(100000) %}{% for b in range(100000) %}") +
                              body + "{% endfor %}{% endfor %}",
                          10'000);
    EXPECT_NE(endless.message().find("exceeded its execution budget"), std::string::npos)
        << body << ": " << endless.message();
  }
  EXPECT_FALSE(RenderError("{{ 'x' * 100000000000 }}").ok());
  EXPECT_FALSE(RenderError("{{ 9223372036854775807 + 1 }}").ok());
}

TEST(JinjaTest, TheStepBudgetCountsStatementsIterationsAndCalls) {
  // The budget Render and chat templates run under.
  EXPECT_EQ(RenderLimits{}.max_steps, 5'000'000);
  // The for statement, the call of range(), 10 iterations and the 10 outputs inside: 22 steps.
  const std::string loop = "{% for x in range(10) %}{{ x }}{% endfor %}";
  EXPECT_TRUE(RenderErrorWithin(loop, 22).ok());
  EXPECT_EQ(RenderErrorWithin(loop, 21).message(),
            "template line 1: template exceeded its execution budget");
  // The same with the loop object built for each iteration.
  const std::string indexed = "{% for x in range(10) %}{{ loop.index }}{% endfor %}";
  EXPECT_TRUE(RenderErrorWithin(indexed, 22).ok());
  EXPECT_FALSE(RenderErrorWithin(indexed, 21).ok());
  // The macro statement, two outputs and two calls: 5 steps.
  const std::string calls = "{% macro f() %}{% endmacro %}{{ f() }}{{ f() }}";
  EXPECT_TRUE(RenderErrorWithin(calls, 5).ok());
  EXPECT_FALSE(RenderErrorWithin(calls, 4).ok());
}

TEST(JinjaTest, RangeFollowsPython) {
  EXPECT_EQ(Render("{{ range(4)|join(',') }}"), "0,1,2,3");
  EXPECT_EQ(Render("{{ range(0, 10, 3)|join(',') }}"), "0,3,6,9");
  EXPECT_EQ(Render("{{ range(10, 0, -3)|join(',') }}"), "10,7,4,1");
  EXPECT_EQ(Render("{{ range(5, 2)|length }}{{ range(2, 5, -1)|length }}"), "00");
  EXPECT_EQ(Render("{{ range(9223372036854775805, 9223372036854775807)|join(',') }}"),
            "9223372036854775805,9223372036854775806");
  EXPECT_EQ(Render("{{ range(-9223372036854775807 - 1, 9223372036854775807, "
                   "4611686018427387904)|join(',') }}"),
            "-9223372036854775808,-4611686018427387904,0,4611686018427387904");
  EXPECT_NE(Render("{{ range(1, 2, 0) }}").find("must not be zero"), std::string::npos);
}

TEST(JinjaTest, TruncatedAndCorruptedTemplatesNeverCrash) {
  const std::string source =
      "{%- set ns = namespace(first=true) %}{{ bos_token }}\n"
      "{%- for m in messages if m.role != 'x' %}\n"
      "  {%- if m['role'] == 'user' and not (m.content is none) -%}[U]{{ m.content|trim }}\n"
      "  {%- elif m.role == 'assistant' %}{% generation %}{{ m.content.split('</think>')[-1] }}"
      "{% endgeneration %}{% set ns.first = false %}\n"
      "  {%- else %}{{ raise_exception('bad role ' ~ m.role) }}{% endif %}\n"
      "{%- endfor %}{# done #}{{ messages|map(attribute='role')|join(', ') }}"
      "{% if add_generation_prompt %}{{ {'a': [1, 2.5]}|tojson(indent=2) }}{% endif %}";
  json ctx = {{"bos_token", "<s>"},
              {"add_generation_prompt", true},
              {"messages",
               {{{"role", "user"}, {"content", " q "}},
                {{"role", "assistant"}, {"content", "<think>t</think>a"}}}}};
  ASSERT_EQ(Render(source, ctx).rfind("<s>[U]q", 0), 0u) << Render(source, ctx);
  const std::string noise = "{}%#-+()[]'\"|.:,~=!<>*/ \n\\0aZ";
  size_t rendered = 0;
  for (size_t i = 0; i <= source.size(); ++i) {
    if (Template::Parse(source.substr(0, i)).ok()) ++rendered;
    (void)RenderError(source.substr(0, i), ctx);
    std::string corrupted = source;
    corrupted[i % source.size()] = noise[i % noise.size()];
    (void)RenderError(corrupted, ctx);
    corrupted.insert(i, noise.substr(i % noise.size(), 3));
    (void)RenderError(corrupted, ctx);
  }
  EXPECT_GT(rendered, 0u);
}

TEST(JinjaTest, GenerationBlocksRecordByteSpans) {
  auto t = Template::Parse(
      "a{% generation %}é{{ x }}{% endgeneration %}b{% generation %}{% endgeneration %}");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->has_generation_blocks());
  Dict ctx;
  ctx.Set("x", Value::String("z"));
  auto r = t->RenderWithSpans(ctx);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "aézb");
  ASSERT_EQ(r->generation_spans.size(), 2u);
  EXPECT_EQ(r->generation_spans[0], (std::pair<size_t, size_t>(1, 4)));
  EXPECT_EQ(r->generation_spans[1], (std::pair<size_t, size_t>(5, 5)));
}

TEST(ChatTemplateTest, ReadsTemplateAndAddedTokensFromTokenizerConfig) {
  json config = {
      {"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
      {"eos_token", "</s>"},
      {"unk_token", nullptr},
      {"chat_template",
       {{{"name", "tool_use"}, {"template", "TOOLS"}},
        {{"name", "default"},
         {"template",
          "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}"
          "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"}}}}};
  auto t = ChatTemplate::FromTokenizerConfig(config.dump());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(t->eos_token(), "</s>");
  json messages = json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(*t->Render(messages, true), "<s>user: hi</s>assistant:");
  EXPECT_FALSE(ChatTemplate::FromTokenizerConfig("{").ok());
  EXPECT_FALSE(ChatTemplate::FromTokenizerConfig("{}").ok());
}

TEST(ChatTemplateTest, TrainingSpansFollowThePrefixRuleWithoutGenerationBlocks) {
  auto t = ChatTemplate::FromSource(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}",
      json::object());
  ASSERT_TRUE(t.ok());
  json messages = json::array({{{"role", "user"}, {"content", "q"}},
                               {{"role", "assistant"}, {"content", "a"}},
                               {{"role", "user"}, {"content", "q2"}},
                               {{"role", "assistant"}, {"content", "b"}}});
  auto r = t->RenderForTraining(messages);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->assistant_spans.size(), 2u);
  auto piece = [&](size_t i) {
    auto [a, b] = r->assistant_spans[i];
    return r->text.substr(a, b - a);
  };
  EXPECT_EQ(piece(0), "a</assistant>");
  EXPECT_EQ(piece(1), "b</assistant>");
}

TEST(ChatTemplateTest, AGenerationPromptThatOpensMoreThanTheTurnShowsStartsTheSpanWhereTheyPart) {
  // As DeepSeek-R1's: the generation prompt opens a think block the rendered turn does not show.
  auto t = ChatTemplate::FromSource(
      "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}"
      "<think>{% endif %}",
      json::object());
  ASSERT_TRUE(t.ok());
  json messages = json::array(
      {{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "a"}}});
  auto r = t->RenderForTraining(messages);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->assistant_spans.size(), 1u);
  EXPECT_EQ(r->assistant_spans[0], (std::pair<size_t, size_t>{1, 2}));
}

TEST(ChatTemplateTest, PrefixRuleRefusesTemplatesThatRewriteEarlierTurns) {
  // Earlier text changes as turns are added (Mistral v0.3 moves the system prompt into the last
  // user turn): no span can be trusted.
  auto t = ChatTemplate::FromSource(
      "{% for m in messages %}{{ m.content }}{% endfor %}{{ messages | length }}", json::object());
  ASSERT_TRUE(t.ok());
  json messages = json::array(
      {{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "a"}}});
  auto r = t->RenderForTraining(messages);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("message 1"), std::string::npos);
}

TEST(ChatTemplateTest, RaisingTemplateGivesInvalidArgumentWithItsMessage) {
  auto t = ChatTemplate::FromSource(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be user') }}"
      "{% endif %}",
      json::object());
  ASSERT_TRUE(t.ok());
  auto r = t->Render(json::array({{{"role", "assistant"}, {"content", "x"}}}), false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("first message must be user"), std::string::npos);
}

}  // namespace
}  // namespace tidal::data::jinja
