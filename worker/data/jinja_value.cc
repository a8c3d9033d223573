// worker/data/jinja_value.cc — Python semantics of the template values (see jinja_value.h).
#include "worker/data/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/utf8.h"

namespace tidal::data::jinja {

const Value* CallArgs::Keyword(std::string_view name) const {
  for (const auto& [key, value] : keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

const Value* CallArgs::Get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  return Keyword(name);
}

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value Value::Undefined(std::string name) {
  Value v;
  v.text_ = std::move(name);
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.boolean_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.integer_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.number_ = f;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.text_ = std::move(s);
  return v;
}
Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeTuple(List items) {
  Value v = MakeList(std::move(items));
  v.tuple_ = true;
  return v;
}
Value Value::MakeDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(dict));
  return v;
}
Value Value::MakeNamespace(Dict attributes) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.dict_ = std::make_shared<Dict>(std::move(attributes));
  return v;
}
Value Value::MakeFunction(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.text_ = std::move(name);
  v.function_ = std::make_shared<const Function>(std::move(fn));
  return v;
}

bool Value::same_object(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kList:
      return list_ == other.list_;
    case Kind::kDict:
    case Kind::kNamespace:
      return dict_ == other.dict_;
    case Kind::kFunction:
      return function_ == other.function_;
    default:
      return Equal(*this, other);
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return boolean_;
    case Kind::kInt:
      return integer_ != 0;
    case Kind::kFloat:
      return number_ != 0.0;
    case Kind::kString:
      return !text_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

std::string FloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, result.ptr);
  // sci: [-]d[.ddd]e[+-]XX
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    int point = exponent + 1;  // digits before the decimal point
    if (point <= 0) {
      out = "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(point)) + "." +
            digits.substr(static_cast<size_t>(point));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return negative ? "-" + out : out;
}

namespace {

std::string ReprString(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

void AppendJsonString(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

constexpr int kMaxJsonDepth = 200;

Status DumpJsonInto(const Value& value, int indent, bool sort_keys, int depth, std::string& out) {
  if (depth > kMaxJsonDepth) return InvalidArgument("tojson: value nested too deeply");
  auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  const char* item_separator = indent < 0 ? ", " : ",";
  switch (value.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return OkStatus();
    case Value::Kind::kBool:
      out += value.boolean() ? "true" : "false";
      return OkStatus();
    case Value::Kind::kInt:
      out += std::to_string(value.integer());
      return OkStatus();
    case Value::Kind::kFloat: {
      double f = value.number();
      if (std::isnan(f)) {
        out += "NaN";
      } else if (std::isinf(f)) {
        out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += FloatRepr(f);
      }
      return OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(value.text(), out);
      return OkStatus();
    case Value::Kind::kList: {
      const auto& list = value.list();
      if (list.empty()) {
        out += "[]";
        return OkStatus();
      }
      out += '[';
      for (size_t i = 0; i < list.size(); ++i) {
        if (i > 0) out += item_separator;
        newline(depth + 1);
        TIDAL_RETURN_IF_ERROR(DumpJsonInto(list[i], indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return OkStatus();
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : value.dict().items) items.push_back(&item);
      if (items.empty()) {
        out += "{}";
        return OkStatus();
      }
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_separator;
        newline(depth + 1);
        AppendJsonString(items[i]->first, out);
        out += ": ";
        TIDAL_RETURN_IF_ERROR(DumpJsonInto(items[i]->second, indent, sort_keys, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return OkStatus();
    }
    default:
      return InvalidArgument(std::string("Object of type ") + value.TypeName() +
                             " is not JSON serializable");
  }
}

template <typename Json>
Value FromJsonImpl(const Json& json, int depth) {
  if (depth > kMaxJsonDepth) return Value::None();
  switch (json.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value::Bool(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::Int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::Float(json.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::String(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Value::List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJsonImpl(item, depth + 1));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      for (auto it = json.begin(); it != json.end(); ++it) {
        dict.items.emplace_back(it.key(), FromJsonImpl(it.value(), depth + 1));
      }
      return Value::MakeDict(std::move(dict));
    }
    case nlohmann::json::value_t::binary:
      return Value::None();
  }
  return Value::None();
}

}  // namespace

std::string ToStr(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kString:
      return value.text();
    default:
      return Repr(value);
  }
}

std::string Repr(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return value.boolean() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(value.integer());
    case Value::Kind::kFloat:
      return FloatRepr(value.number());
    case Value::Kind::kString:
      return ReprString(value.text());
    case Value::Kind::kList: {
      std::string out = value.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < value.list().size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr(value.list()[i]);
      }
      if (value.is_tuple()) return out + (value.list().size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : value.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(k) + ": " + Repr(v);
      }
      return out + "}";
    }
    case Value::Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [k, v] : value.dict().items) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(k) + ": " + Repr(v);
      }
      return out + "}>";
    }
    case Value::Kind::kFunction:
      return "<function " + value.text() + ">";
  }
  return "";
}

StatusOr<std::string> DumpJson(const Value& value, int indent, bool sort_keys) {
  std::string out;
  TIDAL_RETURN_IF_ERROR(DumpJsonInto(value, indent, sort_keys, 0, out));
  return out;
}

Value FromJson(const nlohmann::json& json) { return FromJsonImpl(json, 0); }
Value FromJson(const nlohmann::ordered_json& json) { return FromJsonImpl(json, 0); }

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      return a.number() == b.number();
    }
    return a.integer() == b.integer();
  }
  if (a.kind() != b.kind() || a.is_tuple() != b.is_tuple()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.text() == b.text();
    case Value::Kind::kList: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equal(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().items.size() != b.dict().items.size()) return false;
      for (const auto& [k, v] : a.dict().items) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      double x = a.number(), y = b.number();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.integer(), y = b.integer();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.text().compare(b.text());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return InvalidArgument(std::string("'<' not supported between instances of '") + a.TypeName() +
                         "' and '" + b.TypeName() + "'");
}

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int extra = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (extra < 0 || i + static_cast<size_t>(extra) >= s.size()) {
      out += static_cast<char32_t>(0xFFFD);
      ++i;
      continue;
    }
    char32_t cp = extra == 0 ? c : (c & (0x3F >> extra));
    bool ok = true;
    for (int k = 1; k <= extra; ++k) {
      unsigned char cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out += static_cast<char32_t>(0xFFFD);
      ++i;
      continue;
    }
    out += cp;
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) AppendUtf8(out, cp);
  return out;
}

size_t Utf8Length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

}  // namespace tidal::data::jinja
