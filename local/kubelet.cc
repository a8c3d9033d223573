// local/kubelet.cc
#include "local/kubelet.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/base64.h"
#include "common/log.h"
#include "kube/meta_time.h"
#include "local/json_fields.h"

namespace tidal::local {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string NowRfc3339() { return kube::FormatTime(std::chrono::system_clock::now()); }

void Log(const char* level, const std::string& msg, const json& fields) {
  Logger::Get().Log(level, msg, fields);
}

// Writes `data` to `path` with `mode`, creating parent directories.
Status WriteVolumeFile(const std::string& path, const std::string& data, mode_t mode) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  out.close();
  if (!out) return Unavailable("cannot write " + path);
  ::chmod(path.c_str(), mode);
  return OkStatus();
}

// One connection attempt with a timeout; for HTTP, one GET whose status must be 200–399.
bool ProbeOnce(const std::string& host, int port, const std::string* http_path,
               std::chrono::milliseconds timeout) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1;
  if (ok && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ok = errno == EINPROGRESS;
    if (ok) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      ok = ::poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
           ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
  }
  if (ok && http_path) {
    std::string request = "GET " + *http_path + " HTTP/1.1\r\nHost: " + host + ":" +
                          std::to_string(port) +
                          "\r\nUser-Agent: kube-probe/1.32\r\nConnection: close\r\n\r\n";
    ok = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(request.size());
    std::string head;
    auto deadline = Clock::now() + timeout;
    while (ok && head.find("\r\n") == std::string::npos && Clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (::poll(&p, 1, std::max(left, 1)) != 1) break;
      char buf[256];
      ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      head.append(buf, static_cast<size_t>(n));
    }
    // "HTTP/1.1 200 OK"
    ok = head.size() > 12 && head.compare(0, 5, "HTTP/") == 0;
    if (ok) {
      int code = std::atoi(head.c_str() + head.find(' ') + 1);
      ok = code >= 200 && code < 400;
    }
  }
  ::close(fd);
  return ok;
}

}  // namespace

struct ProcessKubelet::Container {
  std::string name;
  pid_t pid = -1;
  ContainerRun run;
  int restart_count = 0;
  bool ever_started = false;
  std::string started_at, finished_at;
  std::string reason = "ContainerCreating", message;
  int signal = 0;
  json last_state = json::object();
  Clock::time_point next_start{};
  Clock::time_point running_since{};
  // Readiness.
  bool ready = false;
  int probe_successes = 0, probe_failures = 0;
  Clock::time_point next_probe{};
  std::string probe_message;
  // terminationMessagePath, as a file of the pod's directory, and terminationMessagePolicy.
  std::string termination_file;
  bool fallback_to_logs = false;
};

struct ProcessKubelet::PodRuntime {
  std::string uid, ns, name, ip, node, dir;
  std::string start_time;
  std::map<std::string, std::string> volume_dirs;
  bool materialised = false;
  std::string config_error;  // why volumes could not be set up
  std::vector<Container> containers;
  bool terminating = false;
  bool killed = false;
  bool delete_sent = false;
  Clock::time_point kill_at{};
};

std::string ProcessKubelet::LogPath(const std::string& data_dir, const std::string& ns,
                                    const std::string& pod, const std::string& container) {
  return data_dir + "/logs/" + ns + "/" + pod + "/" + container + ".log";
}

ProcessKubelet::ProcessKubelet(ApiServer& api, KubeletOptions options)
    : api_(api), options_(std::move(options)) {}

ProcessKubelet::~ProcessKubelet() {
  Stop();
  if (block_lock_ >= 0) ::close(block_lock_);
}

void ProcessKubelet::Start() {
  // Claim a block of pod addresses before any pod is started. Blocks 1..254 (block 0 holds
  // 127.0.0.1, where the API server and tests listen).
  for (int block = 1; block < 255 && block_lock_ < 0; ++block) {
    const std::string path = "/tmp/tidal-local-127." + std::to_string(block) + ".lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;  // another user's lock file: that block is theirs
    ::fchmod(fd, 0666);    // whoever comes next may lock it once this process is gone
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      block_ = block;
      block_lock_ = fd;
    } else {
      ::close(fd);
    }
  }
  if (block_lock_ < 0)
    Log("warn", "every block of pod addresses is held by another tidal local; pods share 127.0.x.y",
        {});
  thread_ = std::thread([this] { Run(); });
}

void ProcessKubelet::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ProcessKubelet::Run() {
  while (!stop_) {
    int64_t version = api_.store().CurrentVersion();
    const auto started = Clock::now();
    Pass();
    // With thousands of pods a pass takes a while, and the statuses it writes wake the next
    // one at once: rest as long as a slow pass took, so the kubelet leaves the machine at
    // least half of a core for the pods themselves.
    const auto took = Clock::now() - started;
    if (took > std::chrono::milliseconds(5))
      std::this_thread::sleep_for(std::min<Clock::duration>(took, std::chrono::seconds(1)));
    // Wake on the next pod change, or after the resync period for timers and exits.
    auto changes = api_.store().EventsAfter(version, "/pods", options_.resync);
    if (!changes.ok()) std::this_thread::sleep_for(options_.resync);
  }
  // Shutdown, on this thread (children are tied to it by PR_SET_PDEATHSIG): SIGTERM every
  // process group, give them two seconds, then SIGKILL what is left.
  for (auto& [uid, runtime] : pods_)
    for (Container& c : runtime->containers)
      if (c.pid > 0) ::kill(-c.pid, SIGTERM);
  auto deadline = Clock::now() + std::chrono::seconds(2);
  bool any = true;
  while (any && Clock::now() < deadline) {
    any = false;
    for (auto& [uid, runtime] : pods_) {
      Reap(*runtime);
      for (Container& c : runtime->containers) any = any || c.pid > 0;
    }
    if (any) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& [uid, runtime] : pods_)
    for (Container& c : runtime->containers)
      if (c.pid > 0) {
        ::kill(-c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
        c.pid = -1;
      }
}

void ProcessKubelet::Pass() {
  // The store's objects are immutable snapshots: hold them, do not copy them.
  const std::set<std::string> lost = LostNodes();
  const std::vector<ObjectPtr> pods = api_.store().List("/pods", "");
  std::set<std::string> nodes;
  std::vector<NodeInfo> schedulable;
  std::set<std::string> no_execute;  // node + "\n" + key of every NoExecute taint there now
  for (const NodeInfo& n : options_.nodes) {
    if (lost.count(n.name)) continue;
    nodes.insert(n.name);
    schedulable.push_back(n);
    // What `kubectl cordon` and `kubectl taint` changed on the Node object.
    if (ObjectPtr object = api_.store().Get({"/nodes", "", n.name}))
      ReadNodeSpec(*object, schedulable.back());
    for (const Taint& t : schedulable.back().taints)
      if (t.effect == "NoExecute") no_execute.insert(n.name + "\n" + t.key);
  }
  // A taint removed and put back later is timed afresh.
  std::erase_if(taint_seen_, [&](const auto& seen) { return !no_execute.count(seen.first); });
  // What the scheduler and the IP allocator need from all pods, gathered once per pass.
  GpuUsage usage;
  ips_in_use_ = {"127.0.0.1"};
  for (const ObjectPtr& p : pods) {
    usage.Add(*p);
    ips_in_use_.insert(StringField(Field(*p, "status"), "podIP"));
  }
  for (const auto& [uid, runtime] : pods_) ips_in_use_.insert(runtime->ip);
  std::set<std::string> seen;
  // As kube-scheduler's queue: the pods waiting for a node are bound highest priority first
  // (spec.priority, which the API server's Priority admission set), the older first among equals.
  std::vector<const json*> waiting;
  for (const ObjectPtr& p : pods)
    if (StringField(Field(*p, "spec"), "nodeName").empty() &&
        !Field(*p, "metadata").contains("deletionTimestamp"))
      waiting.push_back(p.get());
  auto priority = [](const json& pod) {
    const json& v = Field(Field(pod, "spec"), "priority");
    return v.is_number_integer() ? v.get<int64_t>() : int64_t{0};
  };
  std::stable_sort(waiting.begin(), waiting.end(), [&](const json* a, const json* b) {
    if (priority(*a) != priority(*b)) return priority(*a) > priority(*b);
    return StringField(Field(*a, "metadata"), "creationTimestamp") <
           StringField(Field(*b, "metadata"), "creationTimestamp");
  });
  for (const json* pod : waiting) Bind(*pod, schedulable, usage);
  for (const ObjectPtr& p : pods) {
    const json& pod = *p;
    std::string uid = StringField(Field(pod, "metadata"), "uid");
    seen.insert(uid);
    std::string node = StringField(Field(pod, "spec"), "nodeName");
    if (node.empty()) continue;  // bound above, or waiting
    bool deleting = Field(pod, "metadata").contains("deletionTimestamp");
    if (!nodes.count(node)) continue;
    if (!deleting)
      for (const NodeInfo& n : schedulable)
        if (n.name == node) EvictForTaints(pod, n);
    Sync(pod);
  }
  // Pods gone from the store without a graceful end (force deletion): kill at once. So are
  // those of a lost node (its power is off).
  std::vector<std::string> gone;
  for (const auto& [uid, runtime] : pods_)
    if (!seen.count(uid) || lost.count(runtime->node)) gone.push_back(uid);
  for (const std::string& uid : gone) Forget(uid);
}

std::set<std::string> ProcessKubelet::LostNodes() {
  std::set<std::string> lost;
  for (const ObjectPtr& n : api_.store().List("/nodes", "")) {
    const json& annotations = Field(Field(*n, "metadata"), "annotations");
    if (StringField(annotations, kLostNodeAnnotation) == "true")
      lost.insert(StringField(Field(*n, "metadata"), "name"));
  }
  for (const std::string& name : lost)
    if (!lost_.count(name)) MarkNode(name, true);
  for (const std::string& name : lost_)
    if (!lost.count(name)) MarkNode(name, false);
  lost_ = lost;
  return lost;
}

void ProcessKubelet::MarkNode(const std::string& name, bool lost) {
  auto nodes = api_.registry().Find("", "v1", "nodes");
  auto live = api_.store().Get({"/nodes", "", name});
  if (!nodes || !live) return;
  // spec.taints: the node lifecycle controller's for an unreachable node, or none.
  json node = *live;
  json taints = json::array();
  for (const json& t : Field(Field(node, "spec"), "taints"))
    if (StringField(t, "key") != "node.kubernetes.io/unreachable") taints.push_back(t);
  if (lost)
    for (const char* effect : {"NoSchedule", "NoExecute"})
      taints.push_back({{"key", "node.kubernetes.io/unreachable"},
                        {"effect", effect},
                        {"timeAdded", NowRfc3339()}});
  if (!node["spec"].is_object()) node["spec"] = json::object();
  if (taints.empty())
    node["spec"].erase("taints");  // omitempty, as the API serves it
  else
    node["spec"]["taints"] = taints;
  ApiResult tainted = api_.writer().Update(*nodes, "", name, node, "", WriteOptions{});
  // status: Ready Unknown (NodeStatusUnknown), or Ready again.
  live = api_.store().Get({"/nodes", "", name});
  if (!tainted.ok() || !live) return;
  json status = *live;
  json conditions = json::array();
  for (const json& c : Field(Field(status, "status"), "conditions")) {
    json condition = c;
    if (StringField(c, "type") == "Ready") {
      condition["status"] = lost ? "Unknown" : "True";
      condition["reason"] = lost ? "NodeStatusUnknown" : "KubeletReady";
      condition["message"] =
          lost ? "Kubelet stopped posting node status." : "tidal local process kubelet is ready";
      condition["lastTransitionTime"] = NowRfc3339();
    }
    conditions.push_back(condition);
  }
  status["status"]["conditions"] = conditions;
  api_.writer().Update(*nodes, "", name, status, "status", WriteOptions{});
  Log("info", lost ? "node lost: its processes are killed and it posts nothing more" : "node back",
      {{"node", name}});
}

void ProcessKubelet::EvictForTaints(const json& pod, const NodeInfo& node) {
  std::optional<std::chrono::system_clock::time_point> evict_at;
  std::string why;
  const auto now = std::chrono::system_clock::now();
  for (const Taint& t : node.taints) {
    if (t.effect != "NoExecute") continue;
    const kube::Toleration toleration = kube::TolerationOf(pod, t);
    if (toleration.tolerated && !toleration.seconds) continue;  // tolerated for good
    auto added = now;
    if (auto parsed = kube::ParseRfc3339(t.time_added); !t.time_added.empty() && parsed.ok())
      added = *parsed;
    else
      added = taint_seen_.try_emplace(node.name + "\n" + t.key, now).first->second;
    const auto at = toleration.tolerated
                        ? added + std::chrono::seconds(std::max<int64_t>(0, *toleration.seconds))
                        : added;
    if (!evict_at || at < *evict_at) {
      evict_at = at;
      why = t.key + (t.value.empty() ? "" : "=" + t.value) + ":NoExecute";
    }
  }
  if (!evict_at || now < *evict_at) return;
  auto pods = api_.registry().Find("", "v1", "pods");
  const json& meta = Field(pod, "metadata");
  const std::string ns = StringField(meta, "namespace"), name = StringField(meta, "name");
  if (!pods) return;
  // With the pod's own grace period, as upstream's taint eviction controller deletes.
  ApiResult deleted = api_.writer().Delete(
      *pods, ns, name, {{"preconditions", {{"uid", StringField(meta, "uid")}}}});
  if (!deleted.ok()) return;
  RecordEvent(pod, "Normal", "TaintManagerEviction", "Marking for deletion Pod " + ns + "/" + name,
              "taint-eviction-controller");
  Log("info", "taint eviction", {{"pod", ns + "/" + name}, {"node", node.name}, {"taint", why}});
}

void ProcessKubelet::Bind(const json& pod, const std::vector<NodeInfo>& nodes, GpuUsage& usage) {
  auto pods_info = api_.registry().Find("", "v1", "pods");
  const json& meta = Field(pod, "metadata");
  std::string ns = StringField(meta, "namespace"), name = StringField(meta, "name");
  ScheduleResult decision = Schedule(pod, nodes, usage);
  if (decision.node.empty()) {
    // As the scheduler: Pending with PodScheduled=False, reason Unschedulable (written once per
    // distinct message, with a FailedScheduling Event).
    for (const json& c : Field(Field(pod, "status"), "conditions"))
      if (StringField(c, "type") == "PodScheduled" && StringField(c, "message") == decision.message)
        return;
    json body = pod;
    body["status"]["phase"] = "Pending";
    body["status"]["conditions"] = json::array({{{"type", "PodScheduled"},
                                                 {"status", "False"},
                                                 {"reason", "Unschedulable"},
                                                 {"message", decision.message},
                                                 {"lastProbeTime", nullptr},
                                                 {"lastTransitionTime", NowRfc3339()}}});
    if (api_.writer().Update(*pods_info, ns, name, body, "status", WriteOptions{}).ok()) {
      RecordEvent(pod, "Warning", "FailedScheduling", decision.message, "default-scheduler");
      Log("info", "pod unschedulable", {{"pod", ns + "/" + name}, {"reason", decision.message}});
    }
    return;
  }
  json body = pod;
  body["spec"]["nodeName"] = decision.node;
  if (!decision.gpu_ids.empty()) {
    std::string ids;
    for (int id : decision.gpu_ids) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    body["metadata"]["annotations"][kGpuIdsAnnotation] = ids;
  }
  ApiResult bound = api_.writer().Update(*pods_info, ns, name, body, "", WriteOptions{"Ignore"});
  if (!bound.ok()) return;  // changed meanwhile: the next pass looks again
  usage.Hold(decision.node, decision.gpu_ids, pod);
  RecordEvent(pod, "Normal", "Scheduled",
              "Successfully assigned " + ns + "/" + name + " to " + decision.node,
              "default-scheduler");
  Log("info", "pod bound", {{"pod", ns + "/" + name}, {"node", decision.node}});
}

void ProcessKubelet::RecordEvent(const json& pod, const std::string& type,
                                 const std::string& reason, const std::string& message,
                                 const std::string& component) {
  auto events = api_.registry().Find("", "v1", "events");
  if (!events) return;
  const json& meta = Field(pod, "metadata");
  std::string ns = StringField(meta, "namespace");
  std::string now = NowRfc3339();
  json event = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"generateName", StringField(meta, "name") + "."}, {"namespace", ns}}},
      {"involvedObject",
       {{"apiVersion", "v1"},
        {"kind", "Pod"},
        {"name", StringField(meta, "name")},
        {"namespace", ns},
        {"uid", StringField(meta, "uid")}}},
      {"type", type},
      {"reason", reason},
      {"message", message},
      {"source", {{"component", component}}},
      {"count", 1},
      {"firstTimestamp", now},
      {"lastTimestamp", now},
      {"reportingComponent", component}};
  api_.writer().Create(*events, ns, event, WriteOptions{});
}

void ProcessKubelet::Sync(const json& pod) {
  const json& meta = Field(pod, "metadata");
  std::string uid = StringField(meta, "uid");
  std::string phase = StringField(Field(pod, "status"), "phase");
  bool finished = phase == "Succeeded" || phase == "Failed";
  auto it = pods_.find(uid);
  if (it == pods_.end()) {
    if (finished && !meta.contains("deletionTimestamp")) return;  // nothing left to run
    auto runtime = std::make_unique<PodRuntime>();
    runtime->uid = uid;
    runtime->ns = StringField(meta, "namespace");
    runtime->name = StringField(meta, "name");
    runtime->node = StringField(Field(pod, "spec"), "nodeName");
    runtime->dir = options_.data_dir + "/pods/" + uid;
    const json& status = Field(pod, "status");
    runtime->ip = StringField(status, "podIP");
    runtime->start_time = StringField(status, "startTime");
    if (runtime->start_time.empty()) runtime->start_time = NowRfc3339();
    if (runtime->ip.empty()) runtime->ip = AllocateIp();
    // What an earlier `tidal local` recorded: its processes died with it (PDEATHSIG).
    std::map<std::string, json> previous;
    for (const json& s : Field(status, "containerStatuses")) previous[StringField(s, "name")] = s;
    for (const json& spec : Field(Field(pod, "spec"), "containers")) {
      Container c;
      c.name = StringField(spec, "name");
      auto p = previous.find(c.name);
      if (p != previous.end()) {
        const json& s = p->second;
        c.restart_count = static_cast<int>(IntField(s, "restartCount", 0));
        c.last_state = Field(s, "lastState").is_object() ? Field(s, "lastState") : json::object();
        const json& state = Field(s, "state");
        if (state.contains("running") || state.contains("terminated")) {
          const json& t = state.contains("terminated") ? state["terminated"] : json::object();
          c.ever_started = true;
          c.run.state = ContainerRun::kTerminated;
          c.run.exit_code = static_cast<int>(IntField(t, "exitCode", 137));
          c.reason = t.is_object() && t.contains("reason") ? StringField(t, "reason")
                                                           : "ContainerStatusUnknown";
          c.message = t.contains("reason") ? StringField(t, "message")
                                           : "The container could not be located when the pod "
                                             "was terminated (tidal local restarted)";
          c.started_at = state.contains("running") ? StringField(state["running"], "startedAt")
                                                   : StringField(t, "startedAt");
          c.finished_at = t.contains("finishedAt") ? StringField(t, "finishedAt") : NowRfc3339();
        } else if (c.restart_count > 0 || !c.last_state.empty()) {
          c.ever_started = true;
          c.run.terminated_before = true;
        }
      }
      runtime->containers.push_back(std::move(c));
    }
    it = pods_.emplace(uid, std::move(runtime)).first;
  }
  PodRuntime& runtime = *it->second;
  if (meta.contains("deletionTimestamp")) return Terminate(runtime, pod);
  Reap(runtime);
  if (!finished) {
    if (!runtime.materialised) {
      Status s = Materialise(runtime, pod);
      runtime.config_error = s.ok() ? "" : s.message();
      runtime.materialised = s.ok();
    }
    std::string policy = StringField(Field(pod, "spec"), "restartPolicy");
    const json& specs = Field(Field(pod, "spec"), "containers");
    for (size_t i = 0; i < runtime.containers.size() && i < specs.size(); ++i) {
      Container& c = runtime.containers[i];
      if (c.run.state == ContainerRun::kTerminated && ShouldRestart(policy, c.run.exit_code)) {
        // Back-off before the next start, as kubelet's: 0 for the first restart, then
        // initial × 2^(n−1) up to the maximum; reset after a long clean run.
        json terminated = {{"exitCode", c.run.exit_code},
                           {"reason", c.reason},
                           {"startedAt", c.started_at},
                           {"finishedAt", c.finished_at}};
        if (!c.message.empty()) terminated["message"] = c.message;
        if (c.signal) terminated["signal"] = c.signal;
        c.last_state = {{"terminated", terminated}};
        c.run.state = ContainerRun::kWaiting;
        c.run.terminated_before = true;
        auto delay = std::chrono::milliseconds(0);
        if (c.restart_count > 0) {
          delay = options_.initial_backoff;
          for (int n = 1; n < c.restart_count && delay < options_.max_backoff; ++n) delay *= 2;
          delay = std::min(delay, options_.max_backoff);
        }
        c.next_start = Clock::now() + delay;
        c.reason = "CrashLoopBackOff";
        c.message = "back-off " + std::to_string(delay.count() / 1000) +
                    "s restarting failed container=" + c.name + " pod=" + runtime.name + "_" +
                    runtime.ns + "(" + runtime.uid + ")";
        if (delay.count() > 0)
          RecordEvent(pod, "Warning", "BackOff", "Back-off restarting failed container " + c.name,
                      "kubelet");
      }
      if (c.run.state == ContainerRun::kWaiting && Clock::now() >= c.next_start) {
        if (!runtime.materialised) {
          c.reason = "CreateContainerConfigError";
          c.message = runtime.config_error;
          continue;
        }
        StartContainer(runtime, pod, specs[i], c);
      }
    }
    Probe(runtime, pod);
  }
  WriteStatus(pod, runtime);
}

Status ProcessKubelet::Materialise(PodRuntime& runtime, const json& pod) {
  std::error_code ec;
  fs::create_directories(runtime.dir + "/volumes", ec);
  if (ec) return Unavailable("cannot create " + runtime.dir + ": " + ec.message());
  auto lookup = [&](const std::string& resource, const std::string& name) {
    return api_.store().Get({resource, runtime.ns, name});
  };
  for (const json& volume : Field(Field(pod, "spec"), "volumes")) {
    std::string name = StringField(volume, "name");
    std::string dir = runtime.dir + "/volumes/" + name;
    if (const json& host = Field(volume, "hostPath"); host.is_object()) {
      runtime.volume_dirs[name] = StringField(host, "path");
      continue;
    }
    fs::create_directories(dir, ec);
    runtime.volume_dirs[name] = dir;
    if (Field(volume, "emptyDir").is_object()) continue;
    const json* source = nullptr;
    std::string resource, kind, object_name;
    if (const json& s = Field(volume, "secret"); s.is_object()) {
      source = &s, resource = "/secrets", kind = "Secret",
      object_name = StringField(s, "secretName");
    } else if (const json& c = Field(volume, "configMap"); c.is_object()) {
      source = &c, resource = "/configmaps", kind = "ConfigMap",
      object_name = StringField(c, "name");
    } else {
      return InvalidArgument("volume \"" + name +
                             "\": tidal local supports secret, configMap, emptyDir and hostPath "
                             "volumes only");
    }
    auto object = lookup(resource, object_name);
    if (!object) {
      if (Field(*source, "optional") == true) continue;
      return NotFound(std::string(kind == "Secret" ? "secret" : "configmap") + " \"" + object_name +
                      "\" not found (volume \"" + name + "\")");
    }
    mode_t mode = static_cast<mode_t>(IntField(*source, "defaultMode", 0644));
    std::map<std::string, std::string> values;
    for (const char* field : {"data", "binaryData"}) {
      const json& data = Field(*object, field);
      if (!data.is_object()) continue;
      for (const auto& [k, v] : data.items()) {
        if (!v.is_string()) continue;
        bool base64 = kind == "Secret" || std::string(field) == "binaryData";
        auto decoded = base64 ? Base64Decode(v.get<std::string>())
                              : std::optional<std::string>(v.get<std::string>());
        if (decoded) values[k] = *decoded;
      }
    }
    const json& items = Field(*source, "items");
    if (items.is_array() && !items.empty()) {
      for (const json& item : items) {
        std::string key = StringField(item, "key");
        auto v = values.find(key);
        if (v == values.end())
          return NotFound("couldn't find key " + key + " in " + kind + " " + runtime.ns + "/" +
                          object_name + " (volume \"" + name + "\")");
        std::string path = StringField(item, "path");
        if (path.empty() || path[0] == '/' || path.find("..") != std::string::npos)
          return InvalidArgument("volume \"" + name + "\": items path \"" + path +
                                 "\" must be relative without '..'");
        TIDAL_RETURN_IF_ERROR(WriteVolumeFile(dir + "/" + path, v->second,
                                              static_cast<mode_t>(IntField(item, "mode", mode))));
      }
    } else {
      for (const auto& [k, v] : values)
        TIDAL_RETURN_IF_ERROR(WriteVolumeFile(dir + "/" + k, v, mode));
    }
  }
  return OkStatus();
}

void ProcessKubelet::StartContainer(PodRuntime& runtime, const json& pod, const json& spec,
                                    Container& c) {
  PodContext context;
  context.pod_ip = runtime.ip;
  context.node_name = runtime.node;
  context.pod_dir = runtime.dir;
  context.mounts = ContainerMounts(spec, runtime.volume_dirs);
  // The termination message: what the process writes to terminationMessagePath (default
  // /dev/termination-log), a file of the pod's directory here, becomes the message of its
  // terminated state; with FallbackToLogsOnError an empty one after a failure is the log's tail.
  std::string message_path = StringField(spec, "terminationMessagePath");
  if (message_path.empty()) message_path = "/dev/termination-log";
  c.termination_file = runtime.dir + "/termination-log." + c.name;
  c.fallback_to_logs = StringField(spec, "terminationMessagePolicy") == "FallbackToLogsOnError";
  context.mounts.push_back({message_path, c.termination_file});
  {
    std::error_code ignored;
    fs::remove(c.termination_file, ignored);
  }
  const char* path = std::getenv("PATH");
  context.base_env = {{"PATH", path ? path : "/usr/local/bin:/usr/bin:/bin"},
                      {"HOME", runtime.dir},
                      {"HOSTNAME", runtime.name},
                      {"KUBERNETES_SERVICE_HOST", "127.0.0.1"},
                      {"KUBERNETES_SERVICE_PORT", std::to_string(options_.api_port)},
                      {"TIDAL_LOCAL_POD_DIR", runtime.dir}};
  for (const char* pass : {"LD_LIBRARY_PATH", "LANG", "TZ"})
    if (const char* v = std::getenv(pass)) context.base_env[pass] = v;
  std::string gpu_ids =
      StringField(Field(Field(pod, "metadata"), "annotations"), kGpuIdsAnnotation);
  context.base_env["NVIDIA_VISIBLE_DEVICES"] = gpu_ids.empty() ? "void" : gpu_ids;
  context.base_env["CUDA_VISIBLE_DEVICES"] = gpu_ids;
  context.lookup = [&](const std::string& kind, const std::string& name) -> std::optional<json> {
    auto object =
        api_.store().Get({kind == "Secret" ? "/secrets" : "/configmaps", runtime.ns, name});
    if (!object) return std::nullopt;
    return *object;
  };
  auto prepared = PrepareContainer(pod, spec, options_.images, context);
  auto backoff_after_error = [&](const std::string& reason, const std::string& message) {
    c.run.state = ContainerRun::kWaiting;
    c.reason = reason;
    c.message = message;
    c.next_start = Clock::now() + options_.initial_backoff;
    RecordEvent(pod, "Warning", "Failed", "Error: " + message, "kubelet");
    Log("warn", "container cannot start",
        {{"pod", runtime.ns + "/" + runtime.name}, {"container", c.name}, {"reason", message}});
  };
  if (auto* error = std::get_if<LaunchError>(&prepared))
    return backoff_after_error(error->reason, error->message);
  auto& launch = std::get<ContainerLaunch>(prepared);

  std::error_code ec;
  fs::create_directories(launch.working_dir, ec);
  std::string log = LogPath(options_.data_dir, runtime.ns, runtime.name, c.name);
  fs::create_directories(fs::path(log).parent_path(), ec);
  if (options_.keep_logs && fs::exists(log)) {
    KeepLog(log, runtime.ns, runtime.name, c.name);
    // A new file, not the archived one truncated (the rename below makes one too).
    if (!c.ever_started) fs::remove(log, ec);
  }
  if (c.ever_started && fs::exists(log)) fs::rename(log, log + ".previous", ec);
  int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int err_pipe[2] = {-1, -1};
  if (log_fd < 0 || null_fd < 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    if (log_fd >= 0) ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    return backoff_after_error("RunContainerError",
                               "cannot open " + log + ": " + std::strerror(errno));
  }
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv, envp;
  std::vector<std::string> env_strings;
  for (auto& a : launch.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (const auto& [k, v] : launch.env) env_strings.push_back(k + "=" + v);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP}) ::signal(sig, SIG_DFL);
    ::dup2(null_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    int err = 0;
    if (::chdir(launch.working_dir.c_str()) != 0) err = errno;
    if (!err) {
#ifdef SYS_close_range
      ::syscall(SYS_close_range, 3U, ~0U, 4U /* CLOSE_RANGE_CLOEXEC */);
#endif
      ::execve(argv[0], argv.data(), envp.data());
      err = errno;
    }
    ssize_t ignored = ::write(err_pipe[1], &err, sizeof(err));
    (void)ignored;
    ::_exit(127);
  }
  ::close(err_pipe[1]);
  ::close(log_fd);
  ::close(null_fd);
  if (pid < 0) {
    ::close(err_pipe[0]);
    return backoff_after_error("RunContainerError", std::string("fork: ") + std::strerror(errno));
  }
  ::setpgid(pid, pid);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(err_pipe[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  ::close(err_pipe[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    ::waitpid(pid, nullptr, 0);
    return backoff_after_error("RunContainerError", "exec: \"" + launch.argv[0] + "\" in " +
                                                        launch.working_dir + ": " +
                                                        std::strerror(child_errno));
  }
  if (c.ever_started) ++c.restart_count;
  c.ever_started = true;
  c.pid = pid;
  c.run.state = ContainerRun::kRunning;
  c.started_at = NowRfc3339();
  c.running_since = Clock::now();
  c.reason.clear();
  c.message.clear();
  c.signal = 0;
  c.probe_successes = c.probe_failures = 0;
  c.ready = !Field(spec, "readinessProbe").is_object();
  RecordEvent(pod, "Normal", "Started", "Started container " + c.name, "kubelet");
  Log("info", "container started",
      {{"pod", runtime.ns + "/" + runtime.name},
       {"container", c.name},
       {"pid", pid},
       {"podIP", runtime.ip},
       {"argv", launch.argv}});
}

namespace {

// Kubernetes keeps at most 4096 bytes of the file; from the logs, the last 80 lines or 2048
// bytes, whichever is less.
std::string ReadTail(const std::string& path, size_t max_bytes, size_t max_lines) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  std::string text = all.str();
  if (text.size() > max_bytes) text = text.substr(text.size() - max_bytes);
  // A trailing newline ends the last line; it does not start another.
  size_t start = text.size() - (!text.empty() && text.back() == '\n' ? 1 : 0);
  for (size_t lines = 0; start > 0;) {
    const size_t nl = text.rfind('\n', start - 1);
    if (nl == std::string::npos) return text;
    if (++lines == max_lines) return text.substr(nl + 1);
    start = nl;
  }
  return text;
}

}  // namespace

std::string ProcessKubelet::TerminationMessage(const Container& c, const std::string& log) {
  std::ifstream in(c.termination_file, std::ios::binary);
  std::string message(4096, '\0');
  in.read(message.data(), static_cast<std::streamsize>(message.size()));
  message.resize(static_cast<size_t>(in.gcount()));  // what was read: none when absent
  if (message.empty() && c.fallback_to_logs && c.run.exit_code != 0)
    message = ReadTail(log, 2048, 80);
  return message;
}

void ProcessKubelet::Reap(PodRuntime& runtime) {
  for (Container& c : runtime.containers) {
    if (c.pid <= 0) continue;
    int status = 0;
    pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r == 0) continue;
    // The main process is gone: like a container runtime, take the rest of its group with it.
    ::kill(-c.pid, SIGKILL);
    c.pid = -1;
    c.run.state = ContainerRun::kTerminated;
    c.signal = 0;
    if (r < 0) {
      c.run.exit_code = 137;
    } else if (WIFEXITED(status)) {
      c.run.exit_code = WEXITSTATUS(status);
    } else {
      c.signal = WTERMSIG(status);
      c.run.exit_code = 128 + c.signal;
    }
    c.reason = c.run.exit_code == 0 ? "Completed" : "Error";
    c.message = TerminationMessage(c, LogPath(options_.data_dir, runtime.ns, runtime.name, c.name));
    c.finished_at = NowRfc3339();
    c.ready = false;
    Log(c.run.exit_code == 0 ? "info" : "warn", "container exited",
        {{"pod", runtime.ns + "/" + runtime.name},
         {"container", c.name},
         {"exitCode", c.run.exit_code}});
  }
}

void ProcessKubelet::Terminate(PodRuntime& runtime, const json& pod) {
  const json& meta = Field(pod, "metadata");
  int64_t grace = IntField(meta, "deletionGracePeriodSeconds", 30);
  auto kill_at = Clock::now() + std::chrono::seconds(grace);
  if (!runtime.terminating) {
    runtime.terminating = true;
    runtime.kill_at = kill_at;
    bool any = false;
    for (Container& c : runtime.containers) {
      if (c.pid <= 0) continue;
      ::kill(-c.pid, grace > 0 ? SIGTERM : SIGKILL);
      any = true;
    }
    if (any)
      RecordEvent(pod, "Normal", "Killing",
                  "Stopping container(s) with a grace period of " + std::to_string(grace) + "s",
                  "kubelet");
  } else if (kill_at < runtime.kill_at) {
    runtime.kill_at = kill_at;  // a shorter grace period was asked for since
  }
  Reap(runtime);
  bool running = false;
  for (Container& c : runtime.containers) running = running || c.pid > 0;
  if (running && !runtime.killed && Clock::now() >= runtime.kill_at) {
    runtime.killed = true;
    for (Container& c : runtime.containers)
      if (c.pid > 0) ::kill(-c.pid, SIGKILL);
    Log("warn", "grace period over: SIGKILL", {{"pod", runtime.ns + "/" + runtime.name}});
  }
  if (running || runtime.delete_sent) return;
  // Every process is gone: the kubelet's final delete (grace 0, this uid only).
  WriteStatus(pod, runtime);
  auto pods_info = api_.registry().Find("", "v1", "pods");
  api_.writer().Delete(*pods_info, runtime.ns, runtime.name,
                       {{"gracePeriodSeconds", 0}, {"preconditions", {{"uid", runtime.uid}}}});
  runtime.delete_sent = true;
}

void ProcessKubelet::Probe(PodRuntime& runtime, const json& pod) {
  const json& specs = Field(Field(pod, "spec"), "containers");
  for (size_t i = 0; i < runtime.containers.size() && i < specs.size(); ++i) {
    Container& c = runtime.containers[i];
    const json& probe = Field(specs[i], "readinessProbe");
    if (c.run.state != ContainerRun::kRunning || !probe.is_object()) continue;
    auto now = Clock::now();
    if (c.next_probe == Clock::time_point{})
      c.next_probe =
          c.running_since + std::chrono::seconds(IntField(probe, "initialDelaySeconds", 0));
    if (now < c.next_probe) continue;
    c.next_probe =
        now + std::chrono::seconds(std::max<int64_t>(1, IntField(probe, "periodSeconds", 10)));
    auto timeout = std::chrono::seconds(std::max<int64_t>(1, IntField(probe, "timeoutSeconds", 1)));
    // The probe's port: a number or the name of one of the container's ports.
    auto port_of = [&](const json& handler) -> int {
      const json& port = Field(handler, "port");
      if (port.is_number_integer()) return port.get<int>();
      if (port.is_string()) {
        for (const json& p : Field(specs[i], "ports"))
          if (StringField(p, "name") == port.get<std::string>())
            return static_cast<int>(IntField(p, "containerPort", 0));
        const std::string& s = port.get_ref<const std::string&>();
        if (!s.empty() && std::all_of(s.begin(), s.end(), ::isdigit)) return std::stoi(s);
      }
      return 0;
    };
    bool ok = false;
    if (const json& tcp = Field(probe, "tcpSocket"); tcp.is_object()) {
      std::string host = StringField(tcp, "host").empty() ? runtime.ip : StringField(tcp, "host");
      ok = ProbeOnce(host, port_of(tcp), nullptr, timeout);
      c.probe_message = ok ? ""
                           : "Readiness probe failed: dial tcp " + host + ":" +
                                 std::to_string(port_of(tcp)) + ": connect: connection refused";
    } else if (const json& get = Field(probe, "httpGet"); get.is_object()) {
      std::string host = StringField(get, "host").empty() ? runtime.ip : StringField(get, "host");
      std::string path = StringField(get, "path").empty() ? "/" : StringField(get, "path");
      if (StringField(get, "scheme") == "HTTPS") {
        c.probe_message = "Readiness probe: httpGet over HTTPS is not supported by tidal local";
      } else {
        ok = ProbeOnce(host, port_of(get), &path, timeout);
        c.probe_message = ok ? ""
                             : "Readiness probe failed: GET http://" + host + ":" +
                                   std::to_string(port_of(get)) + path;
      }
    } else {
      c.probe_message = "Readiness probe: only tcpSocket and httpGet probes run in tidal local";
    }
    if (ok) {
      c.probe_failures = 0;
      if (++c.probe_successes >= IntField(probe, "successThreshold", 1)) c.ready = true;
    } else {
      c.probe_successes = 0;
      if (++c.probe_failures >= IntField(probe, "failureThreshold", 3)) c.ready = false;
    }
  }
}

void ProcessKubelet::WriteStatus(const json& pod, PodRuntime& runtime) {
  const json& old_status = Field(pod, "status");
  std::string policy = StringField(Field(pod, "spec"), "restartPolicy");
  const json& specs = Field(Field(pod, "spec"), "containers");
  std::vector<ContainerRun> runs;
  json statuses = json::array();
  bool all_ready = !runtime.containers.empty();
  for (size_t i = 0; i < runtime.containers.size(); ++i) {
    const Container& c = runtime.containers[i];
    runs.push_back(c.run);
    json state;
    switch (c.run.state) {
      case ContainerRun::kRunning:
        state = {{"running", {{"startedAt", c.started_at}}}};
        break;
      case ContainerRun::kTerminated: {
        json t = {{"exitCode", c.run.exit_code},
                  {"reason", c.reason},
                  {"startedAt", c.started_at},
                  {"finishedAt", c.finished_at}};
        if (!c.message.empty()) t["message"] = c.message;
        if (c.signal) t["signal"] = c.signal;
        state = {{"terminated", t}};
        break;
      }
      case ContainerRun::kWaiting: {
        json w = {{"reason", c.reason}};
        if (!c.message.empty()) w["message"] = c.message;
        state = {{"waiting", w}};
        break;
      }
    }
    all_ready = all_ready && c.ready;
    json s = {{"name", c.name},
              {"image", i < specs.size() ? StringField(specs[i], "image") : ""},
              {"imageID", ""},
              {"ready", c.ready},
              {"started", c.run.state == ContainerRun::kRunning},
              {"restartCount", c.restart_count},
              {"state", state},
              {"lastState", c.last_state}};
    if (c.ever_started) s["containerID"] = "tidal-local://" + runtime.uid + "/" + c.name;
    statuses.push_back(s);
  }
  std::string phase = PodPhase(policy, runs);
  // Conditions keep their transition time while their status holds.
  auto condition = [&](const std::string& type, bool value, const std::string& message) {
    std::string status = value ? "True" : "False";
    std::string since = NowRfc3339();
    for (const json& c : Field(old_status, "conditions"))
      if (StringField(c, "type") == type && StringField(c, "status") == status)
        since = StringField(c, "lastTransitionTime");
    json out = {{"type", type},
                {"status", status},
                {"lastProbeTime", nullptr},
                {"lastTransitionTime", since}};
    if (!value && !message.empty()) {
      out["reason"] = type == "Ready" || type == "ContainersReady" ? "ContainersNotReady" : "";
      out["message"] = message;
    }
    return out;
  };
  std::string not_ready;
  for (const Container& c : runtime.containers)
    if (!c.ready) not_ready += (not_ready.empty() ? "" : " ") + c.name;
  std::string not_ready_message;
  if (!not_ready.empty()) not_ready_message = "containers with unready status: [" + not_ready + "]";
  for (const Container& c : runtime.containers)
    if (!c.probe_message.empty() && !c.ready) not_ready_message += "; " + c.probe_message;
  bool done = phase == "Succeeded" || phase == "Failed";
  json status = {
      {"phase", phase},
      {"conditions",
       {condition("PodReadyToStartContainers", true, ""), condition("Initialized", true, ""),
        condition("Ready", all_ready && !done, not_ready_message),
        condition("ContainersReady", all_ready && !done, not_ready_message),
        condition("PodScheduled", true, "")}},
      {"hostIP", "127.0.0.1"},
      {"hostIPs", {{{"ip", "127.0.0.1"}}}},
      {"podIP", runtime.ip},
      {"podIPs", {{{"ip", runtime.ip}}}},
      {"startTime", runtime.start_time},
      {"qosClass", "BestEffort"},
      {"containerStatuses", statuses}};
  if (old_status == status) return;
  json body = pod;
  body["status"] = status;
  auto pods_info = api_.registry().Find("", "v1", "pods");
  api_.writer().Update(*pods_info, runtime.ns, runtime.name, body, "status", WriteOptions{});
}

void ProcessKubelet::Forget(const std::string& uid) {
  auto it = pods_.find(uid);
  if (it == pods_.end()) return;
  PodRuntime& runtime = *it->second;
  for (Container& c : runtime.containers)
    if (c.pid > 0) {
      ::kill(-c.pid, SIGKILL);
      ::waitpid(c.pid, nullptr, 0);
      c.pid = -1;
    }
  std::error_code ec;
  fs::remove_all(runtime.dir, ec);
  // The logs go with the pod, unless a pod of the same name has taken them over.
  bool reused = false;
  for (const auto& [other_uid, other] : pods_)
    reused = reused || (other_uid != uid && other->ns == runtime.ns && other->name == runtime.name);
  if (!reused) {
    const std::string logs = options_.data_dir + "/logs/" + runtime.ns + "/" + runtime.name;
    if (options_.keep_logs)
      for (const Container& c : runtime.containers)
        KeepLog(LogPath(options_.data_dir, runtime.ns, runtime.name, c.name), runtime.ns,
                runtime.name, c.name);
    fs::remove_all(logs, ec);
  }
  Log("info", "pod gone", {{"pod", runtime.ns + "/" + runtime.name}, {"uid", uid}});
  pods_.erase(it);
}

void ProcessKubelet::KeepLog(const std::string& log, const std::string& ns, const std::string& pod,
                             const std::string& container) {
  std::error_code ec;
  if (!fs::exists(log, ec)) return;
  const fs::path dir = fs::path(options_.data_dir) / "logs-archive" / ns / pod;
  fs::create_directories(dir, ec);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  for (int n = 0; n < 1000; ++n) {
    const fs::path kept =
        dir / (container + "-" + std::to_string(ms) + "-" + std::to_string(n) + ".log");
    if (::link(log.c_str(), kept.c_str()) == 0) return;
    if (errno != EEXIST) break;
  }
  Log("warn", "cannot keep a container log",
      {{"pod", ns + "/" + pod}, {"container", container}, {"error", std::strerror(errno)}});
}

std::string ProcessKubelet::AllocateIp() {
  for (int a = 0; a < 256; ++a)
    for (int b = 1; b < 255; ++b) {
      std::string ip =
          "127." + std::to_string(block_) + "." + std::to_string(a) + "." + std::to_string(b);
      if (ips_in_use_.insert(ip).second) return ip;
    }
  return "127.0.0.1";  // 65,000 pods on one machine: share the host's address
}

}  // namespace tidal::local
