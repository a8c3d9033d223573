// worker/data/jinja_filters.cc — Jinja2's builtin filters and tests (jinja2/filters.py,
// jinja2/tests.py) that chat templates use, transformers' tojson (json.dumps, no HTML escaping),
// and the globals of transformers' environment.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>

#include "worker/data/jinja_builtins.h"
#include "worker/data/jinja_parser.h"
#include "worker/data/jinja_strings.h"

namespace tidal::data::jinja {
namespace {

Status FilterError(std::string_view filter, const std::string& what) {
  return InvalidArgument(std::string(filter) + " filter: " + what);
}

// Jinja's soft_str: str() of anything, "" for Undefined.
std::string Str(const Value& v) { return ToStr(v); }

StatusOr<size_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return size_t{0};
    case Value::Kind::kString:
      return Utf8Length(v.text());
    case Value::Kind::kList:
      return v.list().size();
    case Value::Kind::kDict:
      return v.dict().items.size();
    default:
      return InvalidArgument(std::string("object of type '") + v.TypeName() + "' has no len()");
  }
}

// Jinja's make_attrgetter: "a.b" looks up item a then item b; integers index.
StatusOr<Value> AttributePath(const Value& item, const std::string& path) {
  static const std::string kDot = ".";
  Value current = item;
  for (const auto& part : strings::Split(path, &kDot, -1)) {
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                               [](char c) { return c >= '0' && c <= '9'; });
    Value key = digits ? Value::Int(std::stoll(part)) : Value::String(part);
    TIDAL_ASSIGN_OR_RETURN(current, GetItem(current, key));
  }
  return current;
}

CallArgs Rest(const CallArgs& args, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < args.positional.size(); ++i)
    rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

// select/reject/selectattr/rejectattr.
StatusOr<Value> Select(std::string_view filter, const Value& value, const CallArgs& args,
                       bool by_attribute, bool keep) {
  TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(value));
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return FilterError(filter, "expects an attribute name");
    }
    attribute = args.positional[0].text();
    next = 1;
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) return FilterError(filter, "expects a test name");
    test = args.positional[next].text();
    if (!HasTest(*test)) return FilterError(filter, "no test named '" + *test + "'");
  }
  CallArgs test_args = Rest(args, next + 1);
  Value::List out;
  for (const auto& item : items) {
    Value subject = item;
    if (by_attribute) {
      TIDAL_ASSIGN_OR_RETURN(subject, AttributePath(item, attribute));
    }
    bool pass;
    if (test) {
      TIDAL_ASSIGN_OR_RETURN(pass, ApplyTest(*test, subject, test_args));
    } else {
      pass = subject.Truthy();
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

StatusOr<Value> Map(const Value& value, const CallArgs& args) {
  TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(value));
  Value::List out;
  if (const Value* attribute = args.Keyword("attribute")) {
    if (!attribute->is_string()) return FilterError("map", "attribute must be a string");
    const Value* fallback = args.Keyword("default");
    for (const auto& item : items) {
      TIDAL_ASSIGN_OR_RETURN(auto v, AttributePath(item, attribute->text()));
      if (v.is_undefined() && fallback) v = *fallback;
      out.push_back(std::move(v));
    }
    return Value::MakeList(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return FilterError("map", "expects a filter name or attribute=");
  }
  std::string filter = args.positional[0].text();
  if (!HasFilter(filter)) return FilterError("map", "no filter named '" + filter + "'");
  CallArgs rest = Rest(args, 1);
  for (const auto& item : items) {
    TIDAL_ASSIGN_OR_RETURN(auto v, ApplyFilter(filter, item, rest));
    out.push_back(std::move(v));
  }
  return Value::MakeList(std::move(out));
}

std::string Indent(const std::string& s, const Value* width, bool first, bool blank) {
  std::string indention =
      width && width->is_string()
          ? width->text()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, width ? width->integer() : 4)),
                        ' ');
  std::vector<std::string> lines = strings::SplitLines(s + "\n");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
    }
  } else if (!lines.empty()) {
    rv = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (first) rv = indention + rv;
  return rv;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

StatusOr<Value> ToInt(const Value& v, const Value* fallback) {
  Value otherwise = fallback ? *fallback : Value::Int(0);
  switch (v.kind()) {
    case Value::Kind::kInt:
    case Value::Kind::kBool:
      return Value::Int(v.integer());
    case Value::Kind::kFloat:
      if (!std::isfinite(v.number()) || std::fabs(v.number()) > 9.2e18) return otherwise;
      return Value::Int(static_cast<int64_t>(v.number()));
    case Value::Kind::kString: {
      std::string s = strings::Strip(v.text(), nullptr, true, true);
      std::string digits;
      for (char c : s) {
        if (c != '_') digits += c;
      }
      char* end = nullptr;
      errno = 0;
      long long i = std::strtoll(digits.c_str(), &end, 10);
      if (!digits.empty() && end && *end == '\0' && errno == 0) return Value::Int(i);
      double d = std::strtod(digits.c_str(), &end);
      if (!digits.empty() && end && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(d));
      }
      return otherwise;
    }
    default:
      return otherwise;
  }
}

StatusOr<Value> ToFloat(const Value& v, const Value* fallback) {
  Value otherwise = fallback ? *fallback : Value::Float(0.0);
  if (v.is_number()) return Value::Float(v.number());
  if (v.is_string()) {
    std::string s = strings::Strip(v.text(), nullptr, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value::Float(d);
  }
  return otherwise;
}

StatusOr<Value> Sort(const Value& value, const CallArgs& args, bool by_key_pairs) {
  TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(value));
  const Value* reverse = args.Get(by_key_pairs ? 2 : 0, "reverse");
  const Value* case_sensitive = args.Get(by_key_pairs ? 0 : 1, "case_sensitive");
  const Value* attribute = by_key_pairs ? nullptr : args.Get(2, "attribute");
  bool fold = !(case_sensitive && case_sensitive->Truthy());
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& item : items) {
    Value key = item;
    if (by_key_pairs) {
      TIDAL_ASSIGN_OR_RETURN(auto v, GetItem(value, item));
      item = Value::MakeTuple({item, v});
    } else if (attribute && attribute->is_string()) {
      TIDAL_ASSIGN_OR_RETURN(key, AttributePath(item, attribute->text()));
    }
    if (fold && key.is_string()) key = Value::String(strings::Lower(key.text()));
    keyed.emplace_back(std::move(key), item);
  }
  Status error;
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    auto c = Compare(a.first, b.first);
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return *c < 0;
  });
  if (!error.ok()) return error;
  if (reverse && reverse->Truthy()) std::reverse(keyed.begin(), keyed.end());
  Value::List out;
  for (auto& [k, v] : keyed) out.push_back(std::move(v));
  return Value::MakeList(std::move(out));
}

StatusOr<Value> MinMax(const Value& value, bool max) {
  TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(value));
  if (items.empty()) return Value::Undefined("no first item, sequence was empty");
  Value best = items[0];
  for (size_t i = 1; i < items.size(); ++i) {
    TIDAL_ASSIGN_OR_RETURN(int c, Compare(items[i], best));
    if (max ? c > 0 : c < 0) best = items[i];
  }
  return best;
}

using FilterFn = StatusOr<Value> (*)(std::string_view, const Value&, const CallArgs&);

StatusOr<Value> FilterImpl(std::string_view name, const Value& v, const CallArgs& args) {
  if (name == "length" || name == "count") {
    TIDAL_ASSIGN_OR_RETURN(size_t n, Length(v));
    return Value::Int(static_cast<int64_t>(n));
  }
  if (name == "string") return v.is_string() ? v : Value::String(Str(v));
  if (name == "safe") return v;
  if (name == "trim") {
    const Value* chars = args.Get(0, "chars");
    std::string set = chars && chars->is_string() ? chars->text() : "";
    return Value::String(
        strings::Strip(Str(v), chars && chars->is_string() ? &set : nullptr, true, true));
  }
  if (name == "upper") return Value::String(strings::Upper(Str(v)));
  if (name == "lower") return Value::String(strings::Lower(Str(v)));
  if (name == "title") return Value::String(strings::TitleFilter(Str(v)));
  if (name == "capitalize") return Value::String(strings::Capitalize(Str(v)));
  if (name == "escape" || name == "e" || name == "forceescape") {
    return Value::String(HtmlEscape(Str(v)));
  }
  if (name == "replace") {
    const Value* old = args.Get(0, "old");
    const Value* with = args.Get(1, "new");
    const Value* count = args.Get(2, "count");
    if (!old || !with) return FilterError(name, "expects old and new");
    return Value::String(strings::Replace(Str(v), Str(*old), Str(*with),
                                          count && !count->is_none() ? count->integer() : -1));
  }
  if (name == "tojson") {
    const Value* indent = args.Get(1, "indent");
    const Value* ensure_ascii = args.Get(0, "ensure_ascii");
    const Value* sort_keys = args.Get(3, "sort_keys");
    const Value* separators = args.Get(2, "separators");
    if (ensure_ascii && ensure_ascii->Truthy()) {
      return FilterError(name, "ensure_ascii=True is not supported");
    }
    if (separators && !separators->is_none()) {
      return FilterError(name, "separators are not supported");
    }
    int width = -1;
    if (indent && !indent->is_none()) {
      if (indent->kind() != Value::Kind::kInt) return FilterError(name, "indent must be an int");
      width = static_cast<int>(std::clamp<int64_t>(indent->integer(), 0, 64));
    }
    if (v.is_undefined()) return UndefinedError(v);
    TIDAL_ASSIGN_OR_RETURN(auto text, DumpJson(v, width, sort_keys && sort_keys->Truthy()));
    return Value::String(std::move(text));
  }
  if (name == "int") return ToInt(v, args.Get(0, "default"));
  if (name == "float") return ToFloat(v, args.Get(0, "default"));
  if (name == "abs") {
    if (v.kind() == Value::Kind::kFloat) return Value::Float(std::fabs(v.number()));
    if (v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool) {
      if (v.integer() == INT64_MIN) return FilterError(name, "integer overflow");
      return Value::Int(v.integer() < 0 ? -v.integer() : v.integer());
    }
    return InvalidArgument(std::string("bad operand type for abs(): '") + v.TypeName() + "'");
  }
  if (name == "round") {
    const Value* precision = args.Get(0, "precision");
    const Value* method = args.Get(1, "method");
    std::string how = method && method->is_string() ? method->text() : "common";
    if (how != "common" && how != "ceil" && how != "floor") {
      return FilterError(name, "method must be common, ceil or floor");
    }
    if (!v.is_number()) return FilterError(name, std::string("cannot round ") + v.TypeName());
    int64_t p = precision ? precision->integer() : 0;
    if (how == "common") {
      // Python's round(): ints stay ints; floats round half-even on their exact binary value.
      if (v.kind() != Value::Kind::kFloat) return Value::Int(v.integer());
      if (p >= 0 && p <= 30) {
        char buf[512];
        std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(p), v.number());
        return Value::Float(std::strtod(buf, nullptr));
      }
      double scale = std::pow(10.0, static_cast<double>(-p));
      return Value::Float(std::nearbyint(v.number() / scale) * scale);
    }
    double scale = std::pow(10.0, static_cast<double>(p));
    double x = v.number() * scale;
    return Value::Float((how == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
  }
  if (name == "default" || name == "d") {
    const Value* fallback = args.Get(0, "default_value");
    const Value* boolean = args.Get(1, "boolean");
    bool use = v.is_undefined() || (boolean && boolean->Truthy() && !v.Truthy());
    if (!use) return v;
    return fallback ? *fallback : Value::String("");
  }
  if (name == "join") {
    const Value* separator = args.Get(0, "d");
    const Value* attribute = args.Get(1, "attribute");
    TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(v));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && separator) out += Str(*separator);
      Value item = items[i];
      if (attribute && attribute->is_string()) {
        TIDAL_ASSIGN_OR_RETURN(item, AttributePath(item, attribute->text()));
      }
      out += Str(item);
    }
    return Value::String(std::move(out));
  }
  if (name == "first" || name == "last") {
    TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(v));
    if (items.empty())
      return Value::Undefined("No " + std::string(name) + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(v));
    return Value::MakeList(std::move(items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::MakeList({});
    if (!v.is_dict()) return FilterError(name, "can only get item pairs from a mapping");
    Value::List out;
    for (const auto& [k, item] : v.dict().items) {
      out.push_back(Value::MakeTuple({Value::String(k), item}));
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "selectattr") return Select(name, v, args, true, true);
  if (name == "rejectattr") return Select(name, v, args, true, false);
  if (name == "select") return Select(name, v, args, false, true);
  if (name == "reject") return Select(name, v, args, false, false);
  if (name == "map") return Map(v, args);
  if (name == "indent") {
    const Value* first = args.Get(1, "first");
    const Value* blank = args.Get(2, "blank");
    return Value::String(
        Indent(Str(v), args.Get(0, "width"), first && first->Truthy(), blank && blank->Truthy()));
  }
  if (name == "unique") {
    TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(v));
    Value::List out;
    for (const auto& item : items) {
      bool seen = std::any_of(out.begin(), out.end(), [&](const Value& o) {
        if (o.is_string() && item.is_string()) {
          return strings::Lower(o.text()) == strings::Lower(item.text());
        }
        return Equal(o, item);
      });
      if (!seen) out.push_back(item);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string text = DecodeUtf8(v.text());
      std::reverse(text.begin(), text.end());
      return Value::String(EncodeUtf8(text));
    }
    TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(v));
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "sort") return Sort(v, args, false);
  if (name == "dictsort") {
    if (!v.is_dict()) return FilterError(name, "expects a mapping");
    return Sort(v, args, true);
  }
  if (name == "sum") {
    const Value* attribute = args.Get(0, "attribute");
    const Value* start = args.Get(1, "start");
    TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(v));
    bool is_float = start && start->kind() == Value::Kind::kFloat;
    double f = start ? start->number() : 0;
    int64_t i = start ? start->integer() : 0;
    for (auto item : items) {
      if (attribute && attribute->is_string()) {
        TIDAL_ASSIGN_OR_RETURN(item, AttributePath(item, attribute->text()));
      }
      if (!item.is_number()) return FilterError(name, std::string("cannot add ") + item.TypeName());
      if (item.kind() == Value::Kind::kFloat) is_float = true;
      f += item.number();
      if (__builtin_add_overflow(i, item.integer(), &i)) is_float = true;
    }
    return is_float ? Value::Float(f) : Value::Int(i);
  }
  if (name == "min") return MinMax(v, false);
  if (name == "max") return MinMax(v, true);
  if (name == "wordcount") {
    return Value::Int(static_cast<int64_t>(strings::Split(Str(v), nullptr, -1).size()));
  }
  if (name == "center") {
    const Value* width = args.Get(0, "width");
    std::string s = Str(v);
    int64_t w = width ? width->integer() : 80;
    int64_t n = static_cast<int64_t>(Utf8Length(s));
    if (w <= n) return Value::String(s);
    int64_t left = (w - n) / 2 + ((w - n) & w & 1);
    return Value::String(std::string(static_cast<size_t>(left), ' ') + s +
                         std::string(static_cast<size_t>(w - n - left), ' '));
  }
  if (name == "format") {
    std::string pattern = Str(v);
    std::string out;
    size_t next = 0;
    for (size_t i = 0; i < pattern.size(); ++i) {
      if (pattern[i] != '%' || i + 1 >= pattern.size()) {
        out += pattern[i];
        continue;
      }
      char spec = pattern[++i];
      if (spec == '%') {
        out += '%';
        continue;
      }
      if (next >= args.positional.size()) return FilterError(name, "not enough arguments");
      const Value& arg = args.positional[next++];
      if (spec == 's') {
        out += Str(arg);
      } else if (spec == 'r') {
        out += Repr(arg);
      } else if (spec == 'd' || spec == 'i') {
        if (!arg.is_number()) return FilterError(name, "%d format: a number is required");
        out += std::to_string(arg.kind() == Value::Kind::kFloat ? static_cast<int64_t>(arg.number())
                                                                : arg.integer());
      } else {
        return FilterError(name, std::string("unsupported format character '") + spec + "'");
      }
    }
    return Value::String(std::move(out));
  }
  if (name == "attr") {
    const Value* attribute = args.Get(0, "name");
    if (!attribute || !attribute->is_string()) return FilterError(name, "expects a name");
    return GetAttribute(v, attribute->text());
  }
  if (name == "batch") {
    const Value* size = args.Get(0, "linecount");
    const Value* fill = args.Get(1, "fill_with");
    if (!size || size->integer() <= 0) return FilterError(name, "linecount must be positive");
    TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(v));
    Value::List out, row;
    for (auto& item : items) {
      row.push_back(item);
      if (static_cast<int64_t>(row.size()) == size->integer()) {
        out.push_back(Value::MakeList(std::move(row)));
        row.clear();
      }
    }
    if (!row.empty()) {
      while (fill && !fill->is_none() && static_cast<int64_t>(row.size()) < size->integer()) {
        row.push_back(*fill);
      }
      out.push_back(Value::MakeList(std::move(row)));
    }
    return Value::MakeList(std::move(out));
  }
  return FilterError(name, "no such filter");
}

constexpr std::string_view kFilters[] = {
    "length", "count",      "string", "safe",      "trim",        "upper",      "lower",
    "title",  "capitalize", "escape", "e",         "forceescape", "replace",    "tojson",
    "int",    "float",      "abs",    "round",     "default",     "d",          "join",
    "first",  "last",       "list",   "items",     "selectattr",  "rejectattr", "select",
    "reject", "map",        "indent", "unique",    "reverse",     "sort",       "dictsort",
    "sum",    "min",        "max",    "wordcount", "center",      "format",     "attr",
    "batch"};

StatusOr<bool> TestImpl(std::string_view name, const Value& v, const CallArgs& args) {
  const Value* other = args.Get(0, "other");
  auto need_other = [&]() -> Status {
    return other ? OkStatus()
                 : InvalidArgument("test '" + std::string(name) + "' needs an argument");
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.boolean();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.boolean();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") {
    return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  }
  if (name == "sequence") {
    return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  }
  if (name == "callable") return v.kind() == Value::Kind::kFunction;
  if (name == "lower") return v.is_string() && strings::Lower(v.text()) == v.text();
  if (name == "upper") return v.is_string() && strings::Upper(v.text()) == v.text();
  if (name == "escaped") return false;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool) {
      return InvalidArgument("test '" + std::string(name) + "' needs an integer");
    }
    int64_t by = 2;
    if (name == "divisibleby") {
      TIDAL_RETURN_IF_ERROR(need_other());
      by = other->integer();
      if (by == 0) return InvalidArgument("integer division or modulo by zero");
      return v.integer() % by == 0;
    }
    return (v.integer() % 2 != 0) == (name == "odd");
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") {
    TIDAL_RETURN_IF_ERROR(need_other());
    return name == "sameas" ? v.same_object(*other) : Equal(v, *other);
  }
  if (name == "ne" || name == "!=") {
    TIDAL_RETURN_IF_ERROR(need_other());
    return !Equal(v, *other);
  }
  if (name == "lt" || name == "<" || name == "lessthan" || name == "le" || name == "<=" ||
      name == "gt" || name == ">" || name == "greaterthan" || name == "ge" || name == ">=") {
    TIDAL_RETURN_IF_ERROR(need_other());
    if (v.is_undefined()) return UndefinedError(v);
    if (other->is_undefined()) return UndefinedError(*other);
    TIDAL_ASSIGN_OR_RETURN(int c, Compare(v, *other));
    if (name == "lt" || name == "<" || name == "lessthan") return c < 0;
    if (name == "le" || name == "<=") return c <= 0;
    if (name == "gt" || name == ">" || name == "greaterthan") return c > 0;
    return c >= 0;
  }
  if (name == "in") {
    const Value* seq = args.Get(0, "seq");
    if (!seq) return InvalidArgument("test 'in' needs an argument");
    return Contains(*seq, v);
  }
  if (name == "filter") return v.is_string() && HasFilter(v.text());
  if (name == "test") return v.is_string() && HasTest(v.text());
  return InvalidArgument("no test named '" + std::string(name) + "'");
}

constexpr std::string_view kTests[] = {
    "defined", "undefined",   "none",    "string",      "number",   "integer",  "float", "boolean",
    "true",    "false",       "mapping", "iterable",    "sequence", "callable", "lower", "upper",
    "escaped", "odd",         "even",    "divisibleby", "equalto",  "eq",       "==",    "sameas",
    "ne",      "!=",          "lt",      "<",           "lessthan", "le",       "<=",    "gt",
    ">",       "greaterthan", "ge",      ">=",          "in",       "filter",   "test"};

}  // namespace

bool HasFilter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters);
}

bool HasTest(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}

StatusOr<Value> ApplyFilter(std::string_view name, const Value& value, const CallArgs& args) {
  return FilterImpl(name, value, args);
}

StatusOr<bool> ApplyTest(std::string_view name, const Value& value, const CallArgs& args) {
  return TestImpl(name, value, args);
}

Dict GlobalFunctions() {
  Dict globals;
  globals.Set(
      "range", Value::MakeFunction("range", [](const CallArgs& args) -> StatusOr<Value> {
        if (args.positional.empty() || args.positional.size() > 3 || !args.keyword.empty()) {
          return InvalidArgument("range expected 1 to 3 integer arguments");
        }
        for (const auto& a : args.positional) {
          if (a.kind() != Value::Kind::kInt && a.kind() != Value::Kind::kBool) {
            return InvalidArgument(std::string("'") + a.TypeName() +
                                   "' object cannot be interpreted as an integer");
          }
        }
        int64_t start = 0, stop, step = 1;
        if (args.positional.size() == 1) {
          stop = args.positional[0].integer();
        } else {
          start = args.positional[0].integer();
          stop = args.positional[1].integer();
          if (args.positional.size() == 3) step = args.positional[2].integer();
        }
        if (step == 0) return InvalidArgument("range() arg 3 must not be zero");
        // Python's len(range(...)), refused before anything is built (as Jinja2's sandbox).
        const __int128 span = static_cast<__int128>(stop) - start;
        const __int128 length = step > 0 ? (span > 0 ? (span + step - 1) / step : 0)
                                         : (span < 0 ? (span + step + 1) / step : 0);
        if (length > static_cast<__int128>(kMaxSequenceLength)) {
          return InvalidArgument("range too big, max length is " +
                                 std::to_string(kMaxSequenceLength));
        }
        Value::List out;
        out.reserve(static_cast<size_t>(length));
        for (int64_t i = 0; i < static_cast<int64_t>(length); ++i) {
          out.push_back(Value::Int(static_cast<int64_t>(start + static_cast<__int128>(i) * step)));
        }
        return Value::MakeList(std::move(out));
      }));
  globals.Set("namespace",
              Value::MakeFunction("namespace", [](const CallArgs& args) -> StatusOr<Value> {
                Dict attributes;
                for (const auto& a : args.positional) {
                  if (!a.is_dict())
                    return InvalidArgument("namespace() takes mappings or keywords");
                  for (const auto& [k, v] : a.dict().items) attributes.Set(k, v);
                }
                for (const auto& [k, v] : args.keyword) attributes.Set(k, v);
                return Value::MakeNamespace(std::move(attributes));
              }));
  globals.Set("dict", Value::MakeFunction("dict", [](const CallArgs& args) -> StatusOr<Value> {
                Dict dict;
                for (const auto& a : args.positional) {
                  if (!a.is_dict()) return InvalidArgument("dict() takes mappings or keywords");
                  for (const auto& [k, v] : a.dict().items) dict.Set(k, v);
                }
                for (const auto& [k, v] : args.keyword) dict.Set(k, v);
                return Value::MakeDict(std::move(dict));
              }));
  globals.Set("raise_exception",
              Value::MakeFunction("raise_exception", [](const CallArgs& args) -> StatusOr<Value> {
                const Value* message = args.Get(0, "message");
                return InvalidArgument(message ? ToStr(*message) : "raise_exception called");
              }));
  globals.Set("strftime_now",
              Value::MakeFunction("strftime_now", [](const CallArgs& args) -> StatusOr<Value> {
                const Value* format = args.Get(0, "format");
                if (!format || !format->is_string()) {
                  return InvalidArgument("strftime_now expects a format string");
                }
                std::time_t now =
                    std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
                std::tm local{};
                localtime_r(&now, &local);
                char buf[512];
                size_t n = std::strftime(buf, sizeof(buf), format->text().c_str(), &local);
                return Value::String(std::string(buf, n));
              }));
  return globals;
}

}  // namespace tidal::data::jinja
