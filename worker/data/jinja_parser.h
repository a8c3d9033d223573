// worker/data/jinja_parser.h — Jinja2 source text to a syntax tree, with the lexer settings
// transformers uses for chat templates (trim_blocks, lstrip_blocks, loopcontrols, the
// {% generation %} tag). Pure: no evaluation here.
#pragma once

#include <string_view>

#include "common/status.h"
#include "worker/data/jinja_ast.h"

namespace tidal::data::jinja {

struct ParsedTemplate {
  Body body;
  bool has_generation = false;
};

// Errors name the line: "template line 3: unexpected 'endfor'".
StatusOr<ParsedTemplate> ParseTemplate(std::string_view source);

// Whether a filter / test of that name exists (checked while parsing, as Jinja2 does when it
// compiles a template). Defined by the evaluator's builtins.
bool HasFilter(std::string_view name);
bool HasTest(std::string_view name);

}  // namespace tidal::data::jinja
