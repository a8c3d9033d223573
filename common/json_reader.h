// common/json_reader.h — the one way Tidal reads typed fields out of JSON it did not write
// itself (a status, a Kubernetes object, a pod's termination message): an absent or null field
// keeps its default, a present one of the wrong type is an error that names the field and what
// it held ("status.gpus.current: expected an integer, got \"2\""). Nothing is coerced and
// nothing is swallowed. The first error is kept (`status()`); later reads still return their
// defaults, so a caller reads everything and checks once.
//
// A spec a user writes is read by api/spec_section.h instead, which builds on this file's
// types and messages and adds what only a spec needs: every violation collected, unknown
// fields refused, ranges.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::json_read {

// A value as an error message shows it: its JSON, cut to about 80 bytes on a character
// boundary. Bytes that are not UTF-8 (which no parser should hand over, but a refusal must never
// throw) become U+FFFD, so the message itself can always be written as JSON.
inline std::string Shown(const nlohmann::json& value) {
  std::string shown = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (shown.size() <= 80) return shown;
  size_t cut = 77;
  while (cut > 0 && (static_cast<unsigned char>(shown[cut]) & 0xC0) == 0x80) --cut;
  return shown.substr(0, cut) + "...";
}

// Whether `value` is a T without conversion (an integer type also within T's range), and what
// a T is called in a message.
template <typename T>
bool Fits(const nlohmann::json& value) {
  if constexpr (std::is_same_v<T, bool>) {
    return value.is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value.is_string();
  } else if constexpr (std::is_integral_v<T>) {
    if (value.is_number_unsigned())
      return value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    return value.is_number_integer() &&
           value.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
           (std::is_unsigned_v<T> ||
            value.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max()));
  } else {
    static_assert(std::is_floating_point_v<T>, "a bool, a string, an integer or a number");
    return value.is_number();
  }
}

template <typename T>
const char* Expected() {
  if constexpr (std::is_same_v<T, bool>)
    return "true or false";
  else if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else if constexpr (std::is_integral_v<T>)
    return "an integer";
  else
    return "a number";
}

// "status.gpus" + "current" -> "status.gpus.current"; "" + "kind" -> "kind".
inline std::string FieldPath(std::string_view path, std::string_view key) {
  std::string out(path);
  if (!out.empty()) out += '.';
  out += key;
  return out;
}

}  // namespace tidal::json_read

namespace tidal {

class JsonReader {
 public:
  // The field `key` of `object` (an object at `path`): its value; `fallback` when it is absent
  // or null, or (an error) of another type. `object` that is not an object has no fields.
  template <typename T>
  T Get(const nlohmann::json& object, std::string_view path, const char* key, T fallback) {
    const nlohmann::json* v = Find(object, key);
    if (!v) return fallback;
    if (json_read::Fits<T>(*v)) return v->get<T>();
    Fail(json_read::FieldPath(path, key), json_read::Expected<T>(), *v);
    return fallback;
  }

  // A list of strings; empty when absent.
  std::vector<std::string> Strings(const nlohmann::json& object, std::string_view path,
                                   const char* key) {
    std::vector<std::string> out;
    const nlohmann::json* v = Find(object, key);
    if (!v) return out;
    if (v->is_array())
      for (const nlohmann::json& item : *v) {
        if (!item.is_string()) break;
        out.push_back(item.get<std::string>());
      }
    if (!v->is_array() || out.size() != v->size()) {
      Fail(json_read::FieldPath(path, key), "a list of strings", *v);
      return {};
    }
    return out;
  }

  // The object at `key`; nullptr when absent or null, and (an error) when it is something else.
  const nlohmann::json* Object(const nlohmann::json& object, std::string_view path,
                               const char* key) {
    return Typed(object, path, key, &nlohmann::json::is_object, "an object");
  }
  // The list at `key`, as Object.
  const nlohmann::json* Array(const nlohmann::json& object, std::string_view path,
                              const char* key) {
    return Typed(object, path, key, &nlohmann::json::is_array, "a list");
  }

  // Records an error of the caller's own check (an unknown enum value, a bad time).
  void Fail(const std::string& field, std::string_view expected, const nlohmann::json& got) {
    if (status_.ok())
      status_ = InvalidArgument(field + ": expected " + std::string(expected) + ", got " +
                                json_read::Shown(got));
  }
  // Keeps `s` when it is the first error.
  void Absorb(const Status& s) {
    if (status_.ok() && !s.ok()) status_ = s;
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // The field `key` of `object`, or nullptr when absent or null.
  static const nlohmann::json* Find(const nlohmann::json& object, const char* key) {
    if (!object.is_object()) return nullptr;
    auto it = object.find(key);
    return it == object.end() || it->is_null() ? nullptr : &*it;
  }

 private:
  const nlohmann::json* Typed(const nlohmann::json& object, std::string_view path, const char* key,
                              bool (nlohmann::json::*is)() const noexcept, const char* expected) {
    const nlohmann::json* v = Find(object, key);
    if (!v) return nullptr;
    if ((v->*is)()) return v;
    Fail(json_read::FieldPath(path, key), expected, *v);
    return nullptr;
  }

  Status status_;
};

}  // namespace tidal
