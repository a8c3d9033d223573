// worker/data/jinja.h — a Jinja2 interpreter for Hugging Face chat templates: parse once, render
// many times. Mirrors the environment transformers' apply_chat_template builds
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the {% generation %}
// tag, raise_exception/strftime_now globals, a tojson that does not escape HTML). The subset
// supported is listed in docs/chat-templates.md. Depends on nlohmann/json and common/status.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/data/jinja_value.h"

namespace tidal::data::jinja {

struct ParsedTemplate;

struct RenderResult {
  std::string text;
  // Byte ranges [first, second) of `text` written inside {% generation %} blocks, in order.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

// Bounds on one render, so that a hostile template ends in an error rather than a hang.
struct RenderLimits {
  int64_t max_steps = 5'000'000;  // statements executed, loop iterations, calls
};

class Template {
 public:
  // Errors (InvalidArgument) name the line: "template line 4: unexpected 'endif'".
  static StatusOr<Template> Parse(std::string_view source);

  // `context` must be a JSON object; its members are the template's variables.
  StatusOr<std::string> Render(const nlohmann::json& context) const;
  StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;
  // Variables as values (insertion-ordered), plus the generation spans. A render that would
  // pass `limits` ends in InvalidArgument.
  StatusOr<RenderResult> RenderWithSpans(const Dict& context,
                                         const RenderLimits& limits = {}) const;

  bool has_generation_blocks() const;

 private:
  explicit Template(std::shared_ptr<const ParsedTemplate> parsed) : parsed_(std::move(parsed)) {}
  std::shared_ptr<const ParsedTemplate> parsed_;
};

}  // namespace tidal::data::jinja
