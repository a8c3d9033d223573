// local/schema.h — a CustomResourceDefinition's openAPIV3Schema applied to a body, as
// kube-apiserver's apiextensions does: defaults filled in, unknown fields pruned (or reported,
// under fieldValidation=Strict), then types, required, enum, minimum/maximum, length and item
// counts, and pattern checked, each failure a cause naming its field. CEL rules
// (x-kubernetes-validations) are not evaluated here: the operator validates them itself.
// Pure: no I/O.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tidal::local {

// One entry of a Status' details.causes.
struct FieldCause {
  std::string reason;  // FieldValueRequired | FieldValueInvalid | FieldValueNotSupported | ...
  std::string field;   // spec.optimization.zeroStage
  std::string message;
};

struct SchemaResult {
  std::vector<FieldCause> errors;           // 422 Invalid
  std::vector<std::string> unknown_fields;  // pruned; an error under Strict (400)
};

// Defaults and prunes `object` in place and validates it.
SchemaResult ApplySchema(const nlohmann::json& schema, nlohmann::json& object);

}  // namespace tidal::local
