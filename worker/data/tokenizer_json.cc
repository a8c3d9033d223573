// worker/data/tokenizer_json.cc — tokenizer.json into the pipeline structs, validated once:
// every unsupported component is an InvalidArgument naming its type and the supported ones,
// every malformed field one naming the field. nlohmann's exceptions stop here (STYLE.md rule 2).
#include <nlohmann/json.hpp>

#include "worker/data/tokenizer_internal.h"

namespace tidal::data::tokenizer_internal {
namespace {

using nlohmann::json;

Status Unsupported(const std::string& component, const std::string& type,
                   const std::string& supported) {
  return InvalidArgument("tokenizer.json: " + component + " type \"" + type +
                         "\" is not supported (supported: " + supported + ")");
}

StatusOr<const json*> Field(const json& object, const std::string& name, const std::string& where) {
  if (!object.is_object() || !object.contains(name)) {
    return InvalidArgument("tokenizer.json: " + where + "." + name + " is missing");
  }
  return &object.at(name);
}

StatusOr<std::string> StringField(const json& object, const std::string& name,
                                  const std::string& where) {
  TIDAL_ASSIGN_OR_RETURN(const json* value, Field(object, name, where));
  if (!value->is_string()) {
    return InvalidArgument("tokenizer.json: " + where + "." + name + " must be a string");
  }
  return value->get<std::string>();
}

// A boolean that may be absent (then `fallback`).
StatusOr<bool> BoolField(const json& object, const std::string& name, const std::string& where,
                         bool fallback) {
  if (!object.contains(name) || object.at(name).is_null()) return fallback;
  if (!object.at(name).is_boolean()) {
    return InvalidArgument("tokenizer.json: " + where + "." + name + " must be true or false");
  }
  return object.at(name).get<bool>();
}

StatusOr<std::string> TypeOf(const json& object, const std::string& where) {
  if (!object.is_object())
    return InvalidArgument("tokenizer.json: " + where + " must be an object");
  return StringField(object, "type", where);
}

StatusOr<Pattern> ParsePattern(const json& object, const std::string& where) {
  TIDAL_ASSIGN_OR_RETURN(const json* pattern, Field(object, "pattern", where));
  Pattern result;
  if (pattern->is_object() && pattern->contains("String") && pattern->at("String").is_string()) {
    result.literal = pattern->at("String").get<std::string>();
    return result;
  }
  if (pattern->is_object() && pattern->contains("Regex") && pattern->at("Regex").is_string()) {
    auto regex = Regex::Compile(pattern->at("Regex").get<std::string>());
    if (!regex.ok()) return regex.status().WithContext("tokenizer.json: " + where + ".pattern");
    result.regex = *regex;
    return result;
  }
  return InvalidArgument("tokenizer.json: " + where +
                         ".pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

StatusOr<const json*> ArrayField(const json& object, const std::string& name,
                                 const std::string& where) {
  TIDAL_ASSIGN_OR_RETURN(const json* value, Field(object, name, where));
  if (!value->is_array()) {
    return InvalidArgument("tokenizer.json: " + where + "." + name + " must be an array");
  }
  return value;
}

StatusOr<Normalizer> ParseNormalizer(const json& object, const std::string& where) {
  TIDAL_ASSIGN_OR_RETURN(std::string type, TypeOf(object, where));
  Normalizer normalizer;
  if (type == "Sequence") {
    normalizer.type = Normalizer::Type::kSequence;
    TIDAL_ASSIGN_OR_RETURN(const json* children, ArrayField(object, "normalizers", where));
    for (size_t i = 0; i < children->size(); ++i) {
      TIDAL_ASSIGN_OR_RETURN(
          Normalizer child,
          ParseNormalizer(children->at(i), where + ".normalizers[" + std::to_string(i) + "]"));
      normalizer.children.push_back(std::move(child));
    }
  } else if (type == "NFC") {
    normalizer.type = Normalizer::Type::kNfc;
  } else if (type == "NFKC") {
    normalizer.type = Normalizer::Type::kNfkc;
  } else if (type == "NFD") {
    normalizer.type = Normalizer::Type::kNfd;
  } else if (type == "NFKD") {
    normalizer.type = Normalizer::Type::kNfkd;
  } else if (type == "Replace") {
    normalizer.type = Normalizer::Type::kReplace;
    TIDAL_ASSIGN_OR_RETURN(normalizer.pattern, ParsePattern(object, where));
    TIDAL_ASSIGN_OR_RETURN(normalizer.content, StringField(object, "content", where));
  } else if (type == "Prepend") {
    normalizer.type = Normalizer::Type::kPrepend;
    TIDAL_ASSIGN_OR_RETURN(normalizer.content, StringField(object, "prepend", where));
  } else {
    return Unsupported("normalizer", type, "NFC, NFKC, NFD, NFKD, Replace, Prepend, Sequence");
  }
  return normalizer;
}

StatusOr<PreTokenizer::Prepend> ParsePrependScheme(const json& object, const std::string& where) {
  if (object.contains("prepend_scheme") && object.at("prepend_scheme").is_string()) {
    const std::string scheme = object.at("prepend_scheme").get<std::string>();
    if (scheme == "always") return PreTokenizer::Prepend::kAlways;
    if (scheme == "first") return PreTokenizer::Prepend::kFirst;
    if (scheme == "never") return PreTokenizer::Prepend::kNever;
    return InvalidArgument("tokenizer.json: " + where + ".prepend_scheme \"" + scheme +
                           "\" is not one of always, first, never");
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  TIDAL_ASSIGN_OR_RETURN(bool add_prefix_space, BoolField(object, "add_prefix_space", where, true));
  return add_prefix_space ? PreTokenizer::Prepend::kAlways : PreTokenizer::Prepend::kNever;
}

StatusOr<std::string> ReplacementChar(const json& object, const std::string& where) {
  TIDAL_ASSIGN_OR_RETURN(std::string replacement, StringField(object, "replacement", where));
  if (replacement.empty()) {
    return InvalidArgument("tokenizer.json: " + where + ".replacement must be one character");
  }
  return replacement;
}

StatusOr<PreTokenizer> ParsePreTokenizer(const json& object, const std::string& where) {
  TIDAL_ASSIGN_OR_RETURN(std::string type, TypeOf(object, where));
  PreTokenizer pre;
  if (type == "Sequence") {
    pre.type = PreTokenizer::Type::kSequence;
    TIDAL_ASSIGN_OR_RETURN(const json* children, ArrayField(object, "pretokenizers", where));
    for (size_t i = 0; i < children->size(); ++i) {
      TIDAL_ASSIGN_OR_RETURN(
          PreTokenizer child,
          ParsePreTokenizer(children->at(i), where + ".pretokenizers[" + std::to_string(i) + "]"));
      pre.children.push_back(std::move(child));
    }
  } else if (type == "Split") {
    pre.type = PreTokenizer::Type::kSplit;
    TIDAL_ASSIGN_OR_RETURN(pre.pattern, ParsePattern(object, where));
    TIDAL_ASSIGN_OR_RETURN(std::string behavior, StringField(object, "behavior", where));
    if (behavior == "Removed") {
      pre.behavior = SplitBehavior::kRemoved;
    } else if (behavior == "Isolated") {
      pre.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      pre.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      pre.behavior = SplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      pre.behavior = SplitBehavior::kContiguous;
    } else {
      return InvalidArgument("tokenizer.json: " + where + ".behavior \"" + behavior +
                             "\" is not one of Removed, Isolated, MergedWithPrevious, "
                             "MergedWithNext, Contiguous");
    }
    TIDAL_ASSIGN_OR_RETURN(pre.invert, BoolField(object, "invert", where, false));
  } else if (type == "ByteLevel") {
    pre.type = PreTokenizer::Type::kByteLevel;
    TIDAL_ASSIGN_OR_RETURN(pre.add_prefix_space,
                           BoolField(object, "add_prefix_space", where, true));
    TIDAL_ASSIGN_OR_RETURN(pre.use_regex, BoolField(object, "use_regex", where, true));
  } else if (type == "Digits") {
    pre.type = PreTokenizer::Type::kDigits;
    TIDAL_ASSIGN_OR_RETURN(pre.individual_digits,
                           BoolField(object, "individual_digits", where, false));
  } else if (type == "Metaspace") {
    pre.type = PreTokenizer::Type::kMetaspace;
    TIDAL_ASSIGN_OR_RETURN(pre.replacement, ReplacementChar(object, where));
    TIDAL_ASSIGN_OR_RETURN(pre.prepend_scheme, ParsePrependScheme(object, where));
    TIDAL_ASSIGN_OR_RETURN(pre.split, BoolField(object, "split", where, true));
  } else {
    return Unsupported("pre_tokenizer", type, "Split, ByteLevel, Digits, Metaspace, Sequence");
  }
  return pre;
}

StatusOr<Decoder> ParseDecoder(const json& object, const std::string& where) {
  TIDAL_ASSIGN_OR_RETURN(std::string type, TypeOf(object, where));
  Decoder decoder;
  if (type == "Sequence") {
    decoder.type = Decoder::Type::kSequence;
    TIDAL_ASSIGN_OR_RETURN(const json* children, ArrayField(object, "decoders", where));
    for (size_t i = 0; i < children->size(); ++i) {
      TIDAL_ASSIGN_OR_RETURN(
          Decoder child,
          ParseDecoder(children->at(i), where + ".decoders[" + std::to_string(i) + "]"));
      decoder.children.push_back(std::move(child));
    }
  } else if (type == "ByteLevel") {
    decoder.type = Decoder::Type::kByteLevel;
  } else if (type == "ByteFallback") {
    decoder.type = Decoder::Type::kByteFallback;
  } else if (type == "Fuse") {
    decoder.type = Decoder::Type::kFuse;
  } else if (type == "Strip") {
    decoder.type = Decoder::Type::kStrip;
    TIDAL_ASSIGN_OR_RETURN(decoder.content, StringField(object, "content", where));
    for (const char* name : {"start", "stop"}) {
      TIDAL_ASSIGN_OR_RETURN(const json* value, Field(object, name, where));
      if (!value->is_number_unsigned()) {
        return InvalidArgument("tokenizer.json: " + where + "." + name +
                               " must be a non-negative integer");
      }
      (std::string(name) == "start" ? decoder.strip_start : decoder.strip_stop) =
          value->get<size_t>();
    }
  } else if (type == "Replace") {
    decoder.type = Decoder::Type::kReplace;
    TIDAL_ASSIGN_OR_RETURN(decoder.pattern, ParsePattern(object, where));
    TIDAL_ASSIGN_OR_RETURN(decoder.content, StringField(object, "content", where));
  } else if (type == "Metaspace") {
    decoder.type = Decoder::Type::kMetaspace;
    TIDAL_ASSIGN_OR_RETURN(decoder.content, ReplacementChar(object, where));
    TIDAL_ASSIGN_OR_RETURN(PreTokenizer::Prepend scheme, ParsePrependScheme(object, where));
    decoder.prepend_first = scheme != PreTokenizer::Prepend::kNever;
  } else {
    return Unsupported("decoder", type,
                       "ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence");
  }
  return decoder;
}

StatusOr<std::vector<uint32_t>> TemplateIds(const json& piece, const json& special_tokens,
                                            const std::string& where) {
  const json& special = piece.at("SpecialToken");
  TIDAL_ASSIGN_OR_RETURN(std::string name, StringField(special, "id", where + ".SpecialToken"));
  if (!special_tokens.is_object() || !special_tokens.contains(name)) {
    return InvalidArgument("tokenizer.json: post_processor.special_tokens has no \"" + name +
                           "\" (used by " + where + ")");
  }
  const json& ids =
      special_tokens.at(name).contains("ids") ? special_tokens.at(name).at("ids") : json();
  std::vector<uint32_t> result;
  if (!ids.is_array()) {
    return InvalidArgument("tokenizer.json: post_processor.special_tokens[\"" + name +
                           "\"].ids must be an array of token ids");
  }
  for (const json& id : ids) {
    if (!id.is_number_unsigned()) {
      return InvalidArgument("tokenizer.json: post_processor.special_tokens[\"" + name +
                             "\"].ids must be an array of token ids");
    }
    result.push_back(id.get<uint32_t>());
  }
  return result;
}

StatusOr<PostProcessor> ParsePostProcessor(const json& object, const std::string& where) {
  TIDAL_ASSIGN_OR_RETURN(std::string type, TypeOf(object, where));
  PostProcessor post;
  if (type == "Sequence") {
    post.type = PostProcessor::Type::kSequence;
    TIDAL_ASSIGN_OR_RETURN(const json* children, ArrayField(object, "processors", where));
    for (size_t i = 0; i < children->size(); ++i) {
      TIDAL_ASSIGN_OR_RETURN(
          PostProcessor child,
          ParsePostProcessor(children->at(i), where + ".processors[" + std::to_string(i) + "]"));
      post.children.push_back(std::move(child));
    }
  } else if (type == "ByteLevel") {
    post.type = PostProcessor::Type::kByteLevel;
    TIDAL_ASSIGN_OR_RETURN(post.trim_offsets, BoolField(object, "trim_offsets", where, true));
    TIDAL_ASSIGN_OR_RETURN(post.add_prefix_space,
                           BoolField(object, "add_prefix_space", where, true));
  } else if (type == "TemplateProcessing") {
    post.type = PostProcessor::Type::kTemplate;
    TIDAL_ASSIGN_OR_RETURN(const json* single, ArrayField(object, "single", where));
    const json special_tokens =
        object.contains("special_tokens") ? object.at("special_tokens") : json::object();
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& piece = single->at(i);
      const std::string at = where + ".single[" + std::to_string(i) + "]";
      if (piece.is_object() && piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.is_object() && piece.contains("SpecialToken")) {
        TIDAL_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, TemplateIds(piece, special_tokens, at));
        auto& target = seen_sequence ? post.suffix_ids : post.prefix_ids;
        target.insert(target.end(), ids.begin(), ids.end());
      } else {
        return InvalidArgument("tokenizer.json: " + at +
                               " must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    }
  } else {
    return Unsupported("post_processor", type, "TemplateProcessing, ByteLevel, Sequence");
  }
  return post;
}

StatusOr<std::vector<std::pair<std::string, std::string>>> ParseMerges(const json& model) {
  std::vector<std::pair<std::string, std::string>> merges;
  if (!model.contains("merges")) return merges;
  const json& list = model.at("merges");
  if (!list.is_array()) return InvalidArgument("tokenizer.json: model.merges must be an array");
  merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& merge = list[i];
    const std::string where = "tokenizer.json: model.merges[" + std::to_string(i) + "]";
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return InvalidArgument(where + " \"" + line + "\" is not two tokens separated by a space");
      }
      merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return InvalidArgument(where + " must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  return merges;
}

StatusOr<std::unique_ptr<BpeModel>> ParseModel(const json& root) {
  TIDAL_ASSIGN_OR_RETURN(const json* model, Field(root, "model", "(root)"));
  if (!model->is_object()) return InvalidArgument("tokenizer.json: model must be an object");
  std::string type = "BPE";  // files from before "type" existed: BPE has merges
  if (model->contains("type")) {
    TIDAL_ASSIGN_OR_RETURN(type, StringField(*model, "type", "model"));
  }
  if (type != "BPE") return Unsupported("model", type, "BPE");
  TIDAL_ASSIGN_OR_RETURN(const json* vocab_json, Field(*model, "vocab", "model"));
  if (!vocab_json->is_object()) {
    return InvalidArgument("tokenizer.json: model.vocab must be an object of token: id");
  }
  Vocab vocab;
  vocab.reserve(vocab_json->size());
  for (auto it = vocab_json->begin(); it != vocab_json->end(); ++it) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() >= (uint64_t{1} << 31)) {
      return InvalidArgument("tokenizer.json: model.vocab[\"" + it.key() +
                             "\"] must be a token id (an integer in [0, 2^31))");
    }
    vocab.emplace(it.key(), it->get<uint32_t>());
  }
  TIDAL_ASSIGN_OR_RETURN(auto merges, ParseMerges(*model));
  BpeModel::Options options;
  if (model->contains("unk_token") && model->at("unk_token").is_string()) {
    options.unk_token = model->at("unk_token").get<std::string>();
  }
  for (auto [name, target] :
       {std::pair{"continuing_subword_prefix", &options.continuing_subword_prefix},
        std::pair{"end_of_word_suffix", &options.end_of_word_suffix}}) {
    if (model->contains(name) && model->at(name).is_string()) {
      *target = model->at(name).get<std::string>();
    }
  }
  TIDAL_ASSIGN_OR_RETURN(options.fuse_unk, BoolField(*model, "fuse_unk", "model", false));
  TIDAL_ASSIGN_OR_RETURN(options.byte_fallback, BoolField(*model, "byte_fallback", "model", false));
  TIDAL_ASSIGN_OR_RETURN(options.ignore_merges, BoolField(*model, "ignore_merges", "model", false));
  if (model->contains("dropout") && model->at("dropout").is_number() &&
      model->at("dropout").get<double>() > 0.0) {
    return InvalidArgument(
        "tokenizer.json: model.dropout is not supported (encoding would not "
        "be deterministic)");
  }
  return BpeModel::Create(std::move(vocab), merges, std::move(options));
}

StatusOr<std::vector<AddedToken>> ParseAddedTokens(const json& root) {
  std::vector<AddedToken> tokens;
  if (!root.contains("added_tokens") || root.at("added_tokens").is_null()) return tokens;
  const json& list = root.at("added_tokens");
  if (!list.is_array()) return InvalidArgument("tokenizer.json: added_tokens must be an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    const json& entry = list[i];
    AddedToken token;
    TIDAL_ASSIGN_OR_RETURN(const json* id, Field(entry, "id", where));
    if (!id->is_number_unsigned() || id->get<uint64_t>() >= (uint64_t{1} << 31)) {
      return InvalidArgument("tokenizer.json: " + where + ".id must be a token id");
    }
    token.id = id->get<uint32_t>();
    TIDAL_ASSIGN_OR_RETURN(token.content, StringField(entry, "content", where));
    TIDAL_ASSIGN_OR_RETURN(token.single_word, BoolField(entry, "single_word", where, false));
    TIDAL_ASSIGN_OR_RETURN(token.lstrip, BoolField(entry, "lstrip", where, false));
    TIDAL_ASSIGN_OR_RETURN(token.rstrip, BoolField(entry, "rstrip", where, false));
    TIDAL_ASSIGN_OR_RETURN(token.special, BoolField(entry, "special", where, false));
    TIDAL_ASSIGN_OR_RETURN(token.normalized, BoolField(entry, "normalized", where, !token.special));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

StatusOr<std::unique_ptr<TokenizerImpl>> Parse(const json& root) {
  if (!root.is_object()) return InvalidArgument("tokenizer.json: the document must be an object");
  auto impl = std::make_unique<TokenizerImpl>();
  auto present = [&](const char* name) { return root.contains(name) && !root.at(name).is_null(); };
  if (present("normalizer")) {
    TIDAL_ASSIGN_OR_RETURN(impl->normalizer, ParseNormalizer(root.at("normalizer"), "normalizer"));
  }
  if (present("pre_tokenizer")) {
    TIDAL_ASSIGN_OR_RETURN(impl->pre_tokenizer,
                           ParsePreTokenizer(root.at("pre_tokenizer"), "pre_tokenizer"));
  }
  if (present("post_processor")) {
    TIDAL_ASSIGN_OR_RETURN(impl->post_processor,
                           ParsePostProcessor(root.at("post_processor"), "post_processor"));
  }
  if (present("decoder")) {
    TIDAL_ASSIGN_OR_RETURN(impl->decoder, ParseDecoder(root.at("decoder"), "decoder"));
  }
  // The model last: building its vocabulary and merges is the costly part here, and a file with
  // an unsupported component is refused without it.
  TIDAL_ASSIGN_OR_RETURN(impl->model, ParseModel(root));
  TIDAL_ASSIGN_OR_RETURN(impl->added_tokens, ParseAddedTokens(root));

  uint32_t size = static_cast<uint32_t>(impl->model->id_to_token().size());
  for (size_t i = 0; i < impl->added_tokens.size(); ++i) {
    const AddedToken& token = impl->added_tokens[i];
    size = std::max(size, token.id + 1);
    impl->added_by_id[token.id] = i;
    impl->added_by_content[token.content] = token.id;
  }
  impl->vocab_size = size;
  // Template ids must name tokens.
  std::vector<const PostProcessor*> stack;
  if (impl->post_processor) stack.push_back(&*impl->post_processor);
  while (!stack.empty()) {
    const PostProcessor* post = stack.back();
    stack.pop_back();
    for (const PostProcessor& child : post->children) stack.push_back(&child);
    for (const auto* ids : {&post->prefix_ids, &post->suffix_ids}) {
      for (const uint32_t id : *ids) {
        if (id >= size) {
          return InvalidArgument("tokenizer.json: post_processor.special_tokens id " +
                                 std::to_string(id) + " is not below the vocabulary size " +
                                 std::to_string(size));
        }
      }
    }
  }
  impl->raw_matcher.Build(impl->added_tokens, /*normalized=*/false);
  impl->normalized_matcher.Build(impl->added_tokens, /*normalized=*/true);

  bool byte_level = false;
  std::vector<const PreTokenizer*> pres;
  if (impl->pre_tokenizer) pres.push_back(&*impl->pre_tokenizer);
  while (!pres.empty()) {
    const PreTokenizer* pre = pres.back();
    pres.pop_back();
    byte_level |= pre->type == PreTokenizer::Type::kByteLevel;
    for (const PreTokenizer& child : pre->children) pres.push_back(&child);
  }
  impl->description = std::string("BPE") +
                      (byte_level                     ? " (byte-level)"
                       : impl->model->byte_fallback() ? " (byte fallback)"
                                                      : "") +
                      ", " + std::to_string(size) + " ids, " +
                      std::to_string(impl->added_tokens.size()) + " added tokens";
  return impl;
}

}  // namespace

StatusOr<std::unique_ptr<TokenizerImpl>> ParseTokenizerJson(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("tokenizer.json is not valid JSON: ") + e.what());
  }
  try {
    return Parse(root);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("tokenizer.json: unexpected value: ") + e.what());
  }
}

}  // namespace tidal::data::tokenizer_internal
