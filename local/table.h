// local/table.h — server-side printing (meta.k8s.io/v1 Table), which kubectl asks for
// on every human-readable `get`: CRD additionalPrinterColumns, the usual columns of pods,
// nodes, namespaces and deployments, Name/Age otherwise. Pure: `now` is a parameter.
#pragma once

#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "local/registry.h"

namespace tidal::local {

// As k8s.io/apimachinery/pkg/util/duration.HumanDuration: 45s, 3m10s, 2h5m, 3d4h, 400d.
std::string HumanDuration(int64_t seconds);

nlohmann::json ToTable(const ResourceInfo& r, const std::vector<nlohmann::json>& objects,
                       bool with_column_definitions, const std::string& resource_version,
                       std::time_t now);

// True when an Accept header asks for a Table (as=Table;g=meta.k8s.io).
bool WantsTable(const std::string& accept);

}  // namespace tidal::local
