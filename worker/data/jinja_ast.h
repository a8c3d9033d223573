// worker/data/jinja_ast.h — the syntax tree the parser builds and the evaluator walks. Plain data:
// one node type for expressions and one for statements, each with its source line for errors.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/data/jinja_value.h"

namespace tidal::data::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // items
    kTuple,      // items (evaluates to a list)
    kDict,       // items: key, value, key, value, ...
    kGetAttr,    // items[0] . name
    kGetItem,    // items[0] [ items[1] ]
    kSlice,      // items[0] [ items[1] : items[2] : items[3] ] (null parts absent)
    kCall,       // items[0] ( items[1..] , keywords )
    kFilter,     // items[0] | name ( items[1..], keywords ); items[0] null in {% filter %}
    kTest,       // items[0] is [not] name ( items[1..], keywords )
    kNeg,        // - items[0]
    kPos,        // + items[0]
    kNot,        // not items[0]
    kBinary,     // items[0] op items[1]: + - * / // % ** ~ and or
    kCompare,    // items[0] ops[i] items[i+1] ...
    kCondition,  // items[1] if items[0] else items[2] (items[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // name, attribute, filter/test name, binary operator
  bool negated = false;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;  // comparison operators: == != < <= > >= in notin
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conditions[i] -> bodies[i]; else_body
    kFor,          // targets in expr [if condition]: body; else_body
    kSet,          // targets (or target.attribute) = expr
    kSetBlock,     // {% set target %}body{% endset %} (expr: optional filter chain)
    kMacro,        // name(params = defaults): body
    kCallBlock,    // {% call expr %}body{% endcall %}: body is caller()
    kFilterBlock,  // {% filter f %}body{% endfilter %}: expr is the filter chain
    kBreak,
    kContinue,
    kGeneration,  // {% generation %}body{% endgeneration %} (transformers' AssistantTracker)
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attribute;  // for {% set ns.attribute = ... %}
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
  // kFor: whether the body mentions `loop`. When it does not, no loop object is built per
  // iteration (as Jinja2's compiler decides from the body's names).
  bool uses_loop = true;
};

}  // namespace tidal::data::jinja
