// local/pod_spec.cc
#include "local/pod_spec.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <sstream>

#include "common/base64.h"
#include "kube/types.h"
#include "local/json_fields.h"

namespace tidal::local {
namespace {

using nlohmann::json;

StatusOr<int64_t> ContainerGpus(const json& container, const std::string& path) {
  const json& resources = Field(container, "resources");
  for (const char* kind : {"requests", "limits"}) {
    const json& v = Field(Field(resources, kind), kGpuResource);
    if (v.is_null()) continue;
    auto n = kube::WholeQuantity(v);
    if (!n || *n < 0)
      return InvalidArgument(path + ".resources." + kind + "[" + kGpuResource +
                             "]: expected a whole non-negative number, got " + v.dump());
    return *n;
  }
  return 0;
}

std::vector<int> ParseGpuIds(const std::string& text) {
  std::vector<int> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty() && std::all_of(item.begin(), item.end(), ::isdigit))
      ids.push_back(std::stoi(item));
  return ids;
}

bool Finished(const json& pod) {
  std::string phase = StringField(Field(pod, "status"), "phase");
  return phase == "Succeeded" || phase == "Failed";
}

std::string SearchPath(const std::string& name, const std::string& path_env) {
  std::stringstream ss(path_env);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate))
      return candidate;
  }
  return "";
}

// Kubernetes field paths for the downward API that the kubelet resolves.
std::optional<std::string> DownwardValue(const json& pod, const PodContext& context,
                                         const std::string& path) {
  const json& meta = Field(pod, "metadata");
  if (path == "metadata.name") return StringField(meta, "name");
  if (path == "metadata.namespace") return StringField(meta, "namespace");
  if (path == "metadata.uid") return StringField(meta, "uid");
  if (path == "spec.nodeName") return context.node_name;
  if (path == "spec.serviceAccountName")
    return StringField(Field(pod, "spec"), "serviceAccountName");
  if (path == "status.podIP" || path == "status.podIPs") return context.pod_ip;
  if (path == "status.hostIP" || path == "status.hostIPs") return std::string("127.0.0.1");
  for (const char* map : {"labels", "annotations"}) {
    std::string prefix = std::string("metadata.") + map + "['";
    if (path.rfind(prefix, 0) == 0 && path.size() > prefix.size() + 2 &&
        path.substr(path.size() - 2) == "']") {
      std::string key = path.substr(prefix.size(), path.size() - prefix.size() - 2);
      return StringField(Field(meta, map), key.c_str());
    }
  }
  return std::nullopt;
}

// The string value of `key` in a Secret (base64 data) or ConfigMap (data, binaryData).
std::optional<std::string> KeyValue(const std::string& kind, const json& object,
                                    const std::string& key) {
  if (kind == "Secret") {
    const json& v = Field(Field(object, "data"), key.c_str());
    if (!v.is_string()) return std::nullopt;
    return Base64Decode(v.get<std::string>());
  }
  const json& v = Field(Field(object, "data"), key.c_str());
  if (v.is_string()) return v.get<std::string>();
  const json& b = Field(Field(object, "binaryData"), key.c_str());
  if (b.is_string()) return Base64Decode(b.get<std::string>());
  return std::nullopt;
}

std::map<std::string, std::string> AllKeys(const std::string& kind, const json& object) {
  std::map<std::string, std::string> out;
  for (const char* field : {"data", "binaryData"}) {
    const json& m = Field(object, field);
    if (!m.is_object()) continue;
    for (const auto& [k, v] : m.items()) {
      if (auto value = KeyValue(kind, object, k)) out[k] = *value;
    }
  }
  return out;
}

}  // namespace

ImageTable::ImageTable() {
  for (const char* base :
       {"busybox", "alpine", "debian", "ubuntu", "docker.io/library/busybox",
        "docker.io/library/debian", "docker.io/library/ubuntu", "docker.io/library/alpine"})
    entries_[base] = "host";
}

Status ImageTable::Add(const std::string& entry) {
  auto eq = entry.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == entry.size())
    return InvalidArgument("--image: expected IMAGE=EXECUTABLE (or IMAGE=host), got \"" + entry +
                           "\"");
  std::string path = entry.substr(eq + 1);
  if (path != "host" && ::access(path.c_str(), X_OK) != 0)
    return InvalidArgument("--image " + entry + ": " + path + " is not an executable file");
  entries_[entry.substr(0, eq)] = path;
  return OkStatus();
}

std::optional<std::string> ImageTable::Find(const std::string& image) const {
  if (auto it = entries_.find(image); it != entries_.end()) return it->second;
  if (auto it = entries_.find(ImageRepository(image)); it != entries_.end()) return it->second;
  return std::nullopt;
}

std::string ImageRepository(const std::string& image) {
  std::string out = image.substr(0, image.find('@'));
  auto colon = out.rfind(':');
  auto slash = out.rfind('/');
  if (colon != std::string::npos && (slash == std::string::npos || colon > slash))
    out.resize(colon);
  return out;
}

StatusOr<int64_t> PodGpuRequest(const json& pod) {
  const json& spec = Field(pod, "spec");
  int64_t sum = 0, init_max = 0;
  const json& containers = Field(spec, "containers");
  if (containers.is_array()) {
    for (size_t i = 0; i < containers.size(); ++i) {
      TIDAL_ASSIGN_OR_RETURN(
          int64_t n, ContainerGpus(containers[i], "spec.containers[" + std::to_string(i) + "]"));
      sum += n;
    }
  }
  const json& inits = Field(spec, "initContainers");
  if (inits.is_array()) {
    for (size_t i = 0; i < inits.size(); ++i) {
      TIDAL_ASSIGN_OR_RETURN(
          int64_t n, ContainerGpus(inits[i], "spec.initContainers[" + std::to_string(i) + "]"));
      init_max = std::max(init_max, n);
    }
  }
  return std::max(sum, init_max);
}

namespace {
GpuUsage::Placed PlacedOf(const json& pod) {
  GpuUsage::Placed placed;
  const json& meta = Field(pod, "metadata");
  placed.namespace_ = StringField(meta, "namespace");
  const json& labels = Field(meta, "labels");
  if (labels.is_object())
    for (const auto& [k, v] : labels.items())
      if (v.is_string()) placed.labels[k] = v.get<std::string>();
  return placed;
}

// A preferred pod affinity term, as far as the scheduler here reads one.
struct AffinityTerm {
  int64_t weight = 0;
  std::map<std::string, std::string> match_labels;
  std::string topology_key;
  std::set<std::string> namespaces;  // empty: the pod's own
};

std::vector<AffinityTerm> PreferredAffinity(const json& pod) {
  std::vector<AffinityTerm> terms;
  const json& preferred = Field(Field(Field(Field(pod, "spec"), "affinity"), "podAffinity"),
                                "preferredDuringSchedulingIgnoredDuringExecution");
  if (!preferred.is_array()) return terms;
  for (const json& p : preferred) {
    if (!p.is_object()) continue;
    const json& term = Field(p, "podAffinityTerm");
    AffinityTerm t;
    t.weight = p.value("weight", json()).is_number_integer() ? p["weight"].get<int64_t>() : 0;
    t.topology_key = StringField(term, "topologyKey");
    const json& match = Field(Field(term, "labelSelector"), "matchLabels");
    if (match.is_object())
      for (const auto& [k, v] : match.items())
        if (v.is_string()) t.match_labels[k] = v.get<std::string>();
    const json& namespaces = Field(term, "namespaces");
    if (namespaces.is_array())
      for (const json& n : namespaces)
        if (n.is_string()) t.namespaces.insert(n.get<std::string>());
    if (t.weight > 0 && !t.topology_key.empty() && !t.match_labels.empty()) terms.push_back(t);
  }
  return terms;
}
}  // namespace

void GpuUsage::Add(const json& pod) {
  const std::string node = StringField(Field(pod, "spec"), "nodeName");
  if (node.empty() || Finished(pod)) return;
  Held& held = nodes_[node];
  held.pods.push_back(PlacedOf(pod));
  std::string ids = StringField(Field(Field(pod, "metadata"), "annotations"), kGpuIdsAnnotation);
  if (!ids.empty()) {
    for (int id : ParseGpuIds(ids)) held.ids.insert(id);
  } else if (auto n = PodGpuRequest(pod); n.ok()) {
    held.unnumbered += *n;
  }
}

void GpuUsage::Hold(const std::string& node, const std::vector<int>& ids, const json& pod) {
  Held& held = nodes_[node];
  held.ids.insert(ids.begin(), ids.end());
  if (pod.is_object()) held.pods.push_back(PlacedOf(pod));
}

const std::vector<GpuUsage::Placed>& GpuUsage::pods(const std::string& node) const {
  static const std::vector<Placed> kNone;
  auto it = nodes_.find(node);
  return it == nodes_.end() ? kNone : it->second.pods;
}

const std::set<int>& GpuUsage::ids(const std::string& node) const {
  static const std::set<int> kNone;
  auto it = nodes_.find(node);
  return it == nodes_.end() ? kNone : it->second.ids;
}

int64_t GpuUsage::unnumbered(const std::string& node) const {
  auto it = nodes_.find(node);
  return it == nodes_.end() ? 0 : it->second.unnumbered;
}

ScheduleResult Schedule(const json& pod, const std::vector<NodeInfo>& nodes,
                        const std::vector<json>& pods) {
  const std::string uid = StringField(Field(pod, "metadata"), "uid");
  GpuUsage usage;
  for (const json& other : pods)
    if (StringField(Field(other, "metadata"), "uid") != uid) usage.Add(other);
  return Schedule(pod, nodes, usage);
}

void ReadNodeSpec(const json& node, NodeInfo& info) {
  const json& spec = Field(node, "spec");
  info.unschedulable = spec.is_object() && spec.value("unschedulable", false) == true;
  info.taints = kube::TaintsOf(node);
}

ScheduleResult Schedule(const json& pod, const std::vector<NodeInfo>& nodes,
                        const GpuUsage& usage) {
  ScheduleResult result;
  auto request = PodGpuRequest(pod);
  if (!request.ok()) {
    result.message = request.status().message();
    return result;
  }
  const json& selector = Field(Field(pod, "spec"), "nodeSelector");
  std::string fixed_node = StringField(Field(pod, "spec"), "nodeName");
  int insufficient = 0, mismatched = 0, cordoned = 0;
  std::map<std::string, int> untolerated;  // "{key: value}" → nodes
  // Each preferred affinity term's topology values where a bound pod meets it: a node in one of
  // those domains scores the term's weight.
  const std::vector<AffinityTerm> terms = PreferredAffinity(pod);
  const std::string own_namespace = StringField(Field(pod, "metadata"), "namespace");
  std::vector<std::set<std::string>> met(terms.size());
  for (size_t i = 0; i < terms.size(); ++i)
    for (const NodeInfo& node : nodes) {
      auto domain = node.labels.find(terms[i].topology_key);
      if (domain == node.labels.end()) continue;
      for (const GpuUsage::Placed& other : usage.pods(node.name)) {
        const bool in_namespace = terms[i].namespaces.empty()
                                      ? other.namespace_ == own_namespace
                                      : terms[i].namespaces.count(other.namespace_) > 0;
        const bool matches = std::all_of(terms[i].match_labels.begin(), terms[i].match_labels.end(),
                                         [&](const auto& kv) {
                                           auto l = other.labels.find(kv.first);
                                           return l != other.labels.end() && l->second == kv.second;
                                         });
        if (in_namespace && matches) {
          met[i].insert(domain->second);
          break;
        }
      }
    }
  auto score = [&](const NodeInfo& node) {
    int64_t s = 0;
    for (size_t i = 0; i < terms.size(); ++i) {
      auto domain = node.labels.find(terms[i].topology_key);
      if (domain != node.labels.end() && met[i].count(domain->second)) s += terms[i].weight;
    }
    return s;
  };
  int64_t best_free = -1, best_score = -1;
  for (const NodeInfo& node : nodes) {
    if (!fixed_node.empty() && node.name != fixed_node) continue;
    bool match = true;
    if (selector.is_object())
      for (const auto& [k, v] : selector.items()) {
        auto it = node.labels.find(k);
        match = match && v.is_string() && it != node.labels.end() && it->second == v;
      }
    if (!match) {
      ++mismatched;
      continue;
    }
    if (node.unschedulable &&
        !Tolerates(pod, {"node.kubernetes.io/unschedulable", "", "NoSchedule"})) {
      ++cordoned;
      continue;
    }
    const auto taint = std::find_if(node.taints.begin(), node.taints.end(), [&](const Taint& t) {
      return (t.effect == "NoSchedule" || t.effect == "NoExecute") && !Tolerates(pod, t);
    });
    if (taint != node.taints.end()) {
      ++untolerated["{" + taint->key + ": " + taint->value + "}"];
      continue;
    }
    const std::set<int>& used = usage.ids(node.name);
    const int64_t unnumbered = usage.unnumbered(node.name);
    int64_t free_gpus = node.gpus - static_cast<int64_t>(used.size()) - unnumbered;
    if (free_gpus < *request) {
      ++insufficient;
      continue;
    }
    const int64_t node_score = score(node);
    if (best_free >= 0 &&
        (node_score < best_score || (node_score == best_score && free_gpus >= best_free)))
      continue;
    best_free = free_gpus;
    best_score = node_score;
    result.node = node.name;
    result.gpu_ids.clear();
    // Lowest free ids first; ids held by unnumbered pods are unknown, so skip as many.
    int skip = static_cast<int>(unnumbered);
    for (int id = 0; id < node.gpus && static_cast<int64_t>(result.gpu_ids.size()) < *request;
         ++id) {
      if (used.count(id)) continue;
      if (skip > 0) {
        --skip;
        continue;
      }
      result.gpu_ids.push_back(id);
    }
  }
  if (!result.node.empty()) return result;
  size_t considered = fixed_node.empty() ? nodes.size() : 1;
  std::string message = "0/" + std::to_string(considered) + " nodes are available:";
  std::vector<std::string> parts;
  if (insufficient)
    parts.push_back(" " + std::to_string(insufficient) + " Insufficient " + kGpuResource);
  if (mismatched)
    parts.push_back(" " + std::to_string(mismatched) +
                    " node(s) didn't match Pod's node affinity/selector");
  for (const auto& [taint, count] : untolerated)
    parts.push_back(" " + std::to_string(count) + " node(s) had untolerated taint " + taint);
  if (cordoned) parts.push_back(" " + std::to_string(cordoned) + " node(s) were unschedulable");
  if (parts.empty()) parts.push_back(" node \"" + fixed_node + "\" not found");
  for (size_t i = 0; i < parts.size(); ++i) message += (i ? "," : "") + parts[i];
  result.message = message + ".";
  return result;
}

std::string TranslatePath(const std::string& value, const std::vector<Mount>& mounts) {
  // Longest mount paths first, so /data/models wins over /data.
  std::vector<std::pair<std::string, const Mount*>> sorted;
  for (const Mount& m : mounts) {
    std::string mp = m.mount_path;
    while (mp.size() > 1 && mp.back() == '/') mp.pop_back();
    if (mp.size() > 1 && mp[0] == '/') sorted.emplace_back(mp, &m);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  auto starts_path = [](char c) {
    return c == ' ' || c == '=' || c == ':' || c == '"' || c == '\'' || c == '(' || c == ',' ||
           c == '\t' || c == '\n' || c == ';' || c == '<' || c == '>' || c == '|';
  };
  auto ends_path = [&](char c) { return c == '/' || starts_path(c) || c == ')'; };
  std::string out;
  size_t i = 0;
  while (i < value.size()) {
    bool replaced = false;
    if (value[i] == '/' && (i == 0 || starts_path(value[i - 1]))) {
      for (const auto& [mp, m] : sorted) {
        if (value.compare(i, mp.size(), mp) != 0) continue;
        size_t after = i + mp.size();
        if (after < value.size() && !ends_path(value[after])) continue;
        out += m->host_path;
        i = after;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += value[i++];
  }
  return out;
}

std::string ExpandVars(const std::string& text, const std::map<std::string, std::string>& env) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '$' || i + 1 >= text.size()) {
      out += text[i];
      continue;
    }
    if (text[i + 1] == '$') {
      out += '$';
      ++i;
      continue;
    }
    if (text[i + 1] == '(') {
      auto close = text.find(')', i + 2);
      if (close != std::string::npos) {
        std::string name = text.substr(i + 2, close - i - 2);
        auto it = env.find(name);
        out += it != env.end() ? it->second : "$(" + name + ")";
        i = close;
        continue;
      }
    }
    out += '$';
  }
  return out;
}

std::vector<Mount> ContainerMounts(const json& container,
                                   const std::map<std::string, std::string>& volume_dirs) {
  std::vector<Mount> mounts;
  const json& list = Field(container, "volumeMounts");
  if (!list.is_array()) return mounts;
  for (const json& m : list) {
    auto it = volume_dirs.find(StringField(m, "name"));
    std::string mount_path = StringField(m, "mountPath");
    if (it == volume_dirs.end() || mount_path.empty()) continue;
    std::string host = it->second;
    std::string sub = StringField(m, "subPath");
    if (!sub.empty()) host += "/" + sub;
    mounts.push_back({mount_path, host});
  }
  return mounts;
}

std::variant<ContainerLaunch, LaunchError> PrepareContainer(const json& pod, const json& container,
                                                            const ImageTable& images,
                                                            const PodContext& context) {
  std::string name = StringField(container, "name");
  std::string image = StringField(container, "image");
  if (image.empty())
    return LaunchError{"InvalidImageName", "container " + name + ": image is required"};
  auto entry = images.Find(image);
  if (!entry)
    return LaunchError{"ErrImagePull", "image \"" + image +
                                           "\" is not in tidal local's image table: start it with "
                                           "--image " +
                                           ImageRepository(image) + "=/path/to/executable"};
  ContainerLaunch launch;
  launch.env = context.base_env;
  auto lookup = [&](const std::string& kind, const std::string& object_name, bool optional,
                    std::optional<json>& out) -> std::optional<LaunchError> {
    out = context.lookup ? context.lookup(kind, object_name) : std::nullopt;
    if (!out && !optional) {
      std::string lower = kind == "Secret" ? "secret" : "configmap";
      return LaunchError{"CreateContainerConfigError",
                         lower + " \"" + object_name + "\" not found"};
    }
    return std::nullopt;
  };

  const json& env_from = Field(container, "envFrom");
  if (env_from.is_array()) {
    for (const json& source : env_from) {
      std::string prefix = StringField(source, "prefix");
      for (const char* ref : {"configMapRef", "secretRef"}) {
        const json& r = Field(source, ref);
        if (!r.is_object()) continue;
        std::string kind = std::string(ref) == "secretRef" ? "Secret" : "ConfigMap";
        std::optional<json> object;
        if (auto error = lookup(kind, StringField(r, "name"), Field(r, "optional") == true, object))
          return *error;
        if (!object) continue;
        for (const auto& [k, v] : AllKeys(kind, *object)) launch.env[prefix + k] = v;
      }
    }
  }
  const json& env = Field(container, "env");
  if (env.is_array()) {
    for (const json& var : env) {
      std::string var_name = StringField(var, "name");
      if (var_name.empty()) continue;
      const json& value_from = Field(var, "valueFrom");
      if (!value_from.is_object()) {
        launch.env[var_name] =
            TranslatePath(ExpandVars(StringField(var, "value"), launch.env), context.mounts);
        continue;
      }
      if (const json& f = Field(value_from, "fieldRef"); f.is_object()) {
        std::string path = StringField(f, "fieldPath");
        auto v = DownwardValue(pod, context, path);
        if (!v)
          return LaunchError{
              "CreateContainerConfigError",
              "env " + var_name + ": unsupported fieldRef.fieldPath \"" + path + "\""};
        launch.env[var_name] = *v;
        continue;
      }
      if (const json& f = Field(value_from, "resourceFieldRef"); f.is_object()) {
        std::string resource = StringField(f, "resource");
        auto dot = resource.find('.');
        std::string section = resource.substr(0, dot);
        std::string key = dot == std::string::npos ? "" : resource.substr(dot + 1);
        const json& q = Field(Field(Field(container, "resources"), section.c_str()), key.c_str());
        launch.env[var_name] = q.is_string()   ? q.get<std::string>()
                               : q.is_number() ? q.dump()
                                               : "0";
        continue;
      }
      for (const char* ref : {"secretKeyRef", "configMapKeyRef"}) {
        const json& r = Field(value_from, ref);
        if (!r.is_object()) continue;
        std::string kind = std::string(ref) == "secretKeyRef" ? "Secret" : "ConfigMap";
        bool optional = Field(r, "optional") == true;
        std::optional<json> object;
        if (auto error = lookup(kind, StringField(r, "name"), optional, object)) return *error;
        if (!object) break;
        std::string key = StringField(r, "key");
        auto v = KeyValue(kind, *object, key);
        if (!v) {
          if (optional) break;
          return LaunchError{"CreateContainerConfigError",
                             "couldn't find key " + key + " in " + kind + " " +
                                 StringField(Field(pod, "metadata"), "namespace") + "/" +
                                 StringField(r, "name")};
        }
        launch.env[var_name] = *v;
      }
    }
  }

  std::vector<std::string> command, args;
  for (const char* field : {"command", "args"}) {
    const json& list = Field(container, field);
    if (!list.is_array()) continue;
    for (const json& item : list)
      (std::string(field) == "command" ? command : args)
          .push_back(
              TranslatePath(ExpandVars(item.is_string() ? item.get<std::string>() : "", launch.env),
                            context.mounts));
  }
  std::string path_env = launch.env.count("PATH") ? launch.env["PATH"] : "/usr/bin:/bin";
  if (command.empty()) {
    if (*entry == "host")
      return LaunchError{"CreateContainerConfigError",
                         "image \"" + image +
                             "\" has no entrypoint in tidal local: give container " + name +
                             " a command"};
    launch.argv.push_back(*entry);
  } else {
    std::string exe = command[0];
    namespace fs = std::filesystem;
    if (*entry != "host" && fs::path(exe).filename() == fs::path(*entry).filename()) {
      exe = *entry;
    } else if (*entry != "host" &&
               ::access((fs::path(*entry).parent_path() / fs::path(exe).filename()).c_str(),
                        X_OK) == 0) {
      // The image's other executables: those beside its entrypoint.
      exe = (fs::path(*entry).parent_path() / fs::path(exe).filename()).string();
    } else if (exe.find('/') == std::string::npos) {
      exe = SearchPath(exe, path_env);
    } else if (::access(exe.c_str(), X_OK) != 0) {
      exe.clear();
    }
    if (exe.empty())
      return LaunchError{"RunContainerError",
                         "exec: \"" + command[0] + "\": executable file not found in $PATH"};
    launch.argv.push_back(exe);
    launch.argv.insert(launch.argv.end(), command.begin() + 1, command.end());
  }
  launch.argv.insert(launch.argv.end(), args.begin(), args.end());

  std::string working_dir = StringField(container, "workingDir");
  if (working_dir.empty()) {
    launch.working_dir = context.pod_dir;
  } else {
    std::string translated = TranslatePath(working_dir, context.mounts);
    launch.working_dir =
        translated != working_dir ? translated : context.pod_dir + "/rootfs" + working_dir;
  }
  return launch;
}

bool ShouldRestart(const std::string& restart_policy, int exit_code) {
  if (restart_policy == "Never") return false;
  if (restart_policy == "OnFailure") return exit_code != 0;
  return true;  // Always, the default
}

std::string PodPhase(const std::string& restart_policy, const std::vector<ContainerRun>& runs) {
  int waiting = 0, running = 0, stopped = 0, succeeded = 0;
  for (const ContainerRun& run : runs) {
    switch (run.state) {
      case ContainerRun::kRunning:
        ++running;
        break;
      case ContainerRun::kTerminated:
        ++stopped;
        if (run.exit_code == 0) ++succeeded;
        break;
      case ContainerRun::kWaiting:
        if (run.terminated_before)
          ++stopped;
        else
          ++waiting;
        break;
    }
  }
  if (runs.empty() || waiting > 0) return "Pending";
  if (running > 0) return "Running";
  if (restart_policy != "Never" && restart_policy != "OnFailure") return "Running";
  if (stopped == succeeded) return "Succeeded";
  if (restart_policy == "Never") return "Failed";
  return "Running";  // OnFailure: the failed containers start again
}

}  // namespace tidal::local
