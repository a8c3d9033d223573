// local/table.cc
#include "local/table.h"

#include <functional>

#include "common/strings.h"
#include "local/selectors.h"

namespace tidal::local {
namespace {

using nlohmann::json;

std::time_t ParseRfc3339(const std::string& text) {
  std::tm tm{};
  if (!strptime(text.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm)) return 0;
  return timegm(&tm);
}

std::string Age(const json& object, std::time_t now) {
  std::string created = object["metadata"].value("creationTimestamp", "");
  if (created.empty()) return "<unknown>";
  return HumanDuration(static_cast<int64_t>(now - ParseRfc3339(created)));
}

struct Column {
  json definition;
  std::function<json(const json&)> cell;
};

json Definition(const std::string& name, const std::string& type, const std::string& description,
                int priority = 0, const std::string& format = "") {
  return {{"name", name},
          {"type", type},
          {"format", format},
          {"description", description},
          {"priority", priority}};
}

std::vector<Column> ColumnsFor(const ResourceInfo& r, std::time_t now) {
  std::vector<Column> cols;
  cols.push_back(
      {Definition("Name", "string", "Name must be unique within a namespace.", 0, "name"),
       [](const json& o) { return json(o["metadata"].value("name", "")); }});
  auto age =
      Column{Definition("Age", "date", "CreationTimestamp is the time the object was created."),
             [now](const json& o) { return json(Age(o, now)); }};
  if (r.custom) {
    for (const auto& p : r.printer_columns) {
      cols.push_back({Definition(p.name, p.type.empty() ? "string" : p.type, p.description,
                                 p.priority, p.format),
                      [p, now](const json& o) -> json {
                        auto v = EvalJsonPath(o, p.json_path);
                        if (!v) return json();
                        if (p.type == "date" && v->is_string()) {
                          return HumanDuration(
                              static_cast<int64_t>(now - ParseRfc3339(v->get<std::string>())));
                        }
                        return *v;
                      }});
    }
    if (r.printer_columns.empty()) cols.push_back(age);
    return cols;
  }
  if (r.kind == "Pod") {
    cols.push_back({Definition("Ready", "string", "The aggregate readiness state of this pod."),
                    [](const json& o) {
                      int ready = 0, total = 0;
                      if (o.contains("spec") && o["spec"].contains("containers"))
                        total = static_cast<int>(o["spec"]["containers"].size());
                      if (o.contains("status") && o["status"].contains("containerStatuses"))
                        for (const auto& cs : o["status"]["containerStatuses"])
                          ready += cs.value("ready", false) ? 1 : 0;
                      return json(std::to_string(ready) + "/" + std::to_string(total));
                    }});
    cols.push_back({Definition("Status", "string", "The aggregate status of the containers."),
                    [](const json& o) {
                      if (o["metadata"].contains("deletionTimestamp")) return json("Terminating");
                      std::string phase =
                          o.contains("status") ? o["status"].value("phase", "Pending") : "Pending";
                      if (o.contains("status") && o["status"].contains("containerStatuses"))
                        for (const auto& cs : o["status"]["containerStatuses"]) {
                          if (cs.contains("state") && cs["state"].contains("terminated") &&
                              cs["state"]["terminated"].contains("reason"))
                            phase = cs["state"]["terminated"]["reason"];
                          if (cs.contains("state") && cs["state"].contains("waiting") &&
                              cs["state"]["waiting"].contains("reason"))
                            phase = cs["state"]["waiting"]["reason"];
                        }
                      return json(phase);
                    }});
    cols.push_back(
        {Definition("Restarts", "string", "The number of times the containers restarted."),
         [](const json& o) {
           int restarts = 0;
           if (o.contains("status") && o["status"].contains("containerStatuses"))
             for (const auto& cs : o["status"]["containerStatuses"])
               restarts += cs.value("restartCount", 0);
           return json(std::to_string(restarts));
         }});
    cols.push_back(age);
    cols.push_back(
        {Definition("IP", "string", "IP address allocated to the pod.", 1), [](const json& o) {
           return json(o.contains("status") ? o["status"].value("podIP", "<none>") : "<none>");
         }});
    cols.push_back({Definition("Node", "string", "Name of the Node the Pod is bound to.", 1),
                    [](const json& o) {
                      return json(o.contains("spec") ? o["spec"].value("nodeName", "<none>")
                                                     : "<none>");
                    }});
    return cols;
  }
  if (r.kind == "Event") {
    // kubectl's event columns: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE (no NAME).
    cols.clear();
    cols.push_back({Definition("Last Seen", "string", "Time since the event was last seen."),
                    [now](const json& o) {
                      std::string last = o.value("lastTimestamp", "");
                      if (last.empty()) last = o.value("eventTime", "");
                      if (last.empty()) return json("<unknown>");
                      return json(HumanDuration(static_cast<int64_t>(now - ParseRfc3339(last))));
                    }});
    cols.push_back({Definition("Type", "string", "Normal or Warning."),
                    [](const json& o) { return json(o.value("type", "")); }});
    cols.push_back({Definition("Reason", "string", "Why the event happened, CamelCase."),
                    [](const json& o) { return json(o.value("reason", "")); }});
    cols.push_back(
        {Definition("Object", "string", "The object the event is about."), [](const json& o) {
           if (!o.contains("involvedObject") || !o["involvedObject"].is_object()) return json("");
           const json& io = o["involvedObject"];
           std::string kind = io.value("kind", "");
           for (auto& ch : kind) ch = static_cast<char>(std::tolower(ch));
           return json(kind + "/" + io.value("name", ""));
         }});
    cols.push_back({Definition("Message", "string", "What happened, for people."),
                    [](const json& o) { return json(o.value("message", "")); }});
    return cols;
  }
  if (r.kind == "Namespace") {
    cols.push_back(
        {Definition("Status", "string", "The status of the namespace"), [](const json& o) {
           return json(o.contains("status") ? o["status"].value("phase", "Active") : "Active");
         }});
  }
  if (r.kind == "Node") {
    cols.push_back({Definition("Status", "string", "The status of the node"), [](const json& o) {
                      auto ready =
                          EvalJsonPath(o, ".status.conditions[?(@.type==\"Ready\")].status");
                      return json(ready && *ready == "True" ? "Ready" : "NotReady");
                    }});
  }
  if (r.kind == "Deployment") {
    cols.push_back(
        {Definition("Ready", "string", "Number of the pod with ready state"), [](const json& o) {
           auto ready = EvalJsonPath(o, ".status.readyReplicas");
           auto want = EvalJsonPath(o, ".spec.replicas");
           return json((ready ? ready->dump() : "0") + "/" + (want ? want->dump() : "1"));
         }});
  }
  cols.push_back(age);
  return cols;
}

}  // namespace

std::string HumanDuration(int64_t s) {
  if (s < -1) return "<invalid>";
  if (s < 0) return "0s";
  if (s < 120) return std::to_string(s) + "s";
  int64_t m = s / 60;
  if (m < 10)
    return s % 60 == 0 ? std::to_string(m) + "m"
                       : std::to_string(m) + "m" + std::to_string(s % 60) + "s";
  if (m < 180) return std::to_string(m) + "m";
  int64_t h = m / 60;
  if (h < 8)
    return m % 60 == 0 ? std::to_string(h) + "h"
                       : std::to_string(h) + "h" + std::to_string(m % 60) + "m";
  if (h < 48) return std::to_string(h) + "h";
  if (h < 192)
    return h % 24 == 0 ? std::to_string(h / 24) + "d"
                       : std::to_string(h / 24) + "d" + std::to_string(h % 24) + "h";
  if (h < 24 * 365 * 2) return std::to_string(h / 24) + "d";
  int64_t y = h / (24 * 365);
  if (y < 8) return std::to_string(y) + "y" + std::to_string((h / 24) % 365) + "d";
  return std::to_string(y) + "y";
}

bool WantsTable(const std::string& accept) { return accept.find("as=Table") != std::string::npos; }

json ToTable(const ResourceInfo& r, const std::vector<json>& objects, bool with_column_definitions,
             const std::string& resource_version, std::time_t now) {
  std::vector<Column> cols = ColumnsFor(r, now);
  json table = {{"kind", "Table"},
                {"apiVersion", "meta.k8s.io/v1"},
                {"metadata", {{"resourceVersion", resource_version}}},
                {"columnDefinitions", json::array()},
                {"rows", json::array()}};
  if (with_column_definitions)
    for (const auto& c : cols) table["columnDefinitions"].push_back(c.definition);
  for (const auto& o : objects) {
    json cells = json::array();
    for (const auto& c : cols) {
      json v = c.cell(o);
      cells.push_back(v.is_null() ? json("<none>") : v);
    }
    json partial = {{"kind", "PartialObjectMetadata"},
                    {"apiVersion", "meta.k8s.io/v1"},
                    {"metadata", o["metadata"]}};
    table["rows"].push_back({{"cells", cells}, {"object", partial}});
  }
  return table;
}

}  // namespace tidal::local
