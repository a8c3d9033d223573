// operator/controller/status_feed.h — the workers' status, pushed (worker.proto WatchStatus):
// one long-lived, authenticated stream per running worker pod, with no thread of its own. What
// the operator acts on (phase, generation, checkpoints, errors, ...: contract::ActionablePart)
// wakes the job's reconcile at once; the step's figures (step, loss,
// tokens/s) only go to status, through the controller's patcher, at a bounded rate. A stream
// that ends wakes the job too (a signal, never a busy loop): it is opened again at the job's
// next reconcile after a backoff (0.5 s doubling to 30 s, reset by a status), and until then
// the job is polled as before.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "contract/worker_api.h"
#include "operator/reconciler/reconcile.h"

namespace tidal::controller {

class StatusFeed {
 public:
  struct Options {
    std::chrono::milliseconds min_interval{500};  // of step figures, per worker
    std::chrono::milliseconds heartbeat{std::chrono::seconds(10)};
    std::chrono::milliseconds initial_backoff{500};
    std::chrono::milliseconds max_backoff{std::chrono::seconds(30)};
  };
  using Figures =
      reconciler::StepFigures;  // of a job: its rank 0's, at the newest generation it reports

  // `wake(job)`: an actionable change of one of the job's workers, or a stream that ended.
  // Runs on gRPC's threads: it must not block.
  StatusFeed(Options options, std::function<void(const std::string& job)> wake);
  ~StatusFeed();  // closes every stream
  StatusFeed(const StatusFeed&) = delete;
  StatusFeed& operator=(const StatusFeed&) = delete;

  // From the job's reconcile: the worker pods to follow, with their clients (a pod's stream is
  // reopened when its client changes). Opens what is missing, reopens what ended once its
  // backoff is over, closes the streams of pods no longer listed.
  void Follow(const std::string& job,
              const std::map<std::string, std::shared_ptr<contract::WorkerApi>>& pods);
  void Forget(const std::string& job);
  // Whether each of `pods` has an open stream that has delivered a status: the job's workers
  // push every change, and it needs no poll.
  bool Pushed(const std::string& job, const std::vector<std::string>& pods) const;
  // The newest status `pod`'s open stream through `client` delivered, if within `max_age`
  // (null: none — not followed, not yet delivered, ended, through another client, or older: a
  // worker frozen or cut off keeps its stream open until three heartbeats pass). The worker
  // pushes what the operator acts on at once (within 100 ms) and its figures at least every
  // min_interval while it trains.
  std::shared_ptr<const contract::WorkerStatus> Latest(
      const std::string& job, const std::string& pod,
      const std::shared_ptr<contract::WorkerApi>& client, std::chrono::milliseconds max_age) const;
  // Jobs whose figures changed since the last call, with the newest figures.
  std::map<std::string, Figures> TakeChangedFigures();
  // A stream that delivered nothing for three heartbeats (a frozen worker keeps its connection)
  // is taken as ended: its job is woken, and it is reopened at the next Follow after a backoff.
  // Called every few hundred milliseconds (the controller's patcher).
  void Sweep();
  size_t streams() const;

 private:
  struct Worker {
    std::shared_ptr<contract::WorkerApi> client;
    std::unique_ptr<contract::StatusStream> stream;
    uint64_t incarnation = 0;  // of `stream`: callbacks of an older one are ignored
    bool open = false;         // delivered a status and has not ended
    bool stale = false;        // Sweep gave up on it: reopened like an ended one
    std::chrono::steady_clock::time_point last_message{};
    std::optional<contract::WorkerStatus> actionable;      // ActionablePart of the newest status
    std::shared_ptr<const contract::WorkerStatus> latest;  // while open
    std::optional<Figures> figures;                        // when it reports rank 0 in a generation
    std::chrono::steady_clock::time_point retry_at{};
    std::chrono::milliseconds backoff{0};
    std::string error;  // why the last stream ended
  };
  struct Job {
    std::map<std::string, Worker> workers;  // by pod
    std::optional<Figures> figures;         // the newest, as last taken or not
    bool figures_changed = false;
  };
  void OnStatus(const std::string& job, const std::string& pod, uint64_t incarnation,
                const contract::WorkerStatus& status);
  void OnEnd(const std::string& job, const std::string& pod, uint64_t incarnation,
             const Status& why);
  // The worker a callback of stream `incarnation` speaks for (null: that stream was replaced
  // or the pod unfollowed); `job_out` gets its job. Under mu_.
  Worker* FindLocked(const std::string& job, const std::string& pod, uint64_t incarnation,
                     Job** job_out = nullptr);
  std::unique_ptr<contract::StatusStream> Open(const std::string& job, const std::string& pod,
                                               Worker& w);

  const Options options_;
  const std::function<void(const std::string&)> wake_;
  mutable std::mutex mu_;
  std::map<std::string, Job> jobs_;
  uint64_t next_incarnation_ = 1;
};

}  // namespace tidal::controller
