// kube/types.cc
#include "kube/types.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "common/base64.h"
#include "common/json_reader.h"

namespace tidal::kube {
namespace {

using nlohmann::json;

// Reads typed fields out of one JSON object, remembering the first error with its field path:
// a fluent view of it for JsonReader (common/json_reader.h), which does the reading.
class Fields {
 public:
  Fields(const json& object, std::string path) : object_(object), path_(std::move(path)) {
    if (!object_.is_object() && !object_.is_null())
      in_.Fail(path_.empty() ? "object" : path_, "an object", object_);
  }
  const Status& status() const { return in_.status(); }
  std::string Path(const std::string& key) const { return json_read::FieldPath(path_, key); }

  Fields& String(const char* key, std::string& out) { return Read(key, out); }
  Fields& Bool(const char* key, bool& out) { return Read(key, out); }
  template <typename Int>
  Fields& Integer(const char* key, Int& out) {
    return Read(key, out);
  }
  Fields& OptionalInt64(const char* key, std::optional<int64_t>& out) {
    if (JsonReader::Find(object_, key)) {
      const int64_t v = in_.Get<int64_t>(object_, path_, key, 0);
      if (in_.ok()) out = v;
    }
    return *this;
  }
  Fields& Strings(const char* key, std::vector<std::string>& out) {
    for (std::string& s : in_.Strings(object_, path_, key)) out.push_back(std::move(s));
    return *this;
  }
  // Label-like maps; a number stands for its text (resource quantities may be numbers).
  Fields& StringMap(const char* key, std::map<std::string, std::string>& out) {
    if (const json* v = in_.Object(object_, path_, key))
      for (const auto& [k, item] : v->items()) {
        if (item.is_string())
          out[k] = item.get<std::string>();
        else if (item.is_number_integer())
          out[k] = item.dump();
        else
          in_.Fail(Path(key) + "." + k, "a string", item);
      }
    return *this;
  }
  Fields& Array(const char* key, const std::function<void(const json&, const std::string&)>& each) {
    if (const json* v = in_.Array(object_, path_, key))
      for (size_t i = 0; i < v->size() && in_.ok(); ++i)
        each((*v)[i], Path(key) + "[" + std::to_string(i) + "]");
    return *this;
  }
  void Absorb(const Status& s) { in_.Absorb(s); }

 private:
  template <typename T>
  Fields& Read(const char* key, T& out) {
    out = in_.Get<T>(object_, path_, key, out);
    return *this;
  }

  const json& object_;
  std::string path_;
  JsonReader in_;
};

const json& Child(const json& object, const char* key) {
  static const json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

// Writes `value` under `key` unless it is empty and the key was absent (so clearing a field
// that existed writes the empty value, and untouched absent fields stay absent).
template <typename T>
void Put(json& object, const char* key, const T& value) {
  bool empty;
  if constexpr (std::is_same_v<T, bool>)
    empty = !value;
  else if constexpr (std::is_arithmetic_v<T>)
    empty = value == 0;
  else
    empty = value.empty();
  if (empty && !object.contains(key)) return;
  object[key] = value;
}

Status ReadMeta(const json& object, ObjectMeta& meta) {
  const json& m = Child(object, "metadata");
  if (m.is_null()) return OkStatus();
  TIDAL_ASSIGN_OR_RETURN(meta, ObjectMetaFromJson(m));
  return OkStatus();
}

void ReadConditions(Fields& f, const char* key, std::vector<Condition>& out) {
  f.Array(key, [&](const json& item, const std::string& path) {
    Condition c;
    c.raw = item;
    Fields cf(item, path);
    cf.String("type", c.type)
        .String("status", c.status)
        .String("reason", c.reason)
        .String("message", c.message)
        .String("lastTransitionTime", c.last_transition_time);
    f.Absorb(cf.status());
    out.push_back(std::move(c));
  });
}

json ConditionsJson(const std::vector<Condition>& conditions) {
  json out = json::array();
  for (const Condition& c : conditions) {
    json j = c.raw.is_object() ? c.raw : json::object();
    j["type"] = c.type;
    j["status"] = c.status;
    Put(j, "reason", c.reason);
    Put(j, "message", c.message);
    Put(j, "lastTransitionTime", c.last_transition_time);
    out.push_back(j);
  }
  return out;
}

bool ConditionTrue(const std::vector<Condition>& conditions, const std::string& type) {
  return std::any_of(conditions.begin(), conditions.end(),
                     [&](const Condition& c) { return c.type == type && c.status == "True"; });
}

json WithMeta(const json& raw, const ObjectMeta& meta, const char* api_version, const char* kind) {
  json out = raw.is_object() ? raw : json::object();
  out["apiVersion"] = out.value("apiVersion", api_version);
  out["kind"] = out.value("kind", kind);
  out["metadata"] = ToJson(meta);
  return out;
}

Status ReadContainer(const json& item, const std::string& path, Container& c) {
  c.raw = item;
  Fields f(item, path);
  f.String("name", c.name)
      .String("image", c.image)
      .Strings("command", c.command)
      .Strings("args", c.args);
  f.Array("env", [&](const json& e, const std::string& p) {
    EnvVar var;
    var.raw = e;
    Fields ef(e, p);
    ef.String("name", var.name).String("value", var.value);
    f.Absorb(ef.status());
    c.env.push_back(std::move(var));
  });
  f.Array("ports", [&](const json& e, const std::string& p) {
    ContainerPort port;
    port.raw = e;
    Fields pf(e, p);
    pf.String("name", port.name).Integer("containerPort", port.container_port);
    f.Absorb(pf.status());
    c.ports.push_back(std::move(port));
  });
  Fields rf(Child(item, "resources"), f.Path("resources"));
  rf.StringMap("limits", c.limits).StringMap("requests", c.requests);
  f.Absorb(rf.status());
  return f.status();
}

json ToJson(const Container& c) {
  json j = c.raw.is_object() ? c.raw : json::object();
  j["name"] = c.name;
  Put(j, "image", c.image);
  Put(j, "command", c.command);
  Put(j, "args", c.args);
  if (!c.env.empty() || j.contains("env")) {
    json env = json::array();
    for (const EnvVar& var : c.env) {
      json e = var.raw.is_object() ? var.raw : json::object();
      e["name"] = var.name;
      if (!var.value.empty() || !e.contains("valueFrom")) e["value"] = var.value;
      env.push_back(e);
    }
    j["env"] = env;
  }
  if (!c.ports.empty() || j.contains("ports")) {
    json ports = json::array();
    for (const ContainerPort& port : c.ports) {
      json p = port.raw.is_object() ? port.raw : json::object();
      Put(p, "name", port.name);
      p["containerPort"] = port.container_port;
      ports.push_back(p);
    }
    j["ports"] = ports;
  }
  if (!c.limits.empty() || !c.requests.empty() || j.contains("resources")) {
    json& r = j["resources"];
    if (!r.is_object()) r = json::object();
    Put(r, "limits", c.limits);
    Put(r, "requests", c.requests);
  }
  return j;
}

}  // namespace

std::optional<int64_t> WholeQuantity(const json& value) {
  if (value.is_number_integer()) {
    int64_t v = value.get<int64_t>();
    return v >= 0 ? std::optional<int64_t>(v) : std::nullopt;
  }
  if (!value.is_string()) return std::nullopt;
  const std::string& s = value.get_ref<const std::string&>();
  if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), ::isdigit))
    return std::nullopt;
  return std::stoll(s);
}

int64_t Pod::GpuRequest() const {
  int64_t total = 0;
  for (const Container& c : containers) {
    const std::string* quantity = nullptr;
    if (auto r = c.requests.find("nvidia.com/gpu"); r != c.requests.end())
      quantity = &r->second;
    else if (auto l = c.limits.find("nvidia.com/gpu"); l != c.limits.end())
      quantity = &l->second;
    if (quantity) total += WholeQuantity(json(*quantity)).value_or(0);
  }
  return total;
}

PodPhase ParsePodPhase(std::string_view text) {
  if (text.empty() || text == "Pending") return PodPhase::kPending;
  if (text == "Running") return PodPhase::kRunning;
  if (text == "Succeeded") return PodPhase::kSucceeded;
  if (text == "Failed") return PodPhase::kFailed;
  return PodPhase::kUnknown;
}

const char* PodPhaseName(PodPhase phase) {
  switch (phase) {
    case PodPhase::kPending:
      return "Pending";
    case PodPhase::kRunning:
      return "Running";
    case PodPhase::kSucceeded:
      return "Succeeded";
    case PodPhase::kFailed:
      return "Failed";
    case PodPhase::kUnknown:
      return "Unknown";
  }
  return "Unknown";
}

bool Pod::Ready() const { return ConditionTrue(conditions, "Ready"); }

StatusOr<Pod> PodFromJson(const json& object) {
  Pod pod;
  pod.raw = object;
  TIDAL_RETURN_IF_ERROR(ReadMeta(object, pod.metadata));
  Fields spec(Child(object, "spec"), "spec");
  spec.String("nodeName", pod.node_name)
      .String("restartPolicy", pod.restart_policy)
      .String("serviceAccountName", pod.service_account_name)
      .StringMap("nodeSelector", pod.node_selector)
      .OptionalInt64("terminationGracePeriodSeconds", pod.termination_grace_period_seconds)
      .Array("containers", [&](const json& item, const std::string& path) {
        Container c;
        spec.Absorb(ReadContainer(item, path, c));
        pod.containers.push_back(std::move(c));
      });
  TIDAL_RETURN_IF_ERROR(spec.status());
  Fields status(Child(object, "status"), "status");
  std::string phase;
  status.String("phase", phase)
      .String("podIP", pod.pod_ip)
      .String("hostIP", pod.host_ip)
      .String("startTime", pod.start_time);
  pod.phase = ParsePodPhase(phase);
  ReadConditions(status, "conditions", pod.conditions);
  status.Array("containerStatuses", [&](const json& item, const std::string& path) {
    ContainerStatus cs;
    Fields f(item, path);
    f.String("name", cs.name).Bool("ready", cs.ready).Integer("restartCount", cs.restart_count);
    for (const char* state : {"running", "waiting", "terminated"}) {
      const json& s = Child(Child(item, "state"), state);
      if (!s.is_object()) continue;
      cs.state = state;
      Fields sf(s, path + ".state." + state);
      sf.String("reason", cs.reason);
      if (s.contains("exitCode")) {
        int32_t code = 0;
        sf.Integer("exitCode", code);
        cs.exit_code = code;
      }
      f.Absorb(sf.status());
    }
    status.Absorb(f.status());
    pod.container_statuses.push_back(std::move(cs));
  });
  TIDAL_RETURN_IF_ERROR(status.status());
  return pod;
}

json ToJson(const Pod& pod) {
  json out = WithMeta(pod.raw, pod.metadata, "v1", "Pod");
  json& spec = out["spec"];
  if (!spec.is_object()) spec = json::object();
  Put(spec, "nodeName", pod.node_name);
  Put(spec, "restartPolicy", pod.restart_policy);
  Put(spec, "serviceAccountName", pod.service_account_name);
  Put(spec, "nodeSelector", pod.node_selector);
  if (pod.termination_grace_period_seconds)
    spec["terminationGracePeriodSeconds"] = *pod.termination_grace_period_seconds;
  else
    spec.erase("terminationGracePeriodSeconds");
  json containers = json::array();
  for (const Container& c : pod.containers) containers.push_back(ToJson(c));
  spec["containers"] = containers;
  // Status is the kubelet's: the typed status fields are read-only, raw status is kept.
  return out;
}

StatusOr<Service> ServiceFromJson(const json& object) {
  Service svc;
  svc.raw = object;
  TIDAL_RETURN_IF_ERROR(ReadMeta(object, svc.metadata));
  Fields spec(Child(object, "spec"), "spec");
  spec.String("clusterIP", svc.cluster_ip)
      .String("type", svc.type)
      .StringMap("selector", svc.selector)
      .Bool("publishNotReadyAddresses", svc.publish_not_ready_addresses)
      .Array("ports", [&](const json& item, const std::string& path) {
        ServicePort port;
        port.raw = item;
        Fields f(item, path);
        f.String("name", port.name).String("protocol", port.protocol).Integer("port", port.port);
        spec.Absorb(f.status());
        svc.ports.push_back(std::move(port));
      });
  TIDAL_RETURN_IF_ERROR(spec.status());
  return svc;
}

json ToJson(const Service& svc) {
  json out = WithMeta(svc.raw, svc.metadata, "v1", "Service");
  json& spec = out["spec"];
  if (!spec.is_object()) spec = json::object();
  Put(spec, "clusterIP", svc.cluster_ip);
  Put(spec, "type", svc.type);
  Put(spec, "selector", svc.selector);
  Put(spec, "publishNotReadyAddresses", svc.publish_not_ready_addresses);
  json ports = json::array();
  for (const ServicePort& port : svc.ports) {
    json p = port.raw.is_object() ? port.raw : json::object();
    Put(p, "name", port.name);
    Put(p, "protocol", port.protocol);
    p["port"] = port.port;
    ports.push_back(p);
  }
  Put(spec, "ports", ports);
  return out;
}

StatusOr<Secret> SecretFromJson(const json& object) {
  Secret secret;
  secret.raw = object;
  TIDAL_RETURN_IF_ERROR(ReadMeta(object, secret.metadata));
  Fields f(object, "");
  std::map<std::string, std::string> encoded;
  f.String("type", secret.type).StringMap("data", encoded);
  TIDAL_RETURN_IF_ERROR(f.status());
  for (const auto& [k, v] : encoded) {
    auto decoded = Base64Decode(v);
    if (!decoded) return InvalidArgument("data." + k + ": expected base64");
    secret.data[k] = *decoded;
  }
  return secret;
}

json ToJson(const Secret& secret) {
  json out = WithMeta(secret.raw, secret.metadata, "v1", "Secret");
  Put(out, "type", secret.type);
  std::map<std::string, std::string> encoded;
  for (const auto& [k, v] : secret.data) encoded[k] = Base64Encode(v);
  Put(out, "data", encoded);
  return out;
}

StatusOr<ConfigMap> ConfigMapFromJson(const json& object) {
  ConfigMap cm;
  cm.raw = object;
  TIDAL_RETURN_IF_ERROR(ReadMeta(object, cm.metadata));
  Fields f(object, "");
  f.StringMap("data", cm.data);
  TIDAL_RETURN_IF_ERROR(f.status());
  return cm;
}

json ToJson(const ConfigMap& cm) {
  json out = WithMeta(cm.raw, cm.metadata, "v1", "ConfigMap");
  Put(out, "data", cm.data);
  return out;
}

int64_t Node::AllocatableGpus() const {
  auto it = allocatable.find("nvidia.com/gpu");
  return it == allocatable.end() ? 0 : WholeQuantity(json(it->second)).value_or(0);
}

bool Node::Ready() const { return ConditionTrue(conditions, "Ready"); }

std::vector<Taint> TaintsOf(const json& node) {
  std::vector<Taint> taints;
  auto spec = node.find("spec");
  if (spec == node.end() || !spec->is_object()) return taints;
  auto list = spec->find("taints");
  if (list == spec->end() || !list->is_array()) return taints;
  auto text = [](const json& o, const char* key) {
    auto it = o.find(key);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  for (const json& t : *list)
    if (t.is_object())
      taints.push_back({text(t, "key"), text(t, "value"), text(t, "effect"), text(t, "timeAdded")});
  return taints;
}

std::vector<PodToleration> TolerationsOf(const json& list) {
  std::vector<PodToleration> out;
  if (!list.is_array()) return out;
  auto text = [](const json& t, const char* key) {
    auto it = t.find(key);
    return it != t.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  for (const json& t : list) {
    if (!t.is_object()) continue;
    PodToleration p{text(t, "key"), text(t, "operator"), text(t, "value"), text(t, "effect"), {}};
    if (auto s = t.find("tolerationSeconds"); s != t.end() && s->is_number_integer())
      p.seconds = s->get<int64_t>();
    out.push_back(std::move(p));
  }
  return out;
}

Toleration TolerationOf(const std::vector<PodToleration>& tolerations, const Taint& taint) {
  Toleration out;
  for (const PodToleration& t : tolerations) {
    if (!t.effect.empty() && t.effect != taint.effect) continue;
    const bool matches = t.op == "Exists" ? t.key.empty() || t.key == taint.key
                                          : (t.op.empty() || t.op == "Equal") &&
                                                t.key == taint.key && t.value == taint.value;
    if (!matches) continue;
    out.tolerated = true;
    out.seconds = t.seconds;
    return out;  // the first toleration that matches counts (GetMatchingTolerations)
  }
  return out;
}

Toleration TolerationOf(const json& pod, const Taint& taint) {
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return {};
  auto list = spec->find("tolerations");
  return list == spec->end() ? Toleration{} : TolerationOf(TolerationsOf(*list), taint);
}

StatusOr<Node> NodeFromJson(const json& object) {
  Node node;
  node.raw = object;
  TIDAL_RETURN_IF_ERROR(ReadMeta(object, node.metadata));
  Fields spec(Child(object, "spec"), "spec");
  spec.Bool("unschedulable", node.unschedulable);
  TIDAL_RETURN_IF_ERROR(spec.status());
  node.taints = TaintsOf(object);
  Fields status(Child(object, "status"), "status");
  status.StringMap("capacity", node.capacity).StringMap("allocatable", node.allocatable);
  ReadConditions(status, "conditions", node.conditions);
  TIDAL_RETURN_IF_ERROR(status.status());
  return node;
}

json ToJson(const Node& node) {
  json out = WithMeta(node.raw, node.metadata, "v1", "Node");
  json& spec = out["spec"];
  if (!spec.is_object()) spec = json::object();
  Put(spec, "unschedulable", node.unschedulable);
  json& status = out["status"];
  if (!status.is_object()) status = json::object();
  Put(status, "capacity", node.capacity);
  Put(status, "allocatable", node.allocatable);
  if (!node.conditions.empty() || status.contains("conditions"))
    status["conditions"] = ConditionsJson(node.conditions);
  return out;
}

bool CustomResourceDefinition::Established() const {
  return ConditionTrue(conditions, "Established");
}

StatusOr<CustomResourceDefinition> CrdFromJson(const json& object) {
  CustomResourceDefinition crd;
  crd.raw = object;
  TIDAL_RETURN_IF_ERROR(ReadMeta(object, crd.metadata));
  Fields spec(Child(object, "spec"), "spec");
  spec.String("group", crd.group).String("scope", crd.scope);
  Fields names(Child(Child(object, "spec"), "names"), "spec.names");
  names.String("kind", crd.kind)
      .String("plural", crd.plural)
      .String("singular", crd.singular)
      .Strings("shortNames", crd.short_names)
      .Strings("categories", crd.categories);
  spec.Absorb(names.status());
  spec.Array("versions", [&](const json& item, const std::string& path) {
    CrdVersion v;
    v.raw = item;
    Fields f(item, path);
    f.String("name", v.name).Bool("served", v.served).Bool("storage", v.storage);
    spec.Absorb(f.status());
    crd.versions.push_back(std::move(v));
  });
  TIDAL_RETURN_IF_ERROR(spec.status());
  Fields status(Child(object, "status"), "status");
  ReadConditions(status, "conditions", crd.conditions);
  TIDAL_RETURN_IF_ERROR(status.status());
  return crd;
}

json ToJson(const CustomResourceDefinition& crd) {
  json out = WithMeta(crd.raw, crd.metadata, "apiextensions.k8s.io/v1", "CustomResourceDefinition");
  json& spec = out["spec"];
  if (!spec.is_object()) spec = json::object();
  Put(spec, "group", crd.group);
  Put(spec, "scope", crd.scope);
  json& names = spec["names"];
  if (!names.is_object()) names = json::object();
  Put(names, "kind", crd.kind);
  Put(names, "plural", crd.plural);
  Put(names, "singular", crd.singular);
  Put(names, "shortNames", crd.short_names);
  Put(names, "categories", crd.categories);
  json versions = json::array();
  for (const CrdVersion& v : crd.versions) {
    json j = v.raw.is_object() ? v.raw : json::object();
    j["name"] = v.name;
    j["served"] = v.served;
    j["storage"] = v.storage;
    versions.push_back(j);
  }
  Put(spec, "versions", versions);
  return out;
}

StatusOr<ApiStatus> ApiStatusFromJson(const json& object) {
  ApiStatus s;
  s.raw = object;
  Fields f(object, "");
  f.String("status", s.status)
      .String("message", s.message)
      .String("reason", s.reason)
      .Integer("code", s.code);
  Fields details(Child(object, "details"), "details");
  details.Array("causes", [&](const json& item, const std::string& path) {
    StatusCause cause;
    Fields cf(item, path);
    cf.String("reason", cause.reason).String("message", cause.message).String("field", cause.field);
    details.Absorb(cf.status());
    s.causes.push_back(std::move(cause));
  });
  f.Absorb(details.status());
  TIDAL_RETURN_IF_ERROR(f.status());
  return s;
}

json ToJson(const ApiStatus& s) {
  json out = s.raw.is_object() ? s.raw : json::object();
  out["apiVersion"] = "v1";
  out["kind"] = "Status";
  Put(out, "status", s.status);
  Put(out, "message", s.message);
  Put(out, "reason", s.reason);
  Put(out, "code", s.code);
  if (!s.causes.empty()) {
    json causes = json::array();
    for (const StatusCause& c : s.causes) {
      json j = json::object();
      Put(j, "reason", c.reason);
      Put(j, "message", c.message);
      Put(j, "field", c.field);
      causes.push_back(j);
    }
    out["details"]["causes"] = causes;
  }
  return out;
}

}  // namespace tidal::kube
