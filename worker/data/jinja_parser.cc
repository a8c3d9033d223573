// worker/data/jinja_parser.cc — recursive descent over the lexer's tokens, following
// jinja2/parser.py's grammar and precedence (condexpr > or > and > not > compare > + - > ~ >
// * / // % > ** > unary > primary, postfix, filters and tests).
#include "worker/data/jinja_parser.h"

#include <algorithm>
#include <cstdlib>

#include "worker/data/jinja_lexer.h"

namespace tidal::data::jinja {
namespace {

// Deeper nesting than any real template; bounds the parser's and evaluator's recursion.
constexpr int kMaxNesting = 150;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  StatusOr<ParsedTemplate> Run() {
    ParsedTemplate parsed;
    std::string end;
    TIDAL_ASSIGN_OR_RETURN(parsed.body, ParseBody({}, &end));
    parsed.has_generation = has_generation_;
    return parsed;
  }

 private:
  const Token& Cur() const { return t_[i_]; }
  const Token& Peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  void Next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool IsOp(const char* op) const { return Cur().type == Token::Type::kOp && Cur().value == op; }
  bool IsName(const char* name) const {
    return Cur().type == Token::Type::kName && Cur().value == name;
  }
  Status Fail(const std::string& message) const {
    return InvalidArgument("template line " + std::to_string(Cur().line) + ": " + message);
  }
  std::string Describe(const Token& token) const {
    switch (token.type) {
      case Token::Type::kEof:
        return "end of template";
      case Token::Type::kBlockEnd:
        return "end of statement block";
      case Token::Type::kVarEnd:
        return "end of print statement";
      case Token::Type::kData:
        return "template data";
      default:
        return "'" + token.value + "'";
    }
  }
  Status Expect(Token::Type type, const char* what) {
    if (Cur().type != type)
      return Fail(std::string("expected ") + what + ", got " + Describe(Cur()));
    Next();
    return OkStatus();
  }
  Status ExpectOp(const char* op) {
    if (!IsOp(op)) return Fail(std::string("expected '") + op + "', got " + Describe(Cur()));
    Next();
    return OkStatus();
  }
  StatusOr<std::string> ExpectName() {
    if (Cur().type != Token::Type::kName) return Fail("expected a name, got " + Describe(Cur()));
    std::string name = Cur().value;
    Next();
    return name;
  }

  struct DepthGuard {
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }
    int& depth_;
  };

  ExprPtr MakeExpr(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  StmtPtr MakeStmt(Stmt::Kind kind, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = line;
    return s;
  }

  // Statements until one of `end_tags` opens a block ({% endfor %}); stops on that tag's name,
  // consumed, and says which in *end.
  StatusOr<Body> ParseBody(const std::vector<std::string>& end_tags, std::string* end) {
    DepthGuard guard(depth_);
    if (depth_ > kMaxNesting) return Fail("template nested too deeply");
    Body body;
    for (;;) {
      const Token& token = Cur();
      switch (token.type) {
        case Token::Type::kEof:
          if (!end_tags.empty()) {
            return Fail("unexpected end of template, expected '" + end_tags.back() + "'");
          }
          return body;
        case Token::Type::kData: {
          auto s = MakeStmt(Stmt::Kind::kText, token.line);
          s->text = token.value;
          body.push_back(std::move(s));
          Next();
          break;
        }
        case Token::Type::kVarBegin: {
          auto s = MakeStmt(Stmt::Kind::kOutput, token.line);
          Next();
          TIDAL_ASSIGN_OR_RETURN(s->expr, ParseTuple());
          TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kVarEnd, "end of print statement '}}'"));
          body.push_back(std::move(s));
          break;
        }
        case Token::Type::kBlockBegin: {
          Next();
          if (Cur().type != Token::Type::kName) return Fail("tag name expected");
          const std::string& name = Cur().value;
          if (std::find(end_tags.begin(), end_tags.end(), name) != end_tags.end()) {
            *end = name;
            Next();
            return body;
          }
          TIDAL_ASSIGN_OR_RETURN(auto s, ParseStatement());
          if (s) body.push_back(std::move(s));
          break;
        }
        default:
          return Fail("unexpected " + Describe(token));
      }
    }
  }

  StatusOr<StmtPtr> ParseStatement() {
    const std::string name = Cur().value;
    int line = Cur().line;
    Next();
    if (name == "if") return ParseIf(line);
    if (name == "for") return ParseFor(line);
    if (name == "set") return ParseSet(line);
    if (name == "macro") return ParseMacro(line);
    if (name == "call") return ParseCallBlock(line);
    if (name == "filter") return ParseFilterBlock(line);
    if (name == "generation") {
      has_generation_ = true;
      auto s = MakeStmt(Stmt::Kind::kGeneration, line);
      TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
      std::string end;
      TIDAL_ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, &end));
      TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Fail("'" + name + "' outside of a loop");
      auto s = MakeStmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, line);
      TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
      return s;
    }
    return InvalidArgument("template line " + std::to_string(line) +
                           ": unknown or unsupported tag '" + name + "'");
  }

  StatusOr<StmtPtr> ParseIf(int line) {
    auto s = MakeStmt(Stmt::Kind::kIf, line);
    for (;;) {
      TIDAL_ASSIGN_OR_RETURN(auto condition, ParseTuple());
      TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
      std::string end;
      TIDAL_ASSIGN_OR_RETURN(auto body, ParseBody({"elif", "else", "endif"}, &end));
      s->conditions.push_back(std::move(condition));
      s->bodies.push_back(std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
        TIDAL_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, &end));
      }
      TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
      return s;
    }
  }

  StatusOr<StmtPtr> ParseFor(int line) {
    auto s = MakeStmt(Stmt::Kind::kFor, line);
    bool parens = IsOp("(");
    if (parens) Next();
    for (;;) {
      TIDAL_ASSIGN_OR_RETURN(auto target, ExpectName());
      s->targets.push_back(target);
      if (!IsOp(",")) break;
      Next();
      if (IsName("in") || IsOp(")")) break;
    }
    if (parens) TIDAL_RETURN_IF_ERROR(ExpectOp(")"));
    if (!IsName("in")) return Fail("expected 'in', got " + Describe(Cur()));
    Next();
    TIDAL_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/false));
    if (IsName("if")) {
      Next();
      TIDAL_ASSIGN_OR_RETURN(s->condition, ParseExpression());
    }
    if (IsName("recursive")) return Fail("recursive loops are not supported");
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    std::string end;
    ++loop_depth_;
    const int loop_mentions = loop_mentions_;
    auto body = ParseBody({"endfor", "else"}, &end);
    --loop_depth_;
    if (!body.ok()) return body.status();
    s->body = std::move(body).value();
    // Conservative: a mention in a nested loop or macro counts for this loop too.
    s->uses_loop = loop_mentions_ != loop_mentions;
    if (end == "else") {
      TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
      TIDAL_ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, &end));
    }
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    return s;
  }

  StatusOr<StmtPtr> ParseSet(int line) {
    auto s = MakeStmt(Stmt::Kind::kSet, line);
    TIDAL_ASSIGN_OR_RETURN(auto first, ExpectName());
    s->targets.push_back(first);
    if (IsOp(".")) {
      Next();
      TIDAL_ASSIGN_OR_RETURN(s->attribute, ExpectName());
      if (first == "loop") ++loop_mentions_;  // {% set loop.x = ... %} looks `loop` up by name
    } else {
      while (IsOp(",")) {
        Next();
        TIDAL_ASSIGN_OR_RETURN(auto target, ExpectName());
        s->targets.push_back(target);
      }
    }
    if (IsOp("=")) {
      Next();
      TIDAL_ASSIGN_OR_RETURN(s->expr, ParseTuple());
      TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
      return s;
    }
    if (!s->attribute.empty() || s->targets.size() != 1) return Fail("expected '='");
    s->kind = Stmt::Kind::kSetBlock;
    if (IsOp("|")) {
      TIDAL_ASSIGN_OR_RETURN(s->expr, ParseFilterChain(nullptr));
    }
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    std::string end;
    TIDAL_ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, &end));
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    return s;
  }

  Status ParseParams(Stmt& s) {
    TIDAL_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!s.params.empty()) TIDAL_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      TIDAL_ASSIGN_OR_RETURN(auto param, ExpectName());
      ExprPtr fallback;
      if (IsOp("=")) {
        Next();
        TIDAL_ASSIGN_OR_RETURN(fallback, ParseExpression());
      }
      s.params.emplace_back(param, std::move(fallback));
    }
    Next();
    return OkStatus();
  }

  StatusOr<StmtPtr> ParseMacro(int line) {
    auto s = MakeStmt(Stmt::Kind::kMacro, line);
    TIDAL_ASSIGN_OR_RETURN(s->name, ExpectName());
    TIDAL_RETURN_IF_ERROR(ParseParams(*s));
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    std::string end;
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    auto body = ParseBody({"endmacro"}, &end);
    loop_depth_ = saved_loop_depth;
    if (!body.ok()) return body.status();
    s->body = std::move(body).value();
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    return s;
  }

  StatusOr<StmtPtr> ParseCallBlock(int line) {
    auto s = MakeStmt(Stmt::Kind::kCallBlock, line);
    if (IsOp("(")) TIDAL_RETURN_IF_ERROR(ParseParams(*s));
    TIDAL_ASSIGN_OR_RETURN(s->expr, ParseExpression());
    if (s->expr->kind != Expr::Kind::kCall) return Fail("expected a call after 'call'");
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    std::string end;
    TIDAL_ASSIGN_OR_RETURN(s->body, ParseBody({"endcall"}, &end));
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    return s;
  }

  StatusOr<StmtPtr> ParseFilterBlock(int line) {
    auto s = MakeStmt(Stmt::Kind::kFilterBlock, line);
    TIDAL_ASSIGN_OR_RETURN(s->expr, ParseFilterChain(nullptr, /*leading_pipe=*/false));
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    std::string end;
    TIDAL_ASSIGN_OR_RETURN(s->body, ParseBody({"endfilter"}, &end));
    TIDAL_RETURN_IF_ERROR(Expect(Token::Type::kBlockEnd, "end of statement block"));
    return s;
  }

  // ---- expressions ----

  StatusOr<ExprPtr> ParseTuple(bool with_condexpr = true) {
    int line = Cur().line;
    TIDAL_ASSIGN_OR_RETURN(auto first, ParseExpression(with_condexpr));
    if (!IsOp(",")) return first;
    auto tuple = MakeExpr(Expr::Kind::kTuple, line);
    tuple->items.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Cur().type == Token::Type::kBlockEnd || Cur().type == Token::Type::kVarEnd || IsOp(")")) {
        break;
      }
      TIDAL_ASSIGN_OR_RETURN(auto item, ParseExpression(with_condexpr));
      tuple->items.push_back(std::move(item));
    }
    return tuple;
  }

  StatusOr<ExprPtr> ParseExpression(bool with_condexpr = true) {
    DepthGuard guard(depth_);
    if (depth_ > kMaxNesting) return Fail("expression nested too deeply");
    if (!with_condexpr) return ParseOr();
    TIDAL_ASSIGN_OR_RETURN(auto expr, ParseOr());
    while (IsName("if")) {
      int line = Cur().line;
      Next();
      auto cond = MakeExpr(Expr::Kind::kCondition, line);
      TIDAL_ASSIGN_OR_RETURN(auto test, ParseOr());
      cond->items.push_back(std::move(test));
      cond->items.push_back(std::move(expr));
      if (IsName("else")) {
        Next();
        TIDAL_ASSIGN_OR_RETURN(auto otherwise, ParseExpression());
        cond->items.push_back(std::move(otherwise));
      } else {
        cond->items.push_back(nullptr);
      }
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr MakeBinary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
    auto e = MakeExpr(Expr::Kind::kBinary, line);
    e->name = op;
    e->items.push_back(std::move(left));
    e->items.push_back(std::move(right));
    return e;
  }

  StatusOr<ExprPtr> ParseOr() {
    TIDAL_ASSIGN_OR_RETURN(auto left, ParseAnd());
    while (IsName("or")) {
      int line = Cur().line;
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto right, ParseAnd());
      left = MakeBinary("or", std::move(left), std::move(right), line);
    }
    return left;
  }

  StatusOr<ExprPtr> ParseAnd() {
    TIDAL_ASSIGN_OR_RETURN(auto left, ParseNot());
    while (IsName("and")) {
      int line = Cur().line;
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto right, ParseNot());
      left = MakeBinary("and", std::move(left), std::move(right), line);
    }
    return left;
  }

  StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(depth_);
      if (depth_ > kMaxNesting) return Fail("expression nested too deeply");
      auto e = MakeExpr(Expr::Kind::kNot, Cur().line);
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto operand, ParseNot());
      e->items.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  StatusOr<ExprPtr> ParseCompare() {
    int line = Cur().line;
    TIDAL_ASSIGN_OR_RETURN(auto first, ParseMath1());
    ExprPtr compare;
    for (;;) {
      std::string op;
      if (Cur().type == Token::Type::kOp &&
          (Cur().value == "==" || Cur().value == "!=" || Cur().value == "<" ||
           Cur().value == "<=" || Cur().value == ">" || Cur().value == ">=")) {
        op = Cur().value;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && Peek().type == Token::Type::kName && Peek().value == "in") {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (!compare) {
        compare = MakeExpr(Expr::Kind::kCompare, line);
        compare->items.push_back(std::move(first));
      }
      TIDAL_ASSIGN_OR_RETURN(auto operand, ParseMath1());
      compare->ops.push_back(op);
      compare->items.push_back(std::move(operand));
    }
    return compare ? std::move(compare) : std::move(first);
  }

  StatusOr<ExprPtr> ParseMath1() {
    TIDAL_ASSIGN_OR_RETURN(auto left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      std::string op = Cur().value;
      int line = Cur().line;
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto right, ParseConcat());
      left = MakeBinary(op, std::move(left), std::move(right), line);
    }
    return left;
  }

  StatusOr<ExprPtr> ParseConcat() {
    TIDAL_ASSIGN_OR_RETURN(auto left, ParseMath2());
    while (IsOp("~")) {
      int line = Cur().line;
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto right, ParseMath2());
      left = MakeBinary("~", std::move(left), std::move(right), line);
    }
    return left;
  }

  StatusOr<ExprPtr> ParseMath2() {
    TIDAL_ASSIGN_OR_RETURN(auto left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      std::string op = Cur().value;
      int line = Cur().line;
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto right, ParsePow());
      left = MakeBinary(op, std::move(left), std::move(right), line);
    }
    return left;
  }

  StatusOr<ExprPtr> ParsePow() {
    TIDAL_ASSIGN_OR_RETURN(auto left, ParseUnary(true));
    while (IsOp("**")) {
      int line = Cur().line;
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto right, ParseUnary(true));
      left = MakeBinary("**", std::move(left), std::move(right), line);
    }
    return left;
  }

  StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(depth_);
    if (depth_ > kMaxNesting) return Fail("expression nested too deeply");
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      node = MakeExpr(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Cur().line);
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto operand, ParseUnary(false));
      node->items.push_back(std::move(operand));
    } else {
      TIDAL_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    TIDAL_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      for (;;) {
        if (IsOp("|")) {
          TIDAL_ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node)));
        } else if (IsName("is")) {
          TIDAL_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
        } else if (IsOp("(")) {
          TIDAL_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
        } else {
          break;
        }
      }
    }
    return node;
  }

  StatusOr<ExprPtr> ParsePrimary() {
    const Token& token = Cur();
    int line = token.line;
    switch (token.type) {
      case Token::Type::kName: {
        const std::string& name = token.value;
        ExprPtr e;
        if (name == "true" || name == "True" || name == "false" || name == "False") {
          e = MakeExpr(Expr::Kind::kLiteral, line);
          e->value = Value::Bool(name == "true" || name == "True");
        } else if (name == "none" || name == "None") {
          e = MakeExpr(Expr::Kind::kLiteral, line);
          e->value = Value::None();
        } else {
          e = MakeExpr(Expr::Kind::kName, line);
          e->name = name;
          if (name == "loop") ++loop_mentions_;
        }
        Next();
        return e;
      }
      case Token::Type::kString: {
        std::string text;
        while (Cur().type == Token::Type::kString) {
          text += Cur().value;
          Next();
        }
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        e->value = Value::String(std::move(text));
        return e;
      }
      case Token::Type::kInt: {
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        errno = 0;
        long long v = std::strtoll(token.value.c_str(), nullptr, 10);
        if (errno == ERANGE) return Fail("integer literal out of range");
        e->value = Value::Int(v);
        Next();
        return e;
      }
      case Token::Type::kFloat: {
        auto e = MakeExpr(Expr::Kind::kLiteral, line);
        e->value = Value::Float(std::strtod(token.value.c_str(), nullptr));
        Next();
        return e;
      }
      case Token::Type::kOp:
        if (token.value == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return MakeExpr(Expr::Kind::kTuple, line);
          }
          TIDAL_ASSIGN_OR_RETURN(auto inner, ParseTuple());
          TIDAL_RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (token.value == "[") {
          Next();
          auto e = MakeExpr(Expr::Kind::kList, line);
          while (!IsOp("]")) {
            if (!e->items.empty()) TIDAL_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("]")) break;
            TIDAL_ASSIGN_OR_RETURN(auto item, ParseExpression());
            e->items.push_back(std::move(item));
          }
          Next();
          return e;
        }
        if (token.value == "{") {
          Next();
          auto e = MakeExpr(Expr::Kind::kDict, line);
          while (!IsOp("}")) {
            if (!e->items.empty()) TIDAL_RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp("}")) break;
            TIDAL_ASSIGN_OR_RETURN(auto key, ParseExpression());
            TIDAL_RETURN_IF_ERROR(ExpectOp(":"));
            TIDAL_ASSIGN_OR_RETURN(auto value, ParseExpression());
            e->items.push_back(std::move(key));
            e->items.push_back(std::move(value));
          }
          Next();
          return e;
        }
        break;
      default:
        break;
    }
    return Fail("unexpected " + Describe(token));
  }

  StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    for (;;) {
      int line = Cur().line;
      if (IsOp(".")) {
        Next();
        if (Cur().type == Token::Type::kName) {
          auto e = MakeExpr(Expr::Kind::kGetAttr, line);
          e->name = Cur().value;
          e->items.push_back(std::move(node));
          node = std::move(e);
          Next();
        } else if (Cur().type == Token::Type::kInt) {
          auto e = MakeExpr(Expr::Kind::kGetItem, line);
          auto index = MakeExpr(Expr::Kind::kLiteral, line);
          index->value = Value::Int(std::strtoll(Cur().value.c_str(), nullptr, 10));
          e->items.push_back(std::move(node));
          e->items.push_back(std::move(index));
          node = std::move(e);
          Next();
        } else {
          return Fail("expected an attribute name after '.'");
        }
      } else if (IsOp("[")) {
        Next();
        TIDAL_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node), line));
      } else if (IsOp("(")) {
        TIDAL_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  StatusOr<ExprPtr> ParseSubscript(ExprPtr node, int line) {
    ExprPtr parts[3];
    bool slice = false;
    int part = 0;
    for (;;) {
      if (IsOp("]")) break;
      if (IsOp(":")) {
        slice = true;
        if (++part > 2) return Fail("too many ':' in slice");
        Next();
        continue;
      }
      if (parts[part]) return Fail("expected ']' or ':'");
      TIDAL_ASSIGN_OR_RETURN(parts[part], ParseExpression());
    }
    Next();
    if (!slice) {
      if (!parts[0]) return Fail("empty subscript");
      auto e = MakeExpr(Expr::Kind::kGetItem, line);
      e->items.push_back(std::move(node));
      e->items.push_back(std::move(parts[0]));
      return e;
    }
    auto e = MakeExpr(Expr::Kind::kSlice, line);
    e->items.push_back(std::move(node));
    for (auto& p : parts) e->items.push_back(std::move(p));
    return e;
  }

  Status ParseCallArgs(Expr& e) {
    TIDAL_RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(")")) {
      if (!first) TIDAL_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) return Fail("*args and **kwargs are not supported");
      if (Cur().type == Token::Type::kName && Peek().type == Token::Type::kOp &&
          Peek().value == "=") {
        std::string key = Cur().value;
        Next();
        Next();
        TIDAL_ASSIGN_OR_RETURN(auto value, ParseExpression());
        e.keywords.emplace_back(key, std::move(value));
      } else {
        if (!e.keywords.empty()) return Fail("positional argument follows keyword argument");
        TIDAL_ASSIGN_OR_RETURN(auto value, ParseExpression());
        e.items.push_back(std::move(value));
      }
    }
    Next();
    return OkStatus();
  }

  StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto e = MakeExpr(Expr::Kind::kCall, Cur().line);
    e->items.push_back(std::move(callee));
    TIDAL_RETURN_IF_ERROR(ParseCallArgs(*e));
    return e;
  }

  StatusOr<std::string> ParseDottedName() {
    TIDAL_ASSIGN_OR_RETURN(auto name, ExpectName());
    while (IsOp(".")) {
      Next();
      TIDAL_ASSIGN_OR_RETURN(auto part, ExpectName());
      name += "." + part;
    }
    return name;
  }

  // `| f(args) | g ...` applied to `base` (null for {% filter %} / {% set x | f %}).
  StatusOr<ExprPtr> ParseFilterChain(ExprPtr base, bool leading_pipe = true) {
    bool first = true;
    while (IsOp("|") || (first && !leading_pipe)) {
      if (IsOp("|")) Next();
      first = false;
      auto e = MakeExpr(Expr::Kind::kFilter, Cur().line);
      TIDAL_ASSIGN_OR_RETURN(e->name, ParseDottedName());
      if (!HasFilter(e->name)) return Fail("no filter named '" + e->name + "'");
      e->items.push_back(std::move(base));
      if (IsOp("(")) TIDAL_RETURN_IF_ERROR(ParseCallArgs(*e));
      base = std::move(e);
    }
    return base;
  }

  StatusOr<ExprPtr> ParseTest(ExprPtr base) {
    auto e = MakeExpr(Expr::Kind::kTest, Cur().line);
    Next();  // is
    if (IsName("not")) {
      e->negated = true;
      Next();
    }
    TIDAL_ASSIGN_OR_RETURN(e->name, ParseDottedName());
    if (!HasTest(e->name)) return Fail("no test named '" + e->name + "'");
    e->items.push_back(std::move(base));
    if (IsOp("(")) {
      TIDAL_RETURN_IF_ERROR(ParseCallArgs(*e));
    } else if ((Cur().type == Token::Type::kName || Cur().type == Token::Type::kString ||
                Cur().type == Token::Type::kInt || Cur().type == Token::Type::kFloat || IsOp("[") ||
                IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return Fail("You cannot chain multiple tests with is");
      TIDAL_ASSIGN_OR_RETURN(auto arg, ParsePrimary());
      TIDAL_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      e->items.push_back(std::move(arg));
    }
    return e;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int loop_mentions_ = 0;  // `loop` names parsed so far (Stmt::uses_loop)
  bool has_generation_ = false;
};

}  // namespace

StatusOr<ParsedTemplate> ParseTemplate(std::string_view source) {
  TIDAL_ASSIGN_OR_RETURN(auto tokens, Tokenize(source));
  return Parser(std::move(tokens)).Run();
}

}  // namespace tidal::data::jinja
