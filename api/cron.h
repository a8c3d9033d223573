// api/cron.h — the five-field cron expressions of a TrainingJob's schedule windows
// (minute hour day-of-month month day-of-week), as cron(8) reads them: `*`, numbers, ranges
// `a-b`, steps `*/n` and `a-b/n`, lists `a,b`, month and day names (jan, mon), 7 for Sunday,
// and the day rule of Vixie cron (when both day fields are restricted, either may match).
#pragma once

#include <bitset>
#include <string>

#include "common/status.h"

namespace tidal::api {

struct CronExpr {
  std::bitset<60> minutes;
  std::bitset<24> hours;
  std::bitset<32> days;     // 1..31
  std::bitset<13> months;   // 1..12
  std::bitset<7> weekdays;  // 0 = Sunday
  bool days_restricted = false, weekdays_restricted = false;

  // Whether a local wall-clock minute matches (weekday 0 = Sunday).
  bool Matches(int minute, int hour, int day, int month, int weekday) const;
};

// Errors name the field and say what was expected, e.g.
// `hour "25": expected 0-23` or `expected 5 fields (minute hour day month weekday), got 4`.
StatusOr<CronExpr> ParseCron(const std::string& text);

}  // namespace tidal::api
