// operator/local/selectors.h — label selectors (k8s.io/apimachinery/pkg/labels syntax:
// =, ==, !=, in, notin, key, !key), field selectors (=, ==, != on dotted paths such as
// metadata.name, status.phase, involvedObject.uid), and the simple JSONPath of
// additionalPrinterColumns (.a.b, .a[0], .a[?(@.type=="Ready")].status). Pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::local {

struct LabelRequirement {
  enum Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kNotExists } op;
  std::string key;
  std::vector<std::string> values;
};
using LabelSelector = std::vector<LabelRequirement>;

StatusOr<LabelSelector> ParseLabelSelector(const std::string& text);
bool Matches(const LabelSelector& selector, const nlohmann::json& labels);

struct FieldRequirement {
  std::string path;  // dotted: metadata.name
  std::string value;
  bool negate = false;
};
using FieldSelector = std::vector<FieldRequirement>;

StatusOr<FieldSelector> ParseFieldSelector(const std::string& text);
bool Matches(const FieldSelector& selector, const nlohmann::json& object);

// The value at a printer-column JSONPath, or nullopt when absent.
std::optional<nlohmann::json> EvalJsonPath(const nlohmann::json& object, const std::string& path);

}  // namespace tidal::local
