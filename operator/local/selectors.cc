// operator/local/selectors.cc
#include "operator/local/selectors.h"

#include <cctype>

namespace tidal::local {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(0, 1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

// Splits on commas outside parentheses ("a in (x,y),b=c").
std::vector<std::string> SplitTopLevel(const std::string& text) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(Trim(cur));
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!Trim(cur).empty() || !out.empty()) out.push_back(Trim(cur));
  return out;
}

bool ValidLabelKey(const std::string& key) {
  if (key.empty() || key.size() > 316) return false;
  for (char c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        c != '/')
      return false;
  return true;
}

std::optional<std::string> LabelValue(const nlohmann::json& labels, const std::string& key) {
  if (!labels.is_object()) return std::nullopt;
  auto it = labels.find(key);
  if (it == labels.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::string ScalarText(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

}  // namespace

StatusOr<LabelSelector> ParseLabelSelector(const std::string& text) {
  LabelSelector out;
  if (Trim(text).empty()) return out;
  for (const std::string& part : SplitTopLevel(text)) {
    auto bad = [&](const std::string& why) {
      return InvalidArgument("labelSelector: \"" + part + "\": " + why);
    };
    LabelRequirement req;
    size_t paren = part.find('(');
    if (paren != std::string::npos) {
      std::string head = Trim(part.substr(0, paren));
      if (part.back() != ')') return bad("expected a closing parenthesis");
      size_t sp = head.rfind(' ');
      if (sp == std::string::npos) return bad("expected \"key in (v1,v2)\"");
      std::string op = Trim(head.substr(sp + 1));
      req.key = Trim(head.substr(0, sp));
      if (op == "in") {
        req.op = LabelRequirement::kIn;
      } else if (op == "notin") {
        req.op = LabelRequirement::kNotIn;
      } else {
        return bad("expected in or notin, got \"" + op + "\"");
      }
      std::string inner = part.substr(paren + 1, part.size() - paren - 2);
      for (const auto& v : SplitTopLevel(inner)) req.values.push_back(v);
    } else if (size_t ne = part.find("!="); ne != std::string::npos) {
      req.op = LabelRequirement::kNotEquals;
      req.key = Trim(part.substr(0, ne));
      req.values = {Trim(part.substr(ne + 2))};
    } else if (size_t eq = part.find('='); eq != std::string::npos) {
      req.op = LabelRequirement::kEquals;
      req.key = Trim(part.substr(0, eq));
      size_t skip = part.compare(eq, 2, "==") == 0 ? 2 : 1;
      req.values = {Trim(part.substr(eq + skip))};
    } else if (!part.empty() && part[0] == '!') {
      req.op = LabelRequirement::kNotExists;
      req.key = Trim(part.substr(1));
    } else {
      req.op = LabelRequirement::kExists;
      req.key = part;
    }
    if (!ValidLabelKey(req.key)) return bad("invalid label key \"" + req.key + "\"");
    out.push_back(std::move(req));
  }
  return out;
}

bool Matches(const LabelSelector& selector, const nlohmann::json& labels) {
  for (const auto& req : selector) {
    auto value = LabelValue(labels, req.key);
    bool in_values =
        value && std::find(req.values.begin(), req.values.end(), *value) != req.values.end();
    switch (req.op) {
      case LabelRequirement::kEquals:
      case LabelRequirement::kIn:
        if (!in_values) return false;
        break;
      case LabelRequirement::kNotEquals:
      case LabelRequirement::kNotIn:
        if (in_values) return false;  // a missing label satisfies != and notin
        break;
      case LabelRequirement::kExists:
        if (!value) return false;
        break;
      case LabelRequirement::kNotExists:
        if (value) return false;
        break;
    }
  }
  return true;
}

StatusOr<FieldSelector> ParseFieldSelector(const std::string& text) {
  FieldSelector out;
  if (Trim(text).empty()) return out;
  for (const std::string& part : SplitTopLevel(text)) {
    FieldRequirement req;
    size_t pos = part.find("!=");
    size_t skip = 2;
    if (pos != std::string::npos) {
      req.negate = true;
    } else if ((pos = part.find("==")) != std::string::npos) {
    } else if ((pos = part.find('=')) != std::string::npos) {
      skip = 1;
    } else {
      return InvalidArgument("fieldSelector: \"" + part +
                             "\": expected field=value or field!=value");
    }
    req.path = Trim(part.substr(0, pos));
    req.value = Trim(part.substr(pos + skip));
    if (req.path.empty()) return InvalidArgument("fieldSelector: \"" + part + "\": missing field");
    out.push_back(std::move(req));
  }
  return out;
}

bool Matches(const FieldSelector& selector, const nlohmann::json& object) {
  for (const auto& req : selector) {
    auto v = EvalJsonPath(object, "." + req.path);
    std::string text = v ? ScalarText(*v) : "";
    if ((text == req.value) == req.negate) return false;
  }
  return true;
}

std::optional<nlohmann::json> EvalJsonPath(const nlohmann::json& object, const std::string& path) {
  const nlohmann::json* cur = &object;
  size_t i = 0;
  if (path.rfind("{", 0) == 0) return EvalJsonPath(object, path.substr(1, path.size() - 2));
  while (i < path.size()) {
    if (path[i] == '.') {
      ++i;
      size_t end = path.find_first_of(".[", i);
      std::string key = path.substr(i, end == std::string::npos ? std::string::npos : end - i);
      i = end == std::string::npos ? path.size() : end;
      if (key.empty()) continue;
      if (!cur->is_object() || !cur->contains(key)) return std::nullopt;
      cur = &(*cur)[key];
    } else if (path[i] == '[') {
      size_t close = path.find(']', i);
      if (close == std::string::npos) return std::nullopt;
      std::string inner = path.substr(i + 1, close - i - 1);
      i = close + 1;
      if (!cur->is_array()) return std::nullopt;
      if (inner.rfind("?(@.", 0) == 0) {
        // ?(@.field=="value")
        size_t eq = inner.find("==");
        if (eq == std::string::npos) return std::nullopt;
        std::string field = inner.substr(4, eq - 4);
        std::string want = inner.substr(eq + 2);
        if (!want.empty() && want.back() == ')') want.pop_back();
        if (want.size() >= 2 && (want.front() == '"' || want.front() == '\''))
          want = want.substr(1, want.size() - 2);
        const nlohmann::json* found = nullptr;
        for (const auto& item : *cur) {
          auto v = EvalJsonPath(item, "." + field);
          if (v && ScalarText(*v) == want) {
            found = &item;
            break;
          }
        }
        if (!found) return std::nullopt;
        cur = found;
      } else {
        size_t index = 0;
        try {
          index = std::stoul(inner);
        } catch (...) {
          return std::nullopt;
        }
        if (index >= cur->size()) return std::nullopt;
        cur = &(*cur)[index];
      }
    } else {
      return std::nullopt;
    }
  }
  return *cur;
}

}  // namespace tidal::local
