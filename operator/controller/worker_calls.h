// operator/controller/worker_calls.h — the worker RPCs a reconcile starts and does not wait
// for (controller-runtime's rule: a reconcile never blocks on the outside world). Each call
// runs on a thread of its own — a Checkpoint barrier may take minutes, and a pool would let
// one job's barriers hold back another's — at most one per key (the pod and what it asks), so
// a plan that repeats an action while its call still runs starts nothing. When a call ends,
// `done` runs on its thread with the result; the controller's wakes the job, whose next pass
// sees the outcome in what the workers report.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/status.h"

namespace tidal::controller {

class WorkerCalls {
 public:
  WorkerCalls();
  ~WorkerCalls();  // Shutdown(0)
  WorkerCalls(const WorkerCalls&) = delete;
  WorkerCalls& operator=(const WorkerCalls&) = delete;

  // Starts `call` unless a call under `key` still runs (false: nothing started) or Shutdown
  // was called.
  bool Start(const std::string& key, std::function<Status()> call,
             std::function<void(const Status&)> done);
  bool Running(const std::string& key) const;
  size_t running() const;
  // No call starts after this and no `done` runs after it returns. Waits up to `timeout` for
  // the calls under way; the others end on their own (each holds what it uses).
  void Shutdown(std::chrono::milliseconds timeout);

 private:
  struct State {
    std::mutex mu;
    std::condition_variable ended;
    std::set<std::string> running;
    bool shut = false;
  };
  std::shared_ptr<State> state_;
};

}  // namespace tidal::controller
