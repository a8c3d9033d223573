// kube/labels.cc
#include "kube/labels.h"

#include <algorithm>
#include <cctype>
#include <optional>

namespace tidal::kube {
namespace {

bool IsAlnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }

// A qualified name's name part, or a label value: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?
bool ValidName(const std::string& s) {
  if (s.empty() || s.size() > 63 || !IsAlnum(s.front()) || !IsAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return IsAlnum(c) || c == '-' || c == '_' || c == '.'; });
}

bool ValidDnsSubdomain(const std::string& s) {
  if (s.empty() || s.size() > 253 || !IsAlnum(s.front()) || !IsAlnum(s.back())) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (std::islower(static_cast<unsigned char>(c)) ||
            std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.');
  });
}

std::optional<std::string> LabelOf(const nlohmann::json& labels, const std::string& key) {
  if (!labels.is_object()) return std::nullopt;
  auto it = labels.find(key);
  if (it == labels.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

// Tokens of the selector syntax: identifiers (keys, values, in, notin) and operators.
struct Token {
  enum Kind { kIdent, kEquals, kDoubleEquals, kNotEquals, kBang, kOpen, kClose, kComma, kEnd } kind;
  std::string text;
};

std::vector<Token> Lex(const std::string& text) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '(') {
      out.push_back({Token::kOpen, "("}), ++i;
    } else if (c == ')') {
      out.push_back({Token::kClose, ")"}), ++i;
    } else if (c == ',') {
      out.push_back({Token::kComma, ","}), ++i;
    } else if (c == '=') {
      bool twice = i + 1 < text.size() && text[i + 1] == '=';
      out.push_back({twice ? Token::kDoubleEquals : Token::kEquals, twice ? "==" : "="});
      i += twice ? 2 : 1;
    } else if (c == '!') {
      bool ne = i + 1 < text.size() && text[i + 1] == '=';
      out.push_back({ne ? Token::kNotEquals : Token::kBang, ne ? "!=" : "!"});
      i += ne ? 2 : 1;
    } else {
      size_t start = i;
      while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])) &&
             std::string("(),=!").find(text[i]) == std::string::npos)
        ++i;
      out.push_back({Token::kIdent, text.substr(start, i - start)});
    }
  }
  out.push_back({Token::kEnd, ""});
  return out;
}

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text), tokens_(Lex(text)) {}

  StatusOr<std::vector<LabelRequirement>> Parse() {
    std::vector<LabelRequirement> out;
    if (Peek().kind == Token::kEnd) return out;
    for (;;) {
      TIDAL_ASSIGN_OR_RETURN(LabelRequirement req, Requirement());
      out.push_back(std::move(req));
      if (Peek().kind == Token::kEnd) return out;
      if (Next().kind != Token::kComma) return Error("expected ',' between requirements");
    }
  }

 private:
  const Token& Peek() const { return tokens_[pos_]; }
  const Token& Next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  Status Error(const std::string& why) const {
    return InvalidArgument("labelSelector \"" + text_ + "\": " + why);
  }

  StatusOr<std::string> Key() {
    const Token& t = Next();
    if (t.kind != Token::kIdent) return Error("expected a label key, got \"" + t.text + "\"");
    Status valid = ValidateLabelKey(t.text);
    if (!valid.ok()) return Error(valid.message());
    return t.text;
  }

  // A value: an identifier, or nothing (k= matches an empty value) before ',' / end.
  StatusOr<std::string> Value(bool allow_empty) {
    if (Peek().kind != Token::kIdent) {
      if (allow_empty && (Peek().kind == Token::kComma || Peek().kind == Token::kEnd ||
                          Peek().kind == Token::kClose))
        return std::string();
      return Error("expected a value, got \"" + Peek().text + "\"");
    }
    std::string value = Next().text;
    Status valid = ValidateLabelValue(value);
    if (!valid.ok()) return Error(valid.message());
    return value;
  }

  StatusOr<LabelRequirement> Requirement() {
    LabelRequirement req{LabelRequirement::kExists, "", {}};
    if (Peek().kind == Token::kBang) {
      Next();
      TIDAL_ASSIGN_OR_RETURN(req.key, Key());
      req.op = LabelRequirement::kDoesNotExist;
      return req;
    }
    TIDAL_ASSIGN_OR_RETURN(req.key, Key());
    const Token& op = Peek();
    switch (op.kind) {
      case Token::kComma:
      case Token::kEnd:
        return req;  // exists
      case Token::kEquals:
      case Token::kDoubleEquals:
      case Token::kNotEquals: {
        Next();
        req.op =
            op.kind == Token::kNotEquals ? LabelRequirement::kNotEquals : LabelRequirement::kEquals;
        TIDAL_ASSIGN_OR_RETURN(std::string value, Value(true));
        req.values.push_back(std::move(value));
        return req;
      }
      case Token::kIdent:
        if (op.text != "in" && op.text != "notin")
          return Error("expected an operator after \"" + req.key + "\", got \"" + op.text + "\"");
        req.op = op.text == "in" ? LabelRequirement::kIn : LabelRequirement::kNotIn;
        Next();
        if (Next().kind != Token::kOpen) return Error("expected '(' after " + op.text);
        if (Peek().kind == Token::kClose) {
          // "()" is the one empty value, as apimachinery reads it (and prints {""}): found by
          // fuzz/kube_wire_fuzz.cc, since "(,)" parsed and printed as "()", which did not.
          Next();
          req.values.push_back("");
          return req;
        }
        for (;;) {
          TIDAL_ASSIGN_OR_RETURN(std::string value, Value(true));
          req.values.push_back(std::move(value));
          const Token& sep = Next();
          if (sep.kind == Token::kClose) break;
          if (sep.kind != Token::kComma) return Error("expected ',' or ')' in the value list");
        }
        std::sort(req.values.begin(), req.values.end());
        req.values.erase(std::unique(req.values.begin(), req.values.end()), req.values.end());
        return req;
      default:
        return Error("unexpected \"" + op.text + "\" after \"" + req.key + "\"");
    }
  }

  std::string text_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
};

}  // namespace

Status ValidateLabelKey(const std::string& key) {
  size_t slash = key.find('/');
  std::string name = slash == std::string::npos ? key : key.substr(slash + 1);
  if (slash != std::string::npos && !ValidDnsSubdomain(key.substr(0, slash)))
    return InvalidArgument("label key \"" + key +
                           "\": the prefix must be a DNS subdomain (lowercase, ≤ 253)");
  if (!ValidName(name))
    return InvalidArgument("label key \"" + key +
                           "\": the name must be ≤ 63 characters of [A-Za-z0-9-_.], starting "
                           "and ending alphanumeric");
  return OkStatus();
}

Status ValidateLabelValue(const std::string& value) {
  if (value.empty() || ValidName(value)) return OkStatus();
  return InvalidArgument("label value \"" + value +
                         "\": must be ≤ 63 characters of [A-Za-z0-9-_.], starting and ending "
                         "alphanumeric");
}

StatusOr<LabelSelector> LabelSelector::Parse(const std::string& text) {
  LabelSelector selector;
  TIDAL_ASSIGN_OR_RETURN(selector.requirements_, Parser(text).Parse());
  return selector;
}

LabelSelector LabelSelector::FromMap(const std::map<std::string, std::string>& match_labels) {
  LabelSelector selector;
  for (const auto& [k, v] : match_labels)
    selector.requirements_.push_back({LabelRequirement::kEquals, k, {v}});
  return selector;
}

StatusOr<LabelSelector> LabelSelector::FromJson(const nlohmann::json& j) {
  LabelSelector selector;
  if (j.is_null()) return selector;
  if (!j.is_object()) return InvalidArgument("selector: expected an object");
  if (j.contains("matchLabels") && !j["matchLabels"].is_null()) {
    if (!j["matchLabels"].is_object())
      return InvalidArgument("selector.matchLabels: expected a map of strings");
    for (const auto& [k, v] : j["matchLabels"].items()) {
      if (!v.is_string())
        return InvalidArgument("selector.matchLabels." + k + ": expected a string");
      TIDAL_RETURN_IF_ERROR(ValidateLabelKey(k).WithContext("selector.matchLabels"));
      TIDAL_RETURN_IF_ERROR(
          ValidateLabelValue(v.get<std::string>()).WithContext("selector.matchLabels"));
      selector.requirements_.push_back({LabelRequirement::kEquals, k, {v.get<std::string>()}});
    }
  }
  if (j.contains("matchExpressions") && !j["matchExpressions"].is_null()) {
    if (!j["matchExpressions"].is_array())
      return InvalidArgument("selector.matchExpressions: expected a list");
    for (size_t i = 0; i < j["matchExpressions"].size(); ++i) {
      const auto& e = j["matchExpressions"][i];
      const std::string at = "selector.matchExpressions[" + std::to_string(i) + "]";
      if (!e.is_object() || !e.contains("key") || !e["key"].is_string() ||
          !e.contains("operator") || !e["operator"].is_string())
        return InvalidArgument(at + ": expected {key, operator, values}");
      LabelRequirement req{LabelRequirement::kExists, e["key"].get<std::string>(), {}};
      TIDAL_RETURN_IF_ERROR(ValidateLabelKey(req.key).WithContext(at));
      const std::string op = e["operator"];
      if (e.contains("values") && e["values"].is_array())
        for (const auto& v : e["values"]) {
          if (!v.is_string()) return InvalidArgument(at + ".values: expected strings");
          req.values.push_back(v.get<std::string>());
        }
      if (op == "In" || op == "NotIn") {
        req.op = op == "In" ? LabelRequirement::kIn : LabelRequirement::kNotIn;
        if (req.values.empty()) return InvalidArgument(at + ": " + op + " needs values");
        std::sort(req.values.begin(), req.values.end());
        req.values.erase(std::unique(req.values.begin(), req.values.end()), req.values.end());
      } else if (op == "Exists" || op == "DoesNotExist") {
        req.op = op == "Exists" ? LabelRequirement::kExists : LabelRequirement::kDoesNotExist;
        if (!req.values.empty()) return InvalidArgument(at + ": " + op + " takes no values");
      } else {
        return InvalidArgument(
            at + ".operator: expected In, NotIn, Exists or DoesNotExist, got \"" + op + "\"");
      }
      selector.requirements_.push_back(std::move(req));
    }
  }
  return selector;
}

bool LabelSelector::Matches(const nlohmann::json& labels) const {
  for (const auto& req : requirements_) {
    std::optional<std::string> value = LabelOf(labels, req.key);
    bool in_values =
        value && std::find(req.values.begin(), req.values.end(), *value) != req.values.end();
    bool ok = false;
    switch (req.op) {
      case LabelRequirement::kEquals:
      case LabelRequirement::kIn:
        ok = in_values;
        break;
      case LabelRequirement::kNotEquals:
      case LabelRequirement::kNotIn:
        ok = !in_values;
        break;
      case LabelRequirement::kExists:
        ok = value.has_value();
        break;
      case LabelRequirement::kDoesNotExist:
        ok = !value.has_value();
        break;
    }
    if (!ok) return false;
  }
  return true;
}

std::string LabelSelector::ToString() const {
  std::string out;
  for (const auto& req : requirements_) {
    if (!out.empty()) out += ",";
    auto list = [&] {
      std::string s;
      for (const auto& v : req.values) s += (s.empty() ? "" : ",") + v;
      return "(" + s + ")";
    };
    switch (req.op) {
      case LabelRequirement::kEquals:
        out += req.key + "=" + req.values.front();
        break;
      case LabelRequirement::kNotEquals:
        out += req.key + "!=" + req.values.front();
        break;
      case LabelRequirement::kIn:
        out += req.key + " in " + list();
        break;
      case LabelRequirement::kNotIn:
        out += req.key + " notin " + list();
        break;
      case LabelRequirement::kExists:
        out += req.key;
        break;
      case LabelRequirement::kDoesNotExist:
        out += "!" + req.key;
        break;
    }
  }
  return out;
}

}  // namespace tidal::kube
