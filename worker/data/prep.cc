#include "worker/data/prep.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "worker/data/chat_template.h"
#include "worker/data/tokenizer.h"

namespace tidal::data {
namespace {

using nlohmann::json;

constexpr uint32_t kByteBos = 256, kByteEos = 257, kByteVocab = 258;
constexpr size_t kReportedProblems = 20;

std::string Hex64(uint64_t v) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

// A token id from tokenizer_config.json's bos_token/eos_token/pad_token (a string or an
// AddedToken object), looked up in the tokenizer.
std::optional<uint32_t> SpecialId(const Tokenizer& tokenizer, const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config[key];
  std::string content;
  if (v.is_string())
    content = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string())
    content = v["content"].get<std::string>();
  else
    return std::nullopt;
  return tokenizer.TokenToId(content);
}

Status RecordError(const std::string& what) { return InvalidArgument(what); }

StatusOr<std::string> StringField(const json& record, const char* key, bool required) {
  if (!record.contains(key) || record[key].is_null()) {
    if (required) return RecordError(std::string("\"") + key + "\": missing");
    return std::string();
  }
  if (!record[key].is_string())
    return RecordError(std::string("\"") + key + "\": expected a string, got " +
                       record[key].type_name());
  return record[key].get<std::string>();
}

// OpenAI-style "messages" or ShareGPT-style "conversations" → messages with role/content.
StatusOr<json> Conversation(const json& record) {
  const bool sharegpt = !record.contains("messages") && record.contains("conversations");
  const char* key = sharegpt ? "conversations" : "messages";
  if (!record.contains(key)) return RecordError("\"messages\": missing");
  const json& turns = record[key];
  if (!turns.is_array() || turns.empty())
    return RecordError(std::string("\"") + key + "\": expected a non-empty list of messages");
  json messages = json::array();
  for (size_t i = 0; i < turns.size(); ++i) {
    const std::string at = std::string("\"") + key + "\"[" + std::to_string(i) + "]";
    const json& turn = turns[i];
    if (!turn.is_object()) return RecordError(at + ": expected an object");
    json message = turn;
    if (sharegpt) {
      if (!turn.contains("from") || !turn["from"].is_string())
        return RecordError(at + ".from: expected a string");
      if (!turn.contains("value") || !turn["value"].is_string())
        return RecordError(at + ".value: expected a string");
      static const std::map<std::string, std::string> kRoles = {
          {"human", "user"},       {"user", "user"},
          {"gpt", "assistant"},    {"assistant", "assistant"},
          {"system", "system"},    {"tool", "tool"},
          {"observation", "tool"}, {"function_call", "assistant"}};
      auto role = kRoles.find(turn["from"].get<std::string>());
      if (role == kRoles.end())
        return RecordError(at + ".from: \"" + turn["from"].get<std::string>() +
                           "\" is not one of human, gpt, system, tool, observation");
      message = {{"role", role->second}, {"content", turn["value"]}};
    } else {
      if (!turn.contains("role") || !turn["role"].is_string())
        return RecordError(at + ".role: expected a string");
      const bool has_calls = turn.contains("tool_calls") && turn["tool_calls"].is_array();
      if (turn.contains("content") && turn["content"].is_null() && has_calls) {
        // an assistant turn that only calls tools
      } else if (!turn.contains("content") || !turn["content"].is_string()) {
        return RecordError(at + ".content: expected a string");
      }
    }
    messages.push_back(std::move(message));
  }
  bool assistant = false;
  for (const json& m : messages) assistant = assistant || m["role"] == "assistant";
  if (!assistant) return RecordError(std::string("\"") + key + "\": no assistant turn to train on");
  return messages;
}

constexpr std::string_view kAlpacaPrompt =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n";
constexpr std::string_view kAlpacaPromptWithInput =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n### Instruction:\n";

}  // namespace

TextEncoder::TextEncoder() = default;
TextEncoder::~TextEncoder() = default;

std::unique_ptr<TextEncoder> TextEncoder::Bytes() {
  std::unique_ptr<TextEncoder> e(new TextEncoder());
  e->bos_ = kByteBos;
  e->eos_ = kByteEos;
  e->fingerprint_ = "bytes";
  return e;
}

StatusOr<std::unique_ptr<TextEncoder>> TextEncoder::FromFiles(std::string tokenizer_json,
                                                              std::string tokenizer_config_json,
                                                              const TextEncoder* previous) {
  std::unique_ptr<TextEncoder> e(new TextEncoder());
  const XXH128_hash_t digest = XXH3_128bits(tokenizer_json.data(), tokenizer_json.size());
  e->tokenizer_digest_ = Hex64(digest.high64) + Hex64(digest.low64);
  if (previous != nullptr && previous->tokenizer_ &&
      previous->tokenizer_digest_ == e->tokenizer_digest_) {
    e->tokenizer_ = std::make_unique<Tokenizer>(*previous->tokenizer_);  // shares the parsed one
  } else {
    auto tokenizer = Tokenizer::FromJson(tokenizer_json);
    if (!tokenizer.ok())
      return Status(tokenizer.status().code(), "tokenizer.json: " + tokenizer.status().message());
    e->tokenizer_ = std::make_unique<Tokenizer>(std::move(*tokenizer));
  }
  json config = json::object();
  if (!tokenizer_config_json.empty()) {
    config = json::parse(tokenizer_config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return InvalidArgument("tokenizer_config.json: not a JSON object");
    if (config.contains("chat_template")) {
      auto chat = ChatTemplate::FromTokenizerConfig(tokenizer_config_json);
      if (!chat.ok())
        return Status(chat.status().code(),
                      "tokenizer_config.json: chat_template: " + chat.status().message());
      e->chat_ = std::make_unique<ChatTemplate>(std::move(*chat));
    }
  }
  for (auto [key, slot] : {std::pair{"bos_token", &e->bos_}, std::pair{"eos_token", &e->eos_},
                           std::pair{"pad_token", &e->pad_}}) {
    *slot = SpecialId(*e->tokenizer_, config, key);
    const bool named = config.contains(key) && !config[key].is_null();
    if (named && !*slot)
      return InvalidArgument(std::string("tokenizer_config.json: ") + key + " " +
                             config[key].dump() + " is not a token of tokenizer.json");
  }
  // transformers' Llama-style tokenizers add BOS from this flag, not from the post-processor.
  e->add_bos_ = config.contains("add_bos_token") && config["add_bos_token"].is_boolean() &&
                config["add_bos_token"].get<bool>() && e->bos_;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, tokenizer_json.data(), tokenizer_json.size());
  XXH3_64bits_update(state, "\0", 1);
  XXH3_64bits_update(state, tokenizer_config_json.data(), tokenizer_config_json.size());
  e->fingerprint_ = Hex64(XXH3_64bits_digest(state));
  XXH3_freeState(state);
  return e;
}

StatusOr<std::unique_ptr<TextEncoder>> TextEncoder::FromModelDirectory(
    const std::string& uri, const objstore::S3Options& s3, const TextEncoder* previous) {
  TIDAL_ASSIGN_OR_RETURN(auto store, objstore::OpenObjectStore(uri, s3));
  auto tokenizer = store->Get("tokenizer.json");
  if (!tokenizer.ok()) {
    if (tokenizer.status().code() == StatusCode::kNotFound)
      return NotFound(uri + " has no tokenizer.json: Tidal trains a model only with the " +
                      "tokenizer it was trained with (a model trained on raw bytes: set " +
                      "spec.dataset.tokenizer: bytes)");
    return tokenizer.status();
  }
  std::string config;
  if (auto c = store->Get("tokenizer_config.json"); c.ok()) {
    config = std::move(*c);
  } else if (c.status().code() != StatusCode::kNotFound) {
    return c.status();
  }
  auto encoder = FromFiles(std::move(*tokenizer), std::move(config), previous);
  if (!encoder.ok()) return Status(encoder.status().code(), uri + "/" + encoder.status().message());
  return encoder;
}

engine::TokenizerFacts TextEncoder::Facts() const {
  engine::TokenizerFacts t;
  if (is_bytes()) {
    t.kind = "bytes";
    t.description = "bytes (0-255), 256 = begin, 257 = end of document";
    t.vocab_size = kByteVocab;
  } else {
    t.kind = "tokenizer.json";
    t.description = tokenizer_->Describe();
    t.vocab_size = tokenizer_->vocab_size();
  }
  t.fingerprint = fingerprint_;
  t.bos_id = bos_;
  t.eos_id = eos_;
  t.pad_id = pad_;
  return t;
}

std::string TextEncoder::Decode(std::span<const uint32_t> ids) const {
  if (!is_bytes()) return tokenizer_->Decode(ids, /*skip_special_tokens=*/false);
  std::string out;
  for (uint32_t id : ids) {
    if (id < 256)
      out.push_back(static_cast<char>(id));
    else if (id == kByteBos)
      out += "<s>";
    else if (id == kByteEos)
      out += "</s>";
    else
      out += "<?" + std::to_string(id) + ">";
  }
  return out;
}

// `text` with the byte spans that train; the ids and the per-token flag (a token trains when
// it starts inside a span, as transformers' assistant masks do).
static StatusOr<TextEncoder::Tokens> EncodeSpans(
    const Tokenizer* tokenizer, std::string_view text,
    const std::vector<std::pair<size_t, size_t>>& spans, bool add_special_tokens,
    std::optional<uint32_t> eos) {
  TextEncoder::Tokens out;
  auto in_span = [&](size_t at) {
    auto it = std::upper_bound(spans.begin(), spans.end(), std::pair{at, SIZE_MAX});
    return it != spans.begin() && at < std::prev(it)->second;
  };
  const bool ends_in_span = !spans.empty() && spans.back().second >= text.size();
  if (!tokenizer) {
    out.ids.push_back(kByteBos);
    out.trains.push_back(0);
    for (size_t i = 0; i < text.size(); ++i) {
      out.ids.push_back(static_cast<unsigned char>(text[i]));
      out.trains.push_back(in_span(i));
    }
    out.ids.push_back(kByteEos);
    out.trains.push_back(ends_in_span);
    return out;
  }
  Encoding enc = tokenizer->Encode(text, add_special_tokens);
  out.ids = std::move(enc.ids);
  out.trains.resize(out.ids.size());
  for (size_t i = 0; i < out.ids.size(); ++i) {
    const auto [first, last] = enc.offsets[i];
    out.trains[i] = last > first && in_span(first);
  }
  // A document ends with EOS so the model learns to stop; chat templates write their own. An
  // EOS the post-processor added has no text of its own: it trains when the text before does.
  if (eos && add_special_tokens) {
    if (out.ids.empty() || out.ids.back() != *eos) {
      out.ids.push_back(*eos);
      out.trains.push_back(ends_in_span);
    } else {
      out.trains.back() = ends_in_span;
    }
  }
  if (out.ids.empty()) return InvalidArgument("the record encodes to no token");
  return out;
}

StatusOr<TextEncoder::Tokens> TextEncoder::EncodeText(const std::string& text) const {
  TIDAL_ASSIGN_OR_RETURN(Tokens tokens, EncodeSpans(tokenizer_.get(), text, {{0, text.size()}},
                                                    /*add_special_tokens=*/true, eos_));
  if (add_bos_ && (tokens.ids.empty() || tokens.ids.front() != *bos_)) {
    tokens.ids.insert(tokens.ids.begin(), *bos_);
    tokens.trains.insert(tokens.trains.begin(), 0);
  }
  return tokens;
}

StatusOr<TextEncoder::Tokens> TextEncoder::EncodeChat(const json& messages,
                                                      const json& tools) const {
  auto rendering = chat_->RenderForTraining(messages, tools);
  if (!rendering.ok()) return InvalidArgument("chat template: " + rendering.status().message());
  if (rendering->assistant_spans.empty())
    return InvalidArgument("chat template: the rendering has no assistant span to train on");
  // As apply_chat_template(tokenize=True): the template writes BOS and turn markers itself.
  return EncodeSpans(tokenizer_.get(), rendering->text, rendering->assistant_spans,
                     /*add_special_tokens=*/false, eos_);
}

StatusOr<TextEncoder::Tokens> TextEncoder::EncodeRecord(const json& record,
                                                        const std::string& format) const {
  if (!record.is_object())
    return RecordError(std::string("expected a JSON object, got ") + record.type_name());
  if (format == "text") {
    TIDAL_ASSIGN_OR_RETURN(std::string text, StringField(record, "text", true));
    if (text.empty()) return RecordError("\"text\": empty");
    return EncodeText(text);
  }
  if (format == "alpaca") {
    TIDAL_ASSIGN_OR_RETURN(std::string instruction, StringField(record, "instruction", true));
    TIDAL_ASSIGN_OR_RETURN(std::string input, StringField(record, "input", false));
    TIDAL_ASSIGN_OR_RETURN(std::string output, StringField(record, "output", true));
    if (output.empty()) return RecordError("\"output\": empty: nothing to train on");
    if (chat_) {
      json messages =
          json::array({{{"role", "user"},
                        {"content", input.empty() ? instruction : instruction + "\n\n" + input}},
                       {{"role", "assistant"}, {"content", output}}});
      return EncodeChat(messages, nullptr);
    }
    // A model without a chat template: the Stanford Alpaca prompt; the response trains.
    std::string text(input.empty() ? kAlpacaPrompt : kAlpacaPromptWithInput);
    text += instruction;
    if (!input.empty()) text += "\n\n### Input:\n" + input;
    text += "\n\n### Response:\n";
    const size_t response = text.size();
    text += output;
    TIDAL_ASSIGN_OR_RETURN(
        Tokens tokens, EncodeSpans(tokenizer_.get(), text, {{response, text.size()}}, true, eos_));
    if (add_bos_ && tokens.ids.front() != *bos_) {
      tokens.ids.insert(tokens.ids.begin(), *bos_);
      tokens.trains.insert(tokens.trains.begin(), 0);
    }
    return tokens;
  }
  if (format == "messages") {
    if (!chat_)
      return FailedPrecondition(
          "format messages needs the model's chat template (tokenizer_config.json "
          "chat_template); " +
          std::string(is_bytes() ? "the byte tokenizer has none" : "this tokenizer has none"));
    TIDAL_ASSIGN_OR_RETURN(json messages, Conversation(record));
    json tools = record.contains("tools") ? record["tools"] : json(nullptr);
    return EncodeChat(messages, tools);
  }
  return InvalidArgument("spec.dataset.format: \"" + format +
                         "\" is not one of text, alpaca, messages");
}

StatusOr<std::pair<std::string, std::string>> SplitObjectUri(const std::string& uri) {
  std::string path = uri;
  if (path.starts_with("file://")) path = path.substr(7);
  const bool s3 = uri.starts_with("s3://");
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash + 1 == path.size() ||
      (s3 && slash < std::string("s3://").size()))
    return InvalidArgument("spec.dataset.uri: \"" + uri +
                           "\": expected a JSONL object (/path/data.jsonl, file:///path/data.jsonl "
                           "or s3://bucket/key.jsonl)");
  std::string dir = path.substr(0, slash);
  if (!s3) dir = "file://" + (dir.empty() ? std::string("/") : dir);
  return std::pair{dir, path.substr(slash + 1)};
}

StatusOr<bool> IsTokenStore(const std::string& uri, const objstore::S3Options& s3) {
  if (uri.ends_with(".jsonl") || uri.ends_with(".json")) return false;
  auto store = objstore::OpenObjectStore(uri, s3);
  if (!store.ok()) return false;
  auto size = (*store)->Size(std::string(kStoreManifestKey));
  if (size.ok()) return true;
  if (size.status().code() == StatusCode::kNotFound) return false;
  return size.status();
}

namespace {

struct Line {
  std::string_view text;
  uint64_t number;
};

struct Outcome {
  std::optional<TextEncoder::Tokens> tokens;
  Status error;
};

}  // namespace

StatusOr<PrepResult> Prepare(const PrepOptions& options, const TextEncoder& encoder,
                             const objstore::S3Options& s3) {
  if (options.format != "text" && options.format != "alpaca" && options.format != "messages")
    return InvalidArgument("spec.dataset.format: \"" + options.format +
                           "\" is not one of text, alpaca, messages");
  TIDAL_ASSIGN_OR_RETURN(auto where, SplitObjectUri(options.input_uri));
  TIDAL_ASSIGN_OR_RETURN(auto input_store, objstore::OpenObjectStore(where.first, s3));
  auto input = input_store->Get(where.second);
  if (!input.ok()) {
    if (input.status().code() == StatusCode::kNotFound)
      return NotFound("spec.dataset.uri: " + options.input_uri + " not found");
    return Status(input.status().code(),
                  "spec.dataset.uri: " + options.input_uri + ": " + input.status().message());
  }
  const std::string& bytes = *input;

  // What decides the store's contents: the format version, the input, the tokenizer and
  // template, the options.
  const std::string recipe = "tidal-prep/1\nformat=" + options.format +
                             "\nstrict=" + (options.strict ? "1" : "0") +
                             "\ntokenizer=" + encoder.fingerprint() +
                             "\ninput=" + Hex64(XXH3_64bits(bytes.data(), bytes.size())) + "\n";
  const std::string hash = Hex64(XXH3_64bits(recipe.data(), recipe.size()));
  PrepResult result;
  std::string base = options.output_uri;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  result.store_uri = base + "/" + hash;
  TIDAL_ASSIGN_OR_RETURN(auto out, objstore::OpenObjectStore(result.store_uri, s3));
  TIDAL_ASSIGN_OR_RETURN(auto existing, ReadStoreManifest(*out));
  if (existing && existing->content_hash == hash) {
    result.reused = true;
    result.manifest = std::move(*existing);
    return result;
  }
  if (options.lookup_only)
    return NotFound("no token store at " + result.store_uri + " (rank 0 prepares it)");

  std::vector<Line> lines;
  uint64_t number = 0;
  for (size_t at = 0; at < bytes.size();) {
    size_t end = bytes.find('\n', at);
    if (end == std::string::npos) end = bytes.size();
    ++number;
    std::string_view line(bytes.data() + at, end - at);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) lines.push_back({line, number});
    at = end + 1;
  }

  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  TokenStoreWriter writer(*out, options.shard_tokens);
  json problems = json::array();
  std::map<std::string, uint64_t> skipped_by_reason;
  uint64_t skipped = 0;
  constexpr size_t kWindow = 8192;  // records tokenized in parallel, then written in order
  std::vector<Outcome> outcomes;
  for (size_t first = 0; first < lines.size(); first += kWindow) {
    const size_t count = std::min(kWindow, lines.size() - first);
    outcomes.assign(count, Outcome{});
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < count;) {
        const Line& line = lines[first + i];
        json record = json::parse(line.text, nullptr, /*allow_exceptions=*/false);
        if (record.is_discarded()) {
          outcomes[i].error = InvalidArgument("not valid JSON");
          continue;
        }
        try {
          auto tokens = encoder.EncodeRecord(record, options.format);
          if (tokens.ok())
            outcomes[i].tokens = std::move(*tokens);
          else
            outcomes[i].error = tokens.status();
        } catch (const std::exception& e) {  // a bug or bad_alloc: this record, not the run
          outcomes[i].error = Internal(std::string("tokenizing failed: ") + e.what());
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < std::min<int>(threads, static_cast<int>(count)); ++t)
      pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    for (size_t i = 0; i < count; ++i) {
      const Line& line = lines[first + i];
      if (outcomes[i].tokens) {
        TIDAL_RETURN_IF_ERROR(writer.Add(outcomes[i].tokens->ids, outcomes[i].tokens->trains));
        continue;
      }
      const std::string where_text = where.second + ":" + std::to_string(line.number);
      if (options.strict || outcomes[i].error.code() == StatusCode::kFailedPrecondition)
        return InvalidArgument("spec.dataset.uri: " + where_text + ": " +
                               outcomes[i].error.message() +
                               (options.strict ? " (spec.dataset.strict is true)" : ""));
      ++skipped;
      std::string reason = outcomes[i].error.message();
      ++skipped_by_reason[reason.substr(0, reason.find(':'))];
      if (problems.size() < kReportedProblems)
        problems.push_back({{"line", line.number}, {"error", reason}});
    }
    if (options.progress)
      options.progress(lines[first + count - 1].text.end() - bytes.data(), bytes.size(),
                       writer.samples(), writer.tokens());
  }
  if (options.progress)
    options.progress(bytes.size(), bytes.size(), writer.samples(), writer.tokens());
  if (writer.samples() == 0)
    return InvalidArgument("spec.dataset.uri: " + options.input_uri + ": no usable record (" +
                           std::to_string(lines.size()) + " non-empty lines, " +
                           std::to_string(skipped) + " skipped" +
                           (problems.empty() ? std::string()
                                             : "; first: line " + problems[0]["line"].dump() +
                                                   ": " + problems[0]["error"].get<std::string>()) +
                           ")");
  StoreManifest manifest;
  manifest.content_hash = hash;
  manifest.source_format = options.format;
  manifest.tokenizer = encoder.Facts();
  manifest.report = {{"input", options.input_uri},
                     {"lines", number},
                     {"records", lines.size()},
                     {"skipped", skipped},
                     {"skipped_by_reason", skipped_by_reason},
                     {"problems", problems}};
  TIDAL_RETURN_IF_ERROR(writer.Finish(manifest));
  TIDAL_ASSIGN_OR_RETURN(auto written, ReadStoreManifest(*out));
  result.manifest = std::move(*written);
  return result;
}

StatusOr<std::vector<json>> InspectStore(const std::string& store_uri, uint64_t count,
                                         const TextEncoder& encoder,
                                         const objstore::S3Options& s3) {
  TIDAL_ASSIGN_OR_RETURN(auto store, objstore::OpenObjectStore(store_uri, s3));
  TIDAL_ASSIGN_OR_RETURN(auto index, StoreIndex::Open(*store));
  if (index.manifest().tokenizer.kind == "bytes" && !encoder.is_bytes())
    return InvalidArgument(store_uri +
                           " was written with the byte tokenizer; inspect it with "
                           "--tokenizer bytes");
  std::vector<json> out;
  const StoreManifest& manifest = index.manifest();
  for (uint64_t i = 0; i < std::min<uint64_t>(count, index.num_samples()); ++i) {
    const SampleLocation& at = index.at(i);
    const StoreShard& shard = manifest.shards[at.shard];
    TIDAL_ASSIGN_OR_RETURN(std::string id_bytes,
                           store->GetRange(shard.name + ".ids", at.begin * 4, at.length() * 4));
    const uint64_t mask_first = at.begin / 8, mask_last = (at.end + 7) / 8;
    TIDAL_ASSIGN_OR_RETURN(std::string mask_bytes, store->GetRange(shard.name + ".mask", mask_first,
                                                                   mask_last - mask_first));
    if (id_bytes.size() != at.length() * 4 || mask_bytes.size() != mask_last - mask_first)
      return DataLoss(store_uri + "/" + shard.name + ": a short read of sample " +
                      std::to_string(i));
    std::vector<uint32_t> ids(at.length());
    std::memcpy(ids.data(), id_bytes.data(), id_bytes.size());
    std::vector<int> mask(at.length());
    for (uint64_t t = 0; t < at.length(); ++t) {
      const uint64_t bit = at.begin + t - mask_first * 8;
      mask[t] = (static_cast<uint8_t>(mask_bytes[bit / 8]) >> (bit % 8)) & 1;
    }
    // Runs of tokens that train or not, decoded; «…» marks what the loss ignores.
    json spans = json::array();
    std::string marked;
    for (size_t t = 0; t < ids.size();) {
      size_t end = t;
      while (end < ids.size() && mask[end] == mask[t]) ++end;
      std::string text = encoder.Decode(std::span<const uint32_t>(ids).subspan(t, end - t));
      spans.push_back({{"train", mask[t] == 1}, {"text", text}});
      marked += mask[t] ? text : "«" + text + "»";
      t = end;
    }
    out.push_back({{"sample", i},
                   {"tokens", ids.size()},
                   {"trained", std::count(mask.begin(), mask.end(), 1)},
                   {"ids", ids},
                   {"loss_mask", mask},
                   {"text", marked},
                   {"spans", spans}});
  }
  return out;
}

}  // namespace tidal::data
