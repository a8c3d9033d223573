// Chat templates (worker/data/chat_template.h, the Jinja interpreter behind it) from arbitrary
// source: a template ships in the user's tokenizer_config.json and runs over every row of
// their dataset. Fields: template source, messages as JSON. Errors are Status values; the
// training view's assistant spans lie inside the rendered text.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_input.h"
#include "worker/data/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  const auto fields = fuzz::Fields(data, size, 2);
  auto chat = data::ChatTemplate::FromSource(
      fields[0], {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"pad_token", nullptr}});
  if (!chat.ok()) return 0;
  nlohmann::json messages = nlohmann::json::parse(fields[1], nullptr, false);
  if (messages.is_discarded())
    messages = {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}};
  for (bool prompt : {false, true}) (void)chat->Render(messages, prompt);
  auto training = chat->RenderForTraining(messages);
  if (training.ok())
    for (const auto& [begin, end] : training->assistant_spans)
      if (begin > end || end > training->text.size())
        fuzz::Violated("chat_template", "an assistant span lies outside the text");
  return 0;
}
