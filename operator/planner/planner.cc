// operator/planner/planner.cc
#include "operator/planner/planner.h"

#include <date/tz.h>

#include <algorithm>

namespace tidal::planner {
namespace {

using std::chrono::minutes;

bool DayMatches(const api::CronExpr& c, unsigned day, unsigned weekday) {
  if (c.days_restricted && c.weekdays_restricted) return c.days[day] || c.weekdays[weekday];
  return c.days[day] && c.weekdays[weekday];
}

// The instant a local wall-clock minute in `zone` denotes: in a spring-forward gap, when the
// gap ends; in a repeated hour, its first occurrence.
Clock::time_point InstantOf(const date::time_zone& zone, date::local_time<minutes> t) {
  const date::local_info info = zone.get_info(date::local_seconds(t));
  if (info.result == date::local_info::nonexistent) return info.second.begin;
  return date::sys_seconds(t.time_since_epoch() - info.first.offset);
}

}  // namespace

std::optional<Clock::time_point> LastOccurrence(const api::CronExpr& cron, const std::string& tz,
                                                Clock::time_point now) {
  const date::time_zone* zone = date::locate_zone(tz);  // validated with the spec
  const auto now_minute = date::floor<minutes>(now);
  date::local_time<minutes> t = date::floor<minutes>(zone->to_local(now_minute));
  const date::local_time<minutes> limit = t - date::days(400);
  while (t >= limit) {
    const auto day = date::floor<date::days>(t);
    const date::year_month_day ymd{day};
    const unsigned month = static_cast<unsigned>(ymd.month());
    if (!cron.months[month]) {  // to the last minute of the previous month
      t = date::local_days(ymd.year() / ymd.month() / 1) - minutes(1);
      continue;
    }
    if (!DayMatches(cron, static_cast<unsigned>(ymd.day()), date::weekday(day).c_encoding())) {
      t = day - minutes(1);
      continue;
    }
    const auto since_midnight = t - day;
    const int hour = static_cast<int>(since_midnight.count() / 60);
    const int minute = static_cast<int>(since_midnight.count() % 60);
    if (!cron.hours[hour]) {
      t = day + std::chrono::hours(hour) - minutes(1);
      continue;
    }
    if (!cron.minutes[minute]) {
      t -= minutes(1);
      continue;
    }
    // A matching wall-clock minute: the instant it denotes.
    const Clock::time_point at = InstantOf(*zone, t);
    if (at <= now) return at;
    t -= minutes(1);
  }
  return std::nullopt;
}

std::optional<Clock::time_point> NextOccurrence(const api::CronExpr& cron, const std::string& tz,
                                                Clock::time_point now) {
  const date::time_zone* zone = date::locate_zone(tz);  // validated with the spec
  const auto now_minute = date::floor<minutes>(now);
  date::local_time<minutes> t = date::floor<minutes>(zone->to_local(now_minute)) + minutes(1);
  const date::local_time<minutes> limit = t + date::days(400);
  while (t <= limit) {
    const auto day = date::floor<date::days>(t);
    const date::year_month_day ymd{day};
    const unsigned month = static_cast<unsigned>(ymd.month());
    if (!cron.months[month]) {  // to the first minute of the next month
      const date::year_month next = date::year_month{ymd.year(), ymd.month()} + date::months(1);
      t = date::local_days(next / 1);
      continue;
    }
    if (!DayMatches(cron, static_cast<unsigned>(ymd.day()), date::weekday(day).c_encoding())) {
      t = day + date::days(1);
      continue;
    }
    const auto since_midnight = t - day;
    const int hour = static_cast<int>(since_midnight.count() / 60);
    const int minute = static_cast<int>(since_midnight.count() % 60);
    if (!cron.hours[hour]) {
      t = day + std::chrono::hours(hour + 1);
      continue;
    }
    if (!cron.minutes[minute]) {
      t += minutes(1);
      continue;
    }
    const Clock::time_point at = InstantOf(*zone, t);
    if (at > now) return at;
    t += minutes(1);
  }
  return std::nullopt;
}

bool WindowOpen(const api::ScheduleWindow& window, const std::string& tz, Clock::time_point now) {
  const auto start = LastOccurrence(window.start_cron, tz, now);
  if (!start) return false;
  const auto end = LastOccurrence(window.end_cron, tz, now);
  return !end || *start > *end;
}

namespace {

// The count the job's override or open window asks for, in its range; `reason` says which rule.
int64_t Target(const api::TrainingJobSpec& spec, Clock::time_point now, std::string& reason,
               bool& manual) {
  const api::ElasticSpec& e = spec.elastic;
  int64_t target = e.min_gpus;
  manual = false;
  if (spec.replicas) {
    target = *spec.replicas;
    manual = true;
    reason = "manual override (spec.replicas " + std::to_string(*spec.replicas) + ")";
  } else {
    const api::ScheduleWindow* best = nullptr;
    for (const api::ScheduleWindow& w : e.schedule)
      if (WindowOpen(w, e.time_zone, now) && (!best || w.gpus > best->gpus)) best = &w;
    if (best) {
      target = best->gpus;
      reason = "schedule window " + best->name;
    } else {
      reason = e.schedule.empty() ? "minGPUs (no schedule)" : "minGPUs (outside every window)";
    }
  }
  return std::clamp(target, e.min_gpus, e.max_gpus);
}

// The largest count the job can run at, at or below `limit` (never below minGPUs).
int64_t Runnable(const api::TrainingJobSpec& spec, const std::vector<int64_t>& allowed,
                 int64_t limit) {
  int64_t best = spec.elastic.min_gpus;
  for (int64_t n : allowed)
    if (n <= limit) best = std::max(best, n);
  return best;
}

}  // namespace

int64_t WantedGpus(const api::TrainingJobSpec& spec, Clock::time_point now) {
  std::string reason;
  bool manual = false;
  return Runnable(spec, spec.AllowedGpuCounts(), Target(spec, now, reason, manual));
}

Decision DesiredGpus(const api::TrainingJobSpec& spec, const JobState& state,
                     const Capacity& capacity, Clock::time_point now) {
  const api::ElasticSpec& e = spec.elastic;
  Decision d;
  bool manual = false;
  int64_t target = Target(spec, now, d.reason, manual);
  if (!manual) {
    auto sooner = [&d](std::optional<Clock::time_point> t) {
      if (t && (!d.revisit || *t < *d.revisit)) d.revisit = t;
    };
    for (const api::ScheduleWindow& w : e.schedule) {
      sooner(NextOccurrence(w.start_cron, e.time_zone, now));
      sooner(NextOccurrence(w.end_cron, e.time_zone, now));
    }
  }
  const std::vector<int64_t> allowed = spec.AllowedGpuCounts();
  auto runnable = [&](int64_t limit) { return Runnable(spec, allowed, limit); };
  d.wanted = runnable(target);

  // The cluster's share (share.h): a job not admitted waits; one above its share comes down to
  // it, and grows no further than it where it waits for idle GPUs.
  const Share* share = capacity.share ? &*capacity.share : nullptr;
  if (share && !share->admitted && state.current_gpus == 0) {
    d.desired = 0;
    d.waiting = true;
    d.reason = share->reason;
    return d;
  }
  if (share && share->admitted && (share->shared || share->urgent) && share->gpus < target &&
      (e.require_idle_capacity || share->gpus < state.current_gpus)) {
    target = std::max(share->gpus, e.min_gpus);
    d.reason += "; " + share->reason;
  }

  int64_t gated = target;
  if (e.require_idle_capacity && target > state.current_gpus) {
    const int64_t reachable = state.current_gpus + std::max<int64_t>(capacity.idle_gpus, 0);
    if (reachable < target) {
      gated = reachable;
      d.capacity_limited = true;
      d.reason += "; capacity: " + std::to_string(capacity.idle_gpus) + " idle GPUs, " +
                  std::to_string(target) + " wanted";
    }
  }
  d.desired = runnable(gated);
  if (d.desired != gated && gated >= e.min_gpus && gated == target)
    d.reason += "; " + std::to_string(target) + " rounded down to " + std::to_string(d.desired) +
                " (gpusPerPod and the global batch)";

  // A shrink that a stronger claim waits for (share.h's urgent) does not wait for the cooldown.
  const bool urgent = share && share->urgent && d.desired < state.current_gpus;
  if (!manual && !urgent && state.current_gpus > 0 && d.desired != state.current_gpus &&
      state.last_change) {
    const auto since = std::chrono::duration_cast<std::chrono::seconds>(now - *state.last_change);
    if (since.count() < e.cooldown_seconds) {
      d.reason = "cooldown: " + std::to_string(d.desired) + " wanted (" + d.reason +
                 "), last change " + std::to_string(since.count()) + "s ago, cooldownSeconds " +
                 std::to_string(e.cooldown_seconds);
      d.desired = state.current_gpus;
      const Clock::time_point over = *state.last_change + std::chrono::seconds(e.cooldown_seconds);
      if (!d.revisit || over < *d.revisit) d.revisit = over;
    }
  }
  return d;
}

}  // namespace tidal::planner
