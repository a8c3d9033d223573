// operator/controller/observe.cc — what a pass sees (TrainingJobController::Observe): the job,
// its pods as Decide reads them, their nodes, and every running worker's status — pushed, or
// asked of it without blocking the pass — with the clients, tokens and TLS that reach them.
#include <algorithm>
#include <set>

#include "common/base64.h"
#include "common/log.h"
#include "contract/client.h"
#include "kube/meta_time.h"
#include "operator/controller/controller_internal.h"
#include "operator/controller/interval_json.h"
#include "operator/reconciler/children.h"

namespace tidal::controller {

using nlohmann::json;
using reconciler::kControlPort;
using reconciler::kCreatedForGenerationAnnotation;
using reconciler::kFinalizer;
using reconciler::kPrepRole;
using reconciler::kRoleLabel;
using reconciler::kSlotLabel;
using reconciler::kTokenKey;
using reconciler::ObserveStatus;
using reconciler::PrepPodView;
using reconciler::ServiceName;
using reconciler::SpecConfigMapName;
using reconciler::TokenSecretName;
using reconciler::WorkerReport;
using reconciler::WorkerTlsServerName;
using shell::Key;
using shell::NodeNotice;
using shell::NodeSilent;

namespace shell {

bool NodeSilent(const kube::Node& node) {
  for (const kube::Condition& c : node.conditions)
    if (c.type == "Ready") return c.status != "True";  // the Node's own condition, not a job's
  return false;
}

std::string NodeNotice(const std::vector<kube::PodToleration>& tolerations,
                       const kube::Node& node) {
  const std::string& name = node.metadata.name;
  if (node.unschedulable) return "node " + name + " is cordoned";
  for (const kube::Taint& t : node.taints) {
    if (t.effect != "NoExecute") continue;
    const kube::Toleration toleration = kube::TolerationOf(tolerations, t);
    if (toleration.tolerated && !toleration.seconds) continue;
    return "node " + name + " has taint " + t.key + (t.value.empty() ? "" : "=" + t.value) +
           ":NoExecute";
  }
  return "";
}

}  // namespace shell

namespace {

WorkerReport ReportOf(const contract::WorkerStatus& s) {
  WorkerReport r;
  r.phase = s.phase;
  r.generation = s.generation;
  r.rank = s.rank;
  r.world_size = s.world_size;
  r.step = s.step;
  r.loss = s.loss;
  r.tokens_per_second = s.tokens_per_second;
  if (s.last_checkpoint) {
    r.checkpoint_step = s.last_checkpoint->step;
    r.checkpoint_kind = s.last_checkpoint->kind;
    r.checkpoint_uri = s.last_checkpoint->uri;
  }
  r.checkpoint_interval = CheckpointIntervalJson(s);
  if (s.resumed_from) {
    r.resumed_from_step = s.resumed_from->step;
    r.resumed_from_uri = s.resumed_from->uri;
  }
  r.skipped_checkpoints = s.skipped_checkpoints;
  if (s.live_checkpoint) r.live_step = s.live_checkpoint->step;
  r.last_error = s.last_error;
  r.last_error_permanent = s.last_error_permanent;
  r.gpu_utilization_percent = s.gpu_utilization_percent;
  for (const contract::StepEvent& e : s.recent_steps)
    r.recent_steps.push_back({e.step, e.loss, e.gpu_utilization_percent});
  for (const contract::HeldPart& h : s.held_parts)
    r.held.push_back({h.generation, h.rank, h.world_size, h.step});
  if (const auto& p = s.prepared_engine)
    r.prepared = WorkerReport::Prepared{p->generation, p->rank, p->world_size, p->ready, p->error};
  return r;
}

// The pod as Decide sees it; "why not running" from the scheduler or the container.
PodView ViewOf(const kube::CachedPod& pod) {
  PodView v;
  v.name = pod.name;
  v.deleting = pod.deleting;
  v.deletion_deadline = pod.deletion_deadline;
  v.node = pod.node_name;
  v.slot = std::atoi(pod.Label(kSlotLabel).c_str());
  v.created_for_generation = std::atoll(pod.Annotation(kCreatedForGenerationAnnotation).c_str());
  v.phase = pod.phase;
  v.ip = pod.ip;
  v.ready = pod.ready;
  v.reason = pod.not_running_reason;
  return v;
}

// The data phase's pod: its phase, and the outcome tidal-prep left as termination message.
PrepPodView PrepViewOf(const kube::CachedPod& pod) {
  PrepPodView v;
  v.name = pod.name;
  v.phase = pod.phase;
  v.deleting = pod.deleting;
  v.reason = pod.not_running_reason;
  v.message = pod.termination_message;
  return v;
}

}  // namespace

void TrainingJobController::FollowWorkers(const std::string& key, const Observed& observed,
                                          const Plan& plan, WorkerConnections& connections) {
  std::map<std::string, std::shared_ptr<contract::WorkerApi>> followable;
  followable.swap(connections.followable);
  std::string rank0;
  if (plan.steady)
    for (const std::string& member : plan.status.members)
      if (auto r = observed.reports.find(member);
          r != observed.reports.end() && r->second.rank == 0 &&
          r->second.generation == plan.status.generation && followable.count(member))
        rank0 = member;
  if (rank0.empty()) {
    if (connections.quiet_pod.empty()) return;  // every worker is followed already
    connections.quiet_pod.clear();
    feed_.Follow(key, followable);
    LogInfo("following every worker", {{"job", key}});
    return;
  }
  if (connections.quiet_pod != rank0) {
    connections.quiet_pod = rank0;
    feed_.Follow(key, {{rank0, followable.at(rank0)}});
    LogInfo("steady: following rank 0 alone", {{"job", key}, {"pod", rank0}});
  }
  // The others' connections go (a call still running on one keeps its client until it ends).
  std::erase_if(connections.clients, [&](const auto& c) { return c.first != rank0; });
}

std::string TrainingJobController::TokenOf(const std::string& ns, const std::string& job) const {
  kube::ObjectPtr secret = secrets_->store().Get(ns, TokenSecretName(job));
  if (!secret) return "";
  auto data = secret->find("data");
  if (data == secret->end() || !data->is_object()) return "";
  auto token = Base64Decode(data->value(kTokenKey, ""));
  return token ? *token : "";
}

TrainingJobController::WorkerConnections& TrainingJobController::ConnectionsOf(
    const std::string& key) {
  std::lock_guard<std::mutex> lock(connections_mu_);
  std::unique_ptr<WorkerConnections>& c = connections_[key];
  if (!c) c = std::make_unique<WorkerConnections>();
  return *c;  // stable: entries are erased only by this job's own reconcile
}

std::shared_ptr<contract::WorkerApi> TrainingJobController::ClientFor(
    WorkerConnections& connections, const std::string& pod, const std::string& ip,
    const std::string& token, std::chrono::milliseconds timeout) {
  if (!connections.tls_unusable.empty()) return nullptr;
  CachedClient& c = connections.clients[pod];
  if (!c.client || c.ip != ip || c.token != token || c.tls_ca != connections.tls_ca) {
    contract::ClientOptions o;
    o.lean_transport = true;  // one per worker pod: thousands of channels
    o.address = ip + ":" + std::to_string(kControlPort);
    o.token = token;
    o.timeout = timeout;
    o.tls_ca_pem = connections.tls_ca;
    if (!o.tls_ca_pem.empty()) o.tls_server_name = connections.tls_server_name;
    c.client = options_.connect ? options_.connect(o) : std::make_shared<contract::WorkerClient>(o);
    c.ip = ip;
    c.token = token;
    c.tls_ca = connections.tls_ca;
  }
  return c.client;
}

void TrainingJobController::RefreshTls(WorkerConnections& connections, const Observed& o) {
  const std::string secret = o.spec.ok() ? o.spec->worker.tls_secret_name : "";
  const auto now = Clock::now();
  if (secret == connections.tls_secret &&
      (secret.empty() || now - connections.tls_read < std::chrono::minutes(5)))
    return;
  connections.tls_secret = secret;
  connections.tls_read = now;
  connections.tls_ca.clear();
  connections.tls_unusable.clear();
  connections.tls_server_name = WorkerTlsServerName(o.name, o.namespace_);
  if (secret.empty()) return;
  auto request = kube::GetRequest(kube::Resource::Secrets(), o.namespace_, secret);
  auto read = request.ok() ? client_.Call(*request) : StatusOr<json>(request.status());
  std::optional<std::string> ca;
  if (read.ok()) {
    const json data = read->value("data", json::object());
    if (data.is_object() && data.contains("ca.crt") && data["ca.crt"].is_string())
      ca = Base64Decode(data["ca.crt"].get<std::string>());
  }
  if (!ca || ca->empty()) {
    // No CA, no verified connection: the workers stay unreachable (and the log says why)
    // rather than being spoken to in plaintext or unverified.
    connections.tls_unusable = "spec.worker.tlsSecretName " + secret + ": " +
                               (read.ok() ? "no data[ca.crt]" : read.status().ToString());
    LogWarn("the job's workers cannot be verified",
            {{"job", o.namespace_ + "/" + o.name}, {"error", connections.tls_unusable}});
    return;
  }
  connections.tls_ca = *ca;
}

std::optional<Observed> TrainingJobController::Observe(const json& job,
                                                       WorkerConnections& connections) {
  Observed o;
  const json& md = job["metadata"];
  o.name = md.value("name", "");
  o.namespace_ = md.value("namespace", "");
  o.uid = md.value("uid", "");
  o.metadata_generation = md.value("generation", int64_t{0});
  o.deleting = md.contains("deletionTimestamp") && !md["deletionTimestamp"].is_null();
  if (o.deleting && md["deletionTimestamp"].is_string())
    if (auto t = kube::ParseRfc3339(md["deletionTimestamp"].get<std::string>()); t.ok())
      o.deletion_started = *t;
  for (const json& f : md.value("finalizers", json::array())) o.has_finalizer |= f == kFinalizer;
  o.raw_spec = job.value("spec", json::object());
  o.spec = api::ParseManagedJobSpec(o.raw_spec, &o.refused_replicas);
  o.reconcile_failing = connections.reconcile_failing;
  ObserveStatus(job.value("status", json(nullptr)), o);
  if (!o.status_error.empty())
    LogWarn("unreadable status: the job is held", {{"job", o.name}, {"error", o.status_error}});
  o.service_exists = services_->store().Get(o.namespace_, ServiceName(o.name)) != nullptr;
  o.token_exists = secrets_->store().Get(o.namespace_, TokenSecretName(o.name)) != nullptr;
  o.spec_config_exists = configs_->store().Get(o.namespace_, SpecConfigMapName(o.name)) != nullptr;
  for (const std::shared_ptr<const kube::CachedPod>& p : pod_cache_.ByController(o.uid)) {
    if (p->Label(kRoleLabel) == kPrepRole) {
      o.prep_pods.push_back(PrepViewOf(*p));
      continue;
    }
    PodView view = ViewOf(*p);
    if (!view.node.empty()) {
      kube::ObjectPtr node = nodes_->store().Get("", view.node);
      auto parsed = node ? kube::NodeFromJson(*node) : StatusOr<kube::Node>(NotFound(""));
      view.node_lost = !parsed.ok() || NodeSilent(*parsed);
      if (parsed.ok()) view.node_notice = NodeNotice(p->tolerations, *parsed);
    }
    o.pods.push_back(std::move(view));
  }
  // Every running worker's status, asked of all at once; a silent one is remembered from its
  // first silence. No pass waits for an answer (a reconcile never blocks): asks run on their
  // own threads and each answer wakes the job. Some answers a decision needs: the members' of
  // the job's generation, every worker's that answered and is not silent now, and on this
  // operator's first pass over a job (a restart, a new leader) every worker's — it has yet to
  // learn which answer, and a worker at a generation the status does not know must be seen
  // before anything is decided. A drain, a recovery's survivors and buddy copies read them.
  // While one of those is out, the pass decides nothing (Observe returns none) and the
  // last answer's arrival runs the next; that one decides on answers asked since the passes
  // began waiting, or given within two status timeouts.
  // The others — pods of a generation still starting, silent ones that are no member — are
  // asked too, and what they said is read by whichever pass comes next.
  RefreshTls(connections, o);
  const std::string token = TokenOf(o.namespace_, o.name);
  if (!token.empty()) {
    connections.token = token;
    connections.token_uid = o.uid;
  }
  // And follow each one's pushed status from now on (StatusFeed): its changes wake the job.
  // A steady job's rank 0 alone (FollowWorkers).
  std::map<std::string, std::shared_ptr<contract::WorkerApi>>& followed = connections.followable;
  followed.clear();
  const std::string key = Key(o.namespace_, o.name);
  const auto steady_now = std::chrono::steady_clock::now();
  const std::set<std::string> members(o.status.members.begin(), o.status.members.end());
  const bool first_pass = !connections.observed;
  // The running workers' clients, and the newest status each one's open stream pushed.
  std::map<std::string, std::shared_ptr<contract::WorkerApi>> running;
  std::map<std::string, std::shared_ptr<const contract::WorkerStatus>> pushing;
  for (const PodView& p : o.pods) {
    if (p.phase != kube::PodPhase::kRunning || p.ip.empty() || token.empty()) continue;
    std::shared_ptr<contract::WorkerApi> c =
        ClientFor(connections, p.name, p.ip, token, options_.status_timeout);
    if (!c) {  // its TLS Secret is unusable: no call is made
      connections.unreachable_since.try_emplace(p.name, steady_now);
      connections.unreachable_error[p.name] = connections.tls_unusable;
      continue;
    }
    running[p.name] = c;
    if (!p.deleting) followed[p.name] = c;
    if (auto pushed = feed_.Latest(key, p.name, c, options_.status_timeout))
      pushing[p.name] = std::move(pushed);
  }
  std::erase_if(connections.asking, [&](const auto& a) { return !running.count(a.first); });
  if (const std::string& rank0 = connections.quiet_pod; !rank0.empty() && followed.count(rank0)) {
    feed_.Follow(key, {{rank0, followed.at(rank0)}});
    o.pushed = feed_.Pushed(key, {rank0});
  } else {
    connections.quiet_pod.clear();
    feed_.Follow(key, followed);
    o.pushed = feed_.Pushed(key, o.status.members);
  }
  // What the workers pushed stands for their answers only while the generation trains
  // undisturbed: every member pushes, Running, at the status's generation, and no rescale or
  // recovery is under way. Otherwise each of them is asked too: a push's figures may be up to
  // min_interval old, and a recovery from the survivors' memory must know exactly the step of
  // each buddy copy they hold (OperatorTest.KillNineOfAWorker… resumed from the store when a
  // pass took a survivor's pushed copies for its current ones).
  bool undisturbed = !members.empty() && !o.status.rescale;
  for (const std::string& m : members) {
    auto it = pushing.find(m);
    undisturbed = undisturbed && it != pushing.end() &&
                  it->second->phase == api::WorkerPhase::kRunning &&
                  it->second->generation == o.status.generation;
  }
  // Starts an ask; `needed`: a decision waits for it (on its own pool: a silent worker's 3 s
  // never delays it). An answer wakes the job; a failure too where `wake_on_failure`, which a
  // pass waiting for it sets (a silent worker's repeated silence wakes nobody otherwise).
  auto ask = [&](const std::string& pod, const std::shared_ptr<contract::WorkerApi>& c, bool needed,
                 bool wake_on_failure, const std::shared_ptr<WorkerConnections::Awaited>& awaited) {
    auto a = std::make_shared<WorkerConnections::Ask>();
    a->asked = steady_now;
    a->wake_on_failure = wake_on_failure;
    if (awaited) {
      ++awaited->pending;
      a->awaited = awaited;
    }
    connections.asking[pod] = a;
    (needed ? status_calls_ : background_asks_).Submit([this, c, a, key] {
      StatusOr<contract::WorkerStatus> answer = Internal("GetStatus threw");
      try {
        answer = c->GetStatus();
      } catch (const std::exception& e) {
        answer = Internal(std::string("GetStatus threw: ") + e.what());
      } catch (...) {
      }
      const bool ok = answer.ok();
      bool wake;
      std::shared_ptr<WorkerConnections::Awaited> awaited;
      {
        std::lock_guard<std::mutex> lock(a->mu);
        a->answer = std::move(answer);
        a->answered = std::chrono::steady_clock::now();
        awaited = std::move(a->awaited);
        wake = ok || a->wake_on_failure;
      }
      if (awaited) wake = --awaited->pending == 0;
      if (wake) queue_.Add(key);
    });
  };
  // Which workers' answers this pass has, which it waits for, which it asks for now.
  struct Answer {
    std::string pod;
    std::chrono::steady_clock::time_point asked;
    StatusOr<contract::WorkerStatus> status;
  };
  std::vector<Answer> answers;
  std::vector<std::pair<std::string, bool>> consumed;  // the asks whose answer this pass reads
  std::vector<std::pair<std::string, bool>> to_ask;    // pod, needed
  bool awaiting = false;
  auto awaited = std::make_shared<WorkerConnections::Awaited>();
  for (const auto& [pod, c] : running) {
    if (undisturbed && pushing.count(pod)) {
      connections.asking.erase(pod);
      answers.push_back({pod, steady_now, StatusOr<contract::WorkerStatus>(*pushing.at(pod))});
      continue;
    }
    const bool silent = connections.unreachable_since.count(pod) > 0;
    const bool needed = first_pass || members.count(pod) || pushing.count(pod) ||
                        (connections.answered.count(pod) && !silent);
    if (auto it = connections.asking.find(pod); it != connections.asking.end()) {
      WorkerConnections::Ask& a = *it->second;
      std::lock_guard<std::mutex> lock(a.mu);
      if (!a.answer) {  // still asking
        if (needed) {   // this pass's to wait for now
          ++awaited->pending;
          a.awaited = awaited;
          awaiting = true;
        }
        continue;
      }
      // An answer a decision needs is read only while fresh — asked since the passes began
      // waiting (answers that come over several status timeouts, a pool's worth of silent
      // workers at a time, all count), or answered within two status timeouts — else it is
      // asked again.
      const bool fresh = (connections.awaiting_since && a.asked >= *connections.awaiting_since) ||
                         steady_now - a.answered <= 2 * options_.status_timeout;
      if (!needed || fresh) {
        consumed.emplace_back(pod, needed);
        continue;
      }
    }
    to_ask.emplace_back(pod, needed);
    awaiting = awaiting || needed;
  }
  if (awaiting) {
    if (!connections.awaiting_since) connections.awaiting_since = steady_now;
    for (const auto& [pod, needed] : to_ask)
      ask(pod, running.at(pod), needed, !connections.unreachable_since.count(pod),
          needed ? awaited : nullptr);
    if (--awaited->pending == 0) queue_.Add(key);  // every one ended already
    return std::nullopt;                           // the last answer wakes the job
  }
  connections.observed = true;
  connections.awaiting_since.reset();
  for (const auto& [pod, needed] : consumed) {
    std::shared_ptr<WorkerConnections::Ask> a = connections.asking.at(pod);
    connections.asking.erase(pod);
    std::lock_guard<std::mutex> lock(a->mu);
    answers.push_back({pod, a->asked, std::move(*a->answer)});
    // After a failure the worker is asked again, so that its coming back wakes the job (a
    // member on the pool of the asks a decision needs: the next pass waits for it).
    if (!answers.back().status.ok()) to_ask.emplace_back(pod, needed);
  }
  for (const auto& [pod, needed] : to_ask) {
    // A silent worker's answer wakes the job; its silence again does not (it is counted).
    const std::string& name = pod;  // a lambda cannot capture a structured binding in clang 15
    const bool silent = connections.unreachable_since.count(name) ||
                        std::any_of(answers.begin(), answers.end(), [&](const Answer& a) {
                          return a.pod == name && !a.status.ok();
                        });
    ask(name, running.at(name), needed, !silent, nullptr);
  }
  o.now = Clock::now();
  for (Answer& answer : answers) {
    const std::string& pod = answer.pod;
    StatusOr<WorkerReport> s = answer.status.ok() ? StatusOr<WorkerReport>(ReportOf(*answer.status))
                                                  : answer.status.status();
    if (s.ok()) {
      o.reports[pod] = std::move(*s);
      auto& unreachable = connections.unreachable_since;
      const bool first = connections.answered.insert(pod).second;
      if (auto it = unreachable.find(pod); it != unreachable.end()) {
        // A worker that starts is silent until it serves: its first answer is no comeback.
        LogInfo(first ? "worker answers" : "worker answers again",
                {{"job", o.name},
                 {"pod", pod},
                 {first ? "after_starting_seconds" : "after_seconds",
                  std::chrono::duration<double>(steady_now - it->second).count()}});
        unreachable.erase(it);
      }
      connections.unreachable_error.erase(pod);
    } else {
      connections.unreachable_since.try_emplace(pod, answer.asked);
      // Logged when it starts and whenever the reason changes (refused while the worker
      // starts, then a TLS handshake that fails, say), not on every pass.
      std::string& last = connections.unreachable_error[pod];
      if (last != s.status().ToString()) {
        last = s.status().ToString();
        LogInfo("worker does not answer", {{"pod", pod}, {"error", last}});
      }
    }
  }
  // The decision reads times on the wall clock of `now`; durations come from the monotonic one.
  for (const auto& [pod, since] : connections.unreachable_since)
    o.unreachable_since[pod] =
        o.now - std::chrono::duration_cast<Clock::duration>(steady_now - since);
  o.no_progress_for = connections.progress.Observe(o.pods, o.reports, steady_now);
  o.unreachable_error = connections.unreachable_error;
  return o;  // idle_gpus: DecideWithCapacity
}

}  // namespace tidal::controller
