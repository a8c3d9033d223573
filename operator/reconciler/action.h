// operator/reconciler/action.h — what a reconcile asks the shell to do to the world, one type per
// kind: API writes (a finalizer, the job's children, its pods) and worker calls (a barrier, a
// rendezvous, a shutdown). `Decide` puts them into its Plan in the order they must run; the shell
// carries each out with a visitor (operator/controller/execute.cc), so a kind it does not handle
// is a compile error, not a silent `default:`. Each type holds only its own fields.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace tidal::reconciler {

namespace action {

struct AddFinalizer {
  static constexpr const char* kName = "AddFinalizer";
};
struct RemoveFinalizer {
  static constexpr const char* kName = "RemoveFinalizer";
};
struct EnsureService {
  static constexpr const char* kName = "EnsureService";
};
struct EnsureTokenSecret {
  static constexpr const char* kName = "EnsureTokenSecret";
};
struct EnsureSpecConfig {
  static constexpr const char* kName = "EnsureSpecConfig";
};
// The workers' copy of the spec, rewritten while no worker runs.
struct UpdateSpecConfig {
  static constexpr const char* kName = "UpdateSpecConfig";
};

// Worker pods of `generation`, one per slot (pods[i] in slots[i]), created together: one gang.
struct CreatePods {
  static constexpr const char* kName = "CreatePods";
  std::vector<std::string> pods;
  std::vector<int> slots;
  int64_t generation = 0;
};

struct DeletePods {
  static constexpr const char* kName = "DeletePods";
  std::vector<std::string> pods;
};

// Deleted with grace 0, without waiting for their kubelet (a node that is gone).
struct ForceDeletePods {
  static constexpr const char* kName = "ForceDeletePods";
  std::vector<std::string> pods;
};

// The data phase's pod (status.data.key).
struct CreatePrepPod {
  static constexpr const char* kName = "CreatePrepPod";
  std::string pod;
};

// Checkpoint{pause} on every pod: a rescale's barrier (live: kept in the ranks' memory) or the
// anomaly rule's pause. `id` is the barrier's name (worker.proto), the same on every call and
// every re-send of it: the generation in the high 32 bits; the low ones the anomaly's step for a
// pause, all ones for the barrier that ends the generation (rescale, suspend, deletion).
struct Barrier {
  static constexpr const char* kName = "Barrier";
  std::vector<std::string> pods;
  uint64_t id = 0;
  bool live = false;
};

// The next generation's members (`pods`, in rank order; the store on the first one's IP); only
// `targets` are called (those not there yet).
struct Rendezvous {
  static constexpr const char* kName = "Rendezvous";
  std::vector<std::string> pods;
  std::vector<std::string> targets;
  int64_t generation = 0;
  // Where the new generation resumes from (RescaleState::state_peers, in rank order), at which
  // step; none: the store.
  std::vector<std::string> state_peers;
  int64_t state_step = 0;
  // Per rank, the rank whose buddy copy it keeps (planner::BuddyWards).
  std::vector<int> wards;
  // The job's restarts so far (status.restarts), for the workers' automatic checkpoint interval.
  int64_t restarts = 0;
};

// Each pod asked to get ready for its planned rank (ranks[i] of world_size) in `generation`.
struct PrepareEngine {
  static constexpr const char* kName = "PrepareEngine";
  std::vector<std::string> pods;
  std::vector<int> ranks;
  int world_size = 0;
  int64_t generation = 0;
};

struct Shutdown {
  static constexpr const char* kName = "Shutdown";
  std::vector<std::string> pods;
  std::string reason;
};

// Pods held by a pause (the anomaly rule's) go on.
struct Resume {
  static constexpr const char* kName = "Resume";
  std::vector<std::string> pods;
};

}  // namespace action

using Action =
    std::variant<action::AddFinalizer, action::RemoveFinalizer, action::EnsureService,
                 action::EnsureTokenSecret, action::EnsureSpecConfig, action::UpdateSpecConfig,
                 action::CreatePods, action::DeletePods, action::ForceDeletePods,
                 action::CreatePrepPod, action::Barrier, action::Rendezvous, action::PrepareEngine,
                 action::Shutdown, action::Resume>;

// The kind's name, for logs, metrics and tests ("CreatePods").
inline const char* ActionName(const Action& a) {
  return std::visit([](const auto& kind) { return kind.kName; }, a);
}

// The action of kind A, or nullptr: `if (auto* d = As<action::DeletePods>(a)) ...`.
template <class A>
const A* As(const Action& a) {
  return std::get_if<A>(&a);
}

// std::visit over lambdas, one per kind: std::visit(Overloaded{[](const action::X&) {...}, ...},
// a).
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace tidal::reconciler
