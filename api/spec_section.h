// api/spec_section.h — reads one object of a resource spec into typed values (the types and
// their names are common/json_reader.h's), collecting every problem with its field path
// ("spec.lora.rank: must be >= 1, got 0") and refusing unknown keys (a typo such as
// `learningrate` must not silently fall back to a default). Used by the engine's and the
// operator's spec parsing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_reader.h"

namespace tidal::spec {

inline std::string TypeName(const nlohmann::json& j) {
  return j.is_null() ? "null" : j.type_name();
}

// One violation per line: line breaks inside one (a quoted value that holds them) are written
// as \n and \r, so a reader can split the message back into its violations.
inline std::string OneLine(const std::string& error) {
  std::string out;
  for (char c : error) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else
      out.push_back(c);
  }
  return out;
}

class Section {
 public:
  Section(const nlohmann::json& parent, const std::string& key, const std::string& path,
          std::vector<std::string>& errors)
      : path_(path + "." + key), errors_(errors) {
    if (!parent.contains(key) || parent[key].is_null()) return;
    if (!parent[key].is_object()) {
      Error("", "expected an object, got " + TypeName(parent[key]));
      return;
    }
    node_ = &parent[key];
  }
  Section(const nlohmann::json& node, const std::string& path, std::vector<std::string>& errors)
      : path_(path), node_(&node), errors_(errors) {}
  ~Section() {
    if (!node_) return;
    for (const auto& [key, value] : node_->items())
      if (!known_.count(key))
        errors_.push_back((key.empty() ? path_ + "[\"\"]" : FieldPath(key)) + ": unknown field");
  }
  bool present() const { return node_ != nullptr; }
  const nlohmann::json* node() const { return node_; }
  const std::string& path() const { return path_; }
  void Known(const std::string& key) { known_.insert(key); }

  void Error(const std::string& key, const std::string& what) {
    errors_.push_back(OneLine(FieldPath(key) + ": " + what));
  }

  const nlohmann::json* Field(const std::string& key) {
    known_.insert(key);
    if (!node_ || !node_->contains(key) || (*node_)[key].is_null()) return nullptr;
    return &(*node_)[key];
  }
  void String(const std::string& key, std::string& out) {
    if (const nlohmann::json* v = Field(key)) {
      if (json_read::Fits<std::string>(*v))
        out = v->get<std::string>();
      else
        Error(key, std::string("expected ") + json_read::Expected<std::string>() + ", got " +
                       TypeName(*v));
    }
  }
  void Int(const std::string& key, int64_t& out) {
    if (const nlohmann::json* v = Field(key)) {
      if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX})
        Error(key, "expected an integer below 2^63, got " + Dump(*v));
      else if (json_read::Fits<int64_t>(*v))
        out = v->get<int64_t>();
      else
        Error(key, std::string("expected ") + json_read::Expected<int64_t>() + ", got " + Dump(*v));
    }
  }
  // An integer, or the string "auto" (an int-or-string field): `is_auto` says which, and
  // `out` is left as it is for "auto".
  void IntOrAuto(const std::string& key, int64_t& out, bool& is_auto) {
    const nlohmann::json* v = Field(key);
    if (!v || !v->is_string()) return Int(key, out);
    if (*v == "auto")
      is_auto = true;
    else
      Error(key, "expected an integer or \"auto\", got " + Dump(*v));
  }
  void Number(const std::string& key, double& out) {
    if (const nlohmann::json* v = Field(key)) {
      if (json_read::Fits<double>(*v))
        out = v->get<double>();
      else
        Error(key, std::string("expected ") + json_read::Expected<double>() + ", got " + Dump(*v));
    }
  }
  void Bool(const std::string& key, bool& out) {
    if (const nlohmann::json* v = Field(key)) {
      if (json_read::Fits<bool>(*v))
        out = v->get<bool>();
      else
        Error(key, std::string("expected ") + json_read::Expected<bool>() + ", got " + Dump(*v));
    }
  }
  void Seed(const std::string& key, uint64_t& out) {
    int64_t value = static_cast<int64_t>(out);
    Int(key, value);
    if (value < 0)
      Error(key, "must be >= 0, got " + std::to_string(value));
    else
      out = static_cast<uint64_t>(value);
  }
  template <typename T>
  void AtLeast(const std::string& key, T value, T min) {
    if (value < min) Error(key, "must be >= " + Show(min) + ", got " + Show(value));
  }
  // An integer field that must lie in [min, max] (api/spec_limits.h gives the maxima).
  void InRange(const std::string& key, int64_t value, int64_t min, int64_t max) {
    if (value < min || value > max)
      Error(key, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
                     std::to_string(value));
  }
  void OneOf(const std::string& key, const std::string& value,
             std::initializer_list<const char*> allowed) {
    std::string list;
    for (const char* a : allowed) {
      if (value == a) return;
      list += std::string(list.empty() ? "" : " | ") + a;
    }
    Error(key, "expected one of " + list + ", got \"" + value + "\"");
  }

 private:
  template <typename T>
  static std::string Show(T v) {
    if constexpr (std::is_floating_point_v<T>) {
      nlohmann::json j = v;
      return j.dump();
    } else {
      return std::to_string(v);
    }
  }
  // A value as JSON for a refusal; bytes that are not UTF-8 (which no parser should hand
  // over, but a refusal must never throw) become U+FFFD.
  static std::string Dump(const nlohmann::json& v) {
    return v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  // path.key, or path["key"] (JSON-quoted) for a key that is not plain printable ASCII: the
  // errors stay one per line, each starting with its path, whatever keys a document holds
  // (found by fuzz/training_job_spec_fuzz.cc: a key with a newline in it split its line).
  std::string FieldPath(const std::string& key) const {
    if (key.empty()) return path_;
    const bool plain = std::all_of(
        key.begin(), key.end(), [](unsigned char c) { return c > 0x20 && c < 0x7f && c != '"'; });
    if (plain) return path_ + "." + key;
    return path_ + "[" +
           nlohmann::json(key).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "]";
  }
  std::string path_;
  const nlohmann::json* node_ = nullptr;
  std::set<std::string> known_;
  std::vector<std::string>& errors_;
};

}  // namespace tidal::spec
