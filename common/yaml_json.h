// common/yaml_json.h — reads YAML (or JSON, a subset of it) into nlohmann::json so that every
// config consumer works on one typed-JSON representation. yaml-cpp stays inside yaml_json.cc.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal {

// Parses YAML text. Scalars become numbers/booleans/null where YAML 1.2 core schema says so
// (plain, unquoted); quoted scalars stay strings.
StatusOr<nlohmann::json> ParseYaml(const std::string& text);
StatusOr<nlohmann::json> ReadYamlFile(const std::string& path);

}  // namespace tidal
