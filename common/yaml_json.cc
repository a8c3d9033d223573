// common/yaml_json.cc — yaml-cpp adapter; its exceptions become Status here.
#include "common/yaml_json.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "common/utf8.h"

namespace tidal {
namespace {

// YAML 1.2 core schema resolution of plain scalars.
nlohmann::json PlainScalar(const std::string& s) {
  static const std::regex kInt(R"([-+]?[0-9]+)");
  static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  if (s == "null" || s == "Null" || s == "NULL" || s == "~" || s.empty()) return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (std::regex_match(s, kInt)) {
    try {
      return std::stoll(s);
    } catch (const std::out_of_range&) {
      return s;
    }
  }
  if (std::regex_match(s, kFloat)) {
    try {
      return std::stod(s);
    } catch (const std::out_of_range&) {
      return s;  // 1e999: left a string, so the typed reader names the field
    }
  }
  return s;
}

StatusOr<nlohmann::json> Convert(const YAML::Node& node, const std::string& path) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nlohmann::json(nullptr);
    case YAML::NodeType::Scalar:
      // The text was UTF-8, but yaml-cpp writes an escape such as "\N" (U+0085) as one raw
      // byte (found by fuzz/training_job_spec_fuzz.cc).
      if (FirstInvalidUtf8(node.Scalar()))
        return InvalidArgument((path.empty() ? std::string("the document") : path) +
                               ": an escape sequence that yields no UTF-8 text");
      if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str")
        return nlohmann::json(node.Scalar());  // quoted: always a string
      return PlainScalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (size_t i = 0; i < node.size(); ++i) {
        TIDAL_ASSIGN_OR_RETURN(auto item, Convert(node[i], path + "[" + std::to_string(i) + "]"));
        out.push_back(std::move(item));
      }
      return out;
    }
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar())
          return InvalidArgument(path + ": mapping keys must be plain strings");
        const std::string key = kv.first.Scalar();
        if (FirstInvalidUtf8(key))
          return InvalidArgument((path.empty() ? std::string("the document") : path) +
                                 ": a key with an escape sequence that yields no UTF-8 text");
        const std::string child = path.empty() ? key : path + "." + key;
        TIDAL_ASSIGN_OR_RETURN(auto value, Convert(kv.second, child));
        out[key] = std::move(value);
      }
      return out;
    }
  }
  return nlohmann::json(nullptr);
}

}  // namespace

StatusOr<nlohmann::json> ParseYaml(const std::string& text) {
  // YAML is Unicode; yaml-cpp passes ill-formed bytes through into strings, which JSON cannot
  // hold (found by fuzz/training_job_spec_fuzz.cc: a refusal quoting one ended the process).
  if (std::optional<size_t> bad = FirstInvalidUtf8(text)) {
    const size_t newline = *bad == 0 ? std::string::npos : text.rfind('\n', *bad - 1);
    const size_t line_start = newline == std::string::npos ? 0 : newline + 1;
    const size_t line = 1 + std::count(text.begin(), text.begin() + *bad, '\n');
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[*bad]));
    return InvalidArgument("invalid YAML at line " + std::to_string(line) + ", column " +
                           std::to_string(*bad - line_start + 1) + ": " + byte +
                           " is not UTF-8 (expected UTF-8 text)");
  }
  try {
    return Convert(YAML::Load(text), "");
  } catch (const YAML::Exception& e) {
    return InvalidArgument("invalid YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                           std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
}

StatusOr<nlohmann::json> ReadYamlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto parsed = ParseYaml(buffer.str());
  if (!parsed.ok()) return parsed.status().WithContext(path);
  return parsed;
}

}  // namespace tidal
