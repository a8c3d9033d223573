// worker/control/buddy.h — a generation's buddy copies, WorkerRuntime's part that keeps them
// (runtime.cc makes one per generation with a ring). Not for other code.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "worker/control/runtime.h"

namespace tidal::worker {

// A generation's buddy copies (DESIGN.md §4 step 5). Every `buddy_every` steps each rank copies
// its pieces to host memory on the training thread (its only cost there; no collective); a
// thread of this object's own then writes that part into the worker's peer state and copies the
// ward's part of the same step from the ward (ReadState) while training goes on. The copies of
// the two newest copy steps are kept, own and ward's alike, so that after a loss there is a step
// at which every part is held somewhere: at most `buddy_every` steps are trained again. A copy
// that fails is logged and training goes on (the store checkpoint is the fallback).
class WorkerRuntime::Buddy {
 public:
  using Writer = std::function<StatusOr<uint64_t>()>;
  Buddy(WorkerRuntime& runtime, const engine::Membership& m, BuddyRing ring);
  ~Buddy();  // stops the copies and logs what they cost

  // After each optimizer step: when a copy is due, this rank's pieces are copied to host
  // memory; the copier thread does the rest.
  Status AfterStep(engine::Session& session, engine::TrainingHooks& hooks);

  // Waits for the copy under way, and makes no more.
  void Stop();

 private:
  // The keys of rank `rank`'s part of `step`, the part's entries last: the part is whole once
  // they are there.
  std::vector<std::string> Keys(int rank, int64_t step) const;

  // Under rt_.mu_: the part of `step` is no more of use (stopped, or a newer copy is due).
  bool Overtaken(int64_t step) const { return stopped_ || due_ > step; }

  // Records `rank`'s part of `step` as held, unless newer copies made it one to drop.
  void Held(int rank, int64_t step);

  void Copy();

  // Copies the ward's part of `step` into the peer state, its entries last. The ward writes it
  // on its own thread: until its entries are there, they are asked for again (Aborted once a
  // newer copy is due or copies stop). Returns the bytes.
  StatusOr<uint64_t> Pull(int64_t step);

  // Drops every copy older than the two newest copy steps, from memory and from `held`.
  void Prune();

  WorkerRuntime& rt_;
  const int64_t generation_;
  const int rank_, world_size_;
  const BuddyRing ring_;
  // Under rt_.mu_: the newest copy's step and its writer (not yet run), the oldest step kept,
  // and whether copies stopped.
  int64_t due_ = 0, keep_from_ = 0;
  Writer writer_;
  bool stopped_ = false;
  // The training thread's counters, and the copier's.
  int64_t captures_ = 0;
  double capture_seconds_ = 0;
  int64_t writes_ = 0, pulls_ = 0, failed_ = 0;
  uint64_t own_bytes_ = 0, pulled_bytes_ = 0;
  double write_seconds_ = 0, pull_seconds_ = 0;
  std::thread copier_;  // last: starts once the rest is built
};

}  // namespace tidal::worker
