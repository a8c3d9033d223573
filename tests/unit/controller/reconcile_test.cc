// Decide, the controller's brain, against a simulated cluster: pods appear (or stay Pending),
// workers answer GetStatus, train, pause at barriers and join generations as tidal-worker
// does. The status goes through its JSON form between every reconcile — exactly what a new
// leader would read — so every scenario also shows the protocol carries on from status alone.
#include "operator/reconciler/reconcile.h"
#include "tests/test_paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "common/yaml_json.h"
#include "local/schema.h"

namespace tidal::reconciler {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using W = api::WorkerPhase;
using kube::PodPhase;

json Spec(const std::string& extra = "") {
  json spec = json::parse(R"({
    "model": {"preset": "tiny"},
    "dataset": {"uri": "/data/sample.jsonl", "format": "text", "maxSeqLen": 32},
    "optimization": {"globalBatchSize": 8, "microBatchSize": 2, "maxSteps": 1000},
    "elastic": {"minGPUs": 2, "maxGPUs": 4, "cooldownSeconds": 0, "scaleUpTimeoutSeconds": 60},
    "restartPolicy": {"maxRestarts": 2, "backoffSeconds": 10}
  })");
  if (!extra.empty()) spec.merge_patch(json::parse(extra));
  return spec;
}

class Sim {
 public:
  explicit Sim(json spec) { SetSpec(std::move(spec)); }
  void SetSpec(json spec) {
    raw_spec_ = std::move(spec);
    ++metadata_generation_;
  }

  // One reconcile: observe, decide, round-trip the status through JSON, apply the actions,
  // then let the workers train one step.
  Plan Reconcile() {
    ++passes_;
    for (auto it = lingering_.begin(); it != lingering_.end();) {  // terminations that end now
      if (--it->second > 0) {
        ++it;
        continue;
      }
      pods_.erase(it->first);
      it = lingering_.erase(it);
    }
    if (pending_barrier_ && --pending_barrier_passes_ <= 0) {  // the barrier calls end
      releasing_barrier_ = true;
      On(*pending_barrier_);
      releasing_barrier_ = false;
      pending_barrier_.reset();
    }
    Observed o;
    o.name = "job";
    o.namespace_ = "ns";
    o.uid = "uid-1";
    o.metadata_generation = metadata_generation_;
    o.deleting = deleting_;
    o.deletion_started = deletion_started_;
    o.has_finalizer = finalizer_;
    o.spec = api::ParseManagedJobSpec(raw_spec_, &o.refused_replicas);
    o.raw_spec = raw_spec_;
    ObserveStatus(status_json_, o);
    if (!expect_unreadable_status_) EXPECT_EQ(o.status_error, "");
    o.service_exists = service_;
    o.token_exists = token_;
    o.reconcile_failing = reconcile_failing_;
    o.spec_config_exists = config_;
    for (const auto& [name, pod] : pods_) o.pods.push_back(pod);
    for (const auto& [name, pod] : prep_pods_) o.prep_pods.push_back(pod);
    for (const auto& [name, r] : reports_)
      if (pods_.count(name) && pods_[name].phase == PodPhase::kRunning && !silent_.count(name))
        o.reports[name] = r;
    for (const auto& [name, since] : silent_)
      if (pods_.count(name)) o.unreachable_since[name] = since;
    o.unreachable_error = unreachable_error_;
    o.idle_gpus = idle_gpus_;
    o.share = share_;
    o.pushed = pushed_;
    o.now = now_;
    // The shell's monotonic clock: as far from its start as the wall clock, unless a test
    // has stepped the wall clock (wall_step_).
    o.no_progress_for = progress_.Observe(
        o.pods, o.reports, std::chrono::steady_clock::time_point{} + (now_ - start_ - wall_step_));
    Plan plan = Decide(o);
    // Every phase change the code makes is one the transition table allows — in every pass of
    // every scenario below, not only in the table's own test.
    for (const PhaseChange& c : plan.phase_changes) {
      EXPECT_FALSE(c.refused) << "refused: " << planner::PhaseName(c.from) << " + "
                              << planner::EventName(c.event) << " (" << c.reason << ")";
      phase_changes_.push_back(std::string(planner::PhaseName(c.from)) + " -" +
                               planner::EventName(c.event) + "-> " + planner::PhaseName(c.to));
    }
    if (plan.conditions_only)
      status_json_["conditions"] = ToJson(plan.status.conditions);
    else
      status_json_ = ToJson(plan.status, "tidal.dev/job=job");
    // An operator that dies after writing the status loses the actions it had not done.
    if (lose_actions_every_ == 0 || ++reconciles_ % lose_actions_every_ != 0)
      for (const Action& a : plan.actions) Apply(a);
    for (const Event& e : plan.events) {
      events_.push_back(e.reason);
      event_messages_.push_back(e.message);
    }
    Train();
    CheckOneGenerationTrains();
    now_ += 1s;
    return plan;
  }
  // Reconciles until `done` holds (at most `max` times).
  void Until(const std::function<bool()>& done, int max = 50) {
    for (int i = 0; i < max && !done(); ++i) Reconcile();
    ASSERT_TRUE(done()) << "status: " << status_json_.dump();
  }

  // Someone else deletes the pod (an eviction, `kubectl drain`, `kubectl delete pod`): it is
  // marked terminating, and its worker, told by SIGTERM, trains on (TIDAL_DRAIN_SECONDS)
  // until the operator's Shutdown; the pod goes when the operator deletes it too.
  void DeleteFromOutside(const std::string& pod) {
    pods_[pod].deleting = true;
    pods_[pod].deletion_deadline = now_ + 120s;
  }

  JobStatus status() const {  // an unreadable one: its conditions only
    Observed o;
    ObserveStatus(status_json_, o);
    return o.status;
  }
  const json& status_json() const { return status_json_; }
  std::string phase() const { return planner::PhaseName(status().phase); }
  // A rescale under way has reached its Rendezvous stage.
  bool AtRendezvous() const {
    const JobStatus st = status();
    return st.rescale && st.rescale->stage == RescaleState::Stage::kRendezvous;
  }
  // Every phase change made so far, "Running -RescaleStarted-> Scaling".
  std::vector<std::string> phase_changes_;
  bool HasEvent(const std::string& reason) const {
    return std::find(events_.begin(), events_.end(), reason) != events_.end();
  }
  int64_t CountEvents(const std::string& reason) const {
    return std::count(events_.begin(), events_.end(), reason);
  }
  std::map<std::string, PodView> pods_;
  std::map<std::string, WorkerReport> reports_;
  // The data phase: a prep pod ends, as soon as it is created, as this says (phase, message).
  std::map<std::string, PrepPodView> prep_pods_;
  std::vector<std::string> prep_pods_created_;
  std::function<std::pair<std::string, std::string>(int attempt)> prep_outcome_ = [](int) {
    return std::pair<std::string, std::string>(
        "Succeeded", R"({"store": "file:///data/.tidal-tokens/0123abcd", "samples": 40,
                         "tokens": 1200, "reused": false})");
  };
  bool buddies_ = false;  // the workers keep buddy copies every step (buddyEverySteps: 1)
  // PrepareEngine: a new worker loads its engine in prepare_passes_ reconciles, refuses (as
  // TIDAL_KEEP_ENGINE=0 does: no report), or reports a failure.
  enum class Prepare { kLoads, kRefuses, kFails };
  Prepare prepare_ = Prepare::kLoads;
  int prepare_passes_ = 1;
  std::vector<action::PrepareEngine> prepare_asks_;
  std::vector<std::string> barriers_while_loading_;  // workers loading when a barrier came
  // The barrier's calls run off the reconcile (the shell's WorkerCalls): the ranks hold this
  // many passes after it is first sent. 0: at once.
  int barrier_passes_ = 0;
  std::optional<action::Barrier> pending_barrier_;
  int pending_barrier_passes_ = 0;
  bool releasing_barrier_ = false;
  int barrier_resends_ = 0;            // the same barrier sent again while its calls ran
  int prepared_for_another_rank_ = 0;  // Rendezvous ranks off the prepared plan
  bool pods_stay_pending_ = false;
  // The node a new pod of `slot` is bound to ("" for all when unset).
  std::function<std::string(int slot)> node_of_;
  // Pods whose worker stopped answering GetStatus, since when (its process hangs, its network
  // is cut): the shell's unreachable_since.
  std::map<std::string, Clock::time_point> silent_;
  std::map<std::string, std::string> unreachable_error_;  // the shell's: why each is silent
  bool stuck_ = false;
  bool expect_unreadable_status_ = false;
  bool reconcile_failing_ = false;  // the shell's mark: a pass failed and none succeeded since
  json& mutable_status_json() {
    return status_json_;
  }                               // the workers answer "training" but no step ends (a hang)
  Clock::duration wall_step_{0};  // how far the wall clock has been stepped (NTP, a resumed VM)
  int lose_actions_every_ = 0;    // drop every Nth reconcile's actions (a crashed leader)
  int linger_ = 0;  // deleted pods stay, terminating, for this many reconciles (grace period)
  int reconciles_ = 0;
  bool deleting_ = false, finalizer_ = false;
  std::optional<Clock::time_point> deletion_started_;  // the job's deletionTimestamp
  int64_t idle_gpus_ = 8;
  std::optional<planner::Share> share_;  // the cluster's share (none: not shared)
  bool pushed_ = false;                  // the workers push their status (Observed::pushed)
  Clock::time_point now_ = Clock::time_point{} + std::chrono::hours(24 * 365 * 50);
  const Clock::time_point start_ = now_;
  std::vector<std::string> events_;
  std::vector<std::string> event_messages_;  // events_'s messages, in the same order
  std::vector<std::string> shutdown_;
  std::vector<std::string> force_deleted_;
  // The loss each step reports (the job's: every rank the same), and GPU utilisation (none: CPU).
  std::function<double(int64_t step)> loss_ = [](int64_t step) { return 3.0 - 0.001 * step; };
  std::optional<double> gpu_util_;
  int config_updates_ = 0;
  uint64_t last_barrier_id_ = 0;

 private:
  void Apply(const Action& a) {
    std::visit([this](const auto& kind) { On(kind); }, a);
  }
  void On(const action::AddFinalizer&) { finalizer_ = true; }
  void On(const action::RemoveFinalizer&) { finalizer_ = false; }
  void On(const action::EnsureService&) { service_ = true; }
  void On(const action::EnsureTokenSecret&) { token_ = true; }
  void On(const action::EnsureSpecConfig&) { config_ = true; }
  void On(const action::UpdateSpecConfig&) {
    EXPECT_TRUE(pods_.empty()) << "the spec ConfigMap changed under running workers";
    ++config_updates_;
  }
  void On(const action::CreatePods& a) {
    ASSERT_EQ(a.pods.size(), a.slots.size());
    for (size_t i = 0; i < a.pods.size(); ++i) {
      ASSERT_FALSE(pods_.count(a.pods[i])) << a.pods[i] << " created twice";
      PodView p;
      p.name = a.pods[i];
      p.slot = a.slots[i];
      p.created_for_generation = a.generation;
      p.phase = pods_stay_pending_ ? PodPhase::kPending : PodPhase::kRunning;
      p.reason = pods_stay_pending_ ? "Unschedulable" : "";
      p.ip = "127.0.0." + std::to_string(10 + a.slots[i]);
      if (node_of_) p.node = node_of_(a.slots[i]);
      pods_[p.name] = p;
      reports_[p.name] = WorkerReport{.phase = W::kWaiting};
    }
  }
  void On(const action::CreatePrepPod& a) {
    ASSERT_FALSE(prep_pods_.count(a.pod)) << a.pod << " created twice";
    const auto [phase, message] = prep_outcome_(static_cast<int>(prep_pods_created_.size()));
    prep_pods_created_.push_back(a.pod);
    prep_pods_[a.pod] =
        PrepPodView{.name = a.pod, .phase = kube::ParsePodPhase(phase), .message = message};
  }
  void On(const action::DeletePods& a) {
    for (const std::string& p : a.pods) {
      if (prep_pods_.erase(p)) continue;
      reports_.erase(p);  // SIGTERM: the worker stops answering
      if (linger_ > 0 && pods_.count(p)) {
        pods_[p].deleting = true;
        if (!pods_[p].deletion_deadline) pods_[p].deletion_deadline = now_ + 120s;  // grace
        lingering_.try_emplace(p, linger_);
      } else {
        pods_.erase(p);
      }
    }
  }
  void On(const action::ForceDeletePods& a) {
    for (const std::string& p : a.pods) {
      force_deleted_.push_back(p);
      pods_.erase(p);
      lingering_.erase(p);
      reports_.erase(p);
    }
  }
  void On(const action::Barrier& a) {
    if (barrier_passes_ > 0 && !releasing_barrier_) {
      // The shell starts the calls and returns (WorkerCalls): the ranks reach the barrier
      // some passes later. A barrier sent again meanwhile starts no new call.
      if (pending_barrier_ && pending_barrier_->id == a.id) {
        ++barrier_resends_;
      } else {
        pending_barrier_ = a;
        pending_barrier_passes_ = barrier_passes_;
      }
      return;
    }
    for (const auto& [name, r] : reports_)  // the job pauses only once nothing loads
      if (r.prepared && r.prepared->generation > r.generation && !r.prepared->ready &&
          r.prepared->error.empty())
        barriers_while_loading_.push_back(name);
    // Named for the workers (worker.proto): this generation's, never an older barrier's.
    EXPECT_EQ(a.id >> 32, static_cast<uint64_t>(status().generation));
    EXPECT_GE(a.id, last_barrier_id_) << "a barrier named below an earlier one";
    last_barrier_id_ = a.id;
    int64_t step = 0;
    for (const std::string& p : a.pods)
      if (reports_.count(p)) step = std::max(step, reports_[p].step);
    for (const std::string& p : a.pods) {
      if (!reports_.count(p)) continue;
      WorkerReport& r = reports_[p];
      if (r.phase == W::kRunning) {
        r.phase = W::kPaused;
        r.step = step;
      } else if (r.phase != W::kPaused) {
        continue;
      }
      // A live barrier keeps the state in the ranks' memory; else (ranks held at a live
      // checkpoint too) it goes to the store.
      if (a.live) {
        r.live_step = r.step;
      } else {
        r.checkpoint_step = r.step;
        r.checkpoint_uri = "file:///ckpt/step-" + std::to_string(r.step);
        checkpoint_ = std::max(checkpoint_, r.step);
      }
    }
  }
  void On(const action::Rendezvous& a) {
    members_of_[a.generation] = a.pods;
    {  // every rank keeps exactly one rank's copy, never its own (beyond one rank)
      EXPECT_EQ(a.wards.size(), a.pods.size());
      std::set<int> wards(a.wards.begin(), a.wards.end());
      EXPECT_EQ(wards.size(), a.wards.size());
      for (size_t rank = 0; rank < a.wards.size() && a.wards.size() > 1; ++rank) {
        EXPECT_NE(a.wards[rank], static_cast<int>(rank));
        ward_of_[a.pods[rank]] = a.wards[rank];
      }
    }
    for (const std::string& p : a.targets) {
      auto rank = std::find(a.pods.begin(), a.pods.end(), p) - a.pods.begin();
      ASSERT_LT(static_cast<size_t>(rank), a.pods.size()) << "target outside the members";
      WorkerReport& r = reports_[p];
      if (r.prepared && r.prepared->ready &&
          (r.prepared->rank != rank || r.prepared->world_size != std::ssize(a.pods)))
        ++prepared_for_another_rank_;
      r.generation = a.generation;
      r.rank = static_cast<int>(rank);
      r.world_size = static_cast<int>(a.pods.size());
      if (a.state_peers.empty()) {
        r.phase = W::kRunning;
        r.step = checkpoint_;  // resumes from the newest checkpoint
        r.held.clear();
        ++resumed_from_store_;
        last_resumed_step_ = r.step;
      } else {
        r.phase = W::kJoining;  // reads from the peers until the next reconcile's Train
        joining_since_[p] = passes_;
        reading_from_ = a.state_peers;
        reading_step_ = a.state_step;
      }
    }
  }
  void On(const action::Shutdown& a) {
    for (const std::string& p : a.pods) {
      if (!joining_since_.empty() &&
          std::find(reading_from_.begin(), reading_from_.end(), p) != reading_from_.end())
        ADD_FAILURE() << p << " was shut down while the new generation read its state";
      shutdown_.push_back(p);
      reports_.erase(p);
    }
  }
  void On(const action::Resume& a) {
    for (const std::string& p : a.pods)
      if (reports_.count(p) && reports_[p].phase == W::kPaused) reports_[p].phase = W::kRunning;
  }
  void On(const action::PrepareEngine& a) {
    ASSERT_EQ(a.pods.size(), a.ranks.size());
    prepare_asks_.push_back(a);
    for (size_t i = 0; i < a.pods.size(); ++i) {
      if (!reports_.count(a.pods[i]) || prepare_ == Prepare::kRefuses) continue;
      WorkerReport& r = reports_[a.pods[i]];
      EXPECT_LT(r.generation, a.generation) << a.pods[i] << " asked to prepare for the past";
      const WorkerReport::Prepared plan{a.generation, a.ranks[i], a.world_size, false, ""};
      if (r.prepared && r.prepared->generation == plan.generation &&
          r.prepared->rank == plan.rank && r.prepared->world_size == plan.world_size)
        continue;                             // a repeated ask
      if (r.generation == 0 && r.prepared) {  // a new worker's engine: re-cut at the Regroup
        r.prepared = WorkerReport::Prepared{plan.generation, plan.rank, plan.world_size,
                                            r.prepared->ready, r.prepared->error};
        continue;
      }
      r.prepared = plan;
      if (prepare_ == Prepare::kFails) r.prepared->error = "spec.model.uri: not found";
      preparing_since_[a.pods[i]] = passes_;
    }
  }
  void Train() {
    // The new ranks of a live rescale read their state: from the peers while each of them is
    // there and holds the live checkpoint, else (a peer is gone) from the store's newest.
    if (!joining_since_.empty() && std::all_of(joining_since_.begin(), joining_since_.end(),
                                               [&](const auto& j) { return j.second < passes_; })) {
      // Old rank k's part from reading_from_[k]: its live checkpoint, or a buddy copy
      // (its own or its ward's) of the step.
      bool peers_hold = true;
      for (size_t k = 0; k < reading_from_.size(); ++k) {
        const std::string& peer = reading_from_[k];
        if (!reports_.count(peer)) {
          peers_hold = false;
          continue;
        }
        const WorkerReport& w = reports_[peer];
        const bool copy = std::any_of(w.held.begin(), w.held.end(), [&](const auto& h) {
          return h.rank == static_cast<int>(k) && h.step == reading_step_;
        });
        if (w.live_step != reading_step_ && !copy) peers_hold = false;
      }
      for (const auto& [name, since] : joining_since_) {
        if (!reports_.count(name) || reports_[name].phase != W::kJoining) continue;
        WorkerReport& r = reports_[name];
        r.phase = W::kRunning;
        r.step = peers_hold ? reading_step_ : checkpoint_;
        r.live_step.reset();
        resumed_from_peers_ += peers_hold ? 1 : 0;
        resumed_from_store_ += peers_hold ? 0 : 1;
        last_resumed_step_ = r.step;
      }
      joining_since_.clear();
      for (auto& [name, r] : reports_)  // every rank has read: its memory is cleared
        if (r.phase == W::kRunning) r.held.clear();
    }
    // A member that died ends its generation on every peer (gloo sees the closed pairs).
    std::set<int64_t> broken;
    for (const auto& [name, r] : reports_)
      if (!pods_.count(name) || pods_[name].phase == PodPhase::kFailed) broken.insert(r.generation);
    // So does a member that is gone or failed, for any generation it was rendezvoused into (a
    // rescale's next one included, before the status names it): its process group cannot form.
    for (const auto& [generation, members] : members_of_)
      for (const std::string& m : members)
        if (!pods_.count(m) || pods_[m].phase == PodPhase::kFailed) broken.insert(generation);
    for (auto& [name, r] : reports_)
      if (r.phase == W::kRunning && broken.count(r.generation)) {
        r.phase = W::kFailed;
        r.last_error = "a peer closed the connection";
      }
    for (auto& [name, r] : reports_)  // engines load in prepare_passes_ reconciles
      if (r.prepared && !r.prepared->ready && r.prepared->error.empty() &&
          passes_ - preparing_since_[name] >= prepare_passes_)
        r.prepared->ready = true;
    for (auto& [name, r] : reports_)
      if (r.phase == W::kRunning && !stuck_) {
        ++r.step;
        if (r.step % 5 == 0) checkpoint_ = std::max(checkpoint_, r.step);
        r.loss = loss_(r.step);
        r.gpu_utilization_percent = gpu_util_;
        r.recent_steps.push_back({r.step, r.loss, gpu_util_});
        if (r.recent_steps.size() > 64) r.recent_steps.erase(r.recent_steps.begin());
        // Buddy copies, every step: its own part and its ward's, the two newest steps kept.
        if (buddies_ && r.world_size > 1 && ward_of_.count(name)) {
          r.held.push_back({r.generation, r.rank, r.world_size, r.step});
          r.held.push_back({r.generation, ward_of_[name], r.world_size, r.step});
          const int64_t oldest = r.step - 1;  // (clang 14 captures no structured binding)
          std::erase_if(r.held, [oldest](const auto& h) { return h.step < oldest; });
        }
      }
  }
  // DESIGN.md §4: never two generations at once.
  void CheckOneGenerationTrains() {
    std::set<int64_t> training;
    for (const auto& [name, r] : reports_)
      if (r.phase == W::kRunning) training.insert(r.generation);
    EXPECT_LE(training.size(), 1u) << "two generations train at once";
  }

  json raw_spec_;
  int64_t metadata_generation_ = 0;
  json status_json_ = json::object();
  bool service_ = false, token_ = false, config_ = false;
  int64_t checkpoint_ = 0;
  ProgressClock progress_;
  std::map<std::string, int> lingering_;  // terminating pods: reconciles left
  // A live rescale's new ranks reading (pod → the reconcile it joined), and from where.
  int passes_ = 0;  // reconciles, lost actions or not
  std::map<std::string, int> joining_since_;
  std::map<std::string, int> preparing_since_;  // pod → the reconcile it was asked to prepare
  std::map<int64_t, std::vector<std::string>> members_of_;  // generation → its Rendezvous's pods
  std::vector<std::string> reading_from_;
  int64_t reading_step_ = 0;

 public:
  int resumed_from_peers_ = 0;  // new ranks that resumed from their peers' memory
  int resumed_from_store_ = 0;  // ranks that resumed from the store's newest checkpoint
  int64_t last_resumed_step_ = 0;
  std::map<std::string, int> ward_of_;  // pod → the rank whose copy it keeps
  int64_t store_newest() const { return checkpoint_; }
};

std::string ConditionOf(const JobStatus& st, const std::string& type, const char* field) {
  for (const Condition& c : st.conditions)
    if (c.type == type)
      return std::string(field) == "status"   ? ConditionStatusName(c.status)
             : std::string(field) == "reason" ? c.reason
                                              : c.message;
  return "";
}

std::vector<std::string> Names(std::initializer_list<int> slots) {
  std::vector<std::string> out;
  for (int s : slots) out.push_back("job-worker-" + std::to_string(s));
  return out;
}

// The Ready=False (ReconcileError) the shell writes after a failed pass stands while the job
// keeps failing — the next plan's own Ready does not replace it (a failing job's Ready flipped
// with every retry) — and gives way to the job's own once a pass succeeds.
TEST(Reconcile, AReconcileErrorStandsWhileTheJobFailsAndGivesWayOnceAPassSucceeds) {
  Sim sim(Spec());
  sim.Reconcile();
  auto ready = [&] {
    for (const json& c : sim.status_json()["conditions"])
      if (c["type"] == "Ready") return c.value("reason", "");
    return std::string();
  };
  ASSERT_EQ(ready(), "PreparingData");
  auto marked = JobStatusFromJson(sim.status_json());
  ASSERT_TRUE(marked.ok()) << marked.status().ToString();
  MarkReconcileError(*marked, "the operator cannot reconcile this job: pods refused", sim.now_, 1);
  sim.mutable_status_json() = ToJson(*marked, "tidal.dev/job=job");
  sim.reconcile_failing_ = true;
  sim.Reconcile();
  EXPECT_EQ(ready(), "ReconcileError") << sim.status_json().dump();
  sim.reconcile_failing_ = false;
  sim.Reconcile();
  EXPECT_NE(ready(), "ReconcileError") << sim.status_json().dump();
}

TEST(Reconcile, ANewJobCreatesItsChildrenAndMinGpusWorkersThenRendezvousAsGenerationOne) {
  Sim sim(Spec());
  Plan first = sim.Reconcile();
  std::vector<std::string> kinds;
  for (const Action& a : first.actions) kinds.push_back(ActionName(a));
  EXPECT_EQ(kinds, (std::vector<std::string>{"AddFinalizer", "EnsureService", "EnsureTokenSecret",
                                             "EnsureSpecConfig", "CreatePrepPod"}));
  EXPECT_EQ(sim.phase(), "Pending");
  // The data phase is over: its pod goes, the workers come, told the store.
  kinds.clear();
  for (const Action& a : sim.Reconcile().actions) kinds.push_back(ActionName(a));
  EXPECT_EQ(kinds, (std::vector<std::string>{"DeletePods", "CreatePods"}));
  EXPECT_EQ(sim.status().data->store_uri, "file:///data/.tidal-tokens/0123abcd");
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().generation, 1);
  EXPECT_EQ(sim.status().members, Names({0, 1}));
  EXPECT_EQ(sim.reports_["job-worker-1"].rank, 1);
  EXPECT_EQ(sim.status().current_gpus, 2);
  EXPECT_TRUE(sim.HasEvent("CreatingWorkers"));
  EXPECT_TRUE(sim.HasEvent("Rendezvous"));
  sim.Reconcile();
  EXPECT_GT(sim.status().step, 0);
  EXPECT_EQ(sim.status_json()["gpus"]["summary"], "2/2");
}

// Issue 50: a job whose minimum does not fit its share of the cluster makes no pod (none binds
// to hold GPUs it cannot use) and says who holds them, once; admitted, it starts once the GPUs
// of its minimum are idle. A
// running job whose share drops below what it holds for a stronger claim shrinks without
// waiting for its cooldown.
TEST(Reconcile, AJobItsShareDoesNotAdmitWaitsWithNoPodAndARunningOneGivesBackAtOnce) {
  Sim sim(Spec(R"({"elastic": {"cooldownSeconds": 3600, "schedule": [{"name": "all-day",
                   "start": "0 0 * * *", "end": "59 23 * * *", "gpus": 4}]}})"));
  planner::Share waiting;
  waiting.reason =
      "waiting: minGPUs 2, 0 GPUs of 4 not held by the minimum of a running or "
      "older job";
  sim.share_ = waiting;
  sim.Reconcile();  // the data phase
  sim.Reconcile();
  for (int i = 0; i < 3; ++i) {
    Plan plan = sim.Reconcile();
    for (const Action& a : plan.actions)
      EXPECT_NE(ActionName(a), std::string("CreatePods")) << "a pod for a job that waits";
  }
  EXPECT_EQ(sim.phase(), "Pending");
  EXPECT_EQ(sim.pods_.size(), 0u);
  EXPECT_EQ(sim.status().gpus_reason, waiting.reason);
  EXPECT_EQ(sim.CountEvents("WaitingForGpus"), 1) << "once, not every pass";

  planner::Share admitted;
  admitted.admitted = true;
  admitted.gpus = 4;
  admitted.reason = "share 4 of 4 GPUs (priority 0, weight 1)";
  sim.share_ = admitted;
  // Admitted while the GPUs are still being handed back (1 idle, minimum 2): still no pod, so
  // none is bound holding a GPU while the other waits.
  sim.idle_gpus_ = 1;
  for (int i = 0; i < 3; ++i) sim.Reconcile();
  EXPECT_EQ(sim.pods_.size(), 0u);
  EXPECT_EQ(sim.status().gpus_reason.rfind("waiting for its minGPUs 2 to be idle", 0), 0u)
      << sim.status().gpus_reason;
  EXPECT_EQ(sim.CountEvents("WaitingForGpus"), 2);
  sim.idle_gpus_ = 8;
  sim.Until([&] { return sim.phase() == "Running" && sim.status().current_gpus == 4; });

  // Another job's minimum waits for 2 of these: an urgent shrink, inside the hour's cooldown.
  planner::Share yield = admitted;
  yield.gpus = 2;
  yield.urgent = yield.shared = true;
  yield.reason = "share 2 of 4 GPUs (priority 0, weight 1); shared with ns/other 2";
  sim.share_ = yield;
  sim.Until([&] { return sim.status().current_gpus == 2 && !sim.status().rescale; });
  EXPECT_TRUE(sim.HasEvent("ScalingDown"));
  EXPECT_NE(sim.status().gpus_reason.find("shared with ns/other"), std::string::npos)
      << sim.status().gpus_reason;
}

TEST(Reconcile, ScaleUpIsMakeBeforeBreakAndScaleDownShutsTheSurplusRanks) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  Plan plan = sim.Reconcile();
  // The new pods are created while generation 1 keeps training.
  ASSERT_TRUE(sim.status().rescale.has_value());
  EXPECT_EQ(StageName(sim.status().rescale->stage), std::string("WaitingForPods"));
  EXPECT_EQ(sim.reports_["job-worker-0"].phase, W::kRunning);
  EXPECT_TRUE(sim.pods_.count("job-worker-3"));
  sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; });
  EXPECT_EQ(sim.status().members, Names({0, 1, 2, 3}));
  EXPECT_EQ(sim.phase(), "Running");
  EXPECT_TRUE(sim.HasEvent("CheckpointBarrier"));
  EXPECT_TRUE(sim.HasEvent("Rescaled"));
  for (const auto& [name, r] : sim.reports_) EXPECT_EQ(r.world_size, 4) << name;

  sim.SetSpec(Spec(R"({"replicas": 2})"));
  sim.Until([&] { return sim.status().generation == 3 && !sim.status().rescale; });
  EXPECT_EQ(sim.status().members, Names({0, 1}));
  EXPECT_EQ(sim.pods_.size(), 2u);
  EXPECT_EQ(sim.shutdown_, Names({2, 3}));
  EXPECT_EQ(sim.status().current_gpus, 2);
}

// Found by the one slot allocator: with no backoff, the recovery from a worker that stopped
// answering planned the next generation in the same pass that deleted its pod, and took that
// pod back in as a member (it still ran, as far as that pass saw); the new generation then
// waited for a pod that was gone. A pod the plan deletes is never a member, nor its slot reused
// while it goes.
TEST(Reconcile, AWorkerThatStopsAnsweringIsReplacedAndItsPodNeverTakenBack) {
  Sim sim(Spec(R"({"restartPolicy": {"backoffSeconds": 0}})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.silent_["job-worker-1"] = sim.now_;
  sim.now_ += 31s;  // past unreachable_after
  const Plan plan = sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  const JobStatus st = sim.status();
  ASSERT_TRUE(st.rescale);
  EXPECT_EQ(std::count(st.rescale->members.begin(), st.rescale->members.end(), "job-worker-1"), 0)
      << "the silent pod is a member of the generation that replaces it";
  bool created = false;
  for (const Action& a : plan.actions)
    if (const auto* create = As<action::CreatePods>(a)) {
      created = true;
      EXPECT_EQ(std::count(create->pods.begin(), create->pods.end(), "job-worker-1"), 0)
          << "a pod created under the name of one this pass deletes";
    }
  EXPECT_TRUE(created) << "no backoff: the replacement is created at once";
  sim.silent_.clear();
  sim.Until([&] { return sim.phase() == "Running" && sim.status().generation == 2; }, 10);
  EXPECT_EQ(sim.status().current_gpus, 2);
}

// Found by a probe (issue 47): `kubectl delete secret <job>-token` made the operator's calls
// fail UNAUTHENTICATED, and after 30 s the job's restart was put down to a worker that "has not
// answered" — it had answered, refusing the token. The failure names the refusal and its cause.
TEST(Reconcile, AWorkerThatRefusesTheOperatorsTokenIsReportedAsRefusingNotAsSilent) {
  Sim sim(Spec(R"({"restartPolicy": {"backoffSeconds": 0}})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.silent_["job-worker-1"] = sim.now_;
  sim.unreachable_error_["job-worker-1"] = "UNAUTHENTICATED: the job token does not match";
  sim.now_ += 31s;
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  const std::string status = sim.status_json().dump();
  EXPECT_NE(status.find("job-worker-1 has refused the operator's job token"), std::string::npos)
      << status;
  EXPECT_NE(status.find("Secret job-token, which was replaced"), std::string::npos) << status;
  EXPECT_EQ(status.find("has not answered"), std::string::npos) << status;
}

// Found by a probe (issue 47): `kubectl scale tj X --replicas=3` where the batch does not split
// made the whole spec invalid, and a worker killed then was never replaced — Running, its step
// frozen, for as long as the override stood. The bad override is ignored, with an Event and the
// ScaleOverride condition naming it; the job is still managed, and the condition clears when the
// override goes.
TEST(Reconcile, AnInvalidKubectlScaleIsIgnoredWithAConditionAndAKilledWorkerIsStillReplaced) {
  Sim sim(Spec(R"({"restartPolicy": {"backoffSeconds": 0}})"));
  sim.Until([&] { return sim.phase() == "Running" && sim.status().current_gpus == 2; });
  sim.SetSpec(Spec(R"({"replicas": 3, "restartPolicy": {"backoffSeconds": 0}})"));
  sim.Reconcile();
  EXPECT_TRUE(sim.HasEvent("InvalidReplicas"));
  const std::string status = sim.status_json().dump();
  EXPECT_NE(status.find("spec.replicas: at 3 GPUs globalBatchSize 8 does not split"),
            std::string::npos)
      << status;
  EXPECT_EQ(status.find("InvalidSpec"), std::string::npos) << status;
  const int64_t generation = sim.status().generation;
  sim.silent_["job-worker-1"] = sim.now_;  // killed
  sim.now_ += 31s;
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  sim.silent_.clear();
  sim.Until([&] { return sim.phase() == "Running" && sim.status().generation > generation; });
  EXPECT_EQ(sim.status().current_gpus, 2) << "the refused override moved the count";
  sim.SetSpec(Spec(R"({"restartPolicy": {"backoffSeconds": 0}})"));
  sim.Reconcile();
  EXPECT_NE(sim.status_json().dump().find("\"Resolved\""), std::string::npos)
      << sim.status_json().dump();
}

// Issue 47: a job that had never started showed Progressing=True, "Training".
TEST(Reconcile, AJobThatHasNeverStartedIsNotProgressingUntilItsFirstGenerationStarts) {
  Sim sim(Spec());
  sim.prep_outcome_ = [](int) { return std::pair<std::string, std::string>("Running", ""); };
  sim.Reconcile();  // the data phase: its prep pod runs
  EXPECT_EQ(sim.phase(), "Pending");
  EXPECT_EQ(ConditionOf(sim.status(), "Progressing", "status"), "False");
  EXPECT_EQ(ConditionOf(sim.status(), "Progressing", "reason"), "NotStarted");
  const std::string prep = sim.prep_pods_created_.at(0);
  sim.prep_pods_[prep].phase = PodPhase::kSucceeded;
  sim.prep_pods_[prep].message =
      R"({"store": "s3://data/.tidal-tokens/feed", "samples": 500, "tokens": 1234, "reused": true})";
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(ConditionOf(sim.status(), "Progressing", "status"), "True");
  EXPECT_EQ(ConditionOf(sim.status(), "Progressing", "reason"), "Training");
}

// Issue 47: a corrupt newest checkpoint was skipped (good), but only a worker log line said so.
// Rank 0's report of a resume that skipped corrupt checkpoints is a Warning Event, once per
// generation, and the CheckpointsIntact condition names them; a later clean resume clears it.
TEST(Reconcile, AResumeThatSkippedCorruptCheckpointsIsOneWarningEventAndAConditionNamingThem) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  WorkerReport& rank0 = sim.reports_["job-worker-0"];
  rank0.resumed_from_step = 4;
  rank0.resumed_from_uri = "file:///ckpt/step-00000004";
  rank0.skipped_checkpoints = {"step-00000008: chunk 0 of shard-00001-of-00002 fails its checksum"};
  for (int i = 0; i < 3; ++i) sim.Reconcile();
  EXPECT_EQ(std::count(sim.events_.begin(), sim.events_.end(), "CorruptCheckpoint"), 1);
  EXPECT_EQ(ConditionOf(sim.status(), "CheckpointsIntact", "status"), "False");
  const std::string message = ConditionOf(sim.status(), "CheckpointsIntact", "message");
  EXPECT_NE(message.find("generation 1 resumed from step 4 (file:///ckpt/step-00000004): newer "
                         "checkpoints are corrupt and were skipped"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("step-00000008: chunk 0"), std::string::npos) << message;
  rank0.skipped_checkpoints.clear();
  sim.Reconcile();
  EXPECT_EQ(ConditionOf(sim.status(), "CheckpointsIntact", "status"), "True");
}

// Issue 47: a step that never ended (globalBatchSize 2^24 at microBatchSize 1) held a scale-up's
// barrier: the job showed Scaling, holding its new pod's idle GPU, with only an info log line.
// Past the barrier timeout the rescale is abandoned with an Event and a condition, its new pods
// are deleted, and the job trains on as it was.
TEST(Reconcile, ABarrierNotReachedInTimeAbandonsTheRescaleAndReleasesItsNewPods) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.barrier_passes_ = 1000000;  // the ranks never reach the barrier
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return sim.pending_barrier_.has_value(); });
  EXPECT_EQ(sim.pods_.size(), 4u);
  EXPECT_EQ(sim.phase(), "Scaling");
  sim.Reconcile();
  EXPECT_FALSE(sim.HasEvent("BarrierTimedOut")) << "before its timeout";
  sim.now_ += 301s;
  sim.Reconcile();
  EXPECT_TRUE(sim.HasEvent("BarrierTimedOut"));
  EXPECT_EQ(sim.phase(), "Running");
  EXPECT_EQ(ConditionOf(sim.status(), "Scaling", "reason"), "BarrierTimedOut");
  EXPECT_NE(ConditionOf(sim.status(), "Scaling", "message").find("within 300 s"), std::string::npos)
      << ConditionOf(sim.status(), "Scaling", "message");
  EXPECT_EQ(sim.status().generation, 1);
  EXPECT_EQ(sim.pods_.size(), 2u) << "the new pods still hold their GPUs";
  EXPECT_FALSE(sim.status().rescale);
  // The long step ends at last and the ranks hold at the barrier that was asked of them: nothing
  // waits for it any more, so they are resumed, not left paused for good.
  sim.pending_barrier_.reset();
  for (const std::string& m : sim.status().members) sim.reports_[m].phase = W::kPaused;
  const Plan plan = sim.Reconcile();
  bool resumed = false;
  for (const Action& a : plan.actions)
    if (const auto* resume = As<action::Resume>(a)) resumed |= resume->pods == sim.status().members;
  EXPECT_TRUE(resumed) << "ranks held at an abandoned barrier stay paused";
}

// Issue 47: `kubectl delete` of that job hung on the finalizer's final checkpoint. Past the
// barrier timeout the workers are stopped without it and the job is released, the Event naming
// the newest checkpoint there is.
TEST(Reconcile, ADeletionWhoseFinalCheckpointNeverComesReleasesTheJobAfterTheBarrierTimeout) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  for (int i = 0; i < 3; ++i) sim.Reconcile();
  sim.reports_["job-worker-0"].checkpoint_step = 2;  // a periodic checkpoint, committed
  sim.reports_["job-worker-0"].checkpoint_uri = "file:///ckpt/step-00000002";
  sim.barrier_passes_ = 1000000;
  sim.deleting_ = true;
  sim.deletion_started_ = sim.now_;
  sim.Reconcile();
  sim.Reconcile();
  EXPECT_TRUE(sim.finalizer_) << "released before the final checkpoint was given its time";
  sim.now_ += 301s;
  sim.Until([&] { return !sim.finalizer_; }, 3);
  EXPECT_TRUE(sim.HasEvent("FinalCheckpointSkipped"));
  EXPECT_FALSE(sim.HasEvent("FinalCheckpoint"));
  const auto at = std::find(sim.events_.begin(), sim.events_.end(), "FinalCheckpointSkipped");
  const std::string& said = sim.event_messages_[at - sim.events_.begin()];
  EXPECT_NE(said.find("the newest checkpoint is step 2; its checkpoints are kept in file:///ckpt"),
            std::string::npos)
      << said;
  EXPECT_EQ(sim.shutdown_.size(), 2u);
}

// Issue 47: WorkerFailed led with the surviving pod ("worker X-0 failed … reduce_scatter …")
// when X-1 had been killed. The member that is gone leads; the survivor's failure follows.
TEST(Reconcile, TheLostMemberLeadsTheFailureAndTheSurvivorsCollectiveErrorFollows) {
  Sim sim(Spec(R"({"replicas": 2, "elastic": {"minGPUs": 1}})"));
  sim.Until([&] { return sim.phase() == "Running" && sim.status().current_gpus == 2; });
  sim.silent_["job-worker-1"] = sim.now_;  // killed
  sim.reports_["job-worker-0"].phase = W::kFailed;
  sim.reports_["job-worker-0"].last_error = "reduce_scatter: connection reset by peer";
  sim.Reconcile();
  const auto at = std::find(sim.events_.begin(), sim.events_.end(), "WorkerFailed");
  ASSERT_NE(at, sim.events_.end());
  const std::string& said = sim.event_messages_[at - sim.events_.begin()];
  EXPECT_EQ(said.rfind("pod job-worker-1's worker does not answer", 0), 0u) << said;
  EXPECT_NE(said.find("worker job-worker-0 failed generation 1: reduce_scatter"), std::string::npos)
      << said;
}

// Issue 47: a job whose first start failed before it trained a step was retried as a "recovery".
TEST(Reconcile, AStartThatFailsBeforeTheFirstStepIsTriedAgainNotRecovered) {
  Sim sim(Spec(R"({"restartPolicy": {"backoffSeconds": 0}})"));
  sim.pods_stay_pending_ = true;
  sim.Until([&] { return sim.pods_.size() == 2u; });
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.pods_["job-worker-1"].reason = "ImagePullBackOff";
  sim.Reconcile();
  const JobStatus st = sim.status();
  ASSERT_TRUE(st.rescale) << sim.status_json().dump();
  EXPECT_EQ(st.rescale->reason.rfind("another try at the start", 0), 0u) << st.rescale->reason;
  EXPECT_EQ(st.rescale->reason.find("recovery"), std::string::npos) << st.rescale->reason;
}

// Found by the e2e suite (issue 47): the status write of a rescale at its barrier was refused,
// "strict decoding error: unknown field status.rescale.barrierStarted", because the CRD's status
// schema lacked a field the operator writes. Every field of a status with every optional part
// set is one the schema knows, of a type it accepts.
TEST(Reconcile, EveryStatusFieldTheOperatorWritesIsOneTheCrdSchemaAccepts) {
  auto crd = ReadYamlFile(std::string(TIDAL_SOURCE_DIR) + "/crds/tidal.dev_trainingjobs.yaml");
  ASSERT_TRUE(crd.ok()) << crd.status().message();
  const json& schema = (*crd)["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
  const Clock::time_point t = Clock::time_point{} + std::chrono::hours(24 * 365 * 50);
  JobStatus st;
  st.phase = planner::Phase::kScaling;
  st.generation = 3;
  st.members = {"job-worker-0", "job-worker-1"};
  RescaleState r;
  r.stage = RescaleState::Stage::kBarrier;
  r.target_generation = 4;
  r.members = {"job-worker-0", "job-worker-1", "job-worker-2"};
  r.new_pods = {"job-worker-2"};
  r.reason = "scale 2 -> 3";
  r.started = t;
  r.drain = true;
  r.waiting_for = "job-worker-2 (Pending)";
  r.state_peers = {"job-worker-0"};
  r.state_step = 7;
  r.wards = {1, 0, 2};
  r.prepare_asked = t;
  r.barrier_started = t;
  st.rescale = r;
  st.restarts = 2;
  st.restart_streak = 1;
  st.restart_not_before = st.last_membership_change = st.scale_up_not_before = t;
  st.step = 12;
  st.loss = 1.5;
  st.tokens_per_second = 100;
  st.last_checkpoint = {{"step", 10},
                        {"kind", "full"},
                        {"uri", "file:///c/step-10"},
                        {"time", "2026-01-01T00:00:00Z"}};
  st.desired_gpus = 4;
  st.current_gpus = 2;
  st.gpus_reason = "capacity";
  st.failure = "f";
  st.failure_reason = "ConfigurationError";
  st.failed_spec_generation = 2;
  st.last_failure = "x";
  st.last_failure_time = t;
  st.anomaly = AnomalyStatus{"rule", 12, 11, "rising", t, true};
  st.data = DataStatus{"k", DataPhase::kReady, "p", "file:///s", 1, 2, true, "m", 0, t, t};
  st.conditions = {{"CheckpointsIntact", ConditionStatus::kFalse, "CorruptSkipped", "m", t, 1},
                   {"ScaleOverride", ConditionStatus::kFalse, "InvalidReplicas", "m", t, 1}};
  st.observed_generation = 2;
  json job = {{"apiVersion", "tidal.dev/v1alpha1"},
              {"kind", "TrainingJob"},
              {"metadata", {{"name", "job"}}},
              {"spec", {{"model", {{"preset", "tiny"}}}, {"dataset", {{"uri", "d.jsonl"}}}}},
              {"status", ToJson(st, "tidal.dev/job=job")}};
  const local::SchemaResult result = local::ApplySchema(schema, job);
  for (const std::string& f : result.unknown_fields) ADD_FAILURE() << "unknown to the CRD: " << f;
  for (const local::FieldCause& c : result.errors) ADD_FAILURE() << c.field << ": " << c.message;
}

// Issue 47: a Succeeded job kept showing its last GPU count (GPUS 2/2) with no worker left.
TEST(Reconcile, ASucceededJobShowsNoGpusHeldOrWanted) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.pods_["job-worker-0"].phase = PodPhase::kSucceeded;
  sim.Reconcile();
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Succeeded");
  EXPECT_EQ(sim.status().current_gpus, 0);
  EXPECT_EQ(sim.status().desired_gpus, 0);
}

// Found when the workers started pushing: a worker killed -9 is silent at once, its peer
// pushes FAILED for their generation within milliseconds, and the kubelet marks the pod
// failed only later. The silent member is the one to replace; the one that answers goes on —
// here alone, from its memory — and the pod's own failure that follows is no second restart.
TEST(Reconcile, AGenerationFailedWithAMemberThatDoesNotAnswerReplacesThatOneOnly) {
  Sim sim(
      Spec(R"({"replicas": 2, "elastic": {"minGPUs": 1}, "checkpoint": {"buddyEverySteps": 1}})"));
  sim.buddies_ = true;
  sim.Until([&] { return sim.phase() == "Running" && sim.status().current_gpus == 2; });
  for (int i = 0; i < 3; ++i) sim.Reconcile();  // buddy copies of a few steps
  const int64_t generation = sim.status().generation;
  sim.silent_["job-worker-1"] = sim.now_;           // killed: no answer, its pod still Running
  sim.reports_["job-worker-0"].phase = W::kFailed;  // its peer's death ends its generation
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  EXPECT_EQ(sim.status().restarts, 1);
  const JobStatus st = sim.status();
  ASSERT_TRUE(st.rescale);
  EXPECT_EQ(st.rescale->members, Names({0})) << "the silent member taken as a survivor";
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;  // the kubelet catches up
  sim.silent_.clear();
  sim.Until([&] { return sim.phase() == "Running" && sim.status().generation > generation; });
  EXPECT_EQ(sim.status().restarts, 1) << "the pod's failure counted as a second restart";
}

// A reconcile never waits for the barrier's calls (they return once every rank holds, which
// takes a step and a checkpoint): the passes that follow re-send the same barrier, under the
// same name, and go no further until every rank holds; the generation then changes once.
TEST(Reconcile, ABarrierWhoseCallsEndPassesLaterHoldsTheRendezvousUntilEveryRankHolds) {
  Sim sim(Spec());
  sim.barrier_passes_ = 4;
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return sim.pending_barrier_.has_value(); });
  const uint64_t id = sim.pending_barrier_->id;
  for (int i = 0; i < 2; ++i) {
    const Plan plan = sim.Reconcile();
    EXPECT_EQ(sim.phase(), "Scaling");
    EXPECT_EQ(sim.status().generation, 1);
    for (const Action& a : plan.actions) {
      EXPECT_FALSE(As<action::Rendezvous>(a)) << "a rendezvous before every rank held";
      if (const auto* barrier = As<action::Barrier>(a)) EXPECT_EQ(barrier->id, id) << "renamed";
    }
    EXPECT_LE(plan.requeue_after, std::chrono::seconds(2)) << "the poll is the safety net";
  }
  sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; });
  EXPECT_GT(sim.barrier_resends_, 0);
  EXPECT_EQ(sim.phase(), "Running");
  EXPECT_EQ(sim.status().members, Names({0, 1, 2, 3}));
}

// Issue 25: the new workers load their engines for the ranks planned for them while the old
// generation trains; the barrier that pauses the job comes only once they are loaded. A
// leader that dies with the ask lost, or on any pass, changes neither the ranks nor that
// only one generation ever trains.
// Issue 27's placement: the ring's neighbours share a node wherever they can. Pods bound to two
// nodes in alternation (slot 0 on n0, 1 on n1, 2 on n0, ...) get their ranks grouped by node,
// each node where its first member is: the start's ranks, and a scale-up's, whose current
// members keep their order among themselves (rank 0 stays) and whose engines are prepared for
// the ranks the Rendezvous then gives (none for another rank). Pods of one node, or of none
// known, keep the slots' order (every other scenario here).
TEST(Reconcile, RanksThatShareANodeAreNeighboursInTheRing) {
  Sim sim(Spec(R"({"replicas": 4})"));
  sim.node_of_ = [](int slot) { return "n" + std::to_string(slot % 2); };
  sim.Until([&] { return sim.phase() == "Running" && sim.status().generation == 1; });
  EXPECT_EQ(sim.status().members, Names({0, 2, 1, 3}));
  EXPECT_EQ(sim.reports_["job-worker-2"].rank, 1);
  EXPECT_EQ(sim.reports_["job-worker-1"].rank, 2);

  Sim grow(Spec());
  grow.node_of_ = [](int slot) { return "n" + std::to_string(slot % 2); };
  grow.Until([&] { return grow.phase() == "Running"; });
  EXPECT_EQ(grow.status().members, Names({0, 1}));
  grow.SetSpec(Spec(R"({"replicas": 4})"));
  grow.Until([&] { return grow.status().generation == 2 && !grow.status().rescale; });
  EXPECT_EQ(grow.status().members, Names({0, 2, 1, 3}));
  ASSERT_FALSE(grow.prepare_asks_.empty());
  EXPECT_EQ(grow.prepare_asks_.back().pods, Names({0, 2, 1, 3}));
  EXPECT_EQ(grow.prepare_asks_.back().ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(grow.prepared_for_another_rank_, 0);
  EXPECT_EQ(grow.reports_["job-worker-0"].rank, 0);
  for (const auto& [name, r] : grow.reports_) EXPECT_EQ(r.world_size, 4) << name;

  // Back to 2: the first ranks stay — one node's pods, n1's leave together.
  grow.SetSpec(Spec(R"({"replicas": 2})"));
  grow.Until([&] { return grow.status().generation == 3 && !grow.status().rescale; });
  EXPECT_EQ(grow.status().members, Names({0, 2}));
}

TEST(Reconcile, AScaleUpLoadsTheNewEnginesAtTheirPlannedRanksWhileTheJobTrainsThenPauses) {
  Sim sim(Spec());
  sim.prepare_passes_ = 4;
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return !sim.prepare_asks_.empty(); });
  const action::PrepareEngine ask = sim.prepare_asks_.front();
  // Every member of the next generation: the new ones load their engines, the current ones the
  // base weights their new shards add.
  EXPECT_EQ(ask.pods, Names({0, 1, 2, 3}));
  EXPECT_EQ(ask.ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ask.world_size, 4);
  EXPECT_EQ(ask.generation, 2);
  ASSERT_TRUE(sim.status().rescale);
  EXPECT_TRUE(sim.status().rescale->prepare_asked.has_value());
  // Loading: the job trains on at its old size, and status says what it waits for.
  const int64_t step = sim.reports_["job-worker-0"].step;
  sim.Reconcile();
  sim.Reconcile();
  EXPECT_EQ(StageName(sim.status().rescale->stage), std::string("WaitingForPods"));
  EXPECT_NE(sim.status().rescale->waiting_for.find("job-worker-2 (preparing)"), std::string::npos)
      << sim.status().rescale->waiting_for;
  EXPECT_GT(sim.reports_["job-worker-0"].step, step);
  sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; });
  EXPECT_EQ(sim.status().members, Names({0, 1, 2, 3}));
  EXPECT_TRUE(sim.barriers_while_loading_.empty());
  EXPECT_EQ(sim.prepared_for_another_rank_, 0);
  EXPECT_EQ(sim.prepare_asks_.size(), 1u);
  EXPECT_FALSE(sim.HasEvent("EnginesStillLoading"));

  // A scale-down: the staying members read what their new shards add, then the barrier.
  sim.SetSpec(Spec(R"({"replicas": 2})"));
  sim.Until([&] { return sim.prepare_asks_.size() == 2; });
  EXPECT_EQ(sim.prepare_asks_.back().pods, Names({0, 1}));
  EXPECT_EQ(sim.prepare_asks_.back().world_size, 2);
  EXPECT_EQ(sim.prepare_asks_.back().generation, 3);
  sim.Reconcile();
  ASSERT_TRUE(sim.status().rescale);
  EXPECT_EQ(StageName(sim.status().rescale->stage), std::string("WaitingForPods"))
      << "paused while a member read ahead";
  sim.Until([&] { return sim.status().generation == 3 && !sim.status().rescale; });
  EXPECT_TRUE(sim.barriers_while_loading_.empty());
  EXPECT_EQ(sim.status().members, Names({0, 1}));
  EXPECT_EQ(sim.shutdown_, Names({2, 3}));
}

// A leader that dies on any pass, the ask's included (then the new workers load after the
// Rendezvous, as without it), never pauses the job while an engine loads, never asks twice,
// and never trains two generations.
TEST(Reconcile, ALeaderDyingAroundTheAskToPrepareStillScalesUpWithoutPausingForALoad) {
  for (int lose : {2, 3}) {
    SCOPED_TRACE("actions of every " + std::to_string(lose) + "th reconcile lost");
    Sim sim(Spec());
    sim.prepare_passes_ = 4;
    sim.Until([&] { return sim.phase() == "Running"; });
    sim.lose_actions_every_ = lose;
    sim.SetSpec(Spec(R"({"replicas": 4})"));
    sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; });
    EXPECT_EQ(sim.status().members, Names({0, 1, 2, 3}));
    EXPECT_TRUE(sim.barriers_while_loading_.empty());
    EXPECT_EQ(sim.prepared_for_another_rank_, 0);
    EXPECT_LE(sim.prepare_asks_.size(), 1u);
  }
}

// The ask holds nothing it cannot finish: a worker that refuses it (TIDAL_KEEP_ENGINE=0, an
// older worker) or fails to load goes on to the barrier at once and loads after the
// Rendezvous; one still loading after scaleUpTimeoutSeconds no longer holds the job's growth.
TEST(Reconcile, ANewWorkerThatRefusesFailsOrOutlastsTheScaleUpTimeoutToPrepareHoldsNoScaleUp) {
  for (Sim::Prepare mode : {Sim::Prepare::kRefuses, Sim::Prepare::kFails}) {
    Sim sim(Spec());
    sim.prepare_ = mode;
    sim.prepare_passes_ = 1000;
    sim.Until([&] { return sim.phase() == "Running"; });
    sim.SetSpec(Spec(R"({"replicas": 4})"));
    sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; }, 12);
    EXPECT_EQ(sim.prepare_asks_.size(), 1u);
    EXPECT_FALSE(sim.HasEvent("EnginesStillLoading"));
  }
  Sim sim(Spec());  // scaleUpTimeoutSeconds 60; one reconcile a second
  sim.prepare_passes_ = 1000;
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return !sim.prepare_asks_.empty(); });
  for (int i = 0; i < 55; ++i) sim.Reconcile();
  EXPECT_EQ(sim.status().generation, 1);
  EXPECT_EQ(StageName(sim.status().rescale->stage), std::string("WaitingForPods"));
  sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; }, 15);
  EXPECT_TRUE(sim.HasEvent("EnginesStillLoading"));
  EXPECT_EQ(sim.status().members, Names({0, 1, 2, 3}));
}

// DESIGN.md §4 step 5: the barrier keeps the state in the ranks' memory, the new generation
// reads it from the old ranks (status.rescale.statePeers, so that a new leader knows them
// too), and a surplus rank goes only once the generation reading from it runs.
TEST(Reconcile, ARescaleMovesTheStateThroughTheRanksMemoryAndShutsTheSurplusOnlyOnceRead) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  for (int i = 0; i < 3; ++i) sim.Reconcile();
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return sim.AtRendezvous(); });
  EXPECT_EQ(sim.status().rescale->state_peers, Names({0, 1}));
  const int64_t held = sim.status().rescale->state_step;
  EXPECT_GT(held, 0);
  EXPECT_EQ(sim.status_json()["rescale"]["statePeers"], json(Names({0, 1})));
  EXPECT_EQ(sim.status_json()["rescale"]["stateStep"], held);
  sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; });
  EXPECT_EQ(sim.resumed_from_peers_, 4);
  EXPECT_FALSE(sim.status_json().contains("rescale"));

  sim.SetSpec(Spec(R"({"replicas": 2})"));
  sim.Until([&] { return sim.AtRendezvous(); });
  EXPECT_EQ(sim.status().rescale->state_peers, Names({0, 1, 2, 3}));
  EXPECT_TRUE(sim.shutdown_.empty()) << "a surplus rank went before the new ranks read from it";
  sim.Until([&] { return sim.status().generation == 3 && !sim.status().rescale; });
  EXPECT_EQ(sim.resumed_from_peers_, 6);
  EXPECT_EQ(sim.shutdown_, Names({2, 3}));
  EXPECT_EQ(sim.pods_.size(), 2u);
}

// A surplus rank that vanishes while the new generation reads from it: the new ranks resume
// from the store instead (the worker's fallback), and the rescale completes.
TEST(Reconcile, ALiveRescaleWhoseSurplusPeerVanishesCompletesFromTheStore) {
  Sim sim(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return sim.phase() == "Running" && sim.status().current_gpus == 4; });
  for (int i = 0; i < 3; ++i) sim.Reconcile();
  const int from_peers = sim.resumed_from_peers_;
  sim.SetSpec(Spec(R"({"replicas": 2})"));
  sim.Until([&] { return sim.AtRendezvous(); });
  const int64_t next = sim.status().rescale->target_generation;
  sim.pods_.erase("job-worker-3");
  sim.reports_.erase("job-worker-3");
  sim.Until([&] { return sim.status().generation == next && !sim.status().rescale; });
  EXPECT_EQ(sim.resumed_from_peers_, from_peers) << "read from a peer that was gone";
  EXPECT_EQ(sim.status().members, Names({0, 1}));
  EXPECT_EQ(sim.pods_.size(), 2u);
  EXPECT_EQ(sim.status().restarts, 0);
}

// A worker killed while a live scale-up's new generation reads its state: one of the old ranks
// it reads from, or one of the new ranks. Either way that generation fails on every rank, and
// the recovery resumes from the store's newest checkpoint (the memory read from is gone, or fed
// a generation that died): never two generations at once (checked after every reconcile), no
// rank shut down while read from (checked at every Shutdown), nothing older than the store's
// newest, the restart counted, and the job back at the size asked for.
TEST(Reconcile, AWorkerKilledWhileALiveScaleUpReadsItsStateRecoversFromTheStore) {
  for (const std::string dead : {"job-worker-1", "job-worker-3"}) {
    SCOPED_TRACE(dead);
    Sim sim(Spec());
    sim.Until([&] { return sim.phase() == "Running"; });
    for (int i = 0; i < 6; ++i) sim.Reconcile();
    sim.SetSpec(Spec(R"({"replicas": 4})"));
    sim.Until([&] { return sim.AtRendezvous(); });
    const int64_t next = sim.status().rescale->target_generation;
    const int64_t held = sim.status().rescale->state_step;
    const int64_t stored = sim.store_newest();
    ASSERT_GT(stored, 0);
    ASSERT_LE(stored, held);
    sim.pods_[dead].phase = PodPhase::kFailed;
    sim.Until([&] { return sim.phase() == "Recovering"; });
    EXPECT_EQ(sim.status().restarts, 1);
    // The live rescale is over; a recovery takes its place, reading nothing from memory.
    ASSERT_TRUE(sim.status().rescale);
    EXPECT_TRUE(sim.status().rescale->recovery);
    EXPECT_TRUE(sim.status().rescale->state_peers.empty());
    sim.now_ += 10s;  // the backoff
    sim.Until([&] { return sim.phase() == "Running" && sim.status().generation > next; });
    for (const auto& [name, r] : sim.reports_)
      if (r.phase == W::kRunning) {
        EXPECT_GE(r.step, stored) << name << " resumed before the store's newest";
        EXPECT_LE(r.step, held + 1) << name;
      }
    sim.Until([&] {
      return sim.phase() == "Running" && sim.status().current_gpus == 4 && !sim.status().rescale;
    });
    std::vector<std::string> members = sim.status().members;
    std::sort(members.begin(), members.end());  // the replaced slot may take another rank
    EXPECT_EQ(members, Names({0, 1, 2, 3}));
    EXPECT_EQ(sim.status().restarts, 1);
  }
}

// Buddy copies (DESIGN.md §4 step 5): a job of 3 ranks (copies every step) loses a worker. The
// survivors report the parts they hold; the recovery's Rendezvous names, for each old rank, a
// survivor holding its part at the newest step they all cover, and the new generation reads it
// from there: nothing is lost, nothing is read from the store.
constexpr const char* kThreeRanks =
    R"({"replicas": 3, "optimization": {"globalBatchSize": 12}, "elastic": {"maxGPUs": 3}})";
int64_t RunThreeRanksWithBuddies(Sim& sim) {
  sim.buddies_ = true;
  sim.Until([&] {
    return sim.phase() == "Running" && sim.status().current_gpus == 3 && !sim.status().rescale;
  });
  for (int i = 0; i < 6; ++i) sim.Reconcile();
  return sim.reports_["job-worker-0"].step;
}

// The pod that keeps `pod`'s copy in the current generation.
std::string KeeperOf(const Sim& sim, const std::string& pod) {
  const auto members = sim.status().members;
  const int rank =
      static_cast<int>(std::find(members.begin(), members.end(), pod) - members.begin());
  for (const std::string& m : members)
    if (sim.ward_of_.count(m) && sim.ward_of_.at(m) == rank) return m;
  return "";
}

// The survivors are an allowed size (2 of minGPUs 2), so they go on at once, without the
// backoff and without waiting for a replacement pod; the third GPU comes back by a live
// scale-up as soon as its pod is ready (a recovery starts no cooldown).
TEST(Reconcile, ALostWorkerIsRebuiltFromTheSurvivorsBuddyCopiesAndTheStoreIsNotRead) {
  Sim sim(Spec(kThreeRanks));
  const int64_t trained = RunThreeRanksWithBuddies(sim);
  const int from_store = sim.resumed_from_store_;
  const int from_peers = sim.resumed_from_peers_;
  const int64_t generation = sim.status().generation;
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.Until([&] { return sim.status().generation == generation + 1 && !sim.status().rescale; }, 6);
  EXPECT_EQ(sim.status().current_gpus, 2) << "the survivors did not go on alone";
  EXPECT_TRUE(sim.HasEvent("RecoveringFromMemory"));
  EXPECT_TRUE(sim.HasEvent("Recovered"));
  EXPECT_FALSE(sim.HasEvent("BuddyCopiesLost"));
  EXPECT_EQ(sim.resumed_from_store_, from_store) << "a rank resumed from the store";
  EXPECT_EQ(sim.resumed_from_peers_, from_peers + 2);
  EXPECT_EQ(sim.last_resumed_step_, trained) << "the recovery lost steps";
  EXPECT_EQ(sim.status().restarts, 1);
  sim.Until([&] {
    return sim.phase() == "Running" && sim.status().current_gpus == 3 && !sim.status().rescale;
  });
  EXPECT_EQ(sim.resumed_from_store_, from_store) << "the scale-up read the store";
}

// A recovery starts no cooldown: with cooldownSeconds 300 the GPU the survivors lost still comes
// back on the next passes, not five minutes later. (The window, not spec.replicas, asks for 3:
// a count asked for by hand ignores the cooldown anyway.)
TEST(Reconcile, TheGpuLostToARecoveryComesBackWithoutWaitingForTheCooldown) {
  const std::string window = R"({"optimization": {"globalBatchSize": 12}, "elastic": {"maxGPUs": 3,
      "schedule": [{"name": "all-day", "start": "0 0 * * *", "end": "59 23 * * *", "gpus": 3}]}})";
  Sim sim(Spec(window));
  RunThreeRanksWithBuddies(sim);
  json slow = Spec(window);
  slow["elastic"]["cooldownSeconds"] = 300;
  sim.SetSpec(slow);
  sim.now_ += 600s;  // the start's own cooldown is over
  sim.Reconcile();
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.Until([&] { return sim.status().current_gpus == 2 && !sim.status().rescale; }, 6);
  sim.Until(
      [&] {
        return sim.phase() == "Running" && sim.status().current_gpus == 3 && !sim.status().rescale;
      },
      20);  // 20 passes: 20 simulated seconds, far inside 300
}

// A drain (DESIGN.md §4): a member whose pod is deleted from outside (an eviction, `kubectl
// drain`, `kubectl delete pod`) or whose node is cordoned or tainted NoExecute, while its worker
// still trains, is moved off live: the others (an allowed size) rendezvous reading its state from
// its memory, it is shut down once they run, and its GPU comes back elsewhere by a scale-up with
// no cooldown (the window asks for 3, cooldownSeconds 300). No restart, no step lost, the store
// not read; with a leader dying every second or third pass too.
TEST(Reconcile, AMemberThatMustLeaveIsMovedOffLiveLosingNoStepAndItsGpuComesBack) {
  const std::string window = R"({"optimization": {"globalBatchSize": 12}, "elastic": {"maxGPUs": 3,
      "cooldownSeconds": 300,
      "schedule": [{"name": "all-day", "start": "0 0 * * *", "end": "59 23 * * *", "gpus": 3}]}})";
  for (const std::string notice : {"deleted", "cordoned", "NoExecute"})
    for (int lose : {0, 2, 3}) {
      SCOPED_TRACE(notice + ", a leader dying every " + std::to_string(lose));
      Sim sim(Spec(window));
      RunThreeRanksWithBuddies(sim);
      sim.now_ += 600s;  // the start's own cooldown is over
      sim.Reconcile();
      const int from_store = sim.resumed_from_store_;
      const int64_t generation = sim.status().generation;
      sim.lose_actions_every_ = lose;
      if (notice == "deleted")
        sim.DeleteFromOutside("job-worker-1");
      else
        sim.pods_["job-worker-1"].node_notice =
            notice == "cordoned" ? "node n1 is cordoned" : "node n1 has taint spot:NoExecute";
      // Every step trained before the move is where the others go on from.
      int64_t paused_at = 0;
      sim.Until(
          [&] {
            for (const auto& [name, r] : sim.reports_)
              if (r.generation == generation && r.phase == W::kPaused) paused_at = r.step;
            return sim.status().generation > generation && !sim.status().rescale;
          },
          20);
      EXPECT_GT(paused_at, 0);
      EXPECT_EQ(sim.last_resumed_step_, paused_at) << "steps lost or trained again";
      EXPECT_EQ(sim.status().members, Names({0, 2}));
      EXPECT_EQ(sim.status().restarts, 0);
      EXPECT_TRUE(sim.HasEvent("MovingOff"));
      EXPECT_FALSE(sim.HasEvent("WorkerFailed"));
      EXPECT_EQ(sim.resumed_from_store_, from_store) << "the move read the store";
      EXPECT_EQ(std::count(sim.shutdown_.begin(), sim.shutdown_.end(), "job-worker-1"), 1);
      if (notice != "deleted") sim.pods_.erase("job-worker-1");  // its node lets it go
      sim.Until(
          [&] {
            return sim.phase() == "Running" && sim.status().current_gpus == 3 &&
                   !sim.status().rescale;
          },
          20);  // 20 simulated seconds, far inside the cooldown
      // Slot 1 is taken again once its old pod is gone: by a new pod, of a later generation.
      EXPECT_GT(sim.pods_["job-worker-1"].created_for_generation, generation);
      EXPECT_EQ(sim.status().restarts, 0);
    }
}

// The others alone are not an allowed size (minGPUs 2 of 2): a replacement pod comes first,
// then a live rescale onto it and off the leaving pod, which goes once the new generation runs.
// With no idle GPU for a replacement the job trains on and says why; when the pod is finally
// gone, the recovery takes over.
TEST(Reconcile, AMemberThatMustLeaveWhenTheOthersAreTooFewIsReplacedFirst) {
  {
    Sim sim(Spec(R"({"elastic": {"maxGPUs": 2}})"));
    sim.Until([&] { return sim.phase() == "Running"; });
    for (int i = 0; i < 3; ++i) sim.Reconcile();
    const int from_store = sim.resumed_from_store_;
    sim.DeleteFromOutside("job-worker-0");
    sim.Reconcile();
    ASSERT_TRUE(sim.status().rescale);
    EXPECT_EQ(sim.status().rescale->new_pods, Names({2}));
    EXPECT_EQ(sim.reports_["job-worker-0"].phase, W::kRunning) << "training stopped for the move";
    sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; });
    EXPECT_EQ(sim.status().members, Names({1, 2}));
    EXPECT_EQ(sim.status().restarts, 0);
    EXPECT_EQ(sim.resumed_from_store_, from_store);
    EXPECT_FALSE(sim.pods_.count("job-worker-0"));
  }
  {
    Sim sim(Spec(R"({"elastic": {"maxGPUs": 2}})"));
    sim.Until([&] { return sim.phase() == "Running"; });
    sim.idle_gpus_ = 0;
    sim.DeleteFromOutside("job-worker-0");
    for (int i = 0; i < 5; ++i) sim.Reconcile();
    EXPECT_TRUE(sim.HasEvent("MoveOffBlocked"));
    EXPECT_EQ(std::count(sim.events_.begin(), sim.events_.end(), "MoveOffBlocked"), 1);
    EXPECT_EQ(sim.status().generation, 1);
    EXPECT_FALSE(sim.status().rescale);
    EXPECT_NE(sim.status().gpus_reason.find("idle GPUs for replacements"), std::string::npos)
        << sim.status().gpus_reason;
    sim.pods_.erase("job-worker-0");  // its grace period is over
    sim.reports_.erase("job-worker-0");
    sim.idle_gpus_ = 8;
    sim.Until([&] { return sim.phase() == "Recovering"; });
    EXPECT_EQ(sim.status().restarts, 1);
  }
}

// A member told to leave while a rescale is past its pods (at its barrier) is left out of the
// next generation when the others are still an allowed size: it stays a state peer, is shut
// down once the new generation runs, and the job then grows to the size asked for. No restart.
TEST(Reconcile, AMemberThatMustLeaveDuringARescalesBarrierIsLeftOutOfTheNextGeneration) {
  const std::string four = R"({"replicas": 4, "optimization": {"globalBatchSize": 24},
                               "elastic": {"minGPUs": 1}})";
  Sim sim(Spec(four));
  sim.Until([&] { return sim.phase() == "Running" && sim.status().current_gpus == 4; });
  for (int i = 0; i < 3; ++i) sim.Reconcile();
  const int64_t generation = sim.status().generation;
  const int from_store = sim.resumed_from_store_;
  json three = Spec(four);
  three["replicas"] = 3;
  sim.SetSpec(three);
  sim.Until(
      [&] {  // the staying ranks read ahead, then the barrier: every rank pauses
        return sim.status().rescale && sim.status().rescale->stage == RescaleState::Stage::kBarrier;
      },
      5);
  sim.DeleteFromOutside("job-worker-1");
  sim.Until([&] { return sim.status().generation > generation && !sim.status().rescale; }, 10);
  EXPECT_EQ(sim.status().members, Names({0, 2}));
  EXPECT_TRUE(sim.HasEvent("MovingOff"));
  EXPECT_EQ(std::count(sim.shutdown_.begin(), sim.shutdown_.end(), "job-worker-1"), 1);
  EXPECT_EQ(sim.resumed_from_store_, from_store);
  sim.Until([&] {
    return sim.status().current_gpus == 3 && !sim.status().rescale && sim.phase() == "Running";
  });
  EXPECT_EQ(sim.status().restarts, 0);
  EXPECT_FALSE(sim.HasEvent("WorkerFailed"));
}

// A scale-up waiting for its pods when a member must leave gives way: its pods go, the move
// comes first, and the job then grows to the size asked for.
TEST(Reconcile, AMemberThatMustLeaveCancelsAScaleUpStillWaitingForItsPods) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.pods_stay_pending_ = true;
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Reconcile();
  ASSERT_TRUE(sim.status().rescale);
  sim.pods_stay_pending_ = false;
  sim.pods_["job-worker-1"].node_notice = "node n1 is cordoned";
  sim.Reconcile();
  EXPECT_TRUE(sim.HasEvent("ScaleUpCancelled"));
  EXPECT_TRUE(sim.HasEvent("MovingOff"));
  sim.pods_["job-worker-1"].node_notice.clear();  // uncordoned: nothing else moves it
  sim.Until([&] {
    return sim.status().current_gpus == 4 && !sim.status().rescale && sim.phase() == "Running";
  });
  EXPECT_EQ(sim.status().restarts, 0);
}

// Without buddy copies (buddyEverySteps: 0) the same loss waits for the backoff and a
// replacement, and resumes from the store.
TEST(Reconcile, WithoutBuddyCopiesALostWorkerWaitsForTheBackoffAndResumesFromTheStore) {
  Sim sim(Spec(R"({"replicas": 3, "optimization": {"globalBatchSize": 12},
                   "elastic": {"maxGPUs": 3}, "checkpoint": {"buddyEverySteps": 0}})"));
  RunThreeRanksWithBuddies(sim);
  sim.buddies_ = false;
  for (auto& [name, r] : sim.reports_) r.held.clear();
  const int from_store = sim.resumed_from_store_;
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.Until([&] { return sim.phase() == "Recovering"; });
  for (int i = 0; i < 5; ++i) sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering") << "recovered before the backoff";
  sim.now_ += 10s;
  sim.Until([&] { return sim.phase() == "Running" && !sim.status().rescale; });
  EXPECT_EQ(sim.status().current_gpus, 3);
  EXPECT_EQ(sim.resumed_from_store_, from_store + 3);
  EXPECT_FALSE(sim.HasEvent("RecoveringFromMemory"));
  EXPECT_FALSE(sim.HasEvent("BuddyCopiesLost")) << "copies are off: nothing was lost";
}

// The lost worker and the one keeping its copy go together: no survivor holds its part, so the
// recovery resumes from the store's newest checkpoint and an Event says why.
TEST(Reconcile, AWorkerLostWithTheRankKeepingItsCopyRecoversFromTheStoreAndSaysSo) {
  Sim sim(Spec(kThreeRanks));
  RunThreeRanksWithBuddies(sim);
  const std::string keeper = KeeperOf(sim, "job-worker-1");
  ASSERT_FALSE(keeper.empty());
  const int from_store = sim.resumed_from_store_;
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.pods_[keeper].phase = PodPhase::kFailed;
  sim.Until([&] { return sim.phase() == "Recovering"; });
  sim.now_ += 10s;
  sim.Until([&] { return sim.phase() == "Running" && !sim.status().rescale; });
  EXPECT_TRUE(sim.HasEvent("BuddyCopiesLost"));
  EXPECT_FALSE(sim.HasEvent("RecoveringFromMemory"));
  EXPECT_EQ(sim.resumed_from_store_, from_store + 3);
  EXPECT_EQ(sim.last_resumed_step_, sim.store_newest());
}

// An operator that dies (its actions lost) while the survivors' copies are read, at every
// point of the recovery: the next leader reads the plan from the status and sees it through.
TEST(Reconcile, ALeaderDyingDuringABuddyRecoveryLosesNoStepAndNeverRunsTwoGenerations) {
  for (int every : {2, 3}) {
    SCOPED_TRACE(every);
    Sim sim(Spec(kThreeRanks));
    const int64_t trained = RunThreeRanksWithBuddies(sim);
    const int from_store = sim.resumed_from_store_;
    sim.lose_actions_every_ = every;
    sim.pods_["job-worker-2"].phase = PodPhase::kFailed;
    sim.Until([&] { return sim.phase() == "Recovering"; });
    sim.now_ += 10s;
    sim.Until([&] { return sim.phase() == "Running" && !sim.status().rescale; }, 80);
    EXPECT_TRUE(sim.HasEvent("RecoveringFromMemory"));
    EXPECT_EQ(sim.resumed_from_store_, from_store);
    EXPECT_EQ(sim.last_resumed_step_, trained);
    EXPECT_EQ(sim.status().restarts, 1);
  }
}

// A survivor that holds a copy dies while the new generation reads from it: the new ranks
// fall back to the store (every rank knows another failed its part), that generation fails
// with the dead member, and the next recovery starts from the store too. Never two
// generations at once, never a step beyond what was trained.
TEST(Reconcile, AKeeperDyingWhileTheNewGenerationReadsFallsBackToTheStore) {
  Sim sim(Spec(kThreeRanks));
  const int64_t trained = RunThreeRanksWithBuddies(sim);
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.Until([&] { return sim.phase() == "Recovering"; });
  sim.now_ += 10s;
  sim.Until([&] { return sim.AtRendezvous() && !sim.status().rescale->state_peers.empty(); });
  const std::string keeper = sim.status().rescale->state_peers[1];
  sim.pods_[keeper].phase = PodPhase::kFailed;
  sim.now_ += 60s;  // past any backoff
  sim.Until([&] { return sim.phase() == "Running" && !sim.status().rescale; }, 80);
  EXPECT_EQ(sim.status().restarts, 2);
  EXPECT_EQ(sim.last_resumed_step_, sim.store_newest());
  EXPECT_LE(sim.last_resumed_step_, trained);
}

// A suspend while the new generation reads its state from the old one's memory: the store
// has none of it, so the rendezvous is seen through first, then the generation checkpoints to
// the store and its pods go. Nothing trained is lost.
TEST(Reconcile, ASuspendDuringALiveRendezvousSeesItThroughThenCheckpointsToTheStore) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  for (int i = 0; i < 3; ++i) sim.Reconcile();
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return sim.AtRendezvous(); });
  const int64_t held = sim.status().rescale->state_step;
  sim.SetSpec(Spec(R"({"replicas": 4, "suspend": true})"));
  sim.Until([&] { return sim.phase() == "Suspended"; });
  EXPECT_EQ(sim.resumed_from_peers_, 4);
  EXPECT_TRUE(sim.pods_.empty());
  ASSERT_TRUE(sim.status().last_checkpoint.contains("step"));
  EXPECT_GE(sim.status().last_checkpoint["step"].get<int64_t>(), held);
}

// A leader that dies between writing the status and acting (every second reconcile here):
// the next one carries the rescale on from the status, never two generations at once (the
// simulator checks that after every reconcile).
TEST(Reconcile, ALeaderDyingMidRescaleLeavesARescaleTheNextLeaderFinishes) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.lose_actions_every_ = 2;
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; });
  EXPECT_EQ(sim.status().members, Names({0, 1, 2, 3}));
  sim.SetSpec(Spec(R"({"replicas": 2})"));
  sim.Until([&] { return sim.status().generation == 3 && !sim.status().rescale; });
  EXPECT_EQ(sim.status().members, Names({0, 1}));
  for (const auto& [name, r] : sim.reports_) EXPECT_EQ(r.generation, 3) << name;
}

TEST(Reconcile, PodsWhoseCreationWasLostAreCreatedAgainUnderTheSameNames) {
  Sim sim(Spec());
  sim.lose_actions_every_ = 1;  // the first reconcile's status is written, its actions lost
  sim.Reconcile();
  sim.lose_actions_every_ = 0;
  EXPECT_TRUE(sim.pods_.empty());
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().members, Names({0, 1}));
}

TEST(Reconcile, ARecoveryWhoseReplacementStaysPendingGoesOnWithTheSurvivorsWhenAllowed) {
  // 12 sequences of 1: 2, 3 and 4 ranks are all allowed sizes.
  Sim sim(Spec(R"({"optimization": {"globalBatchSize": 12, "microBatchSize": 1},
                   "replicas": 4})"));
  sim.Until([&] { return sim.status().current_gpus == 4 && sim.phase() == "Running"; });
  sim.pods_stay_pending_ = true;
  sim.pods_["job-worker-2"].phase = PodPhase::kFailed;
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  sim.now_ += 10s;
  for (int i = 0; i < 5; ++i) sim.Reconcile();
  EXPECT_EQ(sim.pods_["job-worker-2"].phase, PodPhase::kPending);
  sim.now_ += 60s;
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().members, Names({0, 1, 3}));
  EXPECT_EQ(sim.status().current_gpus, 3);
  EXPECT_TRUE(sim.HasEvent("ScaleUpAbandoned"));
  EXPECT_FALSE(sim.pods_.count("job-worker-2"));
}

TEST(Reconcile, AScaleUpWhosePodsStayPendingIsAbandonedAfterTheTimeoutAndTrainingNeverStops) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.pods_stay_pending_ = true;
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  for (int i = 0; i < 30; ++i) {
    sim.Reconcile();
    EXPECT_EQ(sim.reports_["job-worker-0"].phase, W::kRunning) << "training stopped";
  }
  sim.now_ += 60s;
  sim.Reconcile();
  EXPECT_TRUE(sim.HasEvent("ScaleUpAbandoned"));
  EXPECT_FALSE(sim.status().rescale.has_value());
  EXPECT_EQ(sim.status().generation, 1);
  EXPECT_EQ(sim.pods_.size(), 2u) << "the pending pods were not deleted";
  bool condition = false;
  for (const Condition& c : sim.status().conditions)
    condition |= c.type == "Scaling" && c.reason == "ScaleUpAbandoned" &&
                 c.message.find("Unschedulable") != std::string::npos;
  EXPECT_TRUE(condition) << sim.status_json().dump();
  // No new attempt before max(cooldown, scale-up timeout): pods are not churned.
  for (int i = 0; i < 30; ++i) {
    sim.Reconcile();
    EXPECT_EQ(sim.pods_.size(), 2u) << "retried at once";
  }
  sim.now_ += 60s;
  sim.Reconcile();
  EXPECT_EQ(sim.pods_.size(), 4u) << "never tried again";
}

TEST(Reconcile, AFailedWorkerIsReplacedAfterTheBackoffAndTheRestartCounted) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.reports_["job-worker-1"].phase = W::kFailed;
  sim.reports_["job-worker-1"].last_error = "gloo: connection reset";
  sim.reports_["job-worker-0"].phase = W::kFailed;  // its peer's death ends its generation too
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  EXPECT_EQ(sim.status().restarts, 1);
  EXPECT_TRUE(sim.HasEvent("WorkerFailed"));
  // Both workers are alive (their generation failed, not their pods): nothing is deleted or
  // created, and nothing happens before the backoff.
  for (int i = 0; i < 5; ++i) sim.Reconcile();
  EXPECT_EQ(sim.pods_.size(), 2u);
  EXPECT_EQ(sim.phase(), "Recovering");
  EXPECT_EQ(sim.reports_["job-worker-0"].generation, 1);
  sim.now_ += 10s;
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().generation, 2);
  EXPECT_EQ(sim.status().members, Names({0, 1}));
  EXPECT_TRUE(sim.HasEvent("Recovered"));
  EXPECT_EQ(sim.status().restarts, 1);
}

// A hang outside a collective (a stuck read, a deadlock) never fails on its own: the workers
// answer "training" and the step stays. After progressDeadlineSeconds the generation is
// replaced, pods and all, from the newest checkpoint, counted as a restart; Stalled says why
// and is over once the next generation trains.
TEST(Reconcile, AGenerationWhoseStepStopsWhileItsWorkersAnswerIsStalledAndReplaced) {
  Sim sim(Spec(R"({"restartPolicy": {"progressDeadlineSeconds": 10}})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.Reconcile();
  const int64_t at = sim.reports_["job-worker-0"].step;
  sim.stuck_ = true;
  for (int i = 0; i < 9; ++i) sim.Reconcile();
  EXPECT_FALSE(sim.HasEvent("Stalled")) << "stalled before the deadline";
  sim.Until([&] { return sim.HasEvent("Stalled"); }, 5);
  EXPECT_EQ(ConditionOf(sim.status(), "Stalled", "status"), "True");
  const std::string why = ConditionOf(sim.status(), "Stalled", "message");
  EXPECT_NE(why.find("at step " + std::to_string(at) + " of generation 1"), std::string::npos)
      << why;
  EXPECT_NE(why.find("progressDeadlineSeconds 10"), std::string::npos) << why;
  EXPECT_EQ(sim.phase(), "Recovering");
  EXPECT_EQ(sim.status().restarts, 1);
  EXPECT_FALSE(sim.pods_.count("job-worker-0")) << "a stuck worker cannot rejoin: replaced";
  EXPECT_FALSE(sim.pods_.count("job-worker-1"));
  sim.stuck_ = false;
  sim.now_ += 10s;  // the backoff
  sim.Until([&] { return sim.phase() == "Running" && sim.status().generation == 2; });
  sim.Reconcile();
  EXPECT_EQ(ConditionOf(sim.status(), "Stalled", "status"), "False");
  EXPECT_EQ(sim.status().restarts, 1);
}

// Nothing but a training generation can stall: workers that checkpoint or wait for a long
// time are not stalled, and progressDeadlineSeconds 0 turns the detector off.
TEST(Reconcile, WorkersThatCheckpointForLongOrADetectorTurnedOffNeverStall) {
  Sim sim(Spec(R"({"restartPolicy": {"progressDeadlineSeconds": 10}})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.stuck_ = true;
  for (auto& [name, r] : sim.reports_) r.phase = W::kCheckpointing;
  for (int i = 0; i < 30; ++i) sim.Reconcile();
  EXPECT_FALSE(sim.HasEvent("Stalled"));
  EXPECT_EQ(sim.status().restarts, 0);

  Sim off(Spec(R"({"restartPolicy": {"progressDeadlineSeconds": 0}})"));
  off.Until([&] { return off.phase() == "Running"; });
  off.stuck_ = true;
  for (int i = 0; i < 30; ++i) off.Reconcile();
  EXPECT_FALSE(off.HasEvent("Stalled"));
  EXPECT_EQ(off.status().restarts, 0);
  EXPECT_EQ(ConditionOf(off.status(), "Stalled", "status"), "");
}

// The deadline is measured on the monotonic clock: a step of the wall clock by an hour, with
// the workers training, does not stall the job.
TEST(Reconcile, AWallClockStepOfAnHourDoesNotStallATrainingJob) {
  Sim sim(Spec(R"({"restartPolicy": {"progressDeadlineSeconds": 10}})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.stuck_ = true;  // a slow step: no step ends for a while, but less than the deadline
  sim.Reconcile();
  sim.now_ += 1h;
  sim.wall_step_ += 1h;
  for (int i = 0; i < 5; ++i) sim.Reconcile();
  sim.stuck_ = false;
  for (int i = 0; i < 5; ++i) sim.Reconcile();
  EXPECT_FALSE(sim.HasEvent("Stalled"));
  EXPECT_FALSE(sim.HasEvent("WorkerFailed"));
  EXPECT_EQ(sim.status().restarts, 0);
  EXPECT_EQ(sim.phase(), "Running");
}

// The waits the status holds are wall-clock times. A step back by an hour during a recovery's
// backoff of 10 s does not hold the job for an hour: the wait is capped from now.
TEST(Reconcile, AWallClockStepBackOfAnHourDoesNotLengthenTheRecoveryBackoff) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.reports_["job-worker-1"].phase = W::kFailed;
  sim.reports_["job-worker-0"].phase = W::kFailed;
  sim.Reconcile();
  ASSERT_EQ(sim.phase(), "Recovering");
  sim.now_ -= 1h;
  sim.wall_step_ -= 1h;
  sim.Until([&] { return sim.phase() == "Running"; }, 30);
  EXPECT_EQ(sim.status().generation, 2);
  EXPECT_EQ(sim.status().restarts, 1);
}

// The backoff doubles within a streak of failures and starts again after 10 quiet minutes,
// as the kubelet's CrashLoopBackOff does; the restart count (against maxRestarts) goes on.
TEST(Reconcile, TheRecoveryBackoffDoublesWithinAStreakAndStartsAgainAfterTenQuietMinutes) {
  Sim sim(Spec(R"({"restartPolicy": {"maxRestarts": 5, "backoffSeconds": 10}})"));
  auto fail_and_wait = [&]() {
    sim.Until([&] { return sim.phase() == "Running"; }, 100);
    sim.reports_["job-worker-0"].phase = W::kFailed;
    sim.reports_["job-worker-1"].phase = W::kFailed;
    const auto failed_at = sim.now_;
    sim.Reconcile();
    EXPECT_EQ(sim.phase(), "Recovering");
    return std::chrono::duration_cast<std::chrono::seconds>(*sim.status().restart_not_before -
                                                            failed_at);
  };
  EXPECT_EQ(fail_and_wait(), 10s);
  EXPECT_EQ(fail_and_wait(), 20s) << "a second failure within 10 minutes";
  EXPECT_EQ(fail_and_wait(), 40s);
  EXPECT_EQ(sim.status().restart_streak, 3);
  sim.Until([&] { return sim.phase() == "Running"; }, 100);
  sim.now_ += 11min;  // ten quiet minutes of training
  EXPECT_EQ(fail_and_wait(), 10s) << "a new streak";
  EXPECT_EQ(sim.status().restarts, 4);
  EXPECT_EQ(sim.status().restart_streak, 1);
}

TEST(Reconcile, FailuresThatFollowOneAnotherInOneRecoveryCountAsOneRestart) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.Reconcile();
  sim.pods_["job-worker-0"].phase = PodPhase::kFailed;  // the rest of the generation goes down
  sim.Reconcile();
  EXPECT_EQ(sim.status().restarts, 1);
  sim.now_ += 10s;
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().restarts, 1);
  EXPECT_EQ(sim.status().members.size(), 2u);
}

TEST(Reconcile, AVanishedPodIsRecoveredWithTheSurvivorKept) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.pods_.erase("job-worker-1");
  sim.reports_["job-worker-0"].phase = W::kFailed;
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  EXPECT_TRUE(sim.pods_.count("job-worker-0")) << "the survivor was deleted";
  sim.now_ += 10s;
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().members, Names({0, 1}));
  EXPECT_EQ(sim.reports_["job-worker-0"].generation, 2);
}

TEST(Reconcile, BeyondMaxRestartsTheJobFailsWithTheCauseAndItsPodsGo) {
  Sim sim(Spec());
  for (int restart = 1; restart <= 3; ++restart) {
    sim.Until([&] { return sim.phase() == "Running"; }, 200);
    sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
    sim.pods_["job-worker-1"].reason = "exit code 137";
    sim.Reconcile();
    sim.now_ += std::chrono::seconds(10 << (restart - 1));
  }
  EXPECT_EQ(sim.phase(), "Failed");
  EXPECT_NE(sim.status().failure.find("exit code 137"), std::string::npos) << sim.status().failure;
  EXPECT_NE(sim.status().failure.find("maxRestarts 2"), std::string::npos);
  EXPECT_TRUE(sim.HasEvent("RestartsExhausted"));
  EXPECT_TRUE(sim.pods_.empty());
  Plan after = sim.Reconcile();
  EXPECT_TRUE(after.actions.empty()) << "a failed job is terminal";
}

// A worker whose generation cannot start on the spec (it names the field) fails the job at
// once: no restart spent, no restart loop, the cause in the Ready condition and an Event. An
// edit of the spec starts it again, the workers reading the edited spec.
TEST(Reconcile, AWorkerThatCannotUseTheSpecFailsTheJobNamingTheFieldUntilTheSpecIsEdited) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.reports_["job-worker-0"].phase = W::kFailed;
  sim.reports_["job-worker-0"].last_error = "spec.dataset.uri: cannot open /data/sample.jsonl";
  sim.reports_["job-worker-0"].last_error_permanent = true;
  sim.reports_["job-worker-1"].phase = W::kFailed;  // its peer: a transient failure
  sim.reports_["job-worker-1"].last_error = "a peer closed the connection";
  sim.Reconcile();
  JobStatus st = sim.status();
  EXPECT_EQ(planner::PhaseName(st.phase), std::string("Failed"));
  EXPECT_EQ(st.failure_reason, "ConfigurationError");
  EXPECT_EQ(st.restarts, 0) << "a configuration error is not worth a restart";
  EXPECT_NE(st.failure.find("spec.dataset.uri: cannot open"), std::string::npos) << st.failure;
  EXPECT_TRUE(sim.HasEvent("ConfigurationError"));
  EXPECT_TRUE(sim.pods_.empty()) << "the GPUs of a job that cannot run are given back";
  const json ready = [&] {
    for (const json& c : sim.status_json()["conditions"])
      if (c["type"] == "Ready") return c;
    return json();
  }();
  EXPECT_EQ(ready.value("reason", ""), "ConfigurationError");
  EXPECT_NE(ready.value("message", "").find("spec.dataset.uri"), std::string::npos) << ready;
  for (int i = 0; i < 5; ++i) {
    sim.now_ += 1h;
    EXPECT_TRUE(sim.Reconcile().actions.empty()) << "a job failed on its spec restarted";
  }
  EXPECT_EQ(sim.phase(), "Failed");

  sim.SetSpec(Spec(R"({"dataset": {"uri": "/data/other.jsonl"}})"));
  sim.Reconcile();
  EXPECT_TRUE(sim.HasEvent("SpecChanged"));
  EXPECT_EQ(sim.config_updates_, 1);
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().generation, 2);
  EXPECT_EQ(sim.status().restarts, 0);
  EXPECT_TRUE(sim.status().failure.empty());
}

// A transient failure keeps the restart budget and backoff, and the Recovering condition and
// status.lastFailure say what the restart is for.
TEST(Reconcile, ARecoveringJobShowsTheCauseOfItsLastRestart) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.pods_["job-worker-1"].reason = "Error (exit code 1)";
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  EXPECT_EQ(sim.status().restarts, 1);
  EXPECT_NE(sim.status().last_failure.find("exit code 1"), std::string::npos);
  std::string message;
  for (const json& c : sim.status_json()["conditions"])
    if (c["type"] == "Recovering") message = c.value("message", "");
  EXPECT_NE(message.find("restart 1 of 2"), std::string::npos) << message;
  EXPECT_NE(message.find("pod job-worker-1 failed: Error (exit code 1)"), std::string::npos)
      << message;
}

// The poison spec of issue 20 (maxGPUs 2^62, which once divided by an overflowed zero) beside
// a healthy job: the poison is marked InvalidSpec naming the field and gets nothing; the
// healthy job trains on. (Each reconcile reads the status back from JSON, as a new leader
// does after a restart; tests/e2e/local/operator_test.cc restarts a real operator.)
TEST(Reconcile, APoisonSpecIsMarkedInvalidAndAHealthyJobBesideItTrainsOn) {
  Sim poison(Spec(R"({"optimization": {"globalBatchSize": 12, "microBatchSize": 4},
                      "elastic": {"minGPUs": 1, "maxGPUs": 4611686018427387904}})"));
  Sim healthy(Spec());
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 10; ++i) {
      poison.Reconcile();
      healthy.Reconcile();
    }
    EXPECT_EQ(healthy.phase(), "Running");
    EXPECT_TRUE(poison.pods_.empty());
    std::string reason, message;
    for (const json& c : poison.status_json()["conditions"])
      if (c["type"] == "Ready") {
        reason = c.value("reason", "");
        message = c.value("message", "");
      }
    EXPECT_EQ(reason, "InvalidSpec");
    EXPECT_NE(message.find("spec.elastic.maxGPUs: must be in [1, 65536]"), std::string::npos)
        << message;
  }
  EXPECT_GT(healthy.reports_["job-worker-0"].step, 10);
}

TEST(Reconcile, SuspendCheckpointsAndRemovesTheWorkersAndUnsuspendStartsANewGeneration) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.Reconcile();
  sim.SetSpec(Spec(R"({"suspend": true})"));
  Plan plan = sim.Reconcile();
  ASSERT_FALSE(plan.actions.empty());
  EXPECT_EQ(ActionName(plan.actions.back()), std::string("Barrier"));
  sim.Until([&] { return sim.phase() == "Suspended"; });
  EXPECT_TRUE(sim.pods_.empty());
  EXPECT_TRUE(sim.HasEvent("Suspended"));
  const int64_t generation = sim.status().generation;
  sim.SetSpec(Spec(R"({"suspend": false})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().generation, generation + 1);
  EXPECT_TRUE(sim.HasEvent("Unsuspended"));
}

// Pods take their grace period to go. The job is Suspended only once they are gone (their GPUs
// are free then), shows no current GPUs meanwhile, and resumes into a new generation.
TEST(Reconcile, ASuspendWaitsForTerminatingPodsAndShowsNoGpusMeanwhile) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.linger_ = 4;
  sim.SetSpec(Spec(R"({"suspend": true})"));
  sim.Until([&] {
    return std::any_of(sim.pods_.begin(), sim.pods_.end(),
                       [](const auto& p) { return p.second.deleting; });
  });
  int waited = 0;
  while (!sim.pods_.empty() && waited++ < 10) {
    EXPECT_NE(sim.phase(), "Suspended") << "Suspended while pods still terminate";
    EXPECT_EQ(sim.status().current_gpus, 0);
    sim.Reconcile();
  }
  EXPECT_GE(waited, 2) << "the pods did not linger";
  sim.Until([&] { return sim.phase() == "Suspended"; });
  EXPECT_EQ(sim.status().current_gpus, 0);
  const int64_t generation = sim.status().generation;
  sim.SetSpec(Spec(R"({"suspend": false})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().generation, generation + 1);
  EXPECT_EQ(sim.status().members, Names({0, 1}));
}

// Unsuspended while the suspended pods still terminate: the job comes back (in other slots,
// the old names are still taken) and never runs two generations at once.
// A node that stopped answering (Ready Unknown) never confirms a deletion: its pod would keep
// the job out of Suspended forever. Once the grace period is over it is deleted with grace 0
// (an Event says so); a pod terminating slowly on a healthy node is waited for.
TEST(Reconcile, APodStuckTerminatingOnALostNodeIsForceDeletedAfterItsGracePeriod) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.linger_ = 100000;  // no deletion completes on its own
  sim.pods_["job-worker-1"].node = "tidal-node-1";
  sim.pods_["job-worker-1"].node_lost = true;
  sim.SetSpec(Spec(R"({"suspend": true})"));
  sim.Until([&] { return sim.pods_["job-worker-0"].deleting; });
  const auto deleted_at = sim.now_;
  while (sim.now_ < deleted_at + 119s) {
    sim.Reconcile();
    ASSERT_TRUE(sim.force_deleted_.empty()) << "force-deleted within the grace period";
  }
  sim.Until([&] { return !sim.force_deleted_.empty(); }, 5);
  EXPECT_EQ(sim.force_deleted_, Names({1}));
  EXPECT_TRUE(sim.HasEvent("ForceDeleted"));
  for (int i = 0; i < 10; ++i) sim.Reconcile();
  EXPECT_EQ(sim.force_deleted_, Names({1})) << "a slow kubelet on a healthy node is waited for";
  EXPECT_NE(sim.phase(), "Suspended");
  sim.pods_.erase("job-worker-0");  // its kubelet finishes
  sim.Until([&] { return sim.phase() == "Suspended"; });
}

TEST(Reconcile, AResumeWhileThePodsStillTerminateStartsOneNewGeneration) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  const int64_t generation = sim.status().generation;
  sim.linger_ = 6;
  sim.SetSpec(Spec(R"({"suspend": true})"));
  sim.Until([&] {
    return std::any_of(sim.pods_.begin(), sim.pods_.end(),
                       [](const auto& p) { return p.second.deleting; });
  });
  sim.SetSpec(Spec(R"({"suspend": false})"));
  sim.Until([&] {
    return sim.status().generation > generation && sim.phase() == "Running" &&
           !sim.status().rescale;
  });
  EXPECT_EQ(sim.status().generation, generation + 1);
  EXPECT_EQ(sim.status().members.size(), 2u);
  for (const std::string& m : sim.status().members) {
    ASSERT_TRUE(sim.pods_.count(m)) << m;
    EXPECT_FALSE(sim.pods_[m].deleting) << m << " is a terminating pod";
  }
}

TEST(Reconcile, DeletionTakesAFinalCheckpointBeforeReleasingTheFinalizer) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.deleting_ = true;
  Plan plan = sim.Reconcile();
  EXPECT_TRUE(sim.finalizer_) << "released before the final checkpoint";
  sim.Until([&] { return !sim.finalizer_; });
  EXPECT_TRUE(sim.HasEvent("FinalCheckpoint"));
  EXPECT_EQ(sim.shutdown_.size(), 2u);
  // Issue 47: deleting a job says what happens to its checkpoints: kept, and where.
  const auto at = std::find(sim.events_.begin(), sim.events_.end(), "FinalCheckpoint");
  const std::string& said = sim.event_messages_[at - sim.events_.begin()];
  EXPECT_NE(said.find("its checkpoints are kept in file:///ckpt ("), std::string::npos) << said;
  EXPECT_NE(said.find("spec.checkpoint.resumeFrom"), std::string::npos) << said;
}

// `kubectl get tj` of a job being deleted says so (as a Namespace's phase does), not "Running"
// with no GPUs, from the first pass of its deletion to the finalizer's release.
TEST(Reconcile, AJobBeingDeletedIsTerminatingUntilItsFinalizerGoes) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.deleting_ = true;
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Terminating");
  EXPECT_EQ(ConditionOf(sim.status(), "Ready", "reason"), "Terminating");
  EXPECT_EQ(sim.phase_changes_.back(), "Running -Deleted-> Terminating");
  sim.Until([&] {
    EXPECT_EQ(sim.phase(), "Terminating");
    return !sim.finalizer_;
  });
}

// Found the same way: a job resumed after a suspend showed Recovering (and its resume was
// counted as a recovery) whenever it had ever restarted, since "recovering" was read off the
// restart count. A resume is Pending until its generation trains, and is measured as one.
TEST(Reconcile, AResumeOfAJobThatOnceRecoveredIsPendingAndMeasuredAsAResume) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.Reconcile();
  sim.now_ += 10s;
  sim.Until([&] { return sim.phase() == "Running" && sim.status().restarts == 1; });
  sim.SetSpec(Spec(R"({"suspend": true})"));
  sim.Until([&] { return sim.phase() == "Suspended"; });
  const size_t recovered_before = std::count(sim.events_.begin(), sim.events_.end(), "Recovered");
  sim.SetSpec(Spec(R"({"suspend": false})"));
  std::string kind;
  for (int i = 0; i < 50 && sim.phase() != "Running"; ++i) {
    const Plan plan = sim.Reconcile();
    EXPECT_NE(sim.phase(), "Recovering");
    EXPECT_EQ(ConditionOf(sim.status(), "Recovering", "status"), "False");
    if (plan.finished_rescale) kind = plan.finished_rescale->kind;
  }
  EXPECT_EQ(sim.phase(), "Running");
  EXPECT_EQ(kind, "resume");
  EXPECT_EQ(std::count(sim.events_.begin(), sim.events_.end(), "Recovered"), recovered_before);
  EXPECT_EQ(sim.phase_changes_.back(), "Pending -WorkersReady-> Running");
}

TEST(Reconcile, AnInvalidSpecSetsReadyFalseInvalidSpecAndCreatesNothing) {
  Sim sim(Spec(R"({"elastic": {"minGPUs": 3}})"));
  Plan plan = sim.Reconcile();
  EXPECT_TRUE(plan.actions.empty());
  EXPECT_TRUE(sim.HasEvent("InvalidSpec"));
  bool found = false;
  for (const Condition& c : sim.status().conditions)
    if (c.type == "Ready") {
      found = true;
      EXPECT_EQ(c.status, ConditionStatus::kFalse);
      EXPECT_EQ(c.reason, "InvalidSpec");
      EXPECT_NE(c.message.find("spec.optimization.globalBatchSize"), std::string::npos)
          << c.message;
    }
  EXPECT_TRUE(found);
  sim.Reconcile();
  EXPECT_EQ(std::count(sim.events_.begin(), sim.events_.end(), "InvalidSpec"), 1)
      << "the same invalid spec is reported once";
  sim.SetSpec(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
}

// The data phase (status.data): until tidal-prep's pod has said where the token store is, no
// worker exists and Ready says why; then every worker pod is told the store.
TEST(Reconcile, NoWorkerIsCreatedUntilTheDataPhaseHasPreparedTheStore) {
  Sim sim(Spec());
  sim.prep_outcome_ = [](int) { return std::pair<std::string, std::string>("Running", ""); };
  for (int i = 0; i < 6; ++i) sim.Reconcile();
  ASSERT_EQ(sim.prep_pods_created_.size(), 1u) << "one prep pod, however many reconciles";
  const std::string prep = sim.prep_pods_created_[0];
  EXPECT_EQ(prep.rfind("job-prep-", 0), 0u) << prep;
  EXPECT_TRUE(sim.pods_.empty()) << "a worker before the data is ready";
  EXPECT_EQ(sim.phase(), "Pending");
  EXPECT_EQ(ConditionOf(sim.status(), "Ready", "reason"), "PreparingData");
  EXPECT_NE(ConditionOf(sim.status(), "Ready", "message").find("kubectl logs " + prep),
            std::string::npos);
  EXPECT_EQ(ConditionOf(sim.status(), "DataReady", "status"), "False");
  EXPECT_EQ(std::count(sim.events_.begin(), sim.events_.end(), "PreparingData"), 1);

  sim.prep_pods_[prep].phase = PodPhase::kSucceeded;
  sim.prep_pods_[prep].message =
      R"({"store": "s3://data/.tidal-tokens/feed", "samples": 500000, "tokens": 123456789,
          "reused": true})";
  Plan plan = sim.Reconcile();
  EXPECT_TRUE(sim.prep_pods_.empty()) << "the prep pod stays after the phase";
  EXPECT_EQ(sim.pods_.size(), 2u);
  const JobStatus st = sim.status();
  ASSERT_TRUE(st.data);
  EXPECT_EQ(st.data->phase, DataPhase::kReady);
  EXPECT_EQ(st.data->store_uri, "s3://data/.tidal-tokens/feed");
  EXPECT_EQ(st.data->samples, 500000);
  EXPECT_EQ(st.data->tokens, 123456789);
  EXPECT_TRUE(st.data->reused);
  EXPECT_EQ(ConditionOf(st, "DataReady", "status"), "True");
  EXPECT_TRUE(sim.HasEvent("DataReady"));
  sim.Until([&] { return sim.phase() == "Running"; });
  // A recovery that replaces every worker does not prepare again.
  for (const std::string& m : sim.status().members) sim.pods_[m].phase = PodPhase::kFailed;
  sim.now_ += 1h;
  sim.Until([&] { return sim.phase() == "Running" && sim.status().restarts == 1; });
  EXPECT_EQ(sim.prep_pods_created_.size(), 1u);
}

// A dataset or tokenizer the model cannot use (tidal-prep's invalidSpec): Ready=False
// InvalidSpec naming both sides, no worker, no retry, the prep pod kept for its logs — until
// the spec changes.
TEST(Reconcile, ATokenizerThatDoesNotFitTheModelIsInvalidSpecAndNoWorkerIsCreated) {
  Sim sim(Spec());
  const std::string error =
      "spec.dataset: the data's tokenizer (byte-level BPE, 32000 ids) produced token id 31999, "
      "which the model /models/tiny (config.json vocab_size 512) has no embedding for";
  sim.prep_outcome_ = [&](int attempt) {
    if (attempt > 0)
      return std::pair<std::string, std::string>("Succeeded", R"({"store": "file:///s/1"})");
    return std::pair<std::string, std::string>(
        "Failed", json({{"error", error}, {"invalidSpec", true}}).dump());
  };
  for (int i = 0; i < 5; ++i) {
    sim.now_ += 1h;
    sim.Reconcile();
  }
  EXPECT_EQ(sim.prep_pods_created_.size(), 1u) << "an invalid spec is not retried";
  EXPECT_EQ(sim.prep_pods_.size(), 1u) << "its pod is kept for kubectl logs";
  EXPECT_TRUE(sim.pods_.empty());
  const JobStatus st = sim.status();
  EXPECT_EQ(planner::PhaseName(st.phase), std::string("Pending"));
  EXPECT_EQ(ConditionOf(st, "Ready", "reason"), "InvalidSpec");
  EXPECT_EQ(ConditionOf(st, "Ready", "message"), error);
  EXPECT_EQ(ConditionOf(st, "DataReady", "reason"), "InvalidSpec");
  EXPECT_EQ(std::count(sim.events_.begin(), sim.events_.end(), "InvalidSpec"), 1);
  EXPECT_EQ(st.restarts, 0);

  // An edit elsewhere (not model, dataset or LoRA) cannot fix it; one of the dataset does.
  sim.SetSpec(Spec(R"({"optimization": {"maxSteps": 2000}})"));
  sim.Reconcile();
  EXPECT_EQ(sim.prep_pods_created_.size(), 1u);
  sim.SetSpec(Spec(R"({"optimization": {"maxSteps": 2000}, "dataset": {"tokenizer": "bytes"}})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  ASSERT_EQ(sim.prep_pods_created_.size(), 2u);
  EXPECT_NE(sim.prep_pods_created_[0], sim.prep_pods_created_[1]);
  EXPECT_TRUE(sim.prep_pods_.empty()) << "the old prep pod was not collected";
  EXPECT_EQ(sim.status().data->store_uri, "file:///s/1");
}

// Anything else (a store that does not answer, a crash: no result, the log's tail as message)
// is retried with restartPolicy's backoff, a new pod per attempt, and fails the job beyond
// maxRestarts.
TEST(Reconcile, AFailingDataPhaseIsRetriedWithBackoffThenFailsTheJob) {
  Sim sim(Spec());  // maxRestarts 2, backoffSeconds 10
  sim.prep_outcome_ = [](int) {
    return std::pair<std::string, std::string>("Failed", "Segmentation fault (core dumped)\n");
  };
  sim.Reconcile();
  ASSERT_EQ(sim.prep_pods_created_.size(), 1u);
  sim.Reconcile();  // sees the failure: retry 1 in 10 s
  JobStatus st = sim.status();
  ASSERT_TRUE(st.data);
  EXPECT_EQ(st.data->phase, DataPhase::kRetrying);
  EXPECT_EQ(st.data->failures, 1);
  EXPECT_NE(st.data->message.find("Segmentation fault"), std::string::npos) << st.data->message;
  EXPECT_TRUE(sim.HasEvent("DataPreparationFailed"));
  for (int i = 0; i < 5; ++i) sim.Reconcile();  // 5 s: still in the backoff
  EXPECT_EQ(sim.prep_pods_created_.size(), 1u) << "retried inside the backoff";
  sim.Until([&] { return sim.prep_pods_created_.size() == 2; }, 12);
  sim.Until([&] { return sim.phase() == "Failed"; }, 40);
  EXPECT_EQ(sim.prep_pods_created_.size(), 3u) << "1 + maxRestarts attempts";
  EXPECT_EQ(sim.status().failure_reason, "RestartsExhausted");
  EXPECT_NE(sim.status().failure.find("the data phase failed 3 times"), std::string::npos)
      << sim.status().failure;
  EXPECT_TRUE(sim.pods_.empty());
  EXPECT_TRUE(sim.prep_pods_.empty());
}

// A result tidal-prep did not write as it should (a field of the wrong type) is not taken on
// trust: the attempt failed, saying which field, and is retried.
TEST(Reconcile, APrepResultWithAFieldOfTheWrongTypeIsAFailedAttemptNamingTheField) {
  Sim sim(Spec());
  sim.prep_outcome_ = [](int) {
    return std::pair<std::string, std::string>(
        "Succeeded", R"({"store": "file:///s/0", "samples": "40", "tokens": 900})");
  };
  sim.Reconcile();
  sim.Reconcile();
  const JobStatus st = sim.status();
  ASSERT_TRUE(st.data);
  EXPECT_EQ(st.data->phase, DataPhase::kRetrying);
  EXPECT_EQ(st.data->store_uri, "");
  EXPECT_NE(st.data->message.find(R"(result.samples: expected an integer, got "40")"),
            std::string::npos)
      << st.data->message;
  EXPECT_TRUE(sim.pods_.empty()) << "workers created on a result that does not read";
}

TEST(Reconcile, RankZeroSucceedingMakesTheJobSucceeded) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.pods_["job-worker-0"].phase = PodPhase::kSucceeded;
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Succeeded");
  EXPECT_TRUE(sim.HasEvent("Succeeded"));
}

// Issue 26: a job whose workers push their status is not polled while nothing changes: it is
// looked at again when the clock alone may change what it should do (the schedule window's
// next boundary), at the progress deadline (a stall is a step unchanged across two looks), or
// after the resync — and polled as before when anything else could change it unannounced.
TEST(Reconcile, ASteadyJobWhoseWorkersPushIsLookedAtAgainOnlyWhenTheClockMayChangeIt) {
  Sim sim(Spec(R"({"elastic": {"schedule": [{"name": "night", "start": "5 0 * * *",
                                             "end": "0 6 * * *", "gpus": 4}]}})"));
  sim.pushed_ = true;
  sim.Until([&] { return sim.phase() == "Running" && !sim.status().rescale; });
  Clock::time_point at = sim.now_;
  Plan plan = sim.Reconcile();
  EXPECT_EQ(plan.requeue_after,
            std::chrono::duration_cast<std::chrono::milliseconds>(sim.start_ + 5min - at) + 200ms)
      << "just past the window's start, 00:05";
  sim.pushed_ = false;
  EXPECT_EQ(sim.Reconcile().requeue_after, 5s) << "without pushes, the poll";
  sim.pushed_ = true;

  Sim plain(Spec());  // no schedule: nothing but the progress deadline (600 s)
  plain.pushed_ = true;
  plain.Until([&] { return plain.phase() == "Running" && !plain.status().rescale; });
  Plan steady = plain.Reconcile();
  EXPECT_EQ(steady.requeue_after, 600s);
  EXPECT_TRUE(steady.steady) << "the shell may follow rank 0 alone";
  plain.SetSpec(Spec(R"({"restartPolicy": {"progressDeadlineSeconds": 0}})"));
  EXPECT_EQ(plain.Reconcile().requeue_after, 10min) << "the resync";
  plain.SetSpec(Spec(R"({"anomaly": {"action": "Alert"}})"));
  Plan anomaly = plain.Reconcile();
  EXPECT_EQ(anomaly.requeue_after, 5s) << "the anomaly rule reads every step";
  EXPECT_FALSE(anomaly.steady);
  plain.SetSpec(Spec());
  plain.silent_["job-worker-1"] = plain.now_;
  Plan silent = plain.Reconcile();
  EXPECT_EQ(silent.requeue_after, 5s) << "a worker that does not answer";
  EXPECT_FALSE(silent.steady) << "every worker is followed again";
}

TEST(Reconcile, TheCapacityGateHoldsTheJobAtMinAndSaysWhy) {
  Sim sim(Spec(R"({"elastic": {"schedule": [{"name": "all-day", "start": "0 0 * * *",
                                             "end": "59 23 * * *", "gpus": 4}]}})"));
  sim.idle_gpus_ = 2;  // enough to start at min, not to grow
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.idle_gpus_ = 0;  // the job's own pods now hold those
  for (int i = 0; i < 5; ++i) sim.Reconcile();
  EXPECT_EQ(sim.status().current_gpus, 2);
  EXPECT_FALSE(sim.status().rescale.has_value());
  EXPECT_NE(sim.status().gpus_reason.find("capacity"), std::string::npos)
      << sim.status().gpus_reason;
  sim.idle_gpus_ = 2;
  sim.Until([&] { return sim.status().current_gpus == 4 && !sim.status().rescale; });
}

TEST(Reconcile, StatusRejectsAnUnknownRescaleStageNamingTheField) {
  auto st = JobStatusFromJson({{"rescale", {{"stage", "Sideways"}}}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("status.rescale.stage"), std::string::npos);
}

TEST(Reconcile, StatusFieldsOfTheWrongTypeAreErrorsNamingTheFieldAndAbsentOnesDefault) {
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"generation", "5"}}, R"(status.generation: expected an integer, got "5")"},
      {{{"generation", 2.5}}, "status.generation: expected an integer, got 2.5"},
      {{{"members", {"job-worker-0", 1}}}, "status.members: expected a list of strings"},
      {{{"members", "job-worker-0"}}, "status.members: expected a list of strings"},
      {{{"gpus", {{"current", "2"}}}}, "status.gpus.current: expected an integer"},
      {{{"restartNotBefore", "yesterday"}},
       R"(status.restartNotBefore: expected an RFC 3339 time, got "yesterday")"},
      {{{"rescale", "Barrier"}}, "status.rescale: expected an object"},
      {{{"rescale", {{"stage", "Barrier"}, {"recovery", "no"}}}},
       "status.rescale.recovery: expected true or false"},
      {{{"conditions", json::object()}}, "status.conditions: expected a list"},
      {{{"conditions", {{{"type", "Ready"}, {"status", "Yes"}}}}},
       R"(status.conditions[0].status: expected True, False or Unknown, got "Yes")"},
      {{{"conditions", {{{"status", "True"}}}}}, "status.conditions[0].type: expected"},
      {{{"conditions", {{{"type", "Ready"}, {"status", "True"}, {"observedGeneration", "2"}}}}},
       "status.conditions[0].observedGeneration: expected an integer"},
      {{{"data", {{"key", "k"}, {"phase", "Done"}}}},
       R"(status.data.phase: expected one of Preparing, Ready, Invalid, Retrying, got "Done")"},
      {{{"data", {{"key", "k"}}}},
       "status.data.phase: expected one of Preparing, Ready, Invalid, Retrying, got null"},
      {{{"anomaly", {{"paused", 1}}}}, "status.anomaly.paused: expected true or false"},
      {{{"loss", "low"}}, "status.loss: expected a number"},
      {{{"checkpointInterval", 240}}, "status.checkpointInterval: expected an object"},
      {json::array(), "status: expected an object"},
  };
  for (const auto& [status, expected] : bad) {
    auto st = JobStatusFromJson(status);
    ASSERT_FALSE(st.ok()) << status.dump();
    EXPECT_EQ(st.status().message().rfind(expected, 0), 0u)
        << status.dump() << " gave: " << st.status().message();
  }
  // Absent or null: the defaults (a status from an older operator, or none yet).
  for (const json& status : {json(nullptr), json::object(), json{{"generation", nullptr}}}) {
    auto st = JobStatusFromJson(status);
    ASSERT_TRUE(st.ok()) << status.dump() << ": " << st.status().message();
    EXPECT_EQ(st->generation, 0);
    EXPECT_EQ(st->phase, planner::Phase::kPending);
  }
}

// spec.checkpoint.fullEverySteps auto: rank 0's plan is written into status by the reconcile
// too; once the spec is edited back to a fixed interval the plan is no longer the job's.
TEST(Reconcile, RankZerosCheckpointIntervalIsInStatusUntilTheSpecIsFixedAgain) {
  Sim sim(Spec(R"({"checkpoint": {"fullEverySteps": "auto"}})"));
  sim.Until([&] { return sim.phase() == "Running"; });
  const json plan = {{"fullEverySteps", 120}, {"reason", "Optimal"}, {"failures", 0}};
  for (auto& [name, r] : sim.reports_) r.checkpoint_interval = plan;
  sim.Reconcile();
  EXPECT_EQ(sim.status().checkpoint_interval, plan);
  sim.SetSpec(Spec(R"({"checkpoint": {"fullEverySteps": 50}})"));
  sim.Until([&] { return sim.status().checkpoint_interval.is_null(); });
}

// The automatic checkpoint interval rank 0 planned survives the reconcile's own status writes.
TEST(Reconcile, TheCheckpointIntervalInStatusSurvivesARoundTrip) {
  JobStatus st;
  st.checkpoint_interval = {{"fullEverySteps", 170}, {"reason", "Optimal"}, {"failures", 1}};
  auto back = JobStatusFromJson(ToJson(st, "tidal.dev/job=j"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->checkpoint_interval, st.checkpoint_interval);
  EXPECT_FALSE(ToJson(JobStatus{}, "").contains("checkpointInterval"));
}

// An unreadable status is never replaced by defaults (that would restart the protocol from
// generation 1 over running workers): the job is held, nothing is done to its workers, the
// status keeps what it holds, Ready=False says why and how out; once it reads, the job goes on.
TEST(Reconcile, AStatusThatDoesNotReadHoldsTheJobAndIsLeftAsItIs) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.mutable_status_json()["generation"] = "one";
  sim.expect_unreadable_status_ = true;
  for (int i = 0; i < 5; ++i) {
    Plan plan = sim.Reconcile();
    EXPECT_TRUE(plan.actions.empty()) << ActionName(plan.actions[0]);
    EXPECT_TRUE(plan.conditions_only);
  }
  EXPECT_EQ(sim.status_json()["generation"], "one");
  EXPECT_EQ(sim.status_json()["members"], json(Names({0, 1})));
  EXPECT_EQ(std::count(sim.events_.begin(), sim.events_.end(), "StatusUnreadable"), 1);
  std::string reason, message;
  for (const json& c : sim.status_json()["conditions"])
    if (c["type"] == "Ready") {
      reason = c["reason"];
      message = c["message"];
    }
  EXPECT_EQ(reason, "StatusUnreadable");
  EXPECT_NE(message.find(R"(status.generation: expected an integer, got "one")"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--subresource=status"), std::string::npos) << message;
  EXPECT_EQ(sim.reports_["job-worker-0"].generation, 1);
  EXPECT_EQ(sim.reports_["job-worker-0"].phase, W::kRunning) << "the workers were left alone";

  sim.mutable_status_json()["generation"] = 1;  // fixed by hand
  sim.expect_unreadable_status_ = false;
  sim.Reconcile();
  EXPECT_EQ(ConditionOf(sim.status(), "Ready", "reason"), "Training");
  EXPECT_EQ(sim.status().generation, 1);
  EXPECT_EQ(sim.status().members, Names({0, 1}));
}

// A status restored from a backup (which drops it) or replaced: the workers run a generation
// it does not know. Held, with nothing created, joined or deleted, until the user deletes the
// pods; then the job starts again from its newest checkpoint.
TEST(Reconcile, AStatusBehindItsWorkersHoldsTheJobUntilTheirPodsAreDeleted) {
  Sim sim(Spec());
  sim.Until([&] { return sim.phase() == "Running"; });
  sim.SetSpec(Spec(R"({"replicas": 4})"));
  sim.Until([&] { return sim.status().generation == 2 && !sim.status().rescale; });
  sim.mutable_status_json() = json::object();
  for (int i = 0; i < 5; ++i) {
    Plan plan = sim.Reconcile();
    EXPECT_TRUE(plan.actions.empty()) << ActionName(plan.actions[0]);
  }
  EXPECT_EQ(ConditionOf(sim.status(), "Ready", "reason"), "StatusUnreadable");
  EXPECT_NE(ConditionOf(sim.status(), "Ready", "message")
                .find("runs generation 2 but the status knows generation 0"),
            std::string::npos)
      << ConditionOf(sim.status(), "Ready", "message");
  EXPECT_EQ(sim.pods_.size(), 4u);
  EXPECT_TRUE(sim.HasEvent("StatusUnreadable"));

  sim.pods_.clear();  // kubectl delete pods -l tidal.dev/job=job
  sim.reports_.clear();
  sim.Until([&] { return sim.phase() == "Running"; });
  EXPECT_EQ(sim.status().generation, 1);
  EXPECT_GT(sim.reports_[sim.status().members[0]].step, 0) << "resumed from the checkpoint";
}

// spec.anomaly: the rule runs over the members' newest steps (planner/anomaly.h).
std::string AnomalySpec(const std::string& action) {
  return R"({"anomaly": {"lossRisePercent": 15, "consecutiveSteps": 3, "minGPUUtilPercent": 40,
                         "action": ")" +
         action + R"("}})";
}

// Falls to step 20, then rises 10% a step.
double RisingFromStep20(int64_t step) {
  return step < 20 ? 3.0 - 0.01 * step : 2.8 * std::pow(1.1, step - 19);
}

TEST(Reconcile, ARisingLossPausesACheckpointedJobUntilItsStepIsAcknowledged) {
  Sim sim(Spec(AnomalySpec("Pause")));
  sim.loss_ = RisingFromStep20;
  sim.Until([&] { return sim.phase() == "Paused"; }, 80);
  const JobStatus paused = sim.status();
  ASSERT_TRUE(paused.anomaly && paused.anomaly->step);
  const int64_t at = *paused.anomaly->step;
  EXPECT_EQ(at, 22) << "steps 19-22 rise 33%: the first window over 15%";
  EXPECT_TRUE(paused.anomaly->paused);
  EXPECT_EQ(ConditionOf(paused, "LossAnomaly", "status"), "True");
  EXPECT_NE(ConditionOf(paused, "LossAnomaly", "message").find("\"acknowledgedStep\":22"),
            std::string::npos)
      << ConditionOf(paused, "LossAnomaly", "message");
  EXPECT_NE(paused.anomaly->rule.find("clause is skipped"), std::string::npos)
      << "CPU workers: the status says the utilisation clause is skipped";
  EXPECT_TRUE(sim.HasEvent("LossAnomaly"));
  EXPECT_TRUE(sim.HasEvent("Pausing"));
  // Held at one checkpointed step, no rescale, for as long as nobody acknowledges.
  sim.Until([&] { return sim.reports_["job-worker-0"].phase == W::kPaused; });
  const int64_t held = sim.reports_["job-worker-0"].step;
  EXPECT_EQ(sim.reports_["job-worker-0"].checkpoint_step, held);
  for (int i = 0; i < 10; ++i) sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Paused");
  EXPECT_EQ(sim.reports_["job-worker-0"].step, held);
  EXPECT_EQ(sim.reports_["job-worker-1"].phase, W::kPaused);
  EXPECT_EQ(sim.status().generation, 1);

  // An acknowledgement below the step does nothing; the step itself resumes.
  sim.SetSpec(Spec(R"({"anomaly": {"action": "Pause", "acknowledgedStep": 21}})"));
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Paused");
  sim.SetSpec(Spec(R"({"anomaly": {"action": "Pause", "acknowledgedStep": 22}})"));
  sim.Reconcile();
  EXPECT_TRUE(sim.HasEvent("Resumed"));
  EXPECT_EQ(ConditionOf(sim.status(), "LossAnomaly", "reason"), "Acknowledged");
  sim.Until([&] { return sim.reports_["job-worker-0"].step > held; });
  EXPECT_EQ(sim.status().generation, 1) << "a resume is no new generation";
  // The loss goes on rising: the rise past the acknowledged step pauses it again.
  sim.Until([&] { return sim.phase() == "Paused"; }, 20);
  EXPECT_GT(*sim.status().anomaly->step, 22);
}

TEST(Reconcile, ANoisyLossNeverPausesHoweverLargeItsSwings) {
  Sim sim(Spec(AnomalySpec("Pause")));
  sim.loss_ = [](int64_t step) { return 2.0 * (step % 2 ? 1.3 : 0.7); };
  for (int i = 0; i < 80; ++i) sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Running");
  EXPECT_FALSE(sim.HasEvent("LossAnomaly"));
  ASSERT_TRUE(sim.status().anomaly.has_value());
  EXPECT_GT(sim.status().anomaly->checked_step, 70);
  EXPECT_FALSE(sim.status().anomaly->step.has_value());
}

TEST(Reconcile, BusyGpusKeepARisingLossFromPausingAndTheRuleSaysItChecksThem) {
  Sim sim(Spec(AnomalySpec("Pause")));
  sim.loss_ = RisingFromStep20;
  sim.gpu_util_ = 85.0;
  for (int i = 0; i < 50; ++i) sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Running");
  EXPECT_EQ(sim.status().anomaly->rule,
            "loss up > 15% over 3 consecutive rising steps while GPU utilisation < 40%");
  sim.gpu_util_ = 10.0;  // the GPUs go idle while the loss still rises
  sim.Until([&] { return sim.phase() == "Paused"; }, 20);
  EXPECT_NE(sim.status().anomaly->message.find("GPU utilisation at most 10%"), std::string::npos)
      << sim.status().anomaly->message;
}

TEST(Reconcile, ActionAlertWarnsWithoutPausingAndClearsOnceTheLossStopsRising) {
  Sim sim(Spec(AnomalySpec("Alert")));
  sim.loss_ = [](int64_t step) {
    return step < 20 ? 3.0 - 0.01 * step : step < 26 ? 2.8 * std::pow(1.1, step - 19) : 1.0;
  };
  sim.Until([&] { return sim.HasEvent("LossAnomaly"); }, 80);
  EXPECT_EQ(sim.phase(), "Running");
  EXPECT_EQ(ConditionOf(sim.status(), "LossAnomaly", "status"), "True");
  EXPECT_FALSE(sim.HasEvent("Pausing"));
  EXPECT_EQ(std::count(sim.events_.begin(), sim.events_.end(), "LossAnomaly"), 1)
      << "one rise, one Event, however many steps it goes on for";
  sim.Until([&] { return ConditionOf(sim.status(), "LossAnomaly", "status") == "False"; }, 20);
  EXPECT_EQ(ConditionOf(sim.status(), "LossAnomaly", "reason"), "NoLongerRising");
  EXPECT_EQ(sim.phase(), "Running");
}

// Found by walking the code's transitions through the table: a worker that dies while the
// job is held for a loss anomaly is recovered (the table refused Paused -> Recovering), and the
// recovered generation is held again — the anomaly still waits for its acknowledgement.
TEST(Reconcile, AWorkerDyingWhileTheJobIsPausedIsRecoveredAndTheJobHeldAgain) {
  Sim sim(Spec(AnomalySpec("Pause")));
  sim.loss_ = RisingFromStep20;
  sim.Until([&] { return sim.phase() == "Paused"; }, 80);
  sim.Until([&] { return sim.reports_["job-worker-0"].phase == W::kPaused; });
  const int64_t generation = sim.status().generation;
  sim.pods_["job-worker-1"].phase = PodPhase::kFailed;
  sim.Reconcile();
  EXPECT_EQ(sim.phase(), "Recovering");
  EXPECT_EQ(sim.status().restarts, 1);
  sim.now_ += 10s;  // the backoff
  sim.Until([&] { return sim.status().generation > generation && sim.phase() == "Paused"; }, 80);
  EXPECT_TRUE(sim.status().anomaly->paused);
  for (const char* change : {"Paused -WorkerFailed-> Recovering", "Recovering -Recovered-> Running",
                             "Running -AnomalyPause-> Paused"})
    EXPECT_NE(std::find(sim.phase_changes_.begin(), sim.phase_changes_.end(), change),
              sim.phase_changes_.end())
        << change;
}

}  // namespace
}  // namespace tidal::reconciler
