// operator/controller/worker_calls.cc
#include "operator/controller/worker_calls.h"

#include <thread>

namespace tidal::controller {

WorkerCalls::WorkerCalls() : state_(std::make_shared<State>()) {}

WorkerCalls::~WorkerCalls() { Shutdown(std::chrono::milliseconds(0)); }

bool WorkerCalls::Start(const std::string& key, std::function<Status()> call,
                        std::function<void(const Status&)> done) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->shut || !state_->running.insert(key).second) return false;
  }
  std::thread([state = state_, key, call = std::move(call), done = std::move(done)] {
    Status result;
    try {
      result = call();
    } catch (const std::exception& e) {
      result = Internal(std::string("worker call threw: ") + e.what());
    }
    std::lock_guard<std::mutex> lock(state->mu);
    // Under the lock: Shutdown returns only once no `done` runs, and none runs after it.
    if (!state->shut && done) done(result);
    state->running.erase(key);
    state->ended.notify_all();
  }).detach();
  return true;
}

bool WorkerCalls::Running(const std::string& key) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->running.count(key) > 0;
}

size_t WorkerCalls::running() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->running.size();
}

void WorkerCalls::Shutdown(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->shut = true;
  state_->ended.wait_for(lock, timeout, [&] { return state_->running.empty(); });
}

}  // namespace tidal::controller
