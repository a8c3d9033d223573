// worker/data/jinja_value.h — the values a Jinja template computes with, modelled on the Python
// objects Jinja2 sees when transformers renders a chat template: None, bool, int, float, str,
// list, dict (insertion-ordered), namespace, callables and Undefined. str()/repr()/json.dumps()
// follow Python so that rendered text matches byte for byte. Depends on nlohmann/json only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tidal::data::jinja {

class Value;

// Arguments of a call: positional, then keyword (name=value) in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* Keyword(std::string_view name) const;
  // The argument at `index` or named `name`, or nullptr.
  const Value* Get(size_t index, std::string_view name) const;
};

using Function = std::function<StatusOr<Value>(const CallArgs&)>;

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value value);
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };
  using List = std::vector<Value>;

  Value() = default;  // Undefined
  static Value Undefined(std::string name = "");
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value String(std::string s);
  static Value MakeList(List items);
  // A Python tuple: a list that prints as (a, b) and is not equal to a list.
  static Value MakeTuple(List items);
  static Value MakeDict(Dict dict);
  static Value MakeNamespace(Dict attributes);
  static Value MakeFunction(std::string name, Function fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_tuple() const { return tuple_; }

  bool boolean() const { return boolean_; }
  int64_t integer() const { return kind_ == Kind::kBool ? (boolean_ ? 1 : 0) : integer_; }
  double number() const { return kind_ == Kind::kFloat ? number_ : static_cast<double>(integer()); }
  // The string's bytes (UTF-8), the undefined variable's name or the function's name.
  const std::string& text() const { return text_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict& mutable_namespace() const { return *dict_; }  // namespaces are shared and mutable
  const Function& function() const { return *function_; }
  bool same_object(const Value& other) const;

  bool Truthy() const;
  // Python type name, for error messages ("str", "int", "dict", ...).
  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool boolean_ = false;
  bool tuple_ = false;
  int64_t integer_ = 0;
  double number_ = 0;
  std::string text_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> function_;
};

// Python str(value) (Undefined → "").
std::string ToStr(const Value& value);
// Python repr(value).
std::string Repr(const Value& value);
// Python's float repr: shortest round trip, "1.0", "1e-05", "inf".
std::string FloatRepr(double value);
// json.dumps(value, ensure_ascii=False, indent=indent (<0: none), sort_keys=sort_keys) as
// transformers' tojson filter calls it.
StatusOr<std::string> DumpJson(const Value& value, int indent, bool sort_keys);

Value FromJson(const nlohmann::json& json);
Value FromJson(const nlohmann::ordered_json& json);

// Python ==.
bool Equal(const Value& a, const Value& b);
// Python <: -1, 0, 1, or an error for unorderable types.
StatusOr<int> Compare(const Value& a, const Value& b);

// Python str of code points over UTF-8 bytes: length, indexing and slicing count code points.
std::u32string DecodeUtf8(std::string_view s);
std::string EncodeUtf8(std::u32string_view s);
size_t Utf8Length(std::string_view s);

}  // namespace tidal::data::jinja
