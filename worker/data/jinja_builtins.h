// worker/data/jinja_builtins.h — what Jinja2's environment provides to a chat template:
// attribute and item lookup (environment.getattr / getitem, with the immutable sandbox's refusal of
// mutating methods), the str/dict/list methods templates call, filters, tests and globals
// (range, namespace, dict, raise_exception, strftime_now). Pure functions of their arguments.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "worker/data/jinja_value.h"

namespace tidal::data::jinja {

// Bounds on what one render may build (the template is untrusted input).
inline constexpr size_t kMaxSequenceLength = 1'000'000;  // range(), repetition, list results

// obj.name: for dicts a method of that name wins over the key (as Python's getattr first).
StatusOr<Value> GetAttribute(const Value& obj, const std::string& name);
// obj[key]: for dicts the key wins, then a method; lists and strings index by code point.
StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] with Python's slice rules (null parts are Undefined values).
StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                         const Value& step);
// The items a for loop or a filter iterates: list items, dict keys, string characters; an
// Undefined iterates as empty.
StatusOr<Value::List> Iterate(const Value& value);
// Python's `item in container`.
StatusOr<bool> Contains(const Value& container, const Value& item);
// Errors for operations on an Undefined: its message ("'x' is undefined").
Status UndefinedError(const Value& undefined);

StatusOr<Value> ApplyFilter(std::string_view name, const Value& value, const CallArgs& args);
StatusOr<bool> ApplyTest(std::string_view name, const Value& value, const CallArgs& args);

// The globals transformers' environment has: range, namespace, dict, raise_exception,
// strftime_now.
Dict GlobalFunctions();

}  // namespace tidal::data::jinja
