// worker/data/jinja.cc — the evaluator: walks the syntax tree with Jinja2's scoping (a for loop
// and a macro body get their own scope, so `set` inside them does not leak out; if-blocks do
// not), Python operator semantics, and bounds on recursion, work and output so that a hostile
// template ends in an error, never a crash or a hang.
#include "worker/data/jinja.h"

#include <cmath>
#include <unordered_map>

#include "worker/data/jinja_builtins.h"
#include "worker/data/jinja_parser.h"

namespace tidal::data::jinja {
namespace {

constexpr int kMaxCallDepth = 100;              // nested macro calls / expression depth
constexpr size_t kMaxOutputBytes = 256u << 20;  // what one render may produce

enum class Flow { kNormal, kBreak, kContinue };

struct Scope {
  std::unordered_map<std::string, Value> vars;
  Scope* parent = nullptr;
};

Status At(int line, const Status& status) {
  if (status.ok() || status.message().rfind("template line ", 0) == 0) return status;
  return Status(status.code(), "template line " + std::to_string(line) + ": " + status.message());
}

#define EVAL_OR_RETURN(lhs, expr, line)                      \
  auto TIDAL_CONCAT(eval_, __LINE__) = (expr);               \
  if (!TIDAL_CONCAT(eval_, __LINE__).ok())                   \
    return At(line, TIDAL_CONCAT(eval_, __LINE__).status()); \
  lhs = std::move(TIDAL_CONCAT(eval_, __LINE__)).value()

class Renderer {
 public:
  Renderer(const ParsedTemplate& parsed, const RenderLimits& limits)
      : parsed_(parsed), limits_(limits) {}

  StatusOr<RenderResult> Run(const Dict& context) {
    Scope root;
    for (const auto& [k, v] : GlobalFunctions().items) root.vars[k] = v;
    for (const auto& [k, v] : context.items) root.vars[k] = v;
    root_ = &root;
    RenderResult result;
    root_out_ = &result.text;
    auto flow = ExecBody(parsed_.body, root, result.text);
    if (!flow.ok()) return flow.status();
    result.generation_spans = std::move(spans_);
    return result;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }
    int& depth_;
  };

  Status Step(int line) {
    if (++steps_ > limits_.max_steps) {
      return InvalidArgument("template line " + std::to_string(line) +
                             ": template exceeded its execution budget");
    }
    return OkStatus();
  }

  StatusOr<Flow> ExecBody(const Body& body, Scope& scope, std::string& out) {
    for (const auto& stmt : body) {
      TIDAL_ASSIGN_OR_RETURN(Flow flow, Exec(*stmt, scope, out));
      if (flow != Flow::kNormal) return flow;
      if (out.size() > kMaxOutputBytes) {
        return InvalidArgument("template line " + std::to_string(stmt->line) + ": output exceeds " +
                               std::to_string(kMaxOutputBytes) + " bytes");
      }
    }
    return Flow::kNormal;
  }

  Status Assign(const std::vector<std::string>& targets, const Value& value, Scope& scope,
                int line) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = value;
      return OkStatus();
    }
    auto iterated = Iterate(value);
    if (!iterated.ok()) return At(line, iterated.status());
    const Value::List& items = *iterated;
    if (items.size() != targets.size()) {
      return InvalidArgument("template line " + std::to_string(line) +
                             (items.size() > targets.size() ? ": too many" : ": not enough") +
                             " values to unpack (expected " + std::to_string(targets.size()) +
                             ", got " + std::to_string(items.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
    return OkStatus();
  }

  StatusOr<Flow> Exec(const Stmt& s, Scope& scope, std::string& out) {
    TIDAL_RETURN_IF_ERROR(Step(s.line));
    switch (s.kind) {
      case Stmt::Kind::kText:
        out += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        TIDAL_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
        out += ToStr(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          TIDAL_ASSIGN_OR_RETURN(Value test, Eval(*s.conditions[i], scope));
          if (test.Truthy()) return ExecBody(s.bodies[i], scope, out);
        }
        return ExecBody(s.else_body, scope, out);
      case Stmt::Kind::kFor:
        return ExecFor(s, scope, out);
      case Stmt::Kind::kSet: {
        TIDAL_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, scope));
        if (!s.attribute.empty()) {
          Value target = Lookup(s.targets[0], scope);
          if (target.kind() != Value::Kind::kNamespace) {
            return InvalidArgument("template line " + std::to_string(s.line) +
                                   ": cannot assign attribute on non-namespace object '" +
                                   s.targets[0] + "'");
          }
          target.mutable_namespace().Set(s.attribute, std::move(v));
          return Flow::kNormal;
        }
        TIDAL_RETURN_IF_ERROR(Assign(s.targets, v, scope, s.line));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        TIDAL_ASSIGN_OR_RETURN(Flow flow, ExecBody(s.body, scope, captured));
        (void)flow;
        Value v = Value::String(std::move(captured));
        if (s.expr) {
          TIDAL_ASSIGN_OR_RETURN(v, EvalFilter(*s.expr, scope, &v));
        }
        scope.vars[s.targets[0]] = std::move(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kFilterBlock: {
        std::string captured;
        TIDAL_ASSIGN_OR_RETURN(Flow flow, ExecBody(s.body, scope, captured));
        Value v = Value::String(std::move(captured));
        TIDAL_ASSIGN_OR_RETURN(v, EvalFilter(*s.expr, scope, &v));
        out += ToStr(v);
        return flow;
      }
      case Stmt::Kind::kMacro:
        scope.vars[s.name] = MakeMacro(s, s.name, nullptr);
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock: {
        Value caller = MakeMacro(s, "caller", nullptr);
        TIDAL_ASSIGN_OR_RETURN(Value v, EvalCall(*s.expr, scope, &caller));
        out += ToStr(v);
        return Flow::kNormal;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kGeneration: {
        size_t start = out.size();
        TIDAL_ASSIGN_OR_RETURN(Flow flow, ExecBody(s.body, scope, out));
        if (&out == root_out_) spans_.emplace_back(start, out.size());
        return flow;
      }
    }
    return Flow::kNormal;
  }

  StatusOr<Flow> ExecFor(const Stmt& s, Scope& scope, std::string& out) {
    TIDAL_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, scope));
    // A list is walked in place (lists are immutable, as in Jinja2's sandbox); other iterables
    // are listed first.
    Value::List listed;
    const Value::List* source = &listed;
    if (iterable.is_list()) {
      source = &iterable.list();
    } else {
      EVAL_OR_RETURN(listed, Iterate(iterable), s.line);
    }
    Scope loop_scope{{}, &scope};
    if (s.condition) {
      Value::List kept;
      for (const auto& item : *source) {
        TIDAL_RETURN_IF_ERROR(Step(s.line));
        TIDAL_RETURN_IF_ERROR(Assign(s.targets, item, loop_scope, s.line));
        TIDAL_ASSIGN_OR_RETURN(Value keep, Eval(*s.condition, loop_scope));
        if (keep.Truthy()) kept.push_back(item);
      }
      listed = std::move(kept);
      source = &listed;
    }
    const Value::List& items = *source;
    if (items.empty()) return ExecBody(s.else_body, scope, out);
    const int64_t length = static_cast<int64_t>(items.size());
    auto position = std::make_shared<int64_t>(0);
    Value cycle =
        Value::MakeFunction("loop.cycle", [position](const CallArgs& args) -> StatusOr<Value> {
          if (args.positional.empty()) return InvalidArgument("no items for cycling given");
          return args.positional[static_cast<size_t>(*position) % args.positional.size()];
        });
    for (int64_t i = 0; i < length; ++i) {
      TIDAL_RETURN_IF_ERROR(Step(s.line));
      const Value& item = items[static_cast<size_t>(i)];
      TIDAL_RETURN_IF_ERROR(Assign(s.targets, item, loop_scope, s.line));
      // Building the loop object is most of an iteration's cost where the body is short.
      if (s.uses_loop) {
        Dict loop;
        loop.items.reserve(12);
        loop.items.emplace_back("index", Value::Int(i + 1));
        loop.items.emplace_back("index0", Value::Int(i));
        loop.items.emplace_back("revindex", Value::Int(length - i));
        loop.items.emplace_back("revindex0", Value::Int(length - i - 1));
        loop.items.emplace_back("first", Value::Bool(i == 0));
        loop.items.emplace_back("last", Value::Bool(i == length - 1));
        loop.items.emplace_back("length", Value::Int(length));
        loop.items.emplace_back("depth", Value::Int(1));
        loop.items.emplace_back("depth0", Value::Int(0));
        loop.items.emplace_back("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                                                  : Value::Undefined("there is no previous item"));
        loop.items.emplace_back("nextitem", i + 1 < length
                                                ? items[static_cast<size_t>(i + 1)]
                                                : Value::Undefined("there is no next item"));
        *position = i;
        loop.items.emplace_back("cycle", cycle);
        loop_scope.vars["loop"] = Value::MakeNamespace(std::move(loop));
      }
      TIDAL_ASSIGN_OR_RETURN(Flow flow, ExecBody(s.body, loop_scope, out));
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value MakeMacro(const Stmt& s, const std::string& name, const Value* /*unused*/) {
    return Value::MakeFunction(name, [this, &s](const CallArgs& args) -> StatusOr<Value> {
      DepthGuard guard(depth_);
      if (depth_ > kMaxCallDepth) {
        return InvalidArgument("template line " + std::to_string(s.line) +
                               ": maximum recursion depth exceeded");
      }
      Scope frame{{}, root_};
      size_t used = 0;
      for (size_t i = 0; i < s.params.size(); ++i) {
        const auto& [param, fallback] = s.params[i];
        const Value* given = i < args.positional.size() ? &args.positional[i] : args.Keyword(param);
        if (i < args.positional.size()) ++used;
        if (given) {
          frame.vars[param] = *given;
        } else if (fallback) {
          TIDAL_ASSIGN_OR_RETURN(frame.vars[param], Eval(*fallback, frame));
        } else {
          frame.vars[param] = Value::Undefined("parameter '" + param + "' was not provided");
        }
      }
      Value::List varargs(args.positional.begin() + static_cast<std::ptrdiff_t>(used),
                          args.positional.end());
      frame.vars["varargs"] = Value::MakeTuple(std::move(varargs));
      Dict kwargs;
      for (const auto& [k, v] : args.keyword) {
        bool is_param = false;
        for (const auto& p : s.params) is_param = is_param || p.first == k;
        if (k == "caller") {
          frame.vars["caller"] = v;
        } else if (!is_param) {
          kwargs.Set(k, v);
        }
      }
      frame.vars["kwargs"] = Value::MakeDict(std::move(kwargs));
      std::string captured;
      TIDAL_ASSIGN_OR_RETURN(Flow flow, ExecBody(s.body, frame, captured));
      (void)flow;
      return Value::String(std::move(captured));
    });
  }

  Value Lookup(const std::string& name, Scope& scope) const {
    for (Scope* s = &scope; s != nullptr; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return it->second;
    }
    return Value::Undefined("'" + name + "' is undefined");
  }

  StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first, Scope& scope) {
    CallArgs args;
    for (size_t i = first; i < e.items.size(); ++i) {
      TIDAL_ASSIGN_OR_RETURN(Value v, Eval(*e.items[i], scope));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.keywords) {
      TIDAL_ASSIGN_OR_RETURN(Value v, Eval(*expr, scope));
      args.keyword.emplace_back(key, std::move(v));
    }
    return args;
  }

  // A filter node; `injected` is the value at the bottom of a chain without a base
  // ({% filter %}, {% set x | f %}).
  StatusOr<Value> EvalFilter(const Expr& e, Scope& scope, const Value* injected) {
    Value base;
    const Expr* inner = e.items[0].get();
    if (inner == nullptr) {
      base = injected ? *injected : Value();
    } else if (injected && inner->kind == Expr::Kind::kFilter) {
      TIDAL_ASSIGN_OR_RETURN(base, EvalFilter(*inner, scope, injected));
    } else {
      TIDAL_ASSIGN_OR_RETURN(base, Eval(*inner, scope));
    }
    TIDAL_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
    EVAL_OR_RETURN(Value v, ApplyFilter(e.name, base, args), e.line);
    return v;
  }

  StatusOr<Value> EvalCall(const Expr& e, Scope& scope, const Value* caller) {
    TIDAL_RETURN_IF_ERROR(Step(e.line));
    TIDAL_ASSIGN_OR_RETURN(Value callee, Eval(*e.items[0], scope));
    if (callee.is_undefined()) return At(e.line, UndefinedError(callee));
    if (callee.kind() != Value::Kind::kFunction) {
      return InvalidArgument("template line " + std::to_string(e.line) + ": '" + callee.TypeName() +
                             "' object is not callable");
    }
    TIDAL_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
    if (caller) args.keyword.emplace_back("caller", *caller);
    EVAL_OR_RETURN(Value v, callee.function()(args), e.line);
    return v;
  }

  StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
    auto fail = [&]() {
      return InvalidArgument("template line " + std::to_string(line) +
                             ": unsupported operand type(s) for " + op + ": '" + a.TypeName() +
                             "' and '" + b.TypeName() + "'");
    };
    if (a.is_undefined()) return At(line, UndefinedError(a));
    if (b.is_undefined()) return At(line, UndefinedError(b));
    if (a.is_number() && b.is_number()) {
      bool floating = a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat;
      int64_t x = a.integer(), y = b.integer(), r = 0;
      double fx = a.number(), fy = b.number();
      auto overflow = [&]() {
        return InvalidArgument("template line " + std::to_string(line) + ": integer overflow");
      };
      auto zero = [&]() {
        return InvalidArgument("template line " + std::to_string(line) + ": division by zero");
      };
      if (op == "+") {
        if (floating) return Value::Float(fx + fy);
        if (__builtin_add_overflow(x, y, &r)) return overflow();
        return Value::Int(r);
      }
      if (op == "-") {
        if (floating) return Value::Float(fx - fy);
        if (__builtin_sub_overflow(x, y, &r)) return overflow();
        return Value::Int(r);
      }
      if (op == "*") {
        if (floating) return Value::Float(fx * fy);
        if (__builtin_mul_overflow(x, y, &r)) return overflow();
        return Value::Int(r);
      }
      if (op == "/") {
        if (fy == 0) return zero();
        return Value::Float(fx / fy);
      }
      if (op == "//" || op == "%") {
        if (floating) {
          if (fy == 0) return zero();
          double q = std::floor(fx / fy);
          return op == "//" ? Value::Float(q) : Value::Float(fx - q * fy);
        }
        if (y == 0) return zero();
        if (x == INT64_MIN && y == -1) return overflow();
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return op == "//" ? Value::Int(q) : Value::Int(m);
      }
      if (op == "**") {
        if (!floating && y >= 0) {
          int64_t result = 1;
          for (int64_t i = 0; i < y; ++i) {
            if (__builtin_mul_overflow(result, x, &result)) return overflow();
            if (result == 0 || result == 1) break;
          }
          if (x == -1) result = (y % 2 == 0) ? 1 : -1;
          return Value::Int(result);
        }
        return Value::Float(std::pow(fx, fy));
      }
      return fail();
    }
    if (op == "+" && a.is_string() && b.is_string()) return Value::String(a.text() + b.text());
    if (op == "+" && a.is_list() && b.is_list()) {
      Value::List joined = a.list();
      joined.insert(joined.end(), b.list().begin(), b.list().end());
      return Value::MakeList(std::move(joined));
    }
    if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
      const Value& seq = (a.is_string() || a.is_list()) ? a : b;
      const Value& count = (a.is_string() || a.is_list()) ? b : a;
      if (count.kind() != Value::Kind::kInt && count.kind() != Value::Kind::kBool) return fail();
      int64_t n = std::max<int64_t>(0, count.integer());
      size_t unit = seq.is_string() ? seq.text().size() : seq.list().size();
      if (unit != 0 && static_cast<uint64_t>(n) > kMaxSequenceLength * 64 / unit) {
        return InvalidArgument("template line " + std::to_string(line) +
                               ": repetition result too large");
      }
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.text();
        return Value::String(std::move(out));
      }
      Value::List out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
      return Value::MakeList(std::move(out));
    }
    if (op == "%" && a.is_string()) {
      CallArgs args;
      if (b.is_list()) {
        args.positional = b.list();
      } else {
        args.positional.push_back(b);
      }
      EVAL_OR_RETURN(Value v, ApplyFilter("format", a, args), line);
      return v;
    }
    return fail();
  }

  StatusOr<Value> Eval(const Expr& e, Scope& scope) {
    DepthGuard guard(depth_);
    if (depth_ > kMaxCallDepth * 4) {
      return InvalidArgument("template line " + std::to_string(e.line) +
                             ": maximum recursion depth exceeded");
    }
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name, scope);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Value::List items;
        for (const auto& item : e.items) {
          TIDAL_ASSIGN_OR_RETURN(Value v, Eval(*item, scope));
          items.push_back(std::move(v));
        }
        if (e.kind == Expr::Kind::kTuple) return Value::MakeTuple(std::move(items));
        return Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          TIDAL_ASSIGN_OR_RETURN(Value key, Eval(*e.items[i], scope));
          TIDAL_ASSIGN_OR_RETURN(Value value, Eval(*e.items[i + 1], scope));
          dict.Set(key.is_string() ? key.text() : ToStr(key), std::move(value));
        }
        return Value::MakeDict(std::move(dict));
      }
      case Expr::Kind::kGetAttr: {
        TIDAL_ASSIGN_OR_RETURN(Value obj, Eval(*e.items[0], scope));
        EVAL_OR_RETURN(Value v, GetAttribute(obj, e.name), e.line);
        return v;
      }
      case Expr::Kind::kGetItem: {
        TIDAL_ASSIGN_OR_RETURN(Value obj, Eval(*e.items[0], scope));
        TIDAL_ASSIGN_OR_RETURN(Value key, Eval(*e.items[1], scope));
        EVAL_OR_RETURN(Value v, GetItem(obj, key), e.line);
        return v;
      }
      case Expr::Kind::kSlice: {
        TIDAL_ASSIGN_OR_RETURN(Value obj, Eval(*e.items[0], scope));
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.items[static_cast<size_t>(i) + 1]) {
            TIDAL_ASSIGN_OR_RETURN(parts[i], Eval(*e.items[static_cast<size_t>(i) + 1], scope));
          }
        }
        EVAL_OR_RETURN(Value v, GetSlice(obj, parts[0], parts[1], parts[2]), e.line);
        return v;
      }
      case Expr::Kind::kCall:
        return EvalCall(e, scope, nullptr);
      case Expr::Kind::kFilter:
        return EvalFilter(e, scope, nullptr);
      case Expr::Kind::kTest: {
        TIDAL_ASSIGN_OR_RETURN(Value base, Eval(*e.items[0], scope));
        TIDAL_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1, scope));
        EVAL_OR_RETURN(bool pass, ApplyTest(e.name, base, args), e.line);
        return Value::Bool(pass != e.negated);
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        TIDAL_ASSIGN_OR_RETURN(Value v, Eval(*e.items[0], scope));
        if (v.is_undefined()) return At(e.line, UndefinedError(v));
        if (!v.is_number()) {
          return InvalidArgument(
              "template line " + std::to_string(e.line) + ": bad operand type for unary " +
              (e.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" + v.TypeName() + "'");
        }
        if (e.kind == Expr::Kind::kPos) {
          return v.kind() == Value::Kind::kBool ? Value::Int(v.integer()) : v;
        }
        if (v.kind() == Value::Kind::kFloat) return Value::Float(-v.number());
        if (v.integer() == INT64_MIN) {
          return InvalidArgument("template line " + std::to_string(e.line) + ": integer overflow");
        }
        return Value::Int(-v.integer());
      }
      case Expr::Kind::kNot: {
        TIDAL_ASSIGN_OR_RETURN(Value v, Eval(*e.items[0], scope));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kBinary: {
        TIDAL_ASSIGN_OR_RETURN(Value a, Eval(*e.items[0], scope));
        if (e.name == "and") return a.Truthy() ? Eval(*e.items[1], scope) : StatusOr<Value>(a);
        if (e.name == "or") return a.Truthy() ? StatusOr<Value>(a) : Eval(*e.items[1], scope);
        TIDAL_ASSIGN_OR_RETURN(Value b, Eval(*e.items[1], scope));
        if (e.name == "~") return Value::String(ToStr(a) + ToStr(b));
        return Arithmetic(e.name, a, b, e.line);
      }
      case Expr::Kind::kCompare: {
        TIDAL_ASSIGN_OR_RETURN(Value left, Eval(*e.items[0], scope));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          TIDAL_ASSIGN_OR_RETURN(Value right, Eval(*e.items[i + 1], scope));
          const std::string& op = e.ops[i];
          bool pass;
          if (op == "==") {
            pass = Equal(left, right);
          } else if (op == "!=") {
            pass = !Equal(left, right);
          } else if (op == "in" || op == "notin") {
            EVAL_OR_RETURN(bool hit, Contains(right, left), e.line);
            pass = (op == "in") == hit;
          } else {
            if (left.is_undefined()) return At(e.line, UndefinedError(left));
            if (right.is_undefined()) return At(e.line, UndefinedError(right));
            EVAL_OR_RETURN(int c, Compare(left, right), e.line);
            pass = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!pass) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCondition: {
        TIDAL_ASSIGN_OR_RETURN(Value test, Eval(*e.items[0], scope));
        if (test.Truthy()) return Eval(*e.items[1], scope);
        if (e.items[2]) return Eval(*e.items[2], scope);
        return Value::Undefined("the inline if-expression evaluated to false and no else section");
      }
    }
    return Value();
  }

  const ParsedTemplate& parsed_;
  const RenderLimits limits_;
  Scope* root_ = nullptr;
  std::string* root_out_ = nullptr;
  std::vector<std::pair<size_t, size_t>> spans_;
  int depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

StatusOr<Template> Template::Parse(std::string_view source) {
  TIDAL_ASSIGN_OR_RETURN(auto parsed, ParseTemplate(source));
  return Template(std::make_shared<const ParsedTemplate>(std::move(parsed)));
}

StatusOr<RenderResult> Template::RenderWithSpans(const Dict& context,
                                                 const RenderLimits& limits) const {
  return Renderer(*parsed_, limits).Run(context);
}

StatusOr<std::string> Template::Render(const nlohmann::json& context) const {
  if (!context.is_object()) return InvalidArgument("template context must be a JSON object");
  Value v = FromJson(context);
  TIDAL_ASSIGN_OR_RETURN(auto result, RenderWithSpans(v.dict()));
  return std::move(result.text);
}

StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return InvalidArgument("template context must be a JSON object");
  Value v = FromJson(context);
  TIDAL_ASSIGN_OR_RETURN(auto result, RenderWithSpans(v.dict()));
  return std::move(result.text);
}

bool Template::has_generation_blocks() const { return parsed_->has_generation; }

}  // namespace tidal::data::jinja
