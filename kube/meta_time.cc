// kube/meta_time.cc
#include "kube/meta_time.h"

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <ctime>

namespace tidal::kube {
namespace {

// "2006-01-02T15:04:05" + suffix, from microseconds since the epoch (floor, also before 1970).
std::string Format(int64_t micros, bool with_fraction) {
  std::time_t secs =
      static_cast<std::time_t>(micros >= 0 ? micros / 1000000 : (micros - 999999) / 1000000);
  int64_t frac = micros - static_cast<int64_t>(secs) * 1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  int n = std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900,
                        tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  if (with_fraction)
    std::snprintf(buf + n, sizeof(buf) - n, ".%06lld", static_cast<long long>(frac));
  return std::string(buf) + "Z";
}

int64_t Micros(Clock::WallTime t) {
  return std::chrono::floor<std::chrono::microseconds>(t).time_since_epoch().count();
}

}  // namespace

std::string FormatTime(Clock::WallTime t) { return Format(Micros(t), false); }

std::string FormatMicroTime(Clock::WallTime t) { return Format(Micros(t), true); }

StatusOr<Clock::WallTime> ParseRfc3339(const std::string& text) {
  std::tm tm{};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
                  &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &consumed) != 6 ||
      consumed != 19)
    return InvalidArgument("time \"" + text + "\": expected RFC 3339 (2006-01-02T15:04:05Z)");
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  size_t pos = 19;
  int64_t micros = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int digits = 0;
    while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
      if (digits < 6) micros = micros * 10 + (text[pos] - '0');
      ++digits, ++pos;
    }
    if (digits == 0) return InvalidArgument("time \"" + text + "\": empty fraction");
    for (int d = digits; d < 6; ++d) micros *= 10;
  }
  int offset_minutes = 0;
  std::string zone = text.substr(pos);
  if (zone != "Z" && zone != "z") {
    if (zone.size() != 6 || (zone[0] != '+' && zone[0] != '-') || zone[3] != ':')
      return InvalidArgument("time \"" + text + "\": expected Z or ±hh:mm after the time");
    int h = 0, m = 0;
    if (std::sscanf(zone.c_str() + 1, "%2d:%2d", &h, &m) != 2)
      return InvalidArgument("time \"" + text + "\": bad zone offset");
    offset_minutes = (zone[0] == '-' ? -1 : 1) * (h * 60 + m);
  }
  std::time_t secs = timegm(&tm);
  return Clock::WallTime(std::chrono::duration_cast<Clock::WallTime::duration>(
      std::chrono::seconds(secs - offset_minutes * 60) + std::chrono::microseconds(micros)));
}

}  // namespace tidal::kube
