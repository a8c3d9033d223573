// worker/data/chat_template.h — a model's chat template (tokenizer_config.json's chat_template)
// rendered as transformers' apply_chat_template renders it, plus the training view: the rendered
// conversation and the byte spans of it that are the assistant's (what the loss counts).
// Built on the Jinja interpreter of worker/data/jinja.h; no tokenizer, no LibTorch.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "worker/data/jinja.h"

namespace tidal::data {

struct ChatRendering {
  std::string text;
  // Byte ranges [first, second) of `text` that are the assistant's (what trains), in order.
  std::vector<std::pair<size_t, size_t>> assistant_spans;
};

class ChatTemplate {
 public:
  // tokenizer_config.json's text: reads chat_template (a string, or a list of {name, template}
  // where "default" is used), bos_token / eos_token / pad_token / unk_token (strings or
  // AddedToken objects {"content": ...}).
  static StatusOr<ChatTemplate> FromTokenizerConfig(std::string_view tokenizer_config_json);
  // special_tokens: {"bos_token": "...", ...}; values may also be AddedToken objects or null.
  static StatusOr<ChatTemplate> FromSource(std::string source, nlohmann::json special_tokens);

  // Renders as transformers' apply_chat_template(messages, tools=tools,
  // add_generation_prompt=..., tokenize=False) does. Errors: a template that raises
  // (raise_exception("...")) → InvalidArgument carrying the template's message; undefined-variable
  // misuse, type errors → InvalidArgument naming the template line.
  // Note: nlohmann::json keeps object keys sorted, so `tojson` and `.items()` see keys in sorted
  // order (transformers sees the caller's insertion order).
  StatusOr<std::string> Render(const nlohmann::json& messages, bool add_generation_prompt,
                               const nlohmann::json& tools = nullptr,
                               const nlohmann::json& extra_context = nullptr) const;

  // The training view: the full conversation rendered (add_generation_prompt=false) plus the
  // spans of it that belong to assistant turns. Templates with {% generation %} blocks: exactly
  // those spans (as transformers' return_assistant_tokens_mask). Others: for each assistant
  // message i, the span is the text that rendering messages[:i+1] adds beyond rendering
  // messages[:i] with add_generation_prompt=true (the assistant's content plus its end-of-turn
  // marker, not the role header); FailedPrecondition naming the message index if either
  // rendering is not a prefix of the full one.
  StatusOr<ChatRendering> RenderForTraining(const nlohmann::json& messages,
                                            const nlohmann::json& tools = nullptr) const;

  bool has_generation_blocks() const { return template_.has_generation_blocks(); }
  const std::string& bos_token() const { return bos_token_; }  // "" when none
  const std::string& eos_token() const { return eos_token_; }
  const std::string& source() const { return source_; }

 private:
  ChatTemplate(jinja::Template compiled, std::string source)
      : template_(std::move(compiled)), source_(std::move(source)) {}
  StatusOr<jinja::RenderResult> RenderWithSpans(const nlohmann::json& messages,
                                                bool add_generation_prompt,
                                                const nlohmann::json& tools,
                                                const nlohmann::json& extra_context) const;

  jinja::Template template_;
  std::string source_;
  jinja::Dict special_tokens_;  // name → string, as tokenizer.special_tokens_map
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace tidal::data
