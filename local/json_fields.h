// local/json_fields.h — lenient reads of stored objects for the process kubelet: a
// missing or mistyped field reads as absent (null, "", the fallback), never as an exception.
// Objects in the store passed the API's validation; these readers only spare every call site
// the checks.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace tidal::local {

inline const nlohmann::json& Field(const nlohmann::json& object, const char* key) {
  static const nlohmann::json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

inline std::string StringField(const nlohmann::json& object, const char* key) {
  const nlohmann::json& v = Field(object, key);
  return v.is_string() ? v.get<std::string>() : "";
}

inline int64_t IntField(const nlohmann::json& object, const char* key, int64_t fallback) {
  const nlohmann::json& v = Field(object, key);
  return v.is_number_integer() ? v.get<int64_t>() : fallback;
}

}  // namespace tidal::local
