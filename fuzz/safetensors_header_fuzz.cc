// The safetensors header parser (worker/engine/safetensors_header.h) on arbitrary file bytes: model
// weights and checkpoint shards come from users and object stores. Beyond not crashing, what
// it accepts must be what every reader relies on: each tensor's bytes inside the data section,
// exactly numel × element size of them, none overlapping.
#include <algorithm>
#include <utility>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "worker/engine/safetensors_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  const std::string_view file = fuzz::Text(data, size);
  auto length = safetensors::HeaderLength(file.substr(0, 8), file.size(), "fuzz.safetensors");
  if (!length.ok()) return 0;
  const uint64_t data_size = file.size() - 8 - *length;
  auto header = safetensors::ParseHeader(file.substr(8, *length), data_size, "fuzz.safetensors");
  if (!header.ok()) return 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header->tensors) {
    uint64_t bytes = *safetensors::DtypeBytes(entry.dtype);
    for (int64_t d : entry.shape) {
      if (d < 0) fuzz::Violated("safetensors_header", name + ": negative dim accepted");
      if (d != 0 && bytes > UINT64_MAX / static_cast<uint64_t>(d))
        fuzz::Violated("safetensors_header", name + ": byte size overflows");
      bytes *= static_cast<uint64_t>(d);
    }
    if (entry.end < entry.begin || entry.end > data_size || entry.end - entry.begin != bytes)
      fuzz::Violated("safetensors_header", name + ": data_offsets do not hold the tensor");
    ranges.emplace_back(entry.begin, entry.end);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      fuzz::Violated("safetensors_header", "overlapping tensors accepted");
  return 0;
}
