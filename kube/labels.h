// kube/labels.h — label selectors on the client side, as k8s.io/apimachinery's
// labels package: the string syntax of ?labelSelector= (k=v, k==v, k!=v, k in (a,b),
// k notin (a,b), k, !k, comma = AND) and metav1.LabelSelector objects (matchLabels,
// matchExpressions with In/NotIn/Exists/DoesNotExist). As upstream, != and notin also match
// objects without the key. Pure. `tidal local` serves ?labelSelector= with this parser too.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::kube {

struct LabelRequirement {
  enum Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist } op;
  std::string key;
  std::vector<std::string> values;  // one for = and !=, ≥ 1 for in/notin, none otherwise
  bool operator==(const LabelRequirement&) const = default;
};

class LabelSelector {
 public:
  // The empty selector: matches everything.
  LabelSelector() = default;
  static StatusOr<LabelSelector> Parse(const std::string& text);
  // A metav1.LabelSelector ({matchLabels, matchExpressions}); null or {} matches everything.
  static StatusOr<LabelSelector> FromJson(const nlohmann::json& selector);
  static LabelSelector FromMap(const std::map<std::string, std::string>& match_labels);

  // `labels`: metadata.labels (an object of strings; null or absent means none).
  bool Matches(const nlohmann::json& labels) const;
  bool Empty() const { return requirements_.empty(); }
  const std::vector<LabelRequirement>& requirements() const { return requirements_; }
  // The canonical string form (what Parse reads back).
  std::string ToString() const;

 private:
  std::vector<LabelRequirement> requirements_;
};

// Label keys: [prefix/]name, prefix a DNS subdomain ≤ 253, name ≤ 63 of [A-Za-z0-9-_.] starting
// and ending alphanumeric. Values: "" or such a name.
Status ValidateLabelKey(const std::string& key);
Status ValidateLabelValue(const std::string& value);

}  // namespace tidal::kube
