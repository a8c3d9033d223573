// api/cron.cc
#include "api/cron.h"

#include <charconv>
#include <sstream>
#include <vector>

#include "common/strings.h"

namespace tidal::api {
namespace {

struct Field {
  const char* name;
  int min, max;
  const char* const* names;  // for months and weekdays: names[i] is the value min + i
};

constexpr const char* kMonths[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                   "jul", "aug", "sep", "oct", "nov", "dec"};
constexpr const char* kWeekdays[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};

StatusOr<int> Value(const Field& f, const std::string& text, int max) {
  if (f.names) {
    const std::string lower = AsciiLower(text);
    for (int i = 0; i <= f.max - f.min; ++i)
      if (lower == f.names[i]) return f.min + i;
  }
  int v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < f.min || v > max)
    return InvalidArgument(std::string(f.name) + " \"" + text + "\": expected " +
                           std::to_string(f.min) + "-" + std::to_string(max) +
                           (f.names ? " or a name" : ""));
  return v;
}

// Sets the bits of one field ("*/15", "1-5", "mon,wed", ...); `max` allows 7 for Sunday.
template <size_t N>
Status ParseField(const Field& f, const std::string& text, std::bitset<N>& bits, bool& restricted,
                  int max) {
  restricted = text != "*";
  std::stringstream items(text);
  std::string item;
  bool any = false;
  while (std::getline(items, item, ',')) {
    any = true;
    int step = 1;
    const bool stepped = item.find('/') != std::string::npos;
    if (auto slash = item.find('/'); slash != std::string::npos) {
      const std::string s = item.substr(slash + 1);
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), step);
      if (s.empty() || ec != std::errc() || end != s.data() + s.size() || step < 1)
        return InvalidArgument(std::string(f.name) + " \"" + item +
                               "\": expected a positive step after /");
      item = item.substr(0, slash);
    }
    int lo = f.min, hi = f.max;
    if (item != "*") {
      auto dash = item.find('-');
      TIDAL_ASSIGN_OR_RETURN(lo, Value(f, item.substr(0, dash), max));
      hi = lo;
      if (dash != std::string::npos) {
        TIDAL_ASSIGN_OR_RETURN(hi, Value(f, item.substr(dash + 1), max));
        if (hi < lo)
          return InvalidArgument(std::string(f.name) + " \"" + item + "\": range runs backwards");
      } else if (stepped) {
        hi = f.max;  // "a/n": from a to the end, as cron reads it
      }
    }
    for (int v = lo; v <= hi; v += step) bits.set(static_cast<size_t>(v % (f.max + 1)));
  }
  if (!any) return InvalidArgument(std::string(f.name) + ": empty");
  return OkStatus();
}

}  // namespace

bool CronExpr::Matches(int minute, int hour, int day, int month, int weekday) const {
  if (!minutes[minute] || !hours[hour] || !months[month]) return false;
  if (days_restricted && weekdays_restricted) return days[day] || weekdays[weekday];
  return days[day] && weekdays[weekday];
}

StatusOr<CronExpr> ParseCron(const std::string& text) {
  std::stringstream in(text);
  std::vector<std::string> fields;
  for (std::string f; in >> f;) fields.push_back(f);
  if (fields.size() != 5)
    return InvalidArgument("expected 5 fields (minute hour day month weekday), got " +
                           std::to_string(fields.size()));
  CronExpr c;
  bool unused = false;
  TIDAL_RETURN_IF_ERROR(ParseField({"minute", 0, 59, nullptr}, fields[0], c.minutes, unused, 59));
  TIDAL_RETURN_IF_ERROR(ParseField({"hour", 0, 23, nullptr}, fields[1], c.hours, unused, 23));
  TIDAL_RETURN_IF_ERROR(
      ParseField({"day", 1, 31, nullptr}, fields[2], c.days, c.days_restricted, 31));
  TIDAL_RETURN_IF_ERROR(ParseField({"month", 1, 12, kMonths}, fields[3], c.months, unused, 12));
  // Weekdays 0-7: 7 is Sunday again (folded by the modulo in ParseField).
  TIDAL_RETURN_IF_ERROR(
      ParseField({"weekday", 0, 6, kWeekdays}, fields[4], c.weekdays, c.weekdays_restricted, 7));
  return c;
}

}  // namespace tidal::api
