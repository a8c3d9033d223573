// local/selectors.h — label selectors (k8s.io/apimachinery/pkg/labels syntax:
// =, ==, !=, in, notin, key, !key; kube/labels.h), field selectors (=, ==, != on dotted
// paths such as metadata.name, status.phase, involvedObject.uid), and the simple JSONPath of
// additionalPrinterColumns (.a.b, .a[0], .a[?(@.type=="Ready")].status). Pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "kube/labels.h"

namespace tidal::local {

// Label selectors are the client library's (kube/labels.h): one parser for both sides.
using kube::LabelSelector;
inline StatusOr<LabelSelector> ParseLabelSelector(const std::string& text) {
  return LabelSelector::Parse(text);
}
inline bool Matches(const LabelSelector& selector, const nlohmann::json& labels) {
  return selector.Matches(labels);
}

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
