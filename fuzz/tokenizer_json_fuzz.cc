// tokenizer.json (worker/data/tokenizer.h) from arbitrary bytes: it comes with the user's
// model. Fields: the tokenizer.json text, a text to encode. What an accepted tokenizer encodes
// are ids it knows, with offsets inside the text.
#include <string>

#include "fuzz/fuzz_input.h"
#include "worker/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  const auto fields = fuzz::Fields(data, size, 2);
  auto tokenizer = data::Tokenizer::FromJson(fields[0]);
  if (!tokenizer.ok()) return 0;
  (void)tokenizer->Describe();
  for (bool special : {false, true}) {
    const data::Encoding encoding = tokenizer->Encode(fields[1], special);
    for (uint32_t id : encoding.ids)
      if (id >= tokenizer->vocab_size())
        fuzz::Violated("tokenizer_json", "id " + std::to_string(id) + " >= vocab size " +
                                             std::to_string(tokenizer->vocab_size()));
    for (const auto& [begin, end] : encoding.offsets)
      if (begin > end || end > fields[1].size())
        fuzz::Violated("tokenizer_json", "an offset lies outside the text");
    (void)tokenizer->Decode(encoding.ids, !special);
  }
  return 0;
}
