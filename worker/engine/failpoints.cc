// worker/engine/failpoints.cc
#include "worker/engine/failpoints.h"

#include <cstdlib>
#include <stdexcept>

#include "common/environment.h"

namespace tidal::engine {
namespace {

constexpr std::string_view kPrefix = "TIDAL_TEST_";

const FailpointInfo* Find(std::string_view name) {
  for (const FailpointInfo& f : kFailpoints)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace

StatusOr<Failpoints> Failpoints::From(const std::map<std::string, std::string>& environment) {
  Failpoints out;
  for (auto it = environment.lower_bound(std::string(kPrefix));
       it != environment.end() && it->first.starts_with(kPrefix); ++it) {
    if (!Find(it->first)) {
      std::string known;
      for (const FailpointInfo& f : kFailpoints)
        known += std::string(known.empty() ? "" : ", ") + f.name;
      return InvalidArgument(it->first + ": no such test hook (the worker knows " + known + ")");
    }
    if (!it->second.empty()) out.set_.emplace(it->first, it->second);
  }
  return out;
}

StatusOr<Failpoints> Failpoints::FromProcess() { return From(EnvironmentMap()); }

std::string Failpoints::Get(std::string_view name) const {
  if (!Find(name))
    throw std::logic_error("Failpoints::Get: " + std::string(name) + " is not in kFailpoints");
  auto it = set_.find(name);
  return it == set_.end() ? "" : it->second;
}

}  // namespace tidal::engine
