// operator/controller/controller.h — the TrainingJob controller's shell: informers on
// TrainingJobs, their pods, Services, Secrets and ConfigMaps, and Nodes; each running worker's
// pushed status (StatusFeed); a rate-limited work queue of job keys; for each key, observe (the
// caches, GetStatus on every worker pod, the idle GPUs), Decide (reconcile.h), write the
// status, then start the plan's actions (worker calls run off the reconcile: WorkerCalls) and
// record its Events. Level-triggered: every pass starts from what is. A job is looked at again
// when something it depends on changes (an informer event, a worker's actionable change or
// its stream's end, a worker call's end) and after the plan's requeue delay — a timer, for a
// steady job whose workers push, instead of a poll.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "contract/worker_api.h"
#include "kube/client.h"
#include "kube/events.h"
#include "kube/informer.h"
#include "kube/pod_cache.h"
#include "kube/workqueue.h"
#include "operator/controller/share_index.h"
#include "operator/controller/status_feed.h"
#include "operator/controller/worker_calls.h"
#include "operator/reconciler/reconcile.h"

namespace tidal::controller {

class OperatorMetrics;

struct ControllerOptions {
  std::string namespace_;  // "" watches every namespace
  // Where a job's checkpoints go when its spec names no store: <root>/<namespace>/<job>/<uid>.
  std::string default_checkpoint_root;
  // The decision's options; its barrier_timeout is also how long one Checkpoint barrier call
  // waits for its worker.
  reconciler::ReconcileOptions reconcile;
  std::chrono::milliseconds status_timeout{std::chrono::seconds(3)};  // GetStatus per worker
  // Reconciles running at once (never two of one job: the queue hands a key to one worker).
  // A pass mostly waits on the API server and the workers, so more than the cores helps.
  int workers = 4;
  OperatorMetrics* metrics = nullptr;  // not owned; none recorded when null
  // How a worker is reached: empty, over gRPC (contract::WorkerClient). Tests give fakes.
  contract::WorkerConnector connect;
  // Sharing (planner/share.h): a Pending GPU pod of another workload is yielded to by the jobs
  // of a lower priority (none), or also of its own where its priority is at least this.
  std::optional<int64_t> yield_to_priority;
};

class TrainingJobController {
  struct WorkerConnections;

 public:
  TrainingJobController(kube::KubeClient& client, kube::EventRecorder& recorder,
                        ControllerOptions options);
  ~TrainingJobController();
  TrainingJobController(const TrainingJobController&) = delete;
  TrainingJobController& operator=(const TrainingJobController&) = delete;

  // Starts the informers, waits for their caches, then the reconcile worker.
  Status Start(std::chrono::milliseconds sync_timeout = std::chrono::seconds(30));
  void Stop();
  // One pass over "namespace/name" (what the worker runs; public for tests).
  // How a pass ended, beyond its Status: for Work's metrics and backoff.
  struct PassOutcome {
    bool awaiting = false;  // it decided nothing: answers it needs, or an earlier plan's API
                            // writes, are still out (their end wakes the job)
    bool wrote = false;     // it started API writes, which a later pass sees the end of
  };
  Status Reconcile(const std::string& key, PassOutcome* outcome = nullptr);
  // Reconcile, with anything it throws confined to the job; an exception or an error a retry
  // would meet again gives the job an Event and Ready=False (ReconcileError), and the operator
  // goes on with the others.
  Status ReconcileIsolated(const std::string& key, PassOutcome* outcome = nullptr);

 private:
  void MarkReconcileFailed(const std::string& key, const Status& error);
  // None while answers a decision needs are still out (their arrival wakes the job).
  std::optional<reconciler::Observed> Observe(const nlohmann::json& job,
                                              WorkerConnections& connections);
  // The request that writes the plan's status onto `job`; none when the status already
  // matches (or, `pushed`: the workers push their figures, Observed::pushed, and only those
  // differ, which the patcher writes).
  StatusOr<std::optional<kube::Request>> StatusWrite(const nlohmann::json& job,
                                                     const reconciler::Plan& plan,
                                                     bool pushed = false);
  // StatusWrite, made now: the job as written (or unchanged).
  StatusOr<nlohmann::json> WriteStatus(const nlohmann::json& job, const reconciler::Plan& plan);
  // What a plan's status, once it is written, makes true in the operator's own accounts: its
  // phase changes logged, the job's metrics, its Events (defined in status_writes.cc).
  struct Landing;
  // A plan's actions turned into work, one overload per kind (controller_internal.h).
  class PlanExecutor;
  // Lands it: of a job this operator still follows (a deleted job's pass dropped its series).
  void Land(const Landing& landing, const nlohmann::json& job);
  // Acts on the plan. The status write (when there is one) and the API writes run after the
  // pass, in that order, on api_writes_; the worker calls start once the status is written (a
  // worker never goes where the status does not say it went), and `landing` is landed then.
  // `wrote`: set when it started writes (a later pass sees their end).
  Status Execute(const nlohmann::json& job, const reconciler::Observed& observed,
                 const reconciler::Plan& plan, WorkerConnections& connections,
                 std::optional<kube::Request> status_write, std::shared_ptr<const Landing> landing,
                 bool* wrote);
  // Allocatable nvidia.com/gpu of schedulable nodes minus what bound, unfinished pods request,
  // minus what pods this controller decided to create (and the cache does not show yet)
  // will. Under capacity_mu_.
  // `tolerations`: the job's workers' (spec.worker.tolerations), for NoExecute taints.
  int64_t IdleGpus(const nlohmann::json& tolerations);
  // Observes the capacity, decides and books the GPUs of the pods the plan creates, as one
  // step: two jobs reconciled at once cannot both plan for the same idle GPUs.
  reconciler::Plan DecideWithCapacity(reconciler::Observed& observed);
  // nullptr when the job's TLS Secret cannot be used (connections.tls_unusable says why).
  std::shared_ptr<contract::WorkerApi> ClientFor(WorkerConnections& connections,
                                                 const std::string& pod, const std::string& ip,
                                                 const std::string& token,
                                                 std::chrono::milliseconds timeout);
  WorkerConnections& ConnectionsOf(const std::string& key);
  std::string TokenOf(const std::string& ns, const std::string& job) const;
  void EnqueueOwner(const kube::ObjectPtr& object);
  // A pass's own last status write, by job key, while the jobs cache still holds the version it
  // replaced: the next pass reads `written` instead (read your own writes). Ended by the
  // informer's next event for the job (ForgetOwnWrite), so a steady job keeps no copy.
  struct OwnWrite {
    std::string replaced;  // the resourceVersion the write replaced
    kube::ObjectPtr written;
  };
  // The jobs informer's update handler: ends the saved write once the cache holds another
  // version than it replaced; true when the cache's object is that write itself.
  bool ForgetOwnWrite(const nlohmann::json& cached);
  // After a status write of `key` that replaced version `replaced`: kept while the cache still
  // holds `replaced`.
  void RememberOwnWrite(const std::string& key, const std::string& replaced,
                        kube::ObjectPtr written);
  std::mutex own_writes_mu_;
  std::map<std::string, OwnWrite> own_writes_;
  void Work();

  kube::KubeClient& client_;
  kube::EventRecorder& recorder_;
  ControllerOptions options_;
  // Before the informers: the pods informer's observe hook fills it.
  kube::PodCache pod_cache_;
  std::unique_ptr<kube::Informer> jobs_, pods_, services_, secrets_, configs_, nodes_,
      priority_classes_;
  kube::WorkQueue queue_;
  // The workers' pushed status (after queue_, which its wake-ups use; closed before it).
  StatusFeed feed_;
  // The cluster's GPU shares, kept from the informers' events (after queue_, which it wakes).
  ShareIndex shares_;
  // Writes the step figures the workers push into status (at most once a second per job),
  // between reconciles: a steady job needs none.
  void PatchFigures();
  std::thread patcher_;
  std::mutex patcher_mu_;
  std::condition_variable patcher_cv_;
  bool patcher_stop_ = false;
  struct Patched {
    StatusFeed::Figures figures;
    std::chrono::steady_clock::time_point at{};
    bool pending = false;
    std::string refused_version;  // of the cached job a write was refused against (Conflict)
  };
  std::map<std::string, Patched> patched_;  // by job key; the patcher's thread only
  std::vector<std::thread> workers_;
  std::atomic<bool> started_{false};
  // What the shell remembers of one job's workers between its reconciles: a gRPC client per
  // pod (recreated when the IP or token changes) and since when each has not answered. Only
  // the reconcile of that job touches its entry (one at a time); the map itself is locked.
  struct CachedClient {
    std::string ip, token, tls_ca;
    // Shared with the calls still running on it (WorkerCalls): a client replaced or a job
    // forgotten meanwhile outlives them.
    std::shared_ptr<contract::WorkerApi> client;
  };
  struct WorkerConnections {
    std::map<std::string, CachedClient> clients;
    // The job token its workers were started with (read from its Secret), and the job's UID:
    // a Secret deleted while they run is made again with this token, never a new one, which
    // the running workers would refuse (a replaced generation beside the running one).
    std::string token, token_uid;
    // Since when each silent worker has not answered, on the monotonic clock: a step of the
    // wall clock (NTP, a VM resumed) neither declares a worker lost nor forgives one.
    std::map<std::string, std::chrono::steady_clock::time_point> unreachable_since;
    std::set<std::string> answered;      // pods whose worker has answered at least once
    reconciler::ProgressClock progress;  // the stall detector's input
    std::map<std::string, std::string> unreachable_error;  // the last one logged
    // spec.worker.tlsSecretName's ca.crt ("": plaintext), the name the workers' certificate
    // holds, and when the Secret was read (it is read again every few minutes: rotation).
    std::string tls_secret, tls_ca, tls_server_name;
    std::string tls_unusable;  // why the named Secret cannot be used ("" when it can)
    reconciler::Clock::time_point tls_read;
    // The pod of the job's rank 0 while the job is steady (Plan::steady): the one followed,
    // and the one kept connected ("": every running worker is followed). A steady job holds
    // one connection instead of one per pod.
    std::string quiet_pod;
    // This pass's running workers, each with its client (Observe fills, FollowWorkers empties).
    std::map<std::string, std::shared_ptr<contract::WorkerApi>> followable;
    // The workers' GetStatus asks (Observe), by pod: the answer, once it came, is read by a
    // later pass; those a pass waits for (Awaited) wake the job when the last one ends.
    struct Ask;
    struct Awaited;
    std::map<std::string, std::shared_ptr<Ask>> asking;
    // The API writes a pass started (Execute), on api_writes_: one plan's at a time; their end
    // wakes the job, whose next pass reads a failure.
    struct Writes;
    std::shared_ptr<Writes> writing;
    bool observed = false;  // a pass of this operator has observed the job
    // The last pass that decided failed with an error a retry meets again (Observed).
    bool reconcile_failing = false;
    // Since when passes have decided nothing, waiting for answers (none while one decides).
    std::optional<std::chrono::steady_clock::time_point> awaiting_since;
  };
  // After a pass: follows rank 0 alone (and lets the other clients go) when `plan` finds the
  // job steady, else every running worker.
  void FollowWorkers(const std::string& key, const reconciler::Observed& observed,
                     const reconciler::Plan& plan, WorkerConnections& connections);
  // Reads the job's TLS Secret into `connections` when it is named and not read lately.
  void RefreshTls(WorkerConnections& connections, const reconciler::Observed& observed);
  // GPUs of pods a plan creates, by "namespace/pod", until the pods informer shows the pod
  // bound to a node (then it counts as requested), finished or deleted (an abandoned
  // scale-up's), or a minute passes (its creation failed).
  struct Booking {
    int64_t gpus = 0;
    reconciler::Clock::time_point at;
  };
  std::mutex capacity_mu_;
  std::map<std::string, Booking> booked_gpus_;
  // GPUs requested by bound, unfinished pods, by "namespace/pod", kept by the pods informer's
  // events: IdleGpus then costs nothing per pod. (Listing all pods under capacity_mu_ on every
  // reconcile was most of a reconcile at 2,000 pods, and serialised the reconcile workers.)
  // From the pods informer's observe hook: `pod` as now cached, null once it is gone.
  void CountPod(const std::string& key, const kube::CachedPod* pod);
  struct Held {
    int64_t gpus = 0;
    std::string node;
  };
  std::map<std::string, Held> held_gpus_;
  int64_t held_total_ = 0;
  std::mutex connections_mu_;
  std::map<std::string, std::unique_ptr<WorkerConnections>> connections_;  // by job key
  // The GetStatus asks a decision needs, all of a job's at once (a thread per call was most of
  // the operator's CPU at 2,000 pods); no pass waits on them.
  // Declared last: destroyed (its threads joined) before the clients its calls use.
  ThreadPool status_calls_{16, /*finish_queued=*/false};
  // The GetStatus asks no decision needs (workers starting or silent): apart, so that a silent
  // worker's 3 s never delays a needed ask; what is still queued at shutdown is dropped.
  ThreadPool background_asks_{8, /*finish_queued=*/false};
  ThreadPool patch_calls_{4};  // the patcher's status writes
  // The worker calls a plan makes — Checkpoint barriers (up to barrier_timeout), Rendezvous,
  // PrepareEngine, Resume, Shutdown — run here, never on a reconcile worker: a slow worker
  // holds no reconcile. One call per (pod, what it asks) at a time; its end wakes the job, whose
  // next pass sees the outcome in what the workers report. (Before api_writes_, whose batches
  // start worker calls: it outlives them.)
  WorkerCalls worker_calls_;
  // The writes of a plan (its status, children, pods, finalizers), in its order: here, never on
  // a reconcile worker, so that a slow API server holds no reconcile. What is still queued at
  // shutdown is dropped: the next leader's pass decides it again.
  ThreadPool api_writes_{4, /*finish_queued=*/false};
};

}  // namespace tidal::controller
