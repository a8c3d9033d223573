// worker/data/row_source.h — what the engine reads its training rows from, and how a session
// gets one. Header-only and free of LibTorch and I/O libraries, so the engine (LibTorch only,
// DESIGN.md §6) depends on the interface while the loader that implements it (token store,
// object stores, cache) links into the binaries that run it: tidal-train and tidal-worker.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "worker/data/token_store_manifest.h"
#include "worker/engine/model_files.h"

namespace tidal::engine {
struct TrainConfig;
}

namespace tidal::data {

// One training row: the documents of a packing-plan row back to back (worker/data/packing.h).
struct PackedRow {
  std::vector<uint32_t> tokens;
  std::vector<int32_t> targets;    // the next token of the same document when it trains, else -100
  std::vector<int32_t> positions;  // restart at 0 for every document
  std::vector<int32_t> documents;  // 0, 1, 2, … per document of the row
  std::vector<uint64_t> samples;   // the store's sample ids, in row order
};

class RowSource {
 public:
  virtual ~RowSource() = default;
  // Rows per epoch. Sequence k of the run (DESIGN.md §4: the cursor is global) is a pure
  // function of (store, seed, maxSeqLen, k), whatever the world size.
  virtual uint64_t rows() const = 0;
  // The store's manifest: counts, and the tokenizer the rows were made with (checked against
  // the model before step 0).
  virtual const StoreManifest& manifest() const = 0;
  // Sequences this rank reads next, in order, for background fetching; a hint.
  virtual void Prefetch(std::span<const uint64_t> sequences) = 0;
  virtual StatusOr<PackedRow> Sequence(uint64_t k) = 0;
  // Fetches these sequences' data into the node-local cache before step 0.
  virtual Status Warm(std::span<const uint64_t> sequences) = 0;
};

// How a session gets its rows: rank 0 prepares (tokenizes the dataset into a store unless one
// with the same content hash exists) while the others wait at a barrier; then every rank opens.
class DataProvider {
 public:
  virtual ~DataProvider() = default;
  virtual Status Prepare(const engine::TrainConfig& config) = 0;
  virtual StatusOr<std::unique_ptr<RowSource>> Open(const engine::TrainConfig& config,
                                                    int rank) = 0;
  // spec.model.uri's files: here a local directory; StoreDataProvider also reads file:// and
  // s3:// prefixes by range.
  virtual StatusOr<std::unique_ptr<engine::ModelFiles>> OpenModel(const std::string& uri) {
    if (uri.find("://") != std::string::npos)
      return InvalidArgument("spec.model.uri: " + uri +
                             ": this data provider reads local paths only");
    return engine::LocalModelFiles(uri);
  }
};

}  // namespace tidal::data
