// operator/controller/status_feed.cc
#include "operator/controller/status_feed.h"

#include <algorithm>

#include "common/log.h"
#include "contract/worker_status.h"
#include "operator/controller/interval_json.h"

namespace tidal::controller {

StatusFeed::StatusFeed(Options options, std::function<void(const std::string&)> wake)
    : options_(options), wake_(std::move(wake)) {}

StatusFeed::~StatusFeed() {
  std::vector<std::unique_ptr<contract::StatusStream>> closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [job, j] : jobs_)
      for (auto& [pod, w] : j.workers)
        if (w.stream) closing.push_back(std::move(w.stream));
  }
  closing.clear();  // outside the lock: each waits for its stream's last callback
}

std::unique_ptr<contract::StatusStream> StatusFeed::Open(const std::string& job,
                                                         const std::string& pod, Worker& w) {
  const uint64_t incarnation = w.incarnation = next_incarnation_++;
  w.open = false;
  w.stale = false;
  w.latest.reset();
  return w.client->WatchStatus(
      options_.min_interval, options_.heartbeat,
      [this, job, pod, incarnation](const contract::WorkerStatus& s) {
        OnStatus(job, pod, incarnation, s);
      },
      [this, job, pod, incarnation](const Status& why) { OnEnd(job, pod, incarnation, why); });
}

void StatusFeed::Follow(const std::string& job,
                        const std::map<std::string, std::shared_ptr<contract::WorkerApi>>& pods) {
  std::vector<std::unique_ptr<contract::StatusStream>> closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job& j = jobs_[job];
    for (auto it = j.workers.begin(); it != j.workers.end();) {
      auto listed = pods.find(it->first);
      if (listed == pods.end() || listed->second != it->second.client) {
        if (it->second.stream) closing.push_back(std::move(it->second.stream));
        it = j.workers.erase(it);
      } else {
        ++it;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [pod, client] : pods) {
      if (!client) continue;
      Worker& w = j.workers[pod];
      const bool ended = w.stream && (w.stream->ended() || w.stale);
      if (w.stream && !ended) continue;
      if (ended && now < w.retry_at) continue;
      if (w.stream) closing.push_back(std::move(w.stream));
      w.client = client;
      w.stream = Open(job, pod, w);
    }
  }
  closing.clear();
}

void StatusFeed::Forget(const std::string& job) {
  std::vector<std::unique_ptr<contract::StatusStream>> closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    for (auto& [pod, w] : it->second.workers)
      if (w.stream) closing.push_back(std::move(w.stream));
    jobs_.erase(it);
  }
  closing.clear();
}

bool StatusFeed::Pushed(const std::string& job, const std::vector<std::string>& pods) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto j = jobs_.find(job);
  if (j == jobs_.end() || pods.empty()) return false;
  for (const std::string& pod : pods) {
    auto w = j->second.workers.find(pod);
    if (w == j->second.workers.end() || !w->second.open) return false;
  }
  return true;
}

std::shared_ptr<const contract::WorkerStatus> StatusFeed::Latest(
    const std::string& job, const std::string& pod,
    const std::shared_ptr<contract::WorkerApi>& client, std::chrono::milliseconds max_age) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return nullptr;
  auto w = j->second.workers.find(pod);
  if (w == j->second.workers.end() || !w->second.open || w->second.client != client ||
      std::chrono::steady_clock::now() - w->second.last_message > max_age)
    return nullptr;
  return w->second.latest;
}

std::map<std::string, StatusFeed::Figures> StatusFeed::TakeChangedFigures() {
  std::map<std::string, Figures> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [job, j] : jobs_)
    if (j.figures_changed && j.figures) {
      out[job] = *j.figures;
      j.figures_changed = false;
    }
  return out;
}

void StatusFeed::Sweep() {
  std::vector<std::string> woken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    for (auto& [job, j] : jobs_)
      for (auto& [pod, w] : j.workers) {
        if (!w.open || now - w.last_message <= 3 * options_.heartbeat) continue;
        w.open = false;
        w.stale = true;
        w.figures.reset();
        w.latest.reset();
        w.backoff = options_.initial_backoff;
        w.retry_at = now;  // reopened at once: the worker may only have been slow
        w.error =
            "no status for " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::seconds>(now - w.last_message).count()) +
            " s";
        LogInfo("worker status stream silent", {{"job", job}, {"pod", pod}, {"error", w.error}});
        woken.push_back(job);
      }
  }
  for (const std::string& job : woken) wake_(job);
}

size_t StatusFeed::streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [job, j] : jobs_)
    for (const auto& [pod, w] : j.workers) n += w.stream && w.open ? 1 : 0;
  return n;
}

StatusFeed::Worker* StatusFeed::FindLocked(const std::string& job, const std::string& pod,
                                           uint64_t incarnation, Job** job_out) {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return nullptr;
  auto it = j->second.workers.find(pod);
  if (it == j->second.workers.end() || it->second.incarnation != incarnation) return nullptr;
  if (job_out) *job_out = &j->second;
  return &it->second;
}

void StatusFeed::OnStatus(const std::string& job, const std::string& pod, uint64_t incarnation,
                          const contract::WorkerStatus& status) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Job* j = nullptr;
    Worker* found = FindLocked(job, pod, incarnation, &j);
    if (!found) return;
    Worker& w = *found;
    contract::WorkerStatus actionable = contract::ActionablePart(status);
    wake = !w.open || actionable != w.actionable;
    w.actionable = std::move(actionable);
    w.latest = std::make_shared<const contract::WorkerStatus>(status);
    w.open = true;
    w.last_message = std::chrono::steady_clock::now();
    w.backoff = std::chrono::milliseconds(0);
    w.error.clear();
    const bool rank0 =
        status.rank == 0 && status.generation > 0 && status.phase == api::WorkerPhase::kRunning;
    w.figures.reset();
    if (rank0) {
      Figures f;
      f.generation = status.generation;
      f.step = status.step;
      f.loss = status.loss;
      f.tokens_per_second = status.tokens_per_second;
      if (status.last_checkpoint) {
        f.checkpoint_step = status.last_checkpoint->step;
        f.checkpoint_kind = status.last_checkpoint->kind;
        f.checkpoint_uri = status.last_checkpoint->uri;
      }
      f.checkpoint_interval = CheckpointIntervalJson(status);
      w.figures = std::move(f);
    }
    // The job's figures: the rank 0 of the newest generation among its workers.
    std::optional<Figures> newest;
    for (const auto& [name, other] : j->workers)
      if (other.figures && (!newest || other.figures->generation > newest->generation))
        newest = other.figures;
    if (newest && newest != j->figures) {
      j->figures = newest;
      j->figures_changed = true;
    }
  }
  if (wake) wake_(job);
}

void StatusFeed::OnEnd(const std::string& job, const std::string& pod, uint64_t incarnation,
                       const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Worker* found = FindLocked(job, pod, incarnation);
    if (!found) return;
    Worker& w = *found;
    w.open = false;
    w.figures.reset();
    w.latest.reset();
    w.backoff = w.backoff.count() == 0
                    ? options_.initial_backoff
                    : std::min<std::chrono::milliseconds>(w.backoff * 2, options_.max_backoff);
    w.retry_at = std::chrono::steady_clock::now() + w.backoff;
    if (w.error != why.ToString()) {
      w.error = why.ToString();
      LogInfo("worker status stream ended",
              {{"job", job},
               {"pod", pod},
               {"error", w.error},
               {"retry_in_seconds", std::chrono::duration<double>(w.backoff).count()}});
    }
  }
  wake_(job);
}

}  // namespace tidal::controller
