// worker/data/chat_template.cc — tokenizer_config.json to a ChatTemplate, the variables
// transformers passes to a chat template, and the assistant spans for loss masking.
#include "worker/data/chat_template.h"

namespace tidal::data {
namespace {

constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

// A special token as tokenizer_config.json writes it: a string or an AddedToken object.
std::string TokenContent(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return "";
}

bool IsTokenValue(const nlohmann::json& value) {
  return value.is_string() ||
         (value.is_object() && value.contains("content") && value["content"].is_string());
}

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(std::string_view tokenizer_config_json) {
  nlohmann::json config = nlohmann::json::parse(tokenizer_config_json, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return InvalidArgument("tokenizer_config.json: not a JSON object");
  }
  if (!config.contains("chat_template") || config["chat_template"].is_null()) {
    return NotFound("tokenizer_config.json: no chat_template");
  }
  const nlohmann::json& chat_template = config["chat_template"];
  std::string source;
  if (chat_template.is_string()) {
    source = chat_template.get<std::string>();
  } else if (chat_template.is_array()) {
    bool found = false;
    for (const auto& entry : chat_template) {
      if (entry.is_object() && entry.contains("name") && entry["name"] == "default" &&
          entry.contains("template") && entry["template"].is_string()) {
        source = entry["template"].get<std::string>();
        found = true;
        break;
      }
    }
    if (!found) {
      return InvalidArgument("tokenizer_config.json: chat_template is a list without a 'default'");
    }
  } else {
    return InvalidArgument("tokenizer_config.json: chat_template must be a string or a list");
  }
  nlohmann::json special = nlohmann::json::object();
  for (const char* name : kSpecialTokenNames) {
    if (config.contains(name) && IsTokenValue(config[name])) special[name] = config[name];
  }
  return FromSource(std::move(source), std::move(special));
}

StatusOr<ChatTemplate> ChatTemplate::FromSource(std::string source, nlohmann::json special_tokens) {
  auto compiled = jinja::Template::Parse(source);
  if (!compiled.ok()) return compiled.status().WithContext("chat template");
  ChatTemplate result(std::move(compiled).value(), std::move(source));
  if (!special_tokens.is_null() && !special_tokens.is_object()) {
    return InvalidArgument("special tokens must be a JSON object");
  }
  if (special_tokens.is_object()) {
    for (auto it = special_tokens.begin(); it != special_tokens.end(); ++it) {
      if (!IsTokenValue(it.value())) continue;
      std::string content = TokenContent(it.value());
      result.special_tokens_.Set(it.key(), jinja::Value::String(content));
      if (it.key() == "bos_token") result.bos_token_ = content;
      if (it.key() == "eos_token") result.eos_token_ = content;
    }
  }
  return result;
}

StatusOr<jinja::RenderResult> ChatTemplate::RenderWithSpans(
    const nlohmann::json& messages, bool add_generation_prompt, const nlohmann::json& tools,
    const nlohmann::json& extra_context) const {
  if (!messages.is_array()) return InvalidArgument("messages must be a JSON array");
  if (messages.empty()) {
    // As transformers 5's apply_chat_template.
    return InvalidArgument("Cannot apply chat template to an empty conversation");
  }
  if (!extra_context.is_null() && !extra_context.is_object()) {
    return InvalidArgument("extra_context must be a JSON object");
  }
  // As apply_chat_template: messages, tools, documents, add_generation_prompt, then the
  // tokenizer's special tokens and the caller's extra variables (the later wins).
  jinja::Dict context;
  context.Set("messages", jinja::FromJson(messages));
  context.Set("tools", jinja::FromJson(tools));
  context.Set("documents", jinja::Value::None());
  context.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  for (const auto& [name, value] : special_tokens_.items) context.Set(name, value);
  if (extra_context.is_object()) {
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) {
      context.Set(it.key(), jinja::FromJson(it.value()));
    }
  }
  return template_.RenderWithSpans(context);
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::json& messages,
                                           bool add_generation_prompt, const nlohmann::json& tools,
                                           const nlohmann::json& extra_context) const {
  TIDAL_ASSIGN_OR_RETURN(auto result,
                         RenderWithSpans(messages, add_generation_prompt, tools, extra_context));
  return std::move(result.text);
}

StatusOr<ChatRendering> ChatTemplate::RenderForTraining(const nlohmann::json& messages,
                                                        const nlohmann::json& tools) const {
  TIDAL_ASSIGN_OR_RETURN(auto full, RenderWithSpans(messages, false, tools, nullptr));
  ChatRendering rendering;
  rendering.text = std::move(full.text);
  if (has_generation_blocks()) {
    rendering.assistant_spans = std::move(full.generation_spans);
    return rendering;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& message = messages[i];
    if (!message.is_object() || message.value("role", "") != "assistant") continue;
    nlohmann::json before(nlohmann::json::value_t::array);
    for (size_t k = 0; k < i; ++k) before.push_back(messages[k]);
    nlohmann::json through = before;
    through.push_back(message);
    auto prompt = Render(before, true, tools);
    if (!prompt.ok()) {
      return prompt.status().WithContext("rendering the prompt before message " +
                                         std::to_string(i));
    }
    TIDAL_ASSIGN_OR_RETURN(std::string turn, Render(through, false, tools));
    const std::string& text = rendering.text;
    size_t start = prompt->size();
    if (text.compare(0, prompt->size(), *prompt) != 0) {
      // A generation prompt that opens more than the rendered turn shows (DeepSeek-R1's
      // "<think>\n"): the span starts where that prompt and the full rendering part, after the
      // rendering of the messages before it without the generation prompt.
      TIDAL_ASSIGN_OR_RETURN(std::string plain, Render(before, false, tools));
      if (text.compare(0, plain.size(), plain) != 0 ||
          prompt->compare(0, plain.size(), plain) != 0) {
        return FailedPrecondition("message " + std::to_string(i) +
                                  ": the rendering of the messages before it is not a prefix of "
                                  "the full rendering");
      }
      start = plain.size();
      while (start < std::min(prompt->size(), text.size()) && (*prompt)[start] == text[start])
        ++start;
      // Back to the start of a UTF-8 character.
      while (start > plain.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
        --start;
    }
    if (text.compare(0, turn.size(), turn) != 0 || turn.size() < start) {
      return FailedPrecondition("message " + std::to_string(i) +
                                ": the rendering of the messages through it is not a prefix of "
                                "the full rendering (or is shorter than its prompt)");
    }
    rendering.assistant_spans.emplace_back(start, turn.size());
  }
  return rendering;
}

}  // namespace tidal::data
