// worker/control/buddy.cc
#include "worker/control/buddy.h"

#include <algorithm>
#include <chrono>

#include "common/log.h"
#include "worker/checkpoint/manifest.h"

namespace tidal::worker {

WorkerRuntime::Buddy::Buddy(WorkerRuntime& runtime, const engine::Membership& m, BuddyRing ring)
    : rt_(runtime),
      generation_(m.generation),
      rank_(m.rank),
      world_size_(m.world_size),
      ring_(std::move(ring)),
      copier_([this] { Copy(); }) {}

WorkerRuntime::Buddy::~Buddy() {
  Stop();
  if (captures_ > 0)
    LogInfo("buddy copies",
            {{"copies", captures_},
             {"ward", ring_.ward},
             {"own_bytes_per_copy", writes_ > 0 ? own_bytes_ / writes_ : 0},
             {"pulled_bytes_per_copy", pulls_ > 0 ? pulled_bytes_ / pulls_ : 0},
             {"writes", writes_},
             {"pulls", pulls_},
             {"failed", failed_},
             {"capture_seconds_mean", capture_seconds_ / static_cast<double>(captures_)},
             {"write_seconds_mean", writes_ > 0 ? write_seconds_ / writes_ : 0.0},
             {"pull_seconds_mean", pulls_ > 0 ? pull_seconds_ / pulls_ : 0.0}});
}

Status WorkerRuntime::Buddy::AfterStep(engine::Session& session, engine::TrainingHooks& hooks) {
  const int64_t step = session.step();
  if (stopped_ || step % rt_.options_.buddy_every != 0) return OkStatus();
  const auto start = std::chrono::steady_clock::now();
  auto writer = session.CheckpointBuddy(hooks);
  if (!writer.ok()) {
    LogWarn("buddy copy failed: copies stop for this generation",
            {{"step", step}, {"error", writer.status().message()}});
    Stop();
    return OkStatus();
  }
  capture_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++captures_;
  {
    std::lock_guard<std::mutex> lock(rt_.mu_);
    keep_from_ = step - rt_.options_.buddy_every;  // the two newest copy steps
    due_ = step;
    writer_ = std::move(*writer);  // an older one not yet written is dropped
    rt_.changed_.notify_all();
  }
  Prune();
  return OkStatus();
}

void WorkerRuntime::Buddy::Stop() {
  {
    std::lock_guard<std::mutex> lock(rt_.mu_);
    stopped_ = true;
    rt_.changed_.notify_all();
  }
  if (copier_.joinable()) copier_.join();
}

std::vector<std::string> WorkerRuntime::Buddy::Keys(int rank, int64_t step) const {
  const std::string dir = checkpoint::StepDirectory(step) + "/";
  std::vector<std::string> keys{dir + checkpoint::ShardFileName(rank, world_size_)};
  if (rank == 0) keys.push_back(dir + "trainer_state.json");
  keys.push_back(dir + checkpoint::BuddyPartName(rank, world_size_));
  return keys;
}

void WorkerRuntime::Buddy::Held(int rank, int64_t step) {
  std::lock_guard<std::mutex> lock(rt_.mu_);
  if (step < keep_from_) {
    (void)rt_.peer_state_.Delete(Keys(rank, step));
    return;
  }
  rt_.state_.held.push_back({generation_, rank, world_size_, step});
  rt_.changed_.notify_all();
}

void WorkerRuntime::Buddy::Copy() {
  int64_t done = 0;
  while (true) {
    int64_t step;
    Writer writer;
    {
      std::unique_lock<std::mutex> lock(rt_.mu_);
      rt_.changed_.wait(lock, [&] { return stopped_ || due_ > done; });
      if (stopped_) return;
      step = done = due_;
      writer = std::move(writer_);
    }
    auto start = std::chrono::steady_clock::now();
    auto bytes = writer();
    if (!bytes.ok()) {
      ++failed_;
      LogWarn("writing this rank's buddy copy failed",
              {{"step", step}, {"error", bytes.status().message()}});
      continue;
    }
    write_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++writes_;
    own_bytes_ += *bytes;
    Held(rank_, step);
    start = std::chrono::steady_clock::now();
    auto pulled = Pull(step);
    if (!pulled.ok()) {
      if (pulled.status().code() == StatusCode::kAborted) continue;  // overtaken
      ++failed_;
      LogWarn("copying the ward's part failed", {{"ward", ring_.ward},
                                                 {"from", ring_.members[ring_.ward]},
                                                 {"step", step},
                                                 {"error", pulled.status().message()}});
      continue;
    }
    ++pulls_;
    pulled_bytes_ += *pulled;
    pull_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Held(ring_.ward, step);
  }
}

StatusOr<uint64_t> WorkerRuntime::Buddy::Pull(int64_t step) {
  const std::string& from = ring_.members[ring_.ward];
  const std::vector<std::string> keys = Keys(ring_.ward, step);
  StatusOr<std::string> entries = NotFound("");
  for (int attempt = 0;; ++attempt) {
    entries = rt_.options_.read_peer_object(from, keys.back());
    if (entries.ok() || entries.status().code() != StatusCode::kNotFound) break;
    {
      std::unique_lock<std::mutex> lock(rt_.mu_);
      if (rt_.changed_.wait_for(lock, std::chrono::milliseconds(attempt < 20 ? 2 : 20),
                                [&] { return Overtaken(step); }))
        return Aborted("overtaken by a newer copy");
    }
  }
  if (!entries.ok()) return entries.status();
  uint64_t bytes = entries->size();
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    TIDAL_ASSIGN_OR_RETURN(std::string data, rt_.options_.read_peer_object(from, keys[i]));
    bytes += data.size();
    TIDAL_RETURN_IF_ERROR(rt_.peer_state_.Put(keys[i], data));
  }
  TIDAL_RETURN_IF_ERROR(rt_.peer_state_.Put(keys.back(), *entries));
  return bytes;
}

void WorkerRuntime::Buddy::Prune() {
  int64_t keep_from;
  {
    std::lock_guard<std::mutex> lock(rt_.mu_);
    keep_from = keep_from_;
    auto& held = rt_.state_.held;
    held.erase(std::remove_if(held.begin(), held.end(),
                              [&](const HeldPart& p) { return p.step < keep_from; }),
               held.end());
  }
  auto listed = rt_.peer_state_.List("step-");
  if (!listed.ok()) return;
  std::vector<std::string> old;
  for (const objstore::ObjectInfo& o : *listed) {
    const auto step = checkpoint::ParseStepDirectory(o.key.substr(0, o.key.find('/')));
    if (step && *step < keep_from) old.push_back(o.key);
  }
  if (!old.empty()) (void)rt_.peer_state_.Delete(old);
}

}  // namespace tidal::worker
