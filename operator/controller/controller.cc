// operator/controller/controller.cc
#include "operator/controller/controller.h"

#include <malloc.h>

#include <array>
#include <cmath>
#include <future>
#include <optional>
#include <set>
#include <utility>

#include "common/base64.h"
#include "common/log.h"
#include "kube/meta_time.h"
#include "kube/types.h"
#include "operator/controller/children.h"
#include "operator/controller/interval_json.h"
#include "operator/controller/metrics.h"
#include "tidal/worker/v1/worker.pb.h"
#include "worker/control/client.h"
#include "worker/control/phase_proto.h"

namespace tidal::controller {

// The asks a pass that decided nothing waits for (Observe): the last to end wakes the job, so
// that ten members answering one after another run one pass, not ten. One reference is the
// pass's own until it has counted them all (one that ended meanwhile is then not counted).
struct TrainingJobController::WorkerConnections::Awaited {
  std::atomic<int> pending{1};
};

// A worker's GetStatus, asked by a pass (Observe): its answer, once it came, is read by a later
// one.
struct TrainingJobController::WorkerConnections::Ask {
  std::mutex mu;
  std::chrono::steady_clock::time_point asked;
  // Guarded by mu:
  std::optional<StatusOr<::tidal::worker::v1::WorkerStatus>> answer;
  std::chrono::steady_clock::time_point answered;
  bool wake_on_failure = false;      // else only an answer wakes the job
  std::shared_ptr<Awaited> awaited;  // a pass waits for it: the last one's end wakes the job
};

// The API writes of a plan (Execute): the outcome, once the last one returned or one failed.
struct TrainingJobController::WorkerConnections::Writes {
  std::mutex mu;
  std::optional<Status> result;  // guarded by mu
  bool status_failed = false;    // the failure was the status write's (guarded by mu)
  bool deferred = false;         // a pass found them running and decided nothing (guarded by mu)
};

struct TrainingJobController::Landing {
  std::string key, namespace_, name;
  // The version the jobs cache held when the pass began: what its status write replaces in the
  // cache's eyes (RememberOwnWrite).
  std::string cached_version;
  std::vector<PhaseChange> phase_changes;
  OperatorMetrics::JobFigures figures;
  bool restarted = false;
  bool corrupt_resume = false;  // a resume skipped corrupt checkpoints (a CorruptCheckpoint Event)
  std::optional<std::pair<std::string, double>> rescale;  // its kind, the seconds it took
  std::vector<Event> events;
};

namespace {

using nlohmann::json;
namespace pb = ::tidal::worker::v1;

std::string Key(const std::string& ns, const std::string& name) { return ns + "/" + name; }

// The actions that write API objects (Execute runs them after the pass, in order); the others
// call workers.
// An error a retry would meet again: an exception, an object the API server refuses (400/422),
// an answer nobody expected. Conflicts, an unreachable API server and the workers' answers
// mid-transition (a barrier to a rank that just failed) pass with a requeue.
bool RetryMeetsAgain(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kInternal ||
         s.code() == StatusCode::kDataLoss;
}

bool IsApiWrite(Action::Kind kind) {
  switch (kind) {
    case Action::Kind::kAddFinalizer:
    case Action::Kind::kRemoveFinalizer:
    case Action::Kind::kEnsureService:
    case Action::Kind::kEnsureTokenSecret:
    case Action::Kind::kEnsureSpecConfig:
    case Action::Kind::kUpdateSpecConfig:
    case Action::Kind::kCreatePods:
    case Action::Kind::kDeletePods:
    case Action::Kind::kForceDeletePods:
    case Action::Kind::kCreatePrepPod:
      return true;
    default:
      return false;
  }
}

// A phase this operator does not know (a newer worker's) is no answer: nothing is decided on it.
StatusOr<WorkerReport> ReportOf(const pb::WorkerStatus& s) {
  WorkerReport r;
  const std::optional<api::WorkerPhase> phase = worker::FromProto(s.phase());
  if (!phase)
    return FailedPrecondition("the worker reports phase " + std::to_string(s.phase()) +
                              ", which this operator does not know");
  r.phase = *phase;
  r.generation = s.generation();
  r.rank = s.rank();
  r.world_size = s.world_size();
  r.step = s.step();
  r.loss = s.loss();
  r.tokens_per_second = s.tokens_per_second();
  if (s.has_last_checkpoint()) {
    r.checkpoint_step = s.last_checkpoint().step();
    r.checkpoint_kind = s.last_checkpoint().kind();
    r.checkpoint_uri = s.last_checkpoint().uri();
  }
  r.checkpoint_interval = CheckpointIntervalJson(s);
  if (s.has_resumed_from()) {
    r.resumed_from_step = s.resumed_from().step();
    r.resumed_from_uri = s.resumed_from().uri();
  }
  r.skipped_checkpoints.assign(s.skipped_checkpoints().begin(), s.skipped_checkpoints().end());
  if (s.has_live_checkpoint()) r.live_step = s.live_checkpoint().step();
  r.last_error = s.last_error();
  r.last_error_permanent = s.last_error_permanent();
  if (s.has_gpu_utilization_percent()) r.gpu_utilization_percent = s.gpu_utilization_percent();
  for (const pb::StepEvent& e : s.recent_steps()) {
    planner::StepSample sample{e.step(), e.loss(), std::nullopt};
    if (e.has_gpu_utilization_percent())
      sample.gpu_utilization_percent = e.gpu_utilization_percent();
    r.recent_steps.push_back(sample);
  }
  for (const pb::HeldPart& h : s.held_parts())
    r.held.push_back({h.generation(), h.rank(), h.world_size(), h.step()});
  if (s.has_prepared_engine()) {
    const pb::PreparedEngine& p = s.prepared_engine();
    r.prepared =
        WorkerReport::Prepared{p.generation(), p.rank(), p.world_size(), p.ready(), p.error()};
  }
  return r;
}

// What the controller reads of its pods (the pod cache keeps nothing else).
kube::PodCacheOptions PodCacheOptions() {
  kube::PodCacheOptions o;
  o.labels = {kSlotLabel, kRoleLabel};
  o.annotations = {kCreatedForGenerationAnnotation};
  return o;
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

// A node whose Ready condition is there and not True (Unknown: its kubelet stopped posting;
// False: it reports itself unhealthy). A node without the condition yet is taken as it is.
bool NodeSilent(const kube::Node& node) {
  for (const kube::Condition& c : node.conditions)
    if (c.type == "Ready") return c.status != "True";
  return false;
}

// Why the pod's node wants it gone though it still runs it ("" when not): cordoned (`kubectl
// cordon`, the first step of `kubectl drain`), or tainted NoExecute with a taint the pod does
// not tolerate for good (the taint manager evicts it, at once or after tolerationSeconds).
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

std::string OwnerJobKey(const json& object) {
  const json& md = object["metadata"];
  auto refs = md.find("ownerReferences");
  if (refs == md.end() || !refs->is_array()) return "";
  for (const json& r : *refs)
    if (r.value("kind", "") == "TrainingJob" && r.value("controller", false))
      return Key(md.value("namespace", ""), r.value("name", ""));
  return "";
}

}  // namespace

TrainingJobController::TrainingJobController(kube::KubeClient& client,
                                             kube::EventRecorder& recorder,
                                             ControllerOptions options)
    : client_(client),
      recorder_(recorder),
      options_(std::move(options)),
      pod_cache_(PodCacheOptions()),
      feed_(StatusFeed::Options{}, [this](const std::string& job) { queue_.Add(job); }) {
  auto informer = [&](kube::Resource r, const std::string& selector, bool every_namespace = false) {
    kube::InformerOptions o;
    o.resource = r;
    o.namespace_ = r.namespaced && !every_namespace ? options_.namespace_ : "";
    o.label_selector = selector;
    // Of a Service and a ConfigMap the controller asks only whether it is there; of a Secret,
    // its data (the workers' token).
    if (r.plural == kube::Resource::Services().plural ||
        r.plural == kube::Resource::ConfigMaps().plural)
      o.transform = kube::KeepIdentity;
    if (r.plural == kube::Resource::Secrets().plural) o.transform = kube::KeepIdentityAndData;
    if (r.plural == kube::Resource::Pods().plural) {
      o.transform = kube::KeepIdentity;
      o.observe = [this](kube::ObjectEvent::Type type, const json& pod) {
        std::shared_ptr<const kube::CachedPod> before;
        std::shared_ptr<const kube::CachedPod> cached = pod_cache_.Apply(type, pod, &before);
        const json& md = pod.value("metadata", json::object());
        CountPod(Key(md.value("namespace", ""), md.value("name", "")), cached.get());
        // An update wakes the pod's job only where it changed what the controller reads of a
        // pod (kube::CachedPod): a kubelet's status write that moves a timestamp asks for no
        // pass — which, over a steady job, connects to every peer again (a predicate, as
        // controller-runtime's). Creations and deletions wake it through the handlers.
        if (type == kube::ObjectEvent::kModified && !(before && cached && *before == *cached))
          if (const std::string key = OwnerJobKey(pod); !key.empty()) queue_.Add(key);
      };
    }
    return std::make_unique<kube::Informer>(client_, o);
  };
  const std::string ours = "app.kubernetes.io/managed-by=tidal-operator";
  jobs_ = informer(kube::Resource::TrainingJobs(), "");
  // Every pod of every namespace, even with --namespace: the capacity gate counts others' GPUs.
  // The store keeps only each pod's identity and owner (KeepIdentity); what the controller
  // reads of it is typed in pod_cache_, the GPUs it holds counted as it changes.
  pods_ = informer(kube::Resource::Pods(), "", /*every_namespace=*/true);
  services_ = informer(kube::Resource::Services(), ours);
  secrets_ = informer(kube::Resource::Secrets(), ours);
  configs_ = informer(kube::Resource::ConfigMaps(), ours);
  nodes_ = informer(kube::Resource::Nodes(), "");
}

namespace {
std::string ResourceVersion(const json& object) {
  auto md = object.find("metadata");
  if (md == object.end() || !md->is_object()) return "";
  auto v = md->find("resourceVersion");
  return v != md->end() && v->is_string() ? v->get<std::string>() : "";
}
}  // namespace

TrainingJobController::~TrainingJobController() { Stop(); }

bool TrainingJobController::ForgetOwnWrite(const json& cached) {
  const json& md = cached.value("metadata", json::object());
  if (!md.is_object()) return false;
  const std::string key = Key(md.value("namespace", ""), md.value("name", ""));
  std::lock_guard<std::mutex> lock(own_writes_mu_);
  auto own = own_writes_.find(key);
  if (own == own_writes_.end() || ResourceVersion(cached) == own->second.replaced) return false;
  const bool same = ResourceVersion(cached) == ResourceVersion(*own->second.written);
  own_writes_.erase(own);
  return same;
}

void TrainingJobController::RememberOwnWrite(const std::string& key, const std::string& replaced,
                                             kube::ObjectPtr written) {
  // Kept only while the cache still holds the version it held when the pass began: checked
  // under the lock the informer's handlers take after the cache has an event's object, so a
  // write whose event came already is not kept (a steady job keeps no copy of itself).
  const auto slash = key.find('/');
  std::lock_guard<std::mutex> lock(own_writes_mu_);
  kube::ObjectPtr cached = jobs_->store().Get(key.substr(0, slash), key.substr(slash + 1));
  if (cached && ResourceVersion(*cached) == replaced)
    own_writes_[key] = {replaced, std::move(written)};
  else
    own_writes_.erase(key);
}

Status TrainingJobController::Start(std::chrono::milliseconds sync_timeout) {
  auto enqueue_job = [this](const kube::ObjectPtr& o) {
    queue_.Add(Key((*o)["metadata"].value("namespace", ""), (*o)["metadata"].value("name", "")));
  };
  // An update that only moved the step's figures in status (the patcher's, or a reconcile's
  // of a steady job) asks for nothing: as controller-runtime's predicates filter events.
  // Each also ends what a pass remembers of its own last status write, once the cache holds a
  // version other than the one that write replaced (OwnWrite).
  TIDAL_RETURN_IF_ERROR(jobs_->AddEventHandler(
      {enqueue_job,
       [this, enqueue_job](const kube::ObjectPtr& before, const kube::ObjectPtr& o) {
         // This operator's own status write asks for no pass either: the pass that wrote it
         // asked for its next look (a failed one, with backoff, which the write's wake-up
         // would skip: a failing job's status flipped between its plan's and the error's,
         // each write waking the next failing pass at once).
         const bool own = ForgetOwnWrite(*o);
         if (!own && !OnlyFiguresChanged(*before, *o)) enqueue_job(o);
       },
       [this, enqueue_job](const kube::ObjectPtr& o) {
         ForgetOwnWrite(*o);
         enqueue_job(o);
       }}));
  auto owner = [this](const kube::ObjectPtr& o) { EnqueueOwner(o); };
  for (kube::Informer* inf : {services_.get(), secrets_.get(), configs_.get()})
    TIDAL_RETURN_IF_ERROR(inf->AddEventHandler(
        {owner, [owner](const kube::ObjectPtr&, const kube::ObjectPtr& o) { owner(o); }, owner}));
  // A pod's update wakes its job from the observe hook, where what changed is known.
  TIDAL_RETURN_IF_ERROR(pods_->AddEventHandler({owner, nullptr, owner}));
  for (kube::Informer* inf :
       {jobs_.get(), pods_.get(), services_.get(), secrets_.get(), configs_.get(), nodes_.get()})
    TIDAL_RETURN_IF_ERROR(inf->Start());
  for (kube::Informer* inf :
       {jobs_.get(), pods_.get(), services_.get(), secrets_.get(), configs_.get(), nodes_.get()})
    if (!inf->WaitForSync(sync_timeout))
      return DeadlineExceeded("informer caches did not sync within the timeout");
  started_ = true;
  for (int i = 0; i < std::max(1, options_.workers); ++i) workers_.emplace_back([this] { Work(); });
  patcher_ = std::thread([this] { PatchFigures(); });
  LogInfo("controller started", {{"namespace", options_.namespace_}, {"workers", workers_.size()}});
  return OkStatus();
}

void TrainingJobController::Stop() {
  worker_calls_.Shutdown(std::chrono::milliseconds(0));  // no call wakes a job from now on
  {
    std::lock_guard<std::mutex> lock(patcher_mu_);
    patcher_stop_ = true;
    patcher_cv_.notify_all();
  }
  if (patcher_.joinable()) patcher_.join();
  queue_.ShutDown();
  for (std::thread& w : workers_)
    if (w.joinable()) w.join();
  workers_.clear();
  for (auto* inf :
       {jobs_.get(), pods_.get(), services_.get(), secrets_.get(), configs_.get(), nodes_.get()})
    if (inf) inf->Stop();
}

void TrainingJobController::PatchFigures() {
  // A step waits at most a tick for its write (and a job's writes are a second apart); the
  // streams are swept for silence every second, the allocator trimmed every ten seconds.
  constexpr auto kTick = std::chrono::milliseconds(100);
  constexpr auto kPerJob = std::chrono::seconds(1);
  constexpr auto kSweepEvery = std::chrono::seconds(1);
  constexpr auto kTrimEvery = std::chrono::seconds(10);
  auto swept = std::chrono::steady_clock::now(), trimmed = swept;
  std::unique_lock<std::mutex> lock(patcher_mu_);
  while (!patcher_cv_.wait_for(lock, kTick, [&] { return patcher_stop_; })) {
    lock.unlock();
    if (const auto t = std::chrono::steady_clock::now(); t - swept >= kSweepEvery) {
      feed_.Sweep();
      swept = t;
    }
    if (const auto t = std::chrono::steady_clock::now(); t - trimmed >= kTrimEvery) {
      // What a start-up of hundreds of pods freed goes back to the system: glibc keeps freed
      // pages inside its heaps resident until asked.
      malloc_trim(0);
      trimmed = t;
    }
    for (const auto& [job, figures] : feed_.TakeChangedFigures()) {
      Patched& p = patched_[job];
      if (figures.step > p.figures.step || figures.generation != p.figures.generation ||
          figures.checkpoint_uri != p.figures.checkpoint_uri) {
        p.figures = figures;
        p.pending = true;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    struct Write {
      std::string job, ns, name, version;
      int64_t step;
      std::future<StatusOr<json>> done;
    };
    std::vector<Write> writes;
    for (auto it = patched_.begin(); it != patched_.end();) {
      const std::string& job = it->first;
      Patched& p = it->second;
      const auto slash = job.find('/');
      const std::string ns = job.substr(0, slash), name = job.substr(slash + 1);
      kube::ObjectPtr cached = jobs_->store().Get(ns, name);
      if (!cached) {  // deleted
        it = patched_.erase(it);
        continue;
      }
      ++it;
      if (!p.pending) continue;
      // After a Conflict, again as soon as the cache holds a newer version than the one refused
      // (the write that won), else at the job's usual pace.
      const std::string version = ResourceVersion(*cached);
      const bool newer = !p.refused_version.empty() && version != p.refused_version;
      if (!newer && now - p.at < kPerJob) continue;
      p.pending = false;
      p.refused_version.clear();
      // Only onto a status that trains, only forward, and only onto the status this cache
      // holds (FiguresPatch): a reconcile may have written the same or newer since.
      std::optional<json> patch = FiguresPatch(*cached, p.figures, Clock::now());
      if (!patch) continue;
      p.at = now;
      auto request =
          kube::MergePatchRequest(kube::Resource::TrainingJobs(), ns, name, *patch, "status");
      if (!request.ok()) {
        LogInfo("could not write the step", {{"job", job}, {"error", request.status().ToString()}});
        continue;
      }
      // Side by side: one at a time, 200 jobs' writes took most of a second.
      writes.push_back(
          {job, ns, name, version, p.figures.step,
           patch_calls_.Submit([this, r = std::move(*request)] { return client_.Call(r); })});
    }
    for (Write& w : writes) {
      StatusOr<json> written = w.done.get();
      if (written.status().code() == StatusCode::kAborted) {
        // The status moved past what the cache held (a reconcile wrote it): tried again onto
        // the newer one once the cache has it.
        if (auto it = patched_.find(w.job); it != patched_.end()) {
          it->second.pending = true;
          it->second.refused_version = w.version;
        }
        continue;
      }
      if (!written.ok()) {
        LogInfo("could not write the step",
                {{"job", w.job}, {"error", written.status().ToString()}});
        continue;
      }
      if (options_.metrics) options_.metrics->SetStep(w.ns, w.name, w.step);
    }
    lock.lock();
  }
}

void TrainingJobController::EnqueueOwner(const kube::ObjectPtr& object) {
  const std::string key = OwnerJobKey(*object);
  if (!key.empty()) queue_.Add(key);
}

void TrainingJobController::Work() {
  while (auto key = queue_.Get()) {
    const auto start = std::chrono::steady_clock::now();
    PassOutcome outcome;
    Status s = ReconcileIsolated(*key, &outcome);
    if (OperatorMetrics* m = options_.metrics) {
      using R = OperatorMetrics::PassResult;
      m->ObserveReconcile(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
          !s.ok()            ? R::kError
          : outcome.awaiting ? R::kAwaiting
                             : R::kOk);
      m->SetQueueDepth(queue_.Len());
    }
    if (!s.ok()) {
      LogWarn("reconcile failed", {{"job", *key}, {"error", s.ToString()}});
      queue_.AddRateLimited(*key);
    } else if (!outcome.awaiting && !outcome.wrote) {
      // Only a pass that decided and whose writes all landed ends a streak of failures (and
      // its backoff): an awaiting pass, or one whose API writes still run, has yet to see how
      // it went (a refused pod creation fails the pass after its batch; its retries back off).
      queue_.Forget(*key);
      // And the Ready=False it left: the next pass writes the job's own. (Looked up, not
      // made: a deleted job's pass has just dropped its entry.)
      bool was_failing = false;
      {
        std::lock_guard<std::mutex> lock(connections_mu_);
        if (auto it = connections_.find(*key); it != connections_.end())
          was_failing = std::exchange(it->second->reconcile_failing, false);
      }
      if (was_failing) queue_.Add(*key);
    }
    queue_.Done(*key);
  }
}

Status TrainingJobController::ReconcileIsolated(const std::string& key, PassOutcome* outcome) {
  Status s;
  try {
    s = Reconcile(key, outcome);
  } catch (const std::exception& e) {
    s = Internal(std::string("reconcile threw: ") + e.what());
  } catch (...) {
    s = Internal("reconcile threw an unknown exception");
  }
  // What a retry would meet again, the job says (RetryMeetsAgain); the rest passes with the
  // requeue. A pass that failed after starting its plan's writes leaves the mark to the next
  // one, which meets the error again with its status already written: a mark now would race
  // that status write, and one of the two would be lost to a Conflict.
  const bool started_writes = outcome && outcome->wrote;
  if (RetryMeetsAgain(s) && !started_writes) {
    MarkReconcileFailed(key, s);
    ConnectionsOf(key).reconcile_failing = true;
  }
  return s;
}

void TrainingJobController::MarkReconcileFailed(const std::string& key, const Status& error) {
  const std::string message = "the operator cannot reconcile this job: " + error.ToString();
  try {  // best effort: the requeue with backoff retries the job either way
    const auto slash = key.find('/');
    kube::ObjectPtr job = jobs_->store().Get(key.substr(0, slash), key.substr(slash + 1));
    if (!job) return;
    const std::string cached_version = ResourceVersion(*job);
    {
      // The pass's own status write, where the cache does not have it yet (a Conflict else).
      std::lock_guard<std::mutex> lock(own_writes_mu_);
      if (auto own = own_writes_.find(key);
          own != own_writes_.end() && own->second.replaced == cached_version)
        job = own->second.written;
    }
    recorder_.Record(*job, "Warning", "ReconcileError", message);
    // The condition only on a status that reads back: an empty one in its place would forget
    // the job's generation and members.
    auto status = JobStatusFromJson(job->value("status", json(nullptr)));
    if (!status.ok()) return;
    Plan plan;
    plan.status = *status;
    MarkReconcileError(plan.status, message, Clock::now(),
                       (*job)["metadata"].value("generation", int64_t{0}));
    auto written = WriteStatus(*job, plan);
    if (!written.ok())
      LogWarn("could not mark the job", {{"job", key}, {"error", written.status().message()}});
    else if (ResourceVersion(*written) != ResourceVersion(*job))
      RememberOwnWrite(key, cached_version, std::make_shared<const json>(*written));
  } catch (const std::exception& e) {
    LogError("could not mark the job", {{"job", key}, {"error", e.what()}});
  }
}

// A pass this long is logged with where its time went.
constexpr auto kSlowReconcile = std::chrono::milliseconds(100);

Status TrainingJobController::Reconcile(const std::string& key, PassOutcome* outcome) {
  const auto slash = key.find('/');
  const std::string ns = key.substr(0, slash), name = key.substr(slash + 1);
  kube::ObjectPtr job = jobs_->store().Get(ns, name);
  if (!job) {  // deleted: its children go with it (ownerReferences)
    feed_.Forget(key);
    {
      std::lock_guard<std::mutex> lock(own_writes_mu_);
      own_writes_.erase(key);
    }
    {
      std::lock_guard<std::mutex> lock(connections_mu_);
      connections_.erase(key);
    }
    if (options_.metrics) options_.metrics->ForgetJob(ns, name);
    return OkStatus();
  }
  // Read your own writes: a pass woken (by a pod's event, say) before the cache has this
  // operator's last status write would decide on the status before it, and lose its own write
  // to a Conflict. Where the cache still holds the very version that write replaced, what the
  // write returned is the job as it is (versions are compared for equality only).
  // The version the cache holds: what a write of this pass replaces in the cache's eyes, even
  // where the pass reads an earlier write's copy (two writes before the cache has either).
  const std::string cached_version = ResourceVersion(*job);
  {
    std::lock_guard<std::mutex> lock(own_writes_mu_);
    if (auto own = own_writes_.find(key); own != own_writes_.end()) {
      if (cached_version == own->second.replaced)
        job = own->second.written;
      else
        own_writes_.erase(own);
    }
  }
  // Where a slow pass spent its time, logged (the duration histogram says only that it was).
  using Steady = std::chrono::steady_clock;
  std::array<Steady::time_point, 5> at{Steady::now()};
  WorkerConnections& connections = ConnectionsOf(key);
  // While the API writes of an earlier plan run, nothing is decided: a plan made now would
  // act on a world those writes are changing, and one whose own writes were dropped could
  // record in status a step it never took (a spec edit's ConfigMap update). Their end wakes
  // the job.
  if (std::shared_ptr<WorkerConnections::Writes> w = connections.writing) {
    std::lock_guard<std::mutex> lock(w->mu);
    if (!w->result) {
      w->deferred = true;
      if (outcome) outcome->awaiting = true;
      return OkStatus();
    }
  }
  std::optional<Observed> seen = Observe(*job, connections);
  if (!seen) {
    // The answers it waits for wake the job; the look after two status timeouts only guards
    // against one that never came (an earlier timed look still wins).
    if (outcome) outcome->awaiting = true;
    queue_.AddAfter(key, 2 * options_.status_timeout + std::chrono::seconds(1));
    return OkStatus();
  }
  Observed& observed = *seen;
  at[1] = Steady::now();
  Plan plan = DecideWithCapacity(observed);
  at[2] = Steady::now();
  TIDAL_ASSIGN_OR_RETURN(std::optional<kube::Request> status_write,
                         StatusWrite(*job, plan, observed.pushed));
  auto landing = std::make_shared<Landing>();
  landing->key = key;
  landing->namespace_ = ns;
  landing->name = name;
  landing->cached_version = cached_version;
  landing->phase_changes = plan.phase_changes;
  landing->figures.phase = planner::PhaseName(plan.status.phase);
  landing->figures.desired_gpus = plan.status.desired_gpus;
  landing->figures.current_gpus = plan.status.current_gpus;
  landing->figures.step = plan.status.step;
  landing->figures.generation = plan.status.generation;
  landing->figures.loss_anomaly = ConditionTrue(plan.status, "LossAnomaly");
  landing->restarted = plan.status.restarts > observed.status.restarts;
  if (plan.finished_rescale)
    landing->rescale = {
        plan.finished_rescale->kind,
        std::chrono::duration<double>(observed.now - plan.finished_rescale->started).count()};
  landing->events = plan.events;
  for (const Event& e : plan.events) landing->corrupt_resume |= e.reason == "CorruptCheckpoint";
  at[3] = Steady::now();
  bool wrote = false;
  Status executed = Execute(*job, observed, plan, connections, std::move(status_write),
                            std::move(landing), &wrote);
  if (outcome) outcome->wrote = wrote;
  FollowWorkers(key, observed, plan, connections);
  at[4] = Steady::now();
  if (at[4] - at[0] >= kSlowReconcile) {
    auto ms = [&](int i) {
      return std::chrono::duration<double, std::milli>(at[i + 1] - at[i]).count();
    };
    std::string kinds;
    for (const Action& a : plan.actions)
      kinds += (kinds.empty() ? "" : ",") + std::string(ActionKindName(a.kind));
    LogInfo("slow reconcile", {{"job", key},
                               {"generation", plan.status.generation},
                               {"observe_ms", ms(0)},
                               {"decide_ms", ms(1)},
                               {"plan_status_ms", ms(2)},
                               {"actions_ms", ms(3)},
                               {"actions", kinds},
                               {"workers_answered", observed.reports.size()}});
  }
  if (!executed.ok()) return executed;
  // This pass's timed look replaces any an earlier one asked for (a steady job's is minutes).
  queue_.AddAfterReplacing(key, plan.requeue_after);
  return OkStatus();
}

void TrainingJobController::FollowWorkers(const std::string& key, const Observed& observed,
                                          const Plan& plan, WorkerConnections& connections) {
  std::map<std::string, std::shared_ptr<worker::WorkerApi>> followable;
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

std::shared_ptr<worker::WorkerApi> TrainingJobController::ClientFor(
    WorkerConnections& connections, const std::string& pod, const std::string& ip,
    const std::string& token, std::chrono::milliseconds timeout) {
  if (!connections.tls_unusable.empty()) return nullptr;
  CachedClient& c = connections.clients[pod];
  if (!c.client || c.ip != ip || c.token != token || c.tls_ca != connections.tls_ca) {
    worker::ClientOptions o;
    o.lean_transport = true;  // one per worker pod: thousands of channels
    o.address = ip + ":" + std::to_string(kControlPort);
    o.token = token;
    o.timeout = timeout;
    o.tls_ca_pem = connections.tls_ca;
    if (!o.tls_ca_pem.empty()) o.tls_server_name = connections.tls_server_name;
    c.client = options_.connect ? options_.connect(o) : std::make_shared<worker::WorkerClient>(o);
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

Plan TrainingJobController::DecideWithCapacity(Observed& observed) {
  std::lock_guard<std::mutex> lock(capacity_mu_);
  observed.idle_gpus =
      IdleGpus(observed.spec.ok() ? observed.spec->worker.tolerations : json::array());
  Plan plan = Decide(observed, options_.reconcile);
  if (observed.spec.ok())
    for (const Action& a : plan.actions)
      if (a.kind == Action::Kind::kCreatePods)
        for (const std::string& pod : a.pods)
          booked_gpus_[Key(observed.namespace_, pod)] = {observed.spec->elastic.gpus_per_pod,
                                                         observed.now};
  return plan;
}

int64_t TrainingJobController::IdleGpus(const json& tolerations) {
  int64_t allocatable = 0;
  std::set<std::string> closed;  // nodes that offer nothing
  const std::vector<kube::PodToleration> worker = kube::TolerationsOf(tolerations);
  for (const kube::ObjectPtr& n : nodes_->store().List()) {
    auto node = kube::NodeFromJson(*n);
    // A node that is not Ready (lost, its kubelet silent), cordoned (`kubectl cordon`, a
    // drain) or about to evict the job's workers (NodeNotice: a NoExecute taint) offers
    // nothing, and what its pods hold is not taken from the others.
    const bool shut = !node.ok() || NodeSilent(*node) || !NodeNotice(worker, *node).empty();
    if (node.ok() && shut) closed.insert(node->metadata.name);
    if (shut) continue;
    auto it = node->allocatable.find("nvidia.com/gpu");
    if (it != node->allocatable.end()) allocatable += std::atoll(it->second.c_str());
  }
  // Requested by any bound pod, the job's own included: what is left is truly idle (the
  // planner adds what the job holds itself).
  int64_t requested = held_total_;
  if (!closed.empty())
    for (const auto& [key, held] : held_gpus_)
      if (closed.count(held.node)) requested -= held.gpus;
  const auto now = Clock::now();
  for (auto it = booked_gpus_.begin(); it != booked_gpus_.end();) {
    const auto slash = it->first.find('/');
    std::shared_ptr<const kube::CachedPod> pod =
        pod_cache_.Get(it->first.substr(0, slash), it->first.substr(slash + 1));
    const bool counted = pod && (!pod->node_name.empty() || pod->Finished());
    if (counted || now - it->second.at > std::chrono::minutes(1)) {
      it = booked_gpus_.erase(it);
    } else {
      requested += it->second.gpus;
      ++it;
    }
  }
  return std::max<int64_t>(0, allocatable - requested);
}

void TrainingJobController::CountPod(const std::string& key, const kube::CachedPod* pod) {
  int64_t gpus = 0;
  std::string node;
  if (pod && !pod->Finished() && !pod->node_name.empty()) {
    gpus = pod->gpu_request;
    node = pod->node_name;
  }
  std::lock_guard<std::mutex> lock(capacity_mu_);
  auto it = held_gpus_.find(key);
  held_total_ += gpus - (it == held_gpus_.end() ? 0 : it->second.gpus);
  if (gpus > 0)
    held_gpus_[key] = {gpus, node};
  else if (it != held_gpus_.end())
    held_gpus_.erase(it);
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
  std::map<std::string, std::shared_ptr<worker::WorkerApi>>& followed = connections.followable;
  followed.clear();
  const std::string key = Key(o.namespace_, o.name);
  const auto steady_now = std::chrono::steady_clock::now();
  const std::set<std::string> members(o.status.members.begin(), o.status.members.end());
  const bool first_pass = !connections.observed;
  // The running workers' clients, and the newest status each one's open stream pushed.
  std::map<std::string, std::shared_ptr<worker::WorkerApi>> running;
  std::map<std::string, std::shared_ptr<const pb::WorkerStatus>> pushing;
  for (const PodView& p : o.pods) {
    if (p.phase != "Running" || p.ip.empty() || token.empty()) continue;
    std::shared_ptr<worker::WorkerApi> c =
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
    undisturbed = undisturbed && it != pushing.end() && it->second->phase() == pb::RUNNING &&
                  it->second->generation() == o.status.generation;
  }
  // Starts an ask; `needed`: a decision waits for it (on its own pool: a silent worker's 3 s
  // never delays it). An answer wakes the job; a failure too where `wake_on_failure`, which a
  // pass waiting for it sets (a silent worker's repeated silence wakes nobody otherwise).
  auto ask = [&](const std::string& pod, const std::shared_ptr<worker::WorkerApi>& c, bool needed,
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
      StatusOr<pb::WorkerStatus> answer = Internal("GetStatus threw");
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
    StatusOr<pb::WorkerStatus> status;
  };
  std::vector<Answer> answers;
  std::vector<std::pair<std::string, bool>> consumed;  // the asks whose answer this pass reads
  std::vector<std::pair<std::string, bool>> to_ask;    // pod, needed
  bool awaiting = false;
  auto awaited = std::make_shared<WorkerConnections::Awaited>();
  for (const auto& [pod, c] : running) {
    if (undisturbed && pushing.count(pod)) {
      connections.asking.erase(pod);
      answers.push_back({pod, steady_now, StatusOr<pb::WorkerStatus>(*pushing.at(pod))});
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
    StatusOr<WorkerReport> s =
        answer.status.ok() ? ReportOf(*answer.status) : answer.status.status();
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

StatusOr<std::optional<kube::Request>> TrainingJobController::StatusWrite(const json& job,
                                                                          const Plan& plan,
                                                                          bool pushed) {
  const json& md = job["metadata"];
  if (plan.conditions_only) {
    const json current = job.value("status", json());
    const json conditions = ToJson(plan.status.conditions);
    if (current.is_object() && current.value("conditions", json()) == conditions)
      return std::optional<kube::Request>();
    TIDAL_ASSIGN_OR_RETURN(auto request, kube::MergePatchRequest(
                                             kube::Resource::TrainingJobs(),
                                             md.value("namespace", ""), md.value("name", ""),
                                             {{"status", {{"conditions", conditions}}}}, "status"));
    return std::optional<kube::Request>(std::move(request));
  }
  const std::string selector = std::string(kJobLabel) + "=" + JobLabelValue(md.value("name", ""));
  json status = ToJson(plan.status, selector);
  const json current = job.value("status", json());
  if (current == status) return std::optional<kube::Request>();
  // Figures alone, with the workers pushing them onto a status that trains: the patcher writes
  // those (FiguresPatch). (A reconcile that wrote them raced the patcher's writes and lost to a
  // conflict.) Onto any other phase — a job held Paused whose workers have just checkpointed —
  // the patcher writes nothing, so the reconcile does.
  const bool trains = plan.status.phase == planner::Phase::kRunning ||
                      plan.status.phase == planner::Phase::kScaling;
  if (pushed && trains && WithoutFigures(current) == WithoutFigures(status))
    return std::optional<kube::Request>();
  json updated = job;
  updated["status"] = std::move(status);
  TIDAL_ASSIGN_OR_RETURN(
      auto request, kube::ReplaceRequest(kube::Resource::TrainingJobs(), md.value("namespace", ""),
                                         md.value("name", ""), updated, "status"));
  return std::optional<kube::Request>(std::move(request));
}

StatusOr<json> TrainingJobController::WriteStatus(const json& job, const Plan& plan) {
  TIDAL_ASSIGN_OR_RETURN(std::optional<kube::Request> request, StatusWrite(job, plan));
  if (!request) return job;
  auto written = client_.Call(*request);
  if (!written.ok()) return written.status().WithContext("writing status");
  return written;  // its resourceVersion is the one later patches must name
}

void TrainingJobController::Land(const Landing& landing, const json& job) {
  for (const PhaseChange& c : landing.phase_changes) {
    const json fields = {{"job", landing.key},
                         {"generation", landing.figures.generation},
                         {"from", planner::PhaseName(c.from)},
                         {"event", planner::EventName(c.event)},
                         {"to", planner::PhaseName(c.to)},
                         {"reason", c.reason}};
    if (c.refused)
      LogError("phase change refused by the transition table", fields);
    else
      LogInfo("phase", fields);
  }
  if (OperatorMetrics* m = options_.metrics) {
    // Under the lock a deleted job's pass drops its connections under before its series: a
    // write that lands after that pass makes no series for a job that is gone.
    std::lock_guard<std::mutex> lock(connections_mu_);
    if (connections_.count(landing.key)) {
      m->SetJob(landing.namespace_, landing.name, landing.figures);
      if (landing.restarted) m->CountRestart(landing.namespace_, landing.name);
      if (landing.corrupt_resume) m->CountCorruptResume(landing.namespace_, landing.name);
      if (landing.rescale) m->ObserveRescale(landing.rescale->first, landing.rescale->second);
    }
  }
  for (const Event& e : landing.events) recorder_.Record(job, e.type, e.reason, e.message);
}

Status TrainingJobController::Execute(const json& job, const Observed& o, const Plan& plan,
                                      WorkerConnections& connections,
                                      std::optional<kube::Request> status_write,
                                      std::shared_ptr<const Landing> landing, bool* wrote) {
  const JobRef ref{o.name, o.namespace_, o.uid};
  const std::string token = TokenOf(o.namespace_, o.name);
  auto client_for = [&](const std::string& pod, const std::string& ip) {
    return ClientFor(connections, pod, ip, token, options_.status_timeout);
  };
  // The plan's API writes, in its order: run after this pass, on api_writes_ (below).
  struct Write {
    Action::Kind kind;
    std::function<Status()> call;
  };
  std::vector<Write> writes;
  auto create = [this, ns = o.namespace_](kube::Resource r, json object) {
    return [this, ns, r, object = std::move(object)]() -> Status {
      TIDAL_ASSIGN_OR_RETURN(auto request, kube::CreateRequest(r, ns, object));
      auto made = client_.Call(request);
      if (made.ok() || made.status().code() == StatusCode::kAlreadyExists) return OkStatus();
      return made.status().WithContext("creating " + r.plural + "/" +
                                       object["metadata"].value("name", std::string()));
    };
  };
  auto call = [this](kube::Request request) {
    return [this, request = std::move(request)] { return client_.Call(request).status(); };
  };
  auto pod_ip = [&](const std::string& name) -> std::string {
    for (const PodView& p : o.pods)
      if (p.name == name) return p.ip;
    return "";
  };
  const std::string job_key = Key(o.namespace_, o.name);
  // A worker call of the plan, started on its own thread (WorkerCalls) once the status is
  // written: once per pod and `what` while it runs; its failure is logged and, with `wake`,
  // its end reconciles the job again.
  std::vector<std::function<void()>> starts;
  auto start = [&](const std::string& pod, const std::string& what, std::function<Status()> call,
                   bool wake) {
    starts.push_back([this, job_key, pod, what, wake, call = std::move(call)] {
      worker_calls_.Start(
          job_key + "/" + pod + "/" + what, call,
          [this, job_key, pod, what, wake](const Status& s) {
            if (!s.ok())
              LogInfo("worker call failed",
                      {{"job", job_key}, {"pod", pod}, {"call", what}, {"error", s.ToString()}});
            if (wake) queue_.Add(job_key);
          });
    });
  };
  // The job's resourceVersion when the plan's writes run: the status write's, once made.
  auto version = std::make_shared<std::string>(ResourceVersion(job));
  // The API writes of an earlier plan, ended (Reconcile decides nothing while they run). One
  // that failed fails this pass if it writes too, as it would have failed the pass that planned
  // it (an Event and Ready=False for an error a retry would meet again; a retry with backoff);
  // a plan that writes nothing any more (the pods came, the job was suspended) leaves it.
  // (A status write that failed for a reason a retry meets again — refused, not a conflict —
  // fails a pass that writes the status again.)
  if (std::shared_ptr<WorkerConnections::Writes> w = connections.writing) {
    std::optional<Status> result;
    bool status_failed = false;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      result = w->result;
      status_failed = w->status_failed;
    }
    connections.writing.reset();
    const bool writes_again =
        (status_failed && status_write && result && RetryMeetsAgain(*result)) ||
        std::any_of(plan.actions.begin(), plan.actions.end(),
                    [](const Action& a) { return IsApiWrite(a.kind); });
    if (result && !result->ok() && writes_again) return *result;
  }
  // The plan's actions, collected: worker calls (`starts`) and API writes. Whatever ends the
  // loop, what was collected before it is done (as it was done before it, in order).
  auto act = [&]() -> Status {
    for (const Action& a : plan.actions) {
      Status done = OkStatus();
      // The pod's worker client; nullptr when the pod has no IP yet, or (recorded in `done`)
      // when its TLS Secret is unusable.
      auto worker_of = [&](const std::string& pod) -> std::shared_ptr<worker::WorkerApi> {
        const std::string ip = pod_ip(pod);
        if (ip.empty()) return nullptr;
        std::shared_ptr<worker::WorkerApi> c = client_for(pod, ip);
        if (!c) done = FailedPrecondition(connections.tls_unusable);
        return c;
      };
      switch (a.kind) {
        case Action::Kind::kAddFinalizer:
        case Action::Kind::kRemoveFinalizer: {
          json finalizers = json::array();
          for (const json& f : job["metadata"].value("finalizers", json::array()))
            if (f != kFinalizer) finalizers.push_back(f);
          if (a.kind == Action::Kind::kAddFinalizer) finalizers.push_back(kFinalizer);
          // Named at the version the status write (before it) leaves.
          writes.push_back(
              {a.kind, [this, version, finalizers, ns = o.namespace_, name = o.name]() -> Status {
                 const json patch = {
                     {"metadata", {{"finalizers", finalizers}, {"resourceVersion", *version}}}};
                 TIDAL_ASSIGN_OR_RETURN(
                     auto request,
                     kube::MergePatchRequest(kube::Resource::TrainingJobs(), ns, name, patch));
                 return client_.Call(request).status();
               }});
          break;
        }
        case Action::Kind::kEnsureService:
          writes.push_back({a.kind, create(kube::Resource::Services(), HeadlessService(ref))});
          break;
        case Action::Kind::kEnsureTokenSecret: {
          // The token this job's workers hold, when it had one: its Secret was deleted under
          // them. Emitted so that `kubectl describe` says why the Secret is back.
          std::string known =
              connections.token_uid == o.uid && !o.uid.empty() ? connections.token : "";
          if (!known.empty()) {
            recorder_.Record(job, "Warning", "TokenSecretRecreated",
                             "Secret " + TokenSecretName(o.name) +
                                 " was deleted while the job's workers hold its token: made again "
                                 "with the same token");
          } else {
            TIDAL_ASSIGN_OR_RETURN(known, NewToken());
          }
          writes.push_back({a.kind, create(kube::Resource::Secrets(), TokenSecret(ref, known))});
          break;
        }
        case Action::Kind::kEnsureSpecConfig:
          writes.push_back(
              {a.kind, create(kube::Resource::ConfigMaps(), SpecConfigMap(ref, o.raw_spec))});
          break;
        case Action::Kind::kUpdateSpecConfig: {
          json config = SpecConfigMap(ref, o.raw_spec);
          TIDAL_ASSIGN_OR_RETURN(
              auto request,
              kube::MergePatchRequest(kube::Resource::ConfigMaps(), o.namespace_,
                                      SpecConfigMapName(o.name), {{"data", config["data"]}}));
          writes.push_back({a.kind, [patch = call(std::move(request)),
                                     make = create(kube::Resource::ConfigMaps(), config)] {
                              Status patched = patch();
                              return patched.code() == StatusCode::kNotFound ? make() : patched;
                            }});
          break;
        }
        case Action::Kind::kCreatePods: {
          if (!o.spec.ok()) break;
          WorkerPodOptions w;
          w.generation = a.generation;
          w.group_size = static_cast<int>(a.slots.size());
          if (!options_.default_checkpoint_root.empty())
            w.default_checkpoint_uri = DefaultCheckpointUri(options_.default_checkpoint_root, ref);
          if (plan.status.data && plan.status.data->phase == "Ready")
            w.dataset_store = plan.status.data->store_uri;
          std::vector<json> pods;
          for (int slot : a.slots) {
            w.slot = slot;
            pods.push_back(WorkerPod(ref, *o.spec, w));
          }
          if (pods.empty()) break;
          // All pods of the step at once (one gang). The first alone: a pod the server refuses
          // (quota, admission, a bad field) is refused once, not once per slot. The rest side by
          // side, as the Job controller's slow start does: a 10-pod gang costs two round trips.
          std::vector<std::function<Status()>> each;
          for (json& pod : pods) each.push_back(create(kube::Resource::Pods(), std::move(pod)));
          writes.push_back({a.kind, [each = std::move(each)] {
                              Status made = each[0]();
                              if (!made.ok()) return made;
                              std::vector<std::future<Status>> rest;
                              for (size_t i = 1; i < each.size(); ++i)
                                rest.push_back(std::async(std::launch::async, each[i]));
                              for (auto& f : rest)
                                if (Status s = f.get(); !s.ok()) made = s;
                              return made;
                            }});
          break;
        }
        case Action::Kind::kCreatePrepPod:
          if (!o.spec.ok() || !plan.status.data) break;
          writes.push_back(
              {a.kind, create(kube::Resource::Pods(),
                              PrepPod(ref, *o.spec, a.pods.at(0), plan.status.data->key))});
          break;
        case Action::Kind::kDeletePods:
        case Action::Kind::kForceDeletePods:
          for (const std::string& pod : a.pods) {
            kube::DeleteOptions options;
            if (a.kind == Action::Kind::kForceDeletePods) options.grace_period_seconds = 0;
            TIDAL_ASSIGN_OR_RETURN(auto request, kube::DeleteRequest(kube::Resource::Pods(),
                                                                     o.namespace_, pod, options));
            writes.push_back({a.kind, [delete_pod = call(std::move(request))] {
                                Status deleted = delete_pod();
                                return deleted.code() == StatusCode::kNotFound ? OkStatus()
                                                                               : deleted;
                              }});
            connections.clients.erase(pod);
            connections.answered.erase(pod);
            connections.unreachable_since.erase(pod);
            connections.unreachable_error.erase(pod);
            connections.asking.erase(pod);
          }
          break;
        case Action::Kind::kBarrier:
          // Returns when every rank holds (or one fails): its end wakes the job, whose next pass
          // finds the ranks paused and goes on (the Rendezvous, without waiting for a poll).
          for (const std::string& pod : a.pods)
            if (std::shared_ptr<worker::WorkerApi> c = worker_of(pod))
              start(
                  pod, "barrier " + std::to_string(a.barrier_id),
                  [c,
                   timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
                       options_.reconcile.barrier_timeout),
                   id = a.barrier_id, live = a.live] {
                    return c->Checkpoint(/*pause=*/true, timeout, id, live).status();
                  },
                  /*wake=*/true);
          break;
        case Action::Kind::kRendezvous: {
          if (a.pods.empty()) break;
          const std::string store =
              pod_ip(a.pods[0]) + ":" + std::to_string(StorePort(a.generation));
          // The old ranks' control addresses; one that has none any more makes the new ranks
          // resume from the store (they would fail to read from it anyway).
          std::vector<std::string> peers;
          for (const std::string& pod : a.state_peers) {
            const std::string ip = pod_ip(pod);
            if (ip.empty()) {
              peers.clear();
              break;
            }
            peers.push_back(ip + ":" + std::to_string(kControlPort));
          }
          // The members' control addresses, for buddy copies (none when one has no address yet).
          std::vector<std::string> members;
          for (const std::string& pod : a.pods) {
            const std::string ip = pod_ip(pod);
            if (ip.empty() || a.wards.size() != a.pods.size()) {
              members.clear();
              break;
            }
            members.push_back(ip + ":" + std::to_string(kControlPort));
          }
          for (const std::string& pod : a.targets) {
            const auto rank = std::find(a.pods.begin(), a.pods.end(), pod) - a.pods.begin();
            std::shared_ptr<worker::WorkerApi> c = worker_of(pod);
            if (!c) continue;
            const int ward = members.empty() ? static_cast<int>(rank) : a.wards[rank];
            start(
                pod, "rendezvous " + std::to_string(a.generation),
                [c, generation = a.generation, world = static_cast<int>(a.pods.size()),
                 rank = static_cast<int>(rank), store, peers,
                 step = peers.empty() ? 0 : a.state_step, members, ward, restarts = a.restarts] {
                  Status s = c->Rendezvous(generation, world, rank, store, peers, step, members,
                                           ward, restarts);
                  // Already there (a repeated call after a crash) is success.
                  return s.code() == StatusCode::kAlreadyExists ? OkStatus() : s;
                },
                /*wake=*/true);
          }
          break;
        }
        case Action::Kind::kPrepareEngine:
          // A refusal (TIDAL_KEEP_ENGINE=0, an older worker) only means that worker loads after
          // the Rendezvous: Decide does not wait for it (its failure is logged).
          for (size_t i = 0; i < a.pods.size() && i < a.ranks.size(); ++i)
            if (std::shared_ptr<worker::WorkerApi> c = worker_of(a.pods[i]))
              start(
                  a.pods[i], "prepare " + std::to_string(a.generation),
                  [c, generation = a.generation, world = a.world_size, rank = a.ranks[i]] {
                    return c->PrepareEngine(generation, world, rank);
                  },
                  /*wake=*/false);
          break;
        case Action::Kind::kResume:
          for (const std::string& pod : a.pods)
            if (std::shared_ptr<worker::WorkerApi> c = worker_of(pod))
              start(
                  pod, "resume",
                  [c] {
                    // Not paused (any more) is what this asks for: Decide looks again.
                    Status s = c->Resume();
                    return s.code() == StatusCode::kFailedPrecondition ? OkStatus() : s;
                  },
                  /*wake=*/true);
          break;
        case Action::Kind::kShutdown:
          for (const std::string& pod : a.pods) {
            const std::string ip = pod_ip(pod);
            if (ip.empty() || token.empty()) continue;
            if (std::shared_ptr<worker::WorkerApi> c = client_for(pod, ip))
              start(
                  pod, "shutdown", [c, reason = a.reason] { return c->Shutdown(reason); },
                  /*wake=*/false);  // the pod is deleted anyway
          }
          break;
      }
      if (!done.ok()) {
        LogWarn("action failed",
                {{"job", o.name}, {"action", ActionKindName(a.kind)}, {"error", done.ToString()}});
        return done.WithContext(ActionKindName(a.kind));
      }
    }
    return OkStatus();
  };
  const Status acted = act();
  if (!status_write) {
    // Nothing to write first: the plan lands and its worker calls start now.
    Land(*landing, job);
    for (auto& s : starts) s();
    if (writes.empty()) return acted;
  }
  // In order, the first failure ending them, on api_writes_: a slow API server holds no
  // reconcile (the status write, creating a job's pods and updating its spec's ConfigMap were
  // the slow passes at 200 jobs). Their end wakes the job.
  auto batch = std::make_shared<WorkerConnections::Writes>();
  connections.writing = batch;
  *wrote = true;
  const bool api_writes = !writes.empty(), pass_ok = acted.ok();
  const auto submitted = std::chrono::steady_clock::now();
  api_writes_.Submit([this, batch, job_key, version, api_writes, pass_ok, submitted,
                      landing = std::move(landing), status_write = std::move(status_write),
                      starts = std::move(starts), writes = std::move(writes)]() mutable {
    // Whatever ends them (one that throws: no thread for a side-by-side creation, say) ends
    // them like a failure; the result is always set, or the job's passes would wait forever.
    auto run = [](const std::function<Status()>& step) -> Status {
      try {
        return step();
      } catch (const std::exception& e) {
        return Internal(std::string("threw: ") + e.what());
      } catch (...) {
        return Internal("threw an unknown exception");
      }
    };
    Status result = OkStatus();
    bool status_failed = false;
    if (status_write) {
      result = run([&]() -> Status {
        const std::string before = *version;
        auto written = client_.Call(*status_write);
        if (!written.ok()) {
          status_failed = true;
          return written.status().WithContext("writing status");
        }
        *version = ResourceVersion(*written);
        auto ptr = std::make_shared<const json>(std::move(*written));
        if (*version != before) RememberOwnWrite(job_key, landing->cached_version, ptr);
        Land(*landing, *ptr);
        for (auto& s : starts) s();
        return OkStatus();
      });
      if (!result.ok())
        LogWarn("status write failed", {{"job", job_key}, {"error", result.ToString()}});
    }
    for (const Write& w : writes) {
      if (!result.ok()) break;
      if (Status s = run(w.call); !s.ok()) {
        LogWarn("action failed",
                {{"job", job_key}, {"action", ActionKindName(w.kind)}, {"error", s.ToString()}});
        result = s.WithContext(ActionKindName(w.kind));
      }
    }
    if (OperatorMetrics* m = options_.metrics)
      m->ObservePlanWrites(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count(),
          result.ok());
    bool deferred = false;
    {
      std::lock_guard<std::mutex> lock(batch->mu);
      batch->result = result;
      batch->status_failed = status_failed;
      deferred = batch->deferred;
    }
    // A failure's retry backs off (the pass that reads it returns it, and requeues with backoff
    // again).
    if (!result.ok()) {
      queue_.AddRateLimited(job_key);
      return;
    }
    // A plan whose pass went well and whose writes all landed ends a streak of failures, and
    // the Ready=False that streak left (as Work does after a pass that writes nothing).
    bool was_failing = false;
    if (pass_ok) {
      queue_.Forget(job_key);
      std::lock_guard<std::mutex> lock(connections_mu_);
      if (auto it = connections_.find(job_key); it != connections_.end())
        was_failing = std::exchange(it->second->reconcile_failing, false);
    }
    // What the API writes made wakes the job through its informer's event, once the cache has
    // it (a wake now would beat the pods into the cache and plan them again); a second later is
    // only the look for a write that changed nothing. A status write alone changes nothing the
    // next pass would plan again: a pass it held back (or the one that writes the job's own
    // Ready) runs now.
    if (api_writes)
      queue_.AddAfter(job_key, std::chrono::seconds(1));
    else if (deferred || was_failing)
      queue_.Add(job_key);
  });
  return acted;
}

}  // namespace tidal::controller
