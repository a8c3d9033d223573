// local/selectors.cc
#include "local/selectors.h"

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

std::string ScalarText(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

}  // namespace

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
