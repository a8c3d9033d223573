// Schedule-window cron expressions (api/cron.h) and the planner's search for their
// last occurrence (operator/planner/planner.h): a user writes them, and the operator evaluates
// them on every reconcile. Fields: expression, time-zone index, seconds since 2020.
#include <chrono>
#include <string>

#include "api/cron.h"
#include "fuzz/fuzz_input.h"
#include "operator/planner/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tidal;
  const auto fields = fuzz::Fields(data, size, 3);
  auto cron = api::ParseCron(fields[0]);
  if (!cron.ok()) return 0;
  static const char* const kZones[] = {"UTC", "Europe/Berlin", "America/New_York",
                                       "Australia/Lord_Howe", "Asia/Kathmandu"};
  const std::string tz = kZones[fields[1].empty() ? 0 : static_cast<uint8_t>(fields[1][0]) % 5];
  int64_t offset = 0;
  for (char c : fields[2].substr(0, 4)) offset = offset * 256 + static_cast<uint8_t>(c);
  const auto now = std::chrono::system_clock::time_point(std::chrono::seconds(1577836800)) +
                   std::chrono::seconds(offset % (20LL * 365 * 86400));
  auto last = planner::LastOccurrence(*cron, tz, now);
  if (last && *last > now) fuzz::Violated("cron", "the last occurrence is after now");
  api::ScheduleWindow window{"w", fields[0], fields[0], *cron, *cron, 1};
  (void)planner::WindowOpen(window, tz, now);
  return 0;
}
