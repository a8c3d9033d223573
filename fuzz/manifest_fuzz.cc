// The checkpoint manifest (worker/checkpoint/manifest.h) from arbitrary JSON: a store can hand
// back anything. What it accepts must round-trip unchanged through ToJson, and every read it
// plans for an accepted tensor must stay inside its shard and name checksums for what it
// fetches.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_input.h"
#include "worker/checkpoint/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  const nlohmann::json json = nlohmann::json::parse(data, data + size, nullptr, false);
  if (json.is_discarded()) return 0;
  auto manifest = checkpoint::ManifestFromJson(json);
  if (!manifest.ok()) return 0;
  const nlohmann::json written = checkpoint::ToJson(*manifest);
  auto again = checkpoint::ManifestFromJson(written);
  if (!again.ok())
    fuzz::Violated("manifest",
                   "ToJson of an accepted manifest is refused: " + again.status().message());
  if (checkpoint::ToJson(*again) != written)
    fuzz::Violated("manifest", "ToJson does not round-trip");
  for (const checkpoint::TensorEntry& tensor : manifest->tensors) {
    const int64_t n = tensor.numel();
    for (auto [first, count] : {std::pair<int64_t, int64_t>{0, n}, {n / 3, n - n / 3 - n / 4}}) {
      auto plan = checkpoint::PlanRead(*manifest, tensor.name, first, count);
      if (!plan.ok()) continue;
      for (const checkpoint::ReadRange& range : *plan) {
        const checkpoint::ShardEntry* shard = nullptr;
        for (const auto& s : manifest->shards)
          if (s.file == range.file) shard = &s;
        if (!shard) fuzz::Violated("manifest", "a read names no shard of the manifest");
        if (range.fetch_offset > shard->size ||
            range.fetch_length > shard->size - range.fetch_offset)
          fuzz::Violated("manifest", "a read goes past the end of its shard");
        if (range.skip > range.fetch_length || range.length > range.fetch_length - range.skip)
          fuzz::Violated("manifest", "the wanted bytes are not inside the fetched ones");
      }
    }
  }
  return 0;
}
