// local/schema.cc
#include "local/schema.h"

#include <regex>

namespace tidal::local {
namespace {

std::string Join(const std::string& path, const std::string& field) {
  if (path.empty()) return field;
  std::string out = path;
  out.push_back('.');
  out.append(field);
  return out;
}

std::string Show(const nlohmann::json& v) {
  return v.is_string() ? "\"" + v.get<std::string>() + "\"" : v.dump();
}

bool HasType(const nlohmann::json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "integer")
    return value.is_number_integer() ||
           (value.is_number_float() &&
            value.get<double>() == static_cast<int64_t>(value.get<double>()));
  if (type == "number") return value.is_number();
  if (type == "boolean") return value.is_boolean();
  return true;
}

class Walker {
 public:
  SchemaResult result;

  void Walk(const nlohmann::json& schema, nlohmann::json& value, const std::string& path,
            bool root) {
    if (!schema.is_object()) return;
    if (value.is_null()) {
      if (!schema.value("nullable", false) && !root)
        Invalid(path, value, "must not be null");  // as kube-apiserver without nullable
      return;
    }
    // int-or-string: either type; then, as kube-apiserver's validator (go-openapi), each value
    // keyword applies to its own type only (pattern to a string, minimum to an integer).
    const bool int_or_string = schema.value("x-kubernetes-int-or-string", false);
    if (int_or_string && !value.is_string() && !value.is_number_integer()) {
      Add("FieldValueTypeInvalid", path,
          "Invalid value: " + Show(value) + ": " + path + " in body must be of type int-or-string");
      return;
    }
    std::string type = int_or_string ? "" : schema.value("type", "");
    if (!type.empty() && !HasType(value, type)) {
      Add("FieldValueTypeInvalid", path,
          "Invalid value: \"" + std::string(value.type_name()) + "\": " + path +
              " in body must be of type " + type + ": " + Show(value));
      return;
    }
    if (value.is_object()) WalkObject(schema, value, path, root);
    if (value.is_array()) {
      if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>())
        Invalid(path, value, "should have at least " + schema["minItems"].dump() + " items");
      if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>())
        Add("FieldValueTooMany", path,
            "Too many: " + std::to_string(value.size()) + ": must have at most " +
                schema["maxItems"].dump() + " items");
      if (schema.contains("items"))
        for (size_t i = 0; i < value.size(); ++i)
          Walk(schema["items"], value[i], path + "[" + std::to_string(i) + "]", false);
    }
    if (value.is_string()) {
      size_t len = value.get<std::string>().size();
      if (schema.contains("minLength") && len < schema["minLength"].get<size_t>())
        Invalid(path, value,
                path + " in body should be at least " + schema["minLength"].dump() + " chars long");
      if (schema.contains("maxLength") && len > schema["maxLength"].get<size_t>())
        Add("FieldValueTooLong", path,
            "Too long: may not be more than " + schema["maxLength"].dump() + " bytes");
      if (schema.contains("pattern") && schema["pattern"].is_string()) {
        try {
          std::regex re(schema["pattern"].get<std::string>(), std::regex::ECMAScript);
          if (!std::regex_search(value.get<std::string>(), re))
            Invalid(path, value,
                    path + " in body should match '" + schema["pattern"].get<std::string>() + "'");
        } catch (const std::regex_error&) {
          Add("InternalError", path, "pattern in the schema is not a valid regular expression");
        }
      }
    }
    if (value.is_number()) {
      double v = value.get<double>();
      if (schema.contains("minimum")) {
        double m = schema["minimum"].get<double>();
        bool exclusive = schema.value("exclusiveMinimum", false);
        if (exclusive ? v <= m : v < m)
          Invalid(path, value,
                  path + " in body should be greater than " + (exclusive ? "" : "or equal to ") +
                      schema["minimum"].dump());
      }
      if (schema.contains("maximum")) {
        double m = schema["maximum"].get<double>();
        bool exclusive = schema.value("exclusiveMaximum", false);
        if (exclusive ? v >= m : v > m)
          Invalid(path, value,
                  path + " in body should be less than " + (exclusive ? "" : "or equal to ") +
                      schema["maximum"].dump());
      }
    }
    if (schema.contains("enum") && schema["enum"].is_array()) {
      bool found = false;
      std::string supported;
      for (const auto& e : schema["enum"]) {
        found = found || e == value;
        if (!supported.empty()) supported.append(", ");
        supported.append(Show(e));
      }
      if (!found)
        Add("FieldValueNotSupported", path,
            "Unsupported value: " + Show(value) + ": supported values: " + supported);
    }
  }

 private:
  void WalkObject(const nlohmann::json& schema, nlohmann::json& value, const std::string& path,
                  bool root) {
    const nlohmann::json empty = nlohmann::json::object();
    const nlohmann::json& props = schema.contains("properties") && schema["properties"].is_object()
                                      ? schema["properties"]
                                      : empty;
    // Defaults first (for absent fields), as the apiserver defaults before validating.
    for (auto it = props.begin(); it != props.end(); ++it)
      if (!value.contains(it.key()) && it.value().is_object() && it.value().contains("default"))
        value[it.key()] = it.value()["default"];
    if (schema.contains("required") && schema["required"].is_array())
      for (const auto& r : schema["required"])
        if (r.is_string() && !value.contains(r.get<std::string>()))
          Add("FieldValueRequired", Join(path, r.get<std::string>()), "Required value");
    bool preserve = schema.value("x-kubernetes-preserve-unknown-fields", false);
    const nlohmann::json* additional = nullptr;
    if (schema.contains("additionalProperties")) {
      if (schema["additionalProperties"].is_object()) additional = &schema["additionalProperties"];
      if (schema["additionalProperties"].is_boolean() && schema["additionalProperties"].get<bool>())
        preserve = true;
    }
    std::vector<std::string> prune;
    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string& key = it.key();
      std::string child = Join(path, key);
      if (root && (key == "apiVersion" || key == "kind" || key == "metadata")) continue;
      if (props.contains(key)) {
        Walk(props[key], it.value(), child, false);
      } else if (additional) {
        Walk(*additional, it.value(), child, false);
      } else if (!preserve) {
        prune.push_back(key);
        result.unknown_fields.push_back(child);
      }
    }
    for (const auto& key : prune) value.erase(key);
  }

  void Invalid(const std::string& path, const nlohmann::json& value, const std::string& why) {
    Add("FieldValueInvalid", path, "Invalid value: " + Show(value) + ": " + why);
  }
  void Add(const std::string& reason, const std::string& field, const std::string& message) {
    result.errors.push_back({reason, field, message});
  }
};

}  // namespace

SchemaResult ApplySchema(const nlohmann::json& schema, nlohmann::json& object) {
  Walker walker;
  walker.Walk(schema, object, "", true);
  return walker.result;
}

}  // namespace tidal::local
