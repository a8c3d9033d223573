#include "worker/data/packing.h"

#include <algorithm>
#include <map>

namespace tidal::data {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<uint64_t> SeededPermutation(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = i;
  uint64_t state = seed;
  for (uint64_t i = n; i > 1; --i) {
    // Lemire's multiply-shift maps a 64-bit draw onto [0, i) without a modulo.
    const uint64_t j =
        static_cast<uint64_t>((static_cast<__uint128_t>(SplitMix64(state)) * i) >> 64);
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

PackingPlan BuildPackingPlan(std::span<const uint32_t> lengths, const PackingOptions& options) {
  PackingPlan plan;
  const uint64_t capacity = static_cast<uint64_t>(options.seq_len);
  // Best fit over a bounded window of open rows: each sample goes into the open row it fills
  // most tightly; a new row opens when none has room, and when the window is full the
  // fullest open row is closed first. Rows are emitted in the order they close.
  constexpr size_t kOpenRows = 256;
  std::vector<std::vector<Segment>> open;   // by open-row id
  std::vector<uint64_t> room;               // remaining tokens by open-row id
  std::multimap<uint64_t, size_t> by_room;  // remaining → open-row id
  std::vector<size_t> free_ids;
  auto close = [&](std::multimap<uint64_t, size_t>::iterator it) {
    const size_t id = it->second;
    by_room.erase(it);
    plan.segments.insert(plan.segments.end(), open[id].begin(), open[id].end());
    plan.row_begin.push_back(plan.segments.size());
    open[id].clear();
    free_ids.push_back(id);
  };
  for (uint64_t sample : SeededPermutation(lengths.size(), options.seed ^ 0x7061636bull)) {
    uint64_t length = lengths[sample];
    if (length < 2) {
      ++plan.too_short;
      continue;
    }
    if (length > capacity) {
      if (options.overlong == Overlong::kDrop) {
        ++plan.dropped;
        continue;
      }
      ++plan.truncated;
      plan.truncated_tokens += length - capacity;
      length = capacity;
    }
    plan.packed_tokens += length;
    const Segment segment{sample, static_cast<uint32_t>(length)};
    if (!options.pack) {
      plan.segments.push_back(segment);
      plan.row_begin.push_back(plan.segments.size());
      continue;
    }
    auto fit = by_room.lower_bound(length);
    size_t id;
    if (fit != by_room.end()) {
      id = fit->second;
      by_room.erase(fit);
    } else {
      if (by_room.size() == kOpenRows) close(by_room.begin());
      if (free_ids.empty()) {
        id = open.size();
        open.emplace_back();
        room.push_back(0);
      } else {
        id = free_ids.back();
        free_ids.pop_back();
      }
      room[id] = capacity;
    }
    open[id].push_back(segment);
    room[id] -= length;
    by_room.emplace(room[id], id);
  }
  // The rest, in a fixed order (fullest first) so the plan is a pure function of the inputs.
  while (!by_room.empty()) close(by_room.begin());
  return plan;
}

double PackingPlan::Utilisation(int64_t seq_len) const {
  if (rows() == 0 || seq_len <= 0) return 0;
  return static_cast<double>(packed_tokens) /
         (static_cast<double>(rows()) * static_cast<double>(seq_len));
}

uint64_t RowOrder::RowOf(uint64_t sequence) {
  const uint64_t epoch = sequence / rows_;
  if (epoch != epoch_) {
    // Epoch 0 included: the packing plan's order is already seeded, but rows of similar
    // fill would otherwise come together.
    permutation_ = SeededPermutation(rows_, seed_ * 0x9e3779b97f4a7c15ull + epoch + 1);
    epoch_ = epoch;
  }
  return permutation_[sequence % rows_];
}

}  // namespace tidal::data
