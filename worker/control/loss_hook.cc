#include "worker/control/loss_hook.h"

#include <cmath>
#include <cstdlib>
#include <vector>

namespace tidal::worker {
namespace {

constexpr const char* kExpected =
    "TIDAL_TEST_LOSS_HOOK: expected \"rise:STEP:FACTOR\" (STEP >= 1, FACTOR > 0) or "
    "\"noise:AMPLITUDE\" (0 < AMPLITUDE < 1), got \"";

bool ParseDouble(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(*out);
}

std::vector<std::string> SplitColons(const std::string& text) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == ':')
      parts.emplace_back();
    else
      parts.back() += c;
  }
  return parts;
}

}  // namespace

double LossHook::Apply(int64_t step, double loss) {
  switch (kind) {
    case Kind::kNone:
      return loss;
    case Kind::kRise:
      return step < from_step ? loss
                              : loss * std::pow(factor, static_cast<double>(step - from_step + 1));
    case Kind::kNoise:
      mean_ = mean_ ? 0.9 * *mean_ + 0.1 * loss : loss;
      return *mean_ * (step % 2 != 0 ? 1 + factor : 1 - factor);
  }
  return loss;
}

StatusOr<LossHook> ParseLossHook(const std::string& text) {
  LossHook hook;
  if (text.empty()) return hook;
  const std::vector<std::string> parts = SplitColons(text);
  auto invalid = [&] { return InvalidArgument(kExpected + text + "\""); };
  if (parts[0] == "rise" && parts.size() == 3) {
    double step = 0;
    if (!ParseDouble(parts[1], &step) || step < 1 || step != std::floor(step) ||
        !ParseDouble(parts[2], &hook.factor) || !(hook.factor > 0))
      return invalid();
    hook.kind = LossHook::Kind::kRise;
    hook.from_step = static_cast<int64_t>(step);
    return hook;
  }
  if (parts[0] == "noise" && parts.size() == 2) {
    if (!ParseDouble(parts[1], &hook.factor) || !(hook.factor > 0 && hook.factor < 1))
      return invalid();
    hook.kind = LossHook::Kind::kNoise;
    return hook;
  }
  return invalid();
}

}  // namespace tidal::worker
