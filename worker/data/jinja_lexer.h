// worker/data/jinja_lexer.h — splits template source into tokens as Jinja2's lexer does with
// trim_blocks=True and lstrip_blocks=True: text between tags (already whitespace-controlled),
// tag delimiters, and the names, literals and operators inside tags.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tidal::data::jinja {

struct Token {
  enum class Type {
    kData,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type;
  std::string value;  // data text, name, decoded string literal, number text, operator
  int line = 1;
};

StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace tidal::data::jinja
