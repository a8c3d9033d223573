// operator/controller/controller.cc — the loop: the informers and their handlers, the work
// queue's workers, one pass over a job (Reconcile: observe, decide, execute), and the tracking
// of the operator's own status writes. The rest of the shell: controller_internal.h.
#include "operator/controller/controller.h"

#include <array>
#include <optional>
#include <utility>

#include "common/log.h"
#include "operator/controller/controller_internal.h"
#include "operator/controller/metrics.h"
#include "operator/reconciler/children.h"
#include "operator/reconciler/event_reason.h"

namespace tidal::controller {

using nlohmann::json;
using reconciler::ConditionTrue;
using reconciler::JobStatusFromJson;
using reconciler::kCreatedForGenerationAnnotation;
using reconciler::kRoleLabel;
using reconciler::kSlotLabel;
using reconciler::MarkReconcileError;
using reconciler::OnlyFiguresChanged;
using shell::Key;
using shell::ResourceVersion;
using shell::RetryMeetsAgain;

namespace {

// What the controller reads of its pods (the pod cache keeps nothing else).
kube::PodCacheOptions PodCacheOptions() {
  kube::PodCacheOptions o;
  o.labels = {kSlotLabel, kRoleLabel};
  o.annotations = {kCreatedForGenerationAnnotation};
  return o;
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
      feed_(StatusFeed::Options{}, [this](const std::string& job) { queue_.Add(job); }),
      shares_([this](const std::string& job) { queue_.Add(job); }, options_.yield_to_priority,
              [] { return reconciler::Clock::now(); }, options_.metrics) {
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
    if (r.plural == kube::Resource::PriorityClasses().plural)
      o.transform = [](json& object) {
        json value = object.value("value", json());
        kube::KeepIdentity(object);
        object["value"] = std::move(value);
      };
    if (r.plural == kube::Resource::Pods().plural) {
      o.transform = kube::KeepIdentity;
      o.observe = [this](kube::ObjectEvent::Type type, const json& pod) {
        std::shared_ptr<const kube::CachedPod> before;
        std::shared_ptr<const kube::CachedPod> cached = pod_cache_.Apply(type, pod, &before);
        const json& md = pod.value("metadata", json::object());
        const std::string pod_key = Key(md.value("namespace", ""), md.value("name", ""));
        CountPod(pod_key, cached.get());
        // Another workload's pod: what it holds or waits for is shared around (ShareIndex).
        if (OwnerJobKey(pod).empty()) shares_.SetOtherPod(pod_key, cached.get());
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
  // PriorityClasses, for the jobs that name one: their names and values only.
  priority_classes_ = informer(kube::Resource::PriorityClasses(), "");
}

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
    const std::string key =
        Key((*o)["metadata"].value("namespace", ""), (*o)["metadata"].value("name", ""));
    shares_.SetJob(key, o.get());
    queue_.Add(key);
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
         const json& md = (*o)["metadata"];
         shares_.SetJob(Key(md.value("namespace", ""), md.value("name", "")), o.get());
         if (!own && !OnlyFiguresChanged(*before, *o)) enqueue_job(o);
       },
       [this](const kube::ObjectPtr& o) {
         ForgetOwnWrite(*o);
         const json& md = (*o)["metadata"];
         const std::string key = Key(md.value("namespace", ""), md.value("name", ""));
         shares_.SetJob(key, nullptr);
         queue_.Add(key);
       }}));
  // A node's GPUs and whether it takes pods: the shares' total.
  auto node = [this](const kube::ObjectPtr& o) {
    shares_.SetNode((*o)["metadata"].value("name", ""), o.get());
  };
  auto priority_class = [this](const kube::ObjectPtr& o) {
    const json& value = o->value("value", json());
    shares_.SetPriorityClass(
        (*o)["metadata"].value("name", ""),
        value.is_number_integer() ? std::optional<int64_t>(value.get<int64_t>()) : std::nullopt);
  };
  TIDAL_RETURN_IF_ERROR(priority_classes_->AddEventHandler(
      {priority_class,
       [priority_class](const kube::ObjectPtr&, const kube::ObjectPtr& o) { priority_class(o); },
       [this](const kube::ObjectPtr& o) {
         shares_.SetPriorityClass((*o)["metadata"].value("name", ""), std::nullopt);
       }}));
  TIDAL_RETURN_IF_ERROR(nodes_->AddEventHandler(
      {node, [node](const kube::ObjectPtr&, const kube::ObjectPtr& o) { node(o); },
       [this](const kube::ObjectPtr& o) {
         shares_.SetNode((*o)["metadata"].value("name", ""), nullptr);
       }}));
  auto owner = [this](const kube::ObjectPtr& o) { EnqueueOwner(o); };
  for (kube::Informer* inf : {services_.get(), secrets_.get(), configs_.get()})
    TIDAL_RETURN_IF_ERROR(inf->AddEventHandler(
        {owner, [owner](const kube::ObjectPtr&, const kube::ObjectPtr& o) { owner(o); }, owner}));
  // A pod's update wakes its job from the observe hook, where what changed is known.
  TIDAL_RETURN_IF_ERROR(pods_->AddEventHandler({owner, nullptr, owner}));
  for (kube::Informer* inf : {jobs_.get(), pods_.get(), services_.get(), secrets_.get(),
                              configs_.get(), nodes_.get(), priority_classes_.get()})
    TIDAL_RETURN_IF_ERROR(inf->Start());
  for (kube::Informer* inf : {jobs_.get(), pods_.get(), services_.get(), secrets_.get(),
                              configs_.get(), nodes_.get(), priority_classes_.get()})
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
  for (auto* inf : {jobs_.get(), pods_.get(), services_.get(), secrets_.get(), configs_.get(),
                    nodes_.get(), priority_classes_.get()})
    if (inf) inf->Stop();
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
    recorder_.Record(*job, EventTypeOf(EventReason::kReconcileError),
                     EventReasonName(EventReason::kReconcileError), message);
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
  landing->figures.loss_anomaly = ConditionTrue(plan.status, ConditionType::kLossAnomaly);
  landing->figures.share_gpus = observed.share ? observed.share->gpus : -1;
  landing->restarted = plan.status.restarts > observed.status.restarts;
  if (plan.finished_rescale)
    landing->rescale = {
        plan.finished_rescale->kind,
        std::chrono::duration<double>(observed.now - plan.finished_rescale->started).count()};
  landing->events = plan.events;
  for (const Event& e : plan.events)
    landing->corrupt_resume |= e.reason == EventReasonName(EventReason::kCorruptCheckpoint);
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
      kinds += (kinds.empty() ? "" : ",") + std::string(ActionName(a));
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

}  // namespace tidal::controller
