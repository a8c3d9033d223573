// worker/data/packing.h — which samples of a token store make up each training row, as a pure
// function of the samples' lengths, maxSeqLen and the seed (DESIGN.md §4, §6). Every rank
// computes the same plan from the store's index, so sequence k of the run is the same row at
// any world size, and resuming at another world size continues the same sample ids.
//
// Samples are visited in a seeded order and packed greedily into rows of seq_len tokens; a
// sample never spans rows. Inside a row each sample is its own document: positions restart at
// 0 and attention never crosses documents (the engine's collate step builds both), so the
// packed loss equals the loss of the samples run one by one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tidal::data {

enum class Overlong { kTruncate, kDrop };

struct PackingOptions {
  int64_t seq_len = 2048;
  Overlong overlong = Overlong::kTruncate;
  bool pack = true;  // false: one sample per row (padding fills the rest)
  uint64_t seed = 0;
};

struct Segment {
  uint64_t sample = 0;
  uint32_t length = 0;  // its first `length` tokens (fewer than the sample's when truncated)
};

struct PackingPlan {
  std::vector<Segment> segments;       // rows back to back
  std::vector<uint64_t> row_begin{0};  // rows + 1 offsets into segments
  uint64_t truncated = 0, truncated_tokens = 0, dropped = 0, too_short = 0;
  uint64_t packed_tokens = 0;

  uint64_t rows() const { return row_begin.size() - 1; }
  std::span<const Segment> Row(uint64_t row) const {
    return {segments.data() + row_begin[row], row_begin[row + 1] - row_begin[row]};
  }
  // Filled share of the rows' capacity, in [0, 1].
  double Utilisation(int64_t seq_len) const;
};

// lengths[i]: tokens of sample i. A sample of fewer than 2 tokens has nothing to predict and is
// skipped (counted in too_short).
PackingPlan BuildPackingPlan(std::span<const uint32_t> lengths, const PackingOptions& options);

// The row that sequence `k` of the run reads: epochs visit every row once, each epoch in its
// own seeded order (a Fisher–Yates permutation of our own: std::shuffle's is unspecified).
class RowOrder {
 public:
  RowOrder(uint64_t rows, uint64_t seed) : rows_(rows), seed_(seed) {}
  uint64_t rows() const { return rows_; }
  uint64_t epoch_of(uint64_t sequence) const { return sequence / rows_; }
  uint64_t RowOf(uint64_t sequence);

 private:
  uint64_t rows_, seed_;
  uint64_t epoch_ = UINT64_MAX;
  std::vector<uint64_t> permutation_;
};

// Fisher–Yates permutation of [0, n) driven by splitmix64 from `seed`.
std::vector<uint64_t> SeededPermutation(uint64_t n, uint64_t seed);

}  // namespace tidal::data
