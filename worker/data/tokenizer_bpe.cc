// worker/data/tokenizer_bpe.cc — the BPE model of tokenizer.json, as the `tokenizers` crate's
// models::bpe: merges applied lowest rank first (leftmost on ties) through a heap over a linked
// list of symbols, ignore_merges, byte fallback, unk fusing. Words are cached per thread, so
// concurrent Encode calls share no lock.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "worker/data/tokenizer_internal.h"

namespace tidal::data::tokenizer_internal {

size_t StringHash::operator()(std::string_view s) const noexcept {
  // wyhash-style mixing, 8 bytes at a time.
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  const char* p = s.data();
  size_t n = s.size();
  auto mix = [](uint64_t a, uint64_t b) {
    const __uint128_t r = static_cast<__uint128_t>(a) * b;
    return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
  };
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = mix(h ^ v, 0xA0761D6478BD642Full);
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t v = 0;
    std::memcpy(&v, p, n);
    h = mix(h ^ v, 0xE7037ED1A0B428DBull);
  }
  return static_cast<size_t>(mix(h, 0x8EBC6AF09C88C6E3ull));
}

namespace {

constexpr uint64_t kEmptyKey = ~uint64_t{0};
uint64_t HashPair(uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) ^ (key >> 29); }

// Words up to this many bytes are cached (HF caches words below 256 characters).
constexpr size_t kMaxCachedWordBytes = 256;
// A thread's cache is dropped when it grows past this many words (bounded memory per thread).
constexpr size_t kMaxCachedWords = 1 << 16;

std::atomic<uint64_t> next_instance_id{1};

struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<WordToken>, StringHash, std::equal_to<>> words;
};

// A few caches per thread, one per (model, byte-level) in use; the oldest is reused.
WordCache& ThreadCache(uint64_t owner) {
  thread_local std::array<WordCache, 4> caches;
  thread_local size_t next_slot = 0;
  for (WordCache& cache : caches) {
    if (cache.owner == owner) return cache;
  }
  WordCache& cache = caches[next_slot];
  next_slot = (next_slot + 1) % caches.size();
  cache.owner = owner;
  cache.words.clear();
  return cache;
}

struct Symbol {
  uint32_t id;
  uint32_t length;
  int32_t prev;
  int32_t next;
};

struct Candidate {
  uint32_t rank;
  uint32_t pos;
  uint32_t new_id;
  bool operator>(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, Options options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->instance_id_ = next_instance_id.fetch_add(1);
  uint32_t max_id = 0;
  for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
  model->id_to_token_.assign(vocab.empty() ? 0 : size_t{max_id} + 1, std::string());
  for (const auto& [token, id] : vocab) model->id_to_token_[id] = token;

  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  model->merge_keys_.assign(capacity, kEmptyKey);
  model->merge_values_.assign(capacity, MergeValue{0, 0});
  model->merge_mask_ = capacity - 1;
  const size_t prefix_length = options.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const std::string where = "model.merges[" + std::to_string(rank) + "]";
    auto left_it = vocab.find(left);
    if (left_it == vocab.end()) {
      return InvalidArgument(where + ": token \"" + left + "\" is not in model.vocab");
    }
    auto right_it = vocab.find(right);
    if (right_it == vocab.end()) {
      return InvalidArgument(where + ": token \"" + right + "\" is not in model.vocab");
    }
    std::string merged = left;
    merged += (prefix_length > 0 && right.starts_with(options.continuing_subword_prefix))
                  ? right.substr(prefix_length)
                  : right;
    auto merged_it = vocab.find(merged);
    if (merged_it == vocab.end()) {
      return InvalidArgument(where + ": merged token \"" + merged + "\" is not in model.vocab");
    }
    const uint64_t key = (uint64_t{left_it->second} << 32) | right_it->second;
    uint64_t slot = HashPair(key) & model->merge_mask_;
    while (model->merge_keys_[slot] != kEmptyKey && model->merge_keys_[slot] != key) {
      slot = (slot + 1) & model->merge_mask_;
    }
    // A repeated pair keeps its last rank, as HF's HashMap collect does.
    model->merge_keys_[slot] = key;
    model->merge_values_[slot] = {static_cast<uint32_t>(rank), merged_it->second};
  }

  const auto& chars = ByteLevelChars();
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(chars[b]);
    model->byte_level_id_[b] = it == vocab.end() ? -1 : int64_t{it->second};
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    it = vocab.find(std::string_view(name));
    model->byte_fallback_id_[b] = it == vocab.end() ? -1 : int64_t{it->second};
  }
  if (options.unk_token) {
    auto it = vocab.find(*options.unk_token);
    if (it != vocab.end()) model->unk_id_ = it->second;
  }
  model->options_ = std::move(options);
  model->vocab_ = std::move(vocab);
  return model;
}

const BpeModel::MergeValue* BpeModel::FindMerge(uint32_t left, uint32_t right) const {
  const uint64_t key = (uint64_t{left} << 32) | right;
  uint64_t slot = HashPair(key) & merge_mask_;
  while (true) {
    const uint64_t k = merge_keys_[slot];
    if (k == key) return &merge_values_[slot];
    if (k == kEmptyKey) return nullptr;
    slot = (slot + 1) & merge_mask_;
  }
}

void BpeModel::Tokenize(std::string_view word, bool byte_level, std::vector<WordToken>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const Vocab::const_iterator it = [&] {
      if (!byte_level) return vocab_.find(word);
      thread_local std::string mapped;
      mapped.clear();
      for (const char c : word) mapped += ByteLevelChars()[static_cast<uint8_t>(c)];
      return vocab_.find(mapped);
    }();
    if (it != vocab_.end()) {
      out.push_back({it->second, static_cast<uint32_t>(word.size())});
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    Merge(word, byte_level, out);
    return;
  }
  WordCache& cache = ThreadCache(instance_id_ * 2 + (byte_level ? 1 : 0));
  if (auto it = cache.words.find(word); it != cache.words.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t first = out.size();
  Merge(word, byte_level, out);
  if (cache.words.size() >= kMaxCachedWords) cache.words.clear();
  cache.words.emplace(std::string(word), std::vector<WordToken>(out.begin() + first, out.end()));
}

void BpeModel::Merge(std::string_view word, bool byte_level, std::vector<WordToken>& out) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();
  auto add = [&](uint32_t id, uint32_t length) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, length, index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
  };
  const bool affixes =
      !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  bool previous_unk = false;
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    const size_t length =
        byte_level ? 1 : std::min(Utf8CharLength(static_cast<uint8_t>(word[i])), word.size() - i);
    int64_t id = -1;
    if (byte_level && !affixes) {
      id = byte_level_id_[static_cast<uint8_t>(word[i])];
    } else {
      piece.clear();
      if (i > 0) piece += options_.continuing_subword_prefix;
      if (byte_level) {
        piece += ByteLevelChars()[static_cast<uint8_t>(word[i])];
      } else {
        piece.append(word.substr(i, length));
      }
      if (i + length == word.size()) piece += options_.end_of_word_suffix;
      auto it = vocab_.find(piece);
      if (it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      add(static_cast<uint32_t>(id), static_cast<uint32_t>(length));
      previous_unk = false;
    } else {
      bool fell_back = false;
      if (options_.byte_fallback) {
        fell_back = true;
        for (size_t k = 0; k < length; ++k) {
          if (byte_fallback_id_[static_cast<uint8_t>(word[i + k])] < 0) fell_back = false;
        }
        if (fell_back) {
          for (size_t k = 0; k < length; ++k) {
            add(static_cast<uint32_t>(byte_fallback_id_[static_cast<uint8_t>(word[i + k])]), 1);
          }
          previous_unk = false;
        }
      }
      if (!fell_back && unk_id_) {
        if (options_.fuse_unk && previous_unk) {
          symbols.back().length += static_cast<uint32_t>(length);
        } else {
          add(*unk_id_, static_cast<uint32_t>(length));
        }
        previous_unk = true;
      }
    }
    i += length;
  }

  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeValue* merge = FindMerge(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back({merge->rank, static_cast<uint32_t>(i), merge->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.length == 0 || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    const MergeValue* merge = FindMerge(left.id, right.id);
    if (merge == nullptr || merge->new_id != top.new_id) continue;
    left.id = top.new_id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0)
      symbols[static_cast<size_t>(left.next)].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) {
      const Symbol& before = symbols[static_cast<size_t>(left.prev)];
      if (const MergeValue* m = FindMerge(before.id, left.id)) {
        heap.push_back({m->rank, static_cast<uint32_t>(left.prev), m->new_id});
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      }
    }
    if (left.next >= 0) {
      const Symbol& after = symbols[static_cast<size_t>(left.next)];
      if (const MergeValue* m = FindMerge(left.id, after.id)) {
        heap.push_back({m->rank, top.pos, m->new_id});
        std::push_heap(heap.begin(), heap.end(), std::greater<>());
      }
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.length > 0) out.push_back({symbol.id, symbol.length});
  }
}

}  // namespace tidal::data::tokenizer_internal
