// CRD structural schema: defaults, pruning, and each kind of violation as a field cause.
#include "local/schema.h"

#include <gtest/gtest.h>

namespace tidal::local {
namespace {

using nlohmann::json;

const json kSchema = json::parse(R"({
  "type": "object",
  "properties": {
    "spec": {"type": "object", "required": ["replicas"], "properties": {
      "replicas": {"type": "integer", "minimum": 0, "maximum": 64},
      "color": {"type": "string", "enum": ["red", "green"], "default": "green"},
      "owner": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
      "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
      "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
      "env": {"type": "object", "additionalProperties": {"type": "string"}}
    }}
  }
})");

std::vector<std::string> Fields(const SchemaResult& r) {
  std::vector<std::string> out;
  for (const auto& c : r.errors) out.push_back(c.field + " " + c.reason);
  return out;
}

TEST(Schema, AppliesDefaultsToAbsentFieldsOnly) {
  json o = {{"spec", {{"replicas", 1}}}};
  EXPECT_TRUE(ApplySchema(kSchema, o).errors.empty());
  EXPECT_EQ(o["spec"]["color"], "green");
  json given = {{"spec", {{"replicas", 1}, {"color", "red"}}}};
  ApplySchema(kSchema, given);
  EXPECT_EQ(given["spec"]["color"], "red");
}

TEST(Schema, PrunesUnknownFieldsButKeepsPreservedAndAdditional) {
  json o = {
      {"apiVersion", "x/v1"},
      {"kind", "W"},
      {"metadata", {{"name", "a"}}},
      {"spec", {{"replicas", 1}, {"bogus", 1}, {"free", {{"any", 1}}}, {"env", {{"A", "b"}}}}}};
  SchemaResult r = ApplySchema(kSchema, o);
  EXPECT_EQ(r.unknown_fields, std::vector<std::string>{"spec.bogus"});
  EXPECT_FALSE(o["spec"].contains("bogus"));
  EXPECT_EQ(o["spec"]["free"]["any"], 1);
  EXPECT_EQ(o["spec"]["env"]["A"], "b");
  EXPECT_TRUE(o.contains("metadata"));
}

TEST(Schema, ReportsEveryViolationWithItsField) {
  json o = {{"spec", {{"color", "blue"}, {"owner", "Bob"}, {"tags", {"a", "b", "c"}}}}};
  auto fields = Fields(ApplySchema(kSchema, o));
  EXPECT_EQ(fields, (std::vector<std::string>{
                        "spec.replicas FieldValueRequired", "spec.color FieldValueNotSupported",
                        "spec.owner FieldValueInvalid", "spec.tags FieldValueTooMany"}));
}

TEST(Schema, ChecksTypesAndBounds) {
  json wrong_type = {{"spec", {{"replicas", "two"}}}};
  auto r = ApplySchema(kSchema, wrong_type);
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].reason, "FieldValueTypeInvalid");
  EXPECT_NE(r.errors[0].message.find("must be of type integer"), std::string::npos);
  json too_big = {{"spec", {{"replicas", 65}}}};
  EXPECT_EQ(Fields(ApplySchema(kSchema, too_big)),
            std::vector<std::string>{"spec.replicas FieldValueInvalid"});
  json too_small = {{"spec", {{"replicas", -1}}}};
  EXPECT_EQ(ApplySchema(kSchema, too_small).errors.size(), 1u);
  json long_owner = {{"spec", {{"replicas", 1}, {"owner", "abcdefghij"}}}};
  EXPECT_EQ(Fields(ApplySchema(kSchema, long_owner)),
            std::vector<std::string>{"spec.owner FieldValueTooLong"});
}

}  // namespace
}  // namespace tidal::local
