// kube/meta_time.h — the API's timestamp formats (k8s.io/apimachinery metav1):
// metav1.Time is RFC 3339 in UTC to the second ("2006-01-02T15:04:05Z": creationTimestamp,
// an Event's lastTimestamp), metav1.MicroTime to the microsecond
// ("2006-01-02T15:04:05.000000Z": a Lease's renewTime). Pure.
#pragma once

#include <string>

#include "common/clock.h"
#include "common/status.h"

namespace tidal::kube {

std::string FormatTime(Clock::WallTime t);       // truncated to the second
std::string FormatMicroTime(Clock::WallTime t);  // truncated to the microsecond
// RFC 3339 with or without a fraction (up to microseconds are kept), Z or ±hh:mm.
StatusOr<Clock::WallTime> ParseRfc3339(const std::string& text);

}  // namespace tidal::kube
