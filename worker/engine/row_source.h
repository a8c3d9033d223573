// worker/engine/row_source.h — what the engine reads its training rows from, and how a session
// gets one: interfaces the engine owns and worker/data implements (docs/architecture.md: data
// depends on the engine, never the other way). Header-only and free of LibTorch and I/O
// libraries, so the engine (LibTorch only, DESIGN.md §6) depends on the interface while the
// loader that implements it (token store, object stores, cache) links into the binaries that
// run it: tidal-train and tidal-worker.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/engine/model_files.h"

namespace tidal::engine {

struct TrainConfig;

// What the tokenizer said about itself when the rows were made (a token store keeps it in its
// manifest); the trainer checks it against the model before step 0 (job_fit.h).
struct TokenizerFacts {
  std::string kind;  // "tokenizer.json" | "bytes"
  std::string description;
  std::string fingerprint;  // a hash of tokenizer.json + tokenizer_config.json, or "bytes"
  uint32_t vocab_size = 0;
  uint32_t max_id = 0;  // the largest id any sample holds
  std::optional<uint32_t> bos_id, eos_id, pad_id;
};

// What the engine knows of its dataset beyond the rows.
struct DatasetFacts {
  std::string content_hash;  // of the inputs, tokenizer, template and options the rows came from
  uint64_t samples = 0;
  TokenizerFacts tokenizer;
};

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
  // Counts, and the tokenizer the rows were made with (checked against the model before step 0).
  virtual const DatasetFacts& dataset() const = 0;
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
  virtual Status Prepare(const TrainConfig& config) = 0;
  virtual StatusOr<std::unique_ptr<RowSource>> Open(const TrainConfig& config, int rank) = 0;
  // spec.model.uri's files: here a local directory; StoreDataProvider also reads file:// and
  // s3:// prefixes by range.
  virtual StatusOr<std::unique_ptr<ModelFiles>> OpenModel(const std::string& uri) {
    if (uri.find("://") != std::string::npos)
      return InvalidArgument("spec.model.uri: " + uri +
                             ": this data provider reads local paths only");
    return LocalModelFiles(uri);
  }
};

}  // namespace tidal::engine
