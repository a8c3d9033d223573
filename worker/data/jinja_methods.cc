// worker/data/jinja_methods.cc — attribute/item/slice lookup and the str, dict and list methods a
// template may call, as Jinja2's ImmutableSandboxedEnvironment allows them (mutating methods are
// refused when called).
#include <algorithm>
#include <optional>

#include "worker/data/jinja_builtins.h"
#include "worker/data/jinja_strings.h"

namespace tidal::data::jinja {
namespace {

Status ArgError(const std::string& method, const std::string& what) {
  return InvalidArgument(method + "(): " + what);
}

StatusOr<std::string> StringArg(const CallArgs& args, size_t index, const char* name,
                                const std::string& method) {
  const Value* v = args.Get(index, name);
  if (v == nullptr) return ArgError(method, std::string("missing argument '") + name + "'");
  if (!v->is_string()) {
    return ArgError(method,
                    std::string("argument '") + name + "' must be str, not " + v->TypeName());
  }
  return v->text();
}

// A string argument that may be None/absent (strip's chars, split's sep).
StatusOr<std::optional<std::string>> OptionalStringArg(const CallArgs& args, size_t index,
                                                       const char* name,
                                                       const std::string& method) {
  const Value* v = args.Get(index, name);
  if (v == nullptr || v->is_none()) return std::optional<std::string>();
  if (!v->is_string()) {
    return ArgError(
        method, std::string("argument '") + name + "' must be str or None, not " + v->TypeName());
  }
  return std::optional<std::string>(v->text());
}

StatusOr<int64_t> IntArg(const CallArgs& args, size_t index, const char* name, int64_t fallback,
                         const std::string& method) {
  const Value* v = args.Get(index, name);
  if (v == nullptr || v->is_none()) return fallback;
  if (v->kind() != Value::Kind::kInt && v->kind() != Value::Kind::kBool) {
    return ArgError(method, std::string("argument '") + name + "' must be int");
  }
  return v->integer();
}

Value StringList(const std::vector<std::string>& parts) {
  Value::List items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.push_back(Value::String(p));
  return Value::MakeList(std::move(items));
}

// str.format with {}, {0} and {name} fields (no format specs).
StatusOr<std::string> Format(const std::string& pattern, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '{' && i + 1 < pattern.size() && pattern[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < pattern.size() && pattern[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t close = pattern.find('}', i);
      if (close == std::string::npos) return InvalidArgument("format(): unmatched '{'");
      std::string field = pattern.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!") != std::string::npos) {
        return InvalidArgument("format(): format specs are not supported");
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = args.Get(auto_index++, "");
      } else if (std::all_of(field.begin(), field.end(),
                             [](char d) { return d >= '0' && d <= '9'; })) {
        v = args.Get(static_cast<size_t>(std::stoul(field)), "");
      } else {
        v = args.Keyword(field);
      }
      if (v == nullptr) return InvalidArgument("format(): no argument for field '" + field + "'");
      out += ToStr(*v);
      i = close;
    } else {
      out += c;
    }
  }
  return out;
}

StatusOr<Value> CallStringMethod(const std::string& s, const std::string& name,
                                 const CallArgs& args) {
  const std::string method = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    TIDAL_ASSIGN_OR_RETURN(auto chars, OptionalStringArg(args, 0, "chars", method));
    return Value::String(
        strings::Strip(s, chars ? &*chars : nullptr, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    TIDAL_ASSIGN_OR_RETURN(auto sep, OptionalStringArg(args, 0, "sep", method));
    TIDAL_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(args, 1, "maxsplit", -1, method));
    if (sep && sep->empty()) return ArgError(method, "empty separator");
    if (name == "rsplit" && sep) return StringList(strings::RSplit(s, *sep, maxsplit));
    if (name == "rsplit" && maxsplit >= 0)
      return ArgError(method, "whitespace rsplit with maxsplit");
    return StringList(strings::Split(s, sep ? &*sep : nullptr, maxsplit));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* prefix = args.Get(0, "prefix");
    if (prefix == nullptr) return ArgError(method, "missing argument");
    std::vector<std::string> options;
    if (prefix->is_string()) {
      options.push_back(prefix->text());
    } else if (prefix->is_list()) {
      for (const auto& option : prefix->list()) {
        if (!option.is_string()) return ArgError(method, "tuple items must be str");
        options.push_back(option.text());
      }
    } else {
      return ArgError(method, "argument must be str or a tuple of str");
    }
    for (const auto& option : options) {
      bool hit = name == "startswith"
                     ? s.compare(0, option.size(), option) == 0
                     : s.size() >= option.size() &&
                           s.compare(s.size() - option.size(), option.size(), option) == 0;
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "upper") return Value::String(strings::Upper(s));
  if (name == "lower") return Value::String(strings::Lower(s));
  if (name == "title") return Value::String(strings::Title(s));
  if (name == "capitalize") return Value::String(strings::Capitalize(s));
  if (name == "replace") {
    TIDAL_ASSIGN_OR_RETURN(auto old, StringArg(args, 0, "old", method));
    TIDAL_ASSIGN_OR_RETURN(auto with, StringArg(args, 1, "new", method));
    TIDAL_ASSIGN_OR_RETURN(int64_t count, IntArg(args, 2, "count", -1, method));
    return Value::String(strings::Replace(s, old, with, count));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    TIDAL_ASSIGN_OR_RETURN(auto sub, StringArg(args, 0, "sub", method));
    if (name == "count") {
      if (sub.empty()) return Value::Int(static_cast<int64_t>(Utf8Length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::Int(n);
    }
    size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name == "index") return ArgError(method, "substring not found");
      return Value::Int(-1);
    }
    return Value::Int(static_cast<int64_t>(Utf8Length(std::string_view(s).substr(0, at))));
  }
  if (name == "join") {
    const Value* iterable = args.Get(0, "iterable");
    if (iterable == nullptr) return ArgError(method, "missing argument");
    TIDAL_ASSIGN_OR_RETURN(auto items, Iterate(*iterable));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return ArgError(method, std::string("sequence item ") + std::to_string(i) +
                                    ": expected str instance, " + items[i].TypeName() + " found");
      }
      if (i > 0) out += s;
      out += items[i].text();
    }
    return Value::String(std::move(out));
  }
  if (name == "format") {
    TIDAL_ASSIGN_OR_RETURN(auto out, Format(s, args));
    return Value::String(std::move(out));
  }
  if (name == "splitlines") return StringList(strings::SplitLines(s));
  if (name == "removeprefix" || name == "removesuffix") {
    TIDAL_ASSIGN_OR_RETURN(auto affix, StringArg(args, 0, "affix", method));
    if (name == "removeprefix" && s.compare(0, affix.size(), affix) == 0) {
      return Value::String(s.substr(affix.size()));
    }
    if (name == "removesuffix" && !affix.empty() && s.size() >= affix.size() &&
        s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
      return Value::String(s.substr(0, s.size() - affix.size()));
    }
    return Value::String(s);
  }
  auto all_of = [&](auto predicate) {
    std::u32string text = DecodeUtf8(s);
    return Value::Bool(!text.empty() && std::all_of(text.begin(), text.end(), predicate));
  };
  if (name == "isdigit") return all_of([](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") {
    return all_of([](char32_t c) { return c < 0x80 && strings::IsAlpha(static_cast<char>(c)); });
  }
  if (name == "isalnum") {
    return all_of([](char32_t c) {
      return c < 0x80 && (strings::IsAlpha(static_cast<char>(c)) || (c >= '0' && c <= '9'));
    });
  }
  if (name == "isspace") return all_of([](char32_t c) { return strings::IsPySpace(c); });
  if (name == "islower" || name == "isupper") {
    bool upper = name == "isupper";
    bool cased = false;
    for (char c : s) {
      if (!strings::IsAlpha(c)) continue;
      cased = true;
      if ((c >= 'A' && c <= 'Z') != upper) return Value::Bool(false);
    }
    return Value::Bool(cased);
  }
  return InvalidArgument("'str' object has no attribute '" + name + "'");
}

bool IsStringMethod(const std::string& name) {
  static const char* kNames[] = {
      "strip",   "lstrip",  "rstrip",  "split",      "rsplit",     "startswith",   "endswith",
      "upper",   "lower",   "title",   "capitalize", "replace",    "find",         "rfind",
      "index",   "count",   "join",    "format",     "splitlines", "removeprefix", "removesuffix",
      "isdigit", "isalpha", "isalnum", "isspace",    "islower",    "isupper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool IsDictMethod(const std::string& name) {
  static const char* kNames[] = {"get", "items",   "keys",       "values", "copy",
                                 "pop", "popitem", "setdefault", "update", "clear"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool IsListMethod(const std::string& name) {
  static const char* kNames[] = {"index", "count",  "copy", "append",  "extend", "insert",
                                 "pop",   "remove", "sort", "reverse", "clear"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

Value Unsafe(const Value& obj, const std::string& name) {
  std::string message =
      "access to attribute '" + name + "' of '" + obj.TypeName() + "' object is unsafe";
  return Value::MakeFunction(
      name, [message](const CallArgs&) -> StatusOr<Value> { return InvalidArgument(message); });
}

StatusOr<Value> CallDictMethod(const Value& obj, const std::string& name, const CallArgs& args) {
  const Dict& dict = obj.dict();
  if (name == "get") {
    const Value* key = args.Get(0, "key");
    if (key == nullptr) return ArgError("dict.get", "missing argument");
    const Value* fallback = args.Get(1, "default");
    const Value* hit = key->is_string() ? dict.Find(key->text()) : nullptr;
    if (hit != nullptr) return *hit;
    return fallback ? *fallback : Value::None();
  }
  if (name == "items") {
    Value::List items;
    for (const auto& [k, v] : dict.items) items.push_back(Value::MakeTuple({Value::String(k), v}));
    return Value::MakeList(std::move(items));
  }
  if (name == "keys") {
    Value::List items;
    for (const auto& [k, v] : dict.items) items.push_back(Value::String(k));
    return Value::MakeList(std::move(items));
  }
  if (name == "values") {
    Value::List items;
    for (const auto& [k, v] : dict.items) items.push_back(v);
    return Value::MakeList(std::move(items));
  }
  if (name == "copy") return Value::MakeDict(dict);
  return InvalidArgument("access to attribute '" + name + "' of 'dict' object is unsafe");
}

StatusOr<Value> CallListMethod(const Value& obj, const std::string& name, const CallArgs& args) {
  const auto& list = obj.list();
  if (name == "index" || name == "count") {
    const Value* x = args.Get(0, "value");
    if (x == nullptr) return ArgError("list." + name, "missing argument");
    int64_t n = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      if (!Equal(list[i], *x)) continue;
      if (name == "index") return Value::Int(static_cast<int64_t>(i));
      ++n;
    }
    if (name == "index") return InvalidArgument("list.index(x): x not in list");
    return Value::Int(n);
  }
  if (name == "copy") return obj;
  return InvalidArgument("access to attribute '" + name + "' of 'list' object is unsafe");
}

Value BoundMethod(const Value& obj, const std::string& name) {
  if (obj.is_string()) {
    std::string s = obj.text();
    return Value::MakeFunction(
        "str." + name, [s, name](const CallArgs& args) { return CallStringMethod(s, name, args); });
  }
  if (obj.is_dict()) {
    if (name != "get" && name != "items" && name != "keys" && name != "values" && name != "copy") {
      return Unsafe(obj, name);
    }
    return Value::MakeFunction("dict." + name, [obj, name](const CallArgs& args) {
      return CallDictMethod(obj, name, args);
    });
  }
  if (name != "index" && name != "count" && name != "copy") return Unsafe(obj, name);
  return Value::MakeFunction("list." + name, [obj, name](const CallArgs& args) {
    return CallListMethod(obj, name, args);
  });
}

std::string ObjectName(const Value& obj) { return std::string(obj.TypeName()) + " object"; }

Value Missing(const Value& obj, const std::string& name) {
  std::string message = "'";
  message += ObjectName(obj);
  message += "' has no attribute '";
  message += name;
  message += "'";
  return Value::Undefined(std::move(message));
}

// Python index normalisation: negative counts from the end; out of range → nullopt.
std::optional<size_t> Index(int64_t i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  if (i < 0 || i >= static_cast<int64_t>(size)) return std::nullopt;
  return static_cast<size_t>(i);
}

}  // namespace

Status UndefinedError(const Value& undefined) {
  return InvalidArgument(undefined.text().empty() ? "value is undefined" : undefined.text());
}

StatusOr<Value> GetAttribute(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return UndefinedError(obj);
    case Value::Kind::kDict: {
      if (IsDictMethod(name)) return BoundMethod(obj, name);
      const Value* hit = obj.dict().Find(name);
      return hit ? *hit : Missing(obj, name);
    }
    case Value::Kind::kNamespace: {
      const Value* hit = obj.dict().Find(name);
      return hit ? *hit : Missing(obj, name);
    }
    case Value::Kind::kString:
      return IsStringMethod(name) ? BoundMethod(obj, name) : Missing(obj, name);
    case Value::Kind::kList:
      return IsListMethod(name) ? BoundMethod(obj, name) : Missing(obj, name);
    default:
      return Missing(obj, name);
  }
}

StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  bool integer_key = key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool;
  switch (obj.kind()) {
    case Value::Kind::kDict:
      if (key.is_string()) {
        const Value* hit = obj.dict().Find(key.text());
        if (hit) return *hit;
        return GetAttribute(obj, key.text());
      }
      break;
    case Value::Kind::kList:
      if (integer_key) {
        auto i = Index(key.integer(), obj.list().size());
        if (i) return obj.list()[*i];
      } else if (key.is_string()) {
        return GetAttribute(obj, key.text());
      }
      break;
    case Value::Kind::kString:
      if (integer_key) {
        std::u32string text = DecodeUtf8(obj.text());
        auto i = Index(key.integer(), text.size());
        if (i) return Value::String(EncodeUtf8(text.substr(*i, 1)));
      } else if (key.is_string()) {
        return GetAttribute(obj, key.text());
      }
      break;
    case Value::Kind::kNamespace:
      if (key.is_string()) return GetAttribute(obj, key.text());
      break;
    default:
      break;
  }
  std::string message = "'";
  message += ObjectName(obj);
  message += "' has no attribute ";
  message += Repr(key);
  return Value::Undefined(std::move(message));
}

StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                         const Value& step) {
  if (obj.is_undefined()) return UndefinedError(obj);
  auto part = [](const Value& v, const char* what) -> StatusOr<std::optional<int64_t>> {
    if (v.is_undefined() || v.is_none()) return std::optional<int64_t>();
    if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool) {
      return InvalidArgument(std::string("slice ") + what + " must be an integer or None");
    }
    return std::optional<int64_t>(v.integer());
  };
  TIDAL_ASSIGN_OR_RETURN(auto a, part(start, "start"));
  TIDAL_ASSIGN_OR_RETURN(auto b, part(stop, "stop"));
  TIDAL_ASSIGN_OR_RETURN(auto c, part(step, "step"));
  int64_t s = c.value_or(1);
  if (s == 0) return InvalidArgument("slice step cannot be zero");
  std::u32string text;
  int64_t n;
  if (obj.is_string()) {
    text = DecodeUtf8(obj.text());
    n = static_cast<int64_t>(text.size());
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list().size());
  } else {
    return InvalidArgument(std::string("'") + obj.TypeName() + "' object is not subscriptable");
  }
  // slice.indices(n)
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = s < 0 ? -1 : 0;
    } else if (x >= n) {
      x = s < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t first = clamp(a, s < 0 ? n - 1 : 0);
  int64_t last = clamp(b, s < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = first; s > 0 ? i < last : i > last; i += s)
    picks.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::u32string out;
    for (size_t i : picks) out += text[i];
    return Value::String(EncodeUtf8(out));
  }
  Value::List out;
  for (size_t i : picks) out.push_back(obj.list()[i]);
  return Value::MakeList(std::move(out));
}

StatusOr<Value::List> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return Value::List();
    case Value::Kind::kList:
      return value.list();
    case Value::Kind::kDict: {
      Value::List keys;
      for (const auto& [k, v] : value.dict().items) keys.push_back(Value::String(k));
      return keys;
    }
    case Value::Kind::kString: {
      Value::List chars;
      for (char32_t c : DecodeUtf8(value.text())) {
        chars.push_back(Value::String(EncodeUtf8(std::u32string(1, c))));
      }
      return chars;
    }
    default:
      return InvalidArgument(std::string("'") + value.TypeName() + "' object is not iterable");
  }
}

StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return InvalidArgument(std::string("'in <string>' requires string as left operand, not ") +
                               item.TypeName());
      }
      return container.text().find(item.text()) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.list().begin(), container.list().end(),
                         [&](const Value& v) { return Equal(v, item); });
    case Value::Kind::kDict:
      return item.is_string() && container.dict().Find(item.text()) != nullptr;
    default:
      return InvalidArgument(std::string("argument of type '") + container.TypeName() +
                             "' is not iterable");
  }
}

}  // namespace tidal::data::jinja
