// operator/reconciler/rescale.cc — the make-before-break change of a generation: new pods (their
// slots), engines prepared ahead, the barrier, the rendezvous; scale-down, moves off leaving pods,
// strays.
#include "operator/reconciler/decider.h"

namespace tidal::reconciler::internal {

void Decider::StartGeneration(bool recovery) {
  // A job that never trained a step is started again, not recovered (issue 47: its retry was
  // labelled "recovery", as if it had lost something).
  const bool trained = st_.step > 0 || st_.last_checkpoint.is_object();
  const std::string again = trained ? "recovery" : "another try at the start";
  if (st_.restart_not_before && o_.now < *st_.restart_not_before) {
    plan_.requeue_after =
        std::chrono::duration_cast<std::chrono::milliseconds>(*st_.restart_not_before - o_.now);
    if (!st_.rescale) {  // record the pending recovery so status says what it waits for
      RescaleState r;
      r.stage = Stage::kWaitingForPods;
      r.target_generation = st_.generation + 1;
      r.members = st_.members;
      r.recovery = true;
      r.started = *st_.restart_not_before;
      r.reason = again + " after backoff";
      st_.rescale = r;
    }
    return;
  }
  if (recovery && SurvivorsGoOnFromMemory(st_.members)) {
    RescaleState r;
    r.stage = Stage::kRendezvous;
    r.target_generation = st_.generation + 1;
    r.members = st_.members;
    r.recovery = true;
    r.started = o_.now;
    r.reason = "recovery at the survivors' " + std::to_string(st_.members.size() * GpusPerPod()) +
               " GPUs from their memory (the lost GPUs come back by a live scale-up)";
    st_.rescale = r;
    st_.restart_not_before.reset();
    Rendezvous();
    return;
  }
  const int64_t held = static_cast<int64_t>(st_.members.size()) * GpusPerPod();
  const auto decision =
      planner::DesiredGpus(*spec_, {held, std::nullopt}, {o_.idle_gpus, o_.share}, o_.now);
  st_.desired_gpus = decision.wanted;
  st_.gpus_reason = decision.reason;
  // No idle holding: a job that waits for its minimum makes no pod, none bound holding GPUs it
  // cannot use — its share does not admit it, or (on a shared cluster, for its first
  // generation) the GPUs of its minimum are not idle yet: others are still giving them back.
  const bool gang_wait = !decision.waiting && !recovery && o_.share &&
                         spec_->elastic.require_idle_capacity &&
                         o_.idle_gpus < spec_->elastic.min_gpus;
  if (decision.waiting || gang_wait) {
    if (gang_wait)
      st_.gpus_reason = "waiting for its minGPUs " + std::to_string(spec_->elastic.min_gpus) +
                        " to be idle: " + decision.reason;
    if (o_.status.gpus_reason != st_.gpus_reason)
      Emit(EventReason::kWaitingForGpus, st_.gpus_reason);
    plan_.requeue_after = options_.poll;  // a change of the shares or the GPUs wakes it sooner
    return;
  }
  int64_t want_pods = decision.desired / GpusPerPod();
  std::vector<std::string> members = st_.members;
  if (static_cast<int64_t>(members.size()) > want_pods) members.resize(want_pods);
  std::vector<std::string> created;
  const std::vector<int> slots = FillSlots(members, created, want_pods, /*adopt=*/true);
  RescaleState r;
  r.stage = Stage::kWaitingForPods;
  r.target_generation = st_.generation + 1;
  r.members = members;
  r.new_pods = created;
  r.recovery = recovery || st_.generation == 0;
  r.started = o_.now;
  r.reason = recovery
                 ? again + " at " + std::to_string(decision.desired) + " GPUs"
                 : "start at " + std::to_string(decision.desired) + " GPUs: " + decision.reason;
  st_.rescale = r;
  st_.restart_not_before.reset();
  if (!slots.empty()) {
    Do(action::CreatePods{created, slots, r.target_generation});
    Emit(EventReason::kCreatingWorkers,
         std::to_string(slots.size()) + " worker pod(s) for generation " +
             std::to_string(r.target_generation) + " (" + r.reason + ")");
  }
  plan_.requeue_after = options_.poll;
}

void Decider::MaybeRescale() {
  const int64_t held = static_cast<int64_t>(st_.members.size()) * GpusPerPod();
  const auto decision = planner::DesiredGpus(*spec_, {held, st_.last_membership_change},
                                             {o_.idle_gpus, o_.share}, o_.now);
  st_.desired_gpus = decision.wanted;
  st_.gpus_reason = decision.reason;
  NoChangeUnderWay("no membership change under way");
  if (decision.desired == held) {
    Steady(decision, std::nullopt);
    return;
  }
  if (decision.desired > held && st_.scale_up_not_before && o_.now < *st_.scale_up_not_before) {
    st_.gpus_reason = decision.reason + "; holding after an abandoned scale-up until " +
                      kube::FormatTime(*st_.scale_up_not_before);
    Steady(decision, st_.scale_up_not_before);
    return;
  }
  RescaleState r;
  r.target_generation = st_.generation + 1;
  r.started = o_.now;
  r.reason = "scale " + std::to_string(held) + " -> " + std::to_string(decision.desired) +
             " GPUs: " + decision.reason;
  const int64_t want_pods = decision.desired / GpusPerPod();
  if (decision.desired < held) {  // scale down: the first ranks stay, once prepared
    r.stage = Stage::kWaitingForPods;
    r.members.assign(st_.members.begin(), st_.members.begin() + want_pods);
    StartScaling(r.reason);
    st_.rescale = r;
    Emit(EventReason::kScalingDown, r.reason);
    Advance();
    return;
  }
  r.stage = Stage::kWaitingForPods;
  r.members = st_.members;
  const std::vector<int> slots = AddNewPods(r, want_pods - static_cast<int64_t>(r.members.size()));
  st_.rescale = r;
  Do(action::CreatePods{r.new_pods, slots, r.target_generation});
  Emit(EventReason::kScalingUp,
       r.reason + "; creating " + std::to_string(slots.size()) + " pod(s), training goes on");
}

void Decider::DropLeavingMembers(RescaleState& r) {
  std::vector<std::string> staying;
  std::string why;
  for (const std::string& m : r.members) {
    const std::string notice = LeaveNotice(m);
    if (notice.empty())
      staying.push_back(m);
    else
      why += (why.empty() ? "" : "; ") + notice;
  }
  if (staying.size() == r.members.size() || staying.empty()) return;
  const int64_t gpus = static_cast<int64_t>(staying.size()) * GpusPerPod();
  const auto allowed = spec_->AllowedGpuCounts();
  if (std::find(allowed.begin(), allowed.end(), gpus) == allowed.end()) return;
  r.members = staying;
  r.drain = true;
  r.reason += "; without the pod(s) that must leave: " + why;
  Emit(EventReason::kMovingOff,
       why + ": left out of generation " + std::to_string(r.target_generation));
}

void Decider::Steady(const planner::Decision& decision, std::optional<Clock::time_point> until) {
  if (!o_.pushed || decision.capacity_limited || !o_.unreachable_since.empty() || spec_->anomaly ||
      st_.phase != Phase::kRunning)
    return;  // the poll stays
  for (const std::string& m : st_.members) {
    const WorkerReport* r = Report(m);
    if (!r || r->phase != W::kRunning || r->generation != st_.generation) return;
  }
  auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(kSteadyResync);
  auto sooner = [&](std::optional<Clock::time_point> t) {
    if (!t) return;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(*t - o_.now) + kAfterBoundary;
    wait = std::min(wait, left);
  };
  sooner(decision.revisit);
  sooner(until);
  if (const int64_t deadline = spec_->restart_policy.progress_deadline_seconds; deadline > 0)
    wait = std::min<std::chrono::milliseconds>(wait, std::chrono::seconds(deadline));
  plan_.requeue_after = std::max<std::chrono::milliseconds>(wait, kAfterBoundary);
  plan_.steady = true;
}

std::vector<int> Decider::AddNewPods(RescaleState& r, int64_t n) const {
  return FillSlots(r.members, r.new_pods, static_cast<int64_t>(r.members.size()) + n,
                   /*adopt=*/false);
}

std::vector<int> Decider::FillSlots(std::vector<std::string>& members,
                                    std::vector<std::string>& created, int64_t want,
                                    bool adopt) const {
  std::set<std::string> deleted;
  for (const Action& a : plan_.actions)
    if (auto* d = As<action::DeletePods>(a))
      deleted.insert(d->pods.begin(), d->pods.end());
    else if (auto* f = As<action::ForceDeletePods>(a))
      deleted.insert(f->pods.begin(), f->pods.end());
  std::set<int> held;  // slots of the job's pods, whatever their names
  for (const PodView& p : o_.pods) held.insert(p.slot);
  std::vector<int> slots;
  for (int slot = 0; static_cast<int64_t>(members.size()) < want; ++slot) {
    const std::string name = o_.name + "-worker-" + std::to_string(slot);
    if (std::find(members.begin(), members.end(), name) != members.end()) continue;
    if (deleted.count(name)) continue;
    if (const PodView* existing = Pod(name)) {
      const bool going = existing->deleting || existing->phase == PodPhase::kFailed ||
                         existing->phase == PodPhase::kSucceeded;
      if (adopt && !going) members.push_back(name);
      continue;
    }
    if (held.count(slot)) continue;  // a pod of another name holds it
    slots.push_back(slot);
    created.push_back(name);
    members.push_back(name);
  }
  return slots;
}

std::vector<std::string> Decider::LeavingMembers(std::string* why) const {
  std::vector<std::string> leaving;
  for (const std::string& m : st_.members) {
    const std::string notice = LeaveNotice(m);
    if (notice.empty() || !Serves(m, st_.generation)) continue;
    leaving.push_back(m);
    if (why) *why += (why->empty() ? "" : "; ") + notice;
  }
  return leaving;
}

bool Decider::LeavingMembersStopAScaleUp() {
  const RescaleState& r = *st_.rescale;
  if (r.stage != Stage::kWaitingForPods || r.recovery || r.drain || LeavingMembers().empty())
    return false;
  if (!r.new_pods.empty()) Do(action::DeletePods{r.new_pods});
  Emit(r.new_pods.empty() ? EventReason::kScaleDownCancelled : EventReason::kScaleUpCancelled,
       "a member must leave first: " + r.reason);
  return true;
}

bool Decider::MoveOffLeavingMembers() {
  std::string why;
  const std::vector<std::string> leaving = LeavingMembers(&why);
  if (leaving.empty()) return false;
  std::vector<std::string> stay;
  for (const std::string& m : st_.members)
    if (std::find(leaving.begin(), leaving.end(), m) == leaving.end()) stay.push_back(m);
  const int64_t held = static_cast<int64_t>(st_.members.size()) * GpusPerPod();
  const int64_t stay_gpus = static_cast<int64_t>(stay.size()) * GpusPerPod();
  const auto allowed = spec_->AllowedGpuCounts();
  RescaleState r;
  r.target_generation = st_.generation + 1;
  r.started = o_.now;
  r.drain = true;
  if (!stay.empty() && std::find(allowed.begin(), allowed.end(), stay_gpus) != allowed.end()) {
    r.stage = Stage::kBarrier;
    r.barrier_started = o_.now;
    r.members = stay;
    r.reason = why + ": scale " + std::to_string(held) + " -> " + std::to_string(stay_gpus) +
               " GPUs live, off the leaving pod(s)";
    StartScaling(r.reason);
    st_.rescale = r;
    Emit(EventReason::kMovingOff,
         r.reason + "; their GPUs come back elsewhere by a scale-up once there are any");
    Advance();
    return true;
  }
  // The others alone are too few: as many new pods as leave, on GPUs that are idle now (and
  // not again before the hold after an abandoned attempt is over).
  const int64_t need = static_cast<int64_t>(leaving.size()) * GpusPerPod();
  const bool holding = st_.scale_up_not_before && o_.now < *st_.scale_up_not_before;
  if (o_.idle_gpus < need || holding) {
    const std::string blocked =
        why + ": no move off is possible: the others' " + std::to_string(stay_gpus) +
        " GPUs are not an allowed size and " + std::to_string(need) +
        " idle GPUs for replacements are not there (" + std::to_string(o_.idle_gpus) + " are" +
        (holding ? ", or a replacement was just abandoned" : "") + "); training goes on";
    if (st_.gpus_reason != blocked) Emit(EventReason::kMoveOffBlocked, blocked);
    st_.gpus_reason = blocked;
    NoChangeUnderWay(blocked);
    plan_.requeue_after = options_.poll;
    return true;
  }
  r.stage = Stage::kWaitingForPods;
  r.members = stay;
  const std::vector<int> slots = AddNewPods(r, static_cast<int64_t>(leaving.size()));
  r.reason = why + ": " + std::to_string(r.new_pods.size()) +
             " replacement pod(s) first, then a live rescale off the leaving pod(s)";
  st_.rescale = r;
  Do(action::CreatePods{r.new_pods, slots, r.target_generation});
  Emit(EventReason::kMovingOff, r.reason + "; training goes on meanwhile");
  plan_.requeue_after = options_.poll;
  return true;
}

bool Decider::AllPaused(const std::vector<std::string>& names, bool live_ok) const {
  std::optional<int64_t> step;
  for (const std::string& n : names) {
    const WorkerReport* r = Report(n);
    if (!r || r->phase != W::kPaused) return false;
    const bool stored = r->checkpoint_step && *r->checkpoint_step == r->step;
    const bool live = live_ok && r->live_step && *r->live_step == r->step;
    if (!stored && !live) return false;
    if (step && *step != r->step) return false;
    step = r->step;
  }
  return !names.empty();
}

void Decider::Advance() {
  RescaleState& r = *st_.rescale;
  switch (r.stage) {
    case Stage::kWaitingForPods: {
      if (st_.restart_not_before) {
        StartGeneration(true);  // waits out the backoff, then creates the pods
        return;
      }
      // Pods the status says were created but are not there (the creating leader died, or
      // its create failed): create them again, under the same names.
      std::vector<std::string> missing;
      std::vector<int> slots;
      const std::string prefix = o_.name + "-worker-";
      for (const std::string& p : r.new_pods)
        if (!Pod(p) && p.rfind(prefix, 0) == 0) {
          missing.push_back(p);
          slots.push_back(std::atoi(p.c_str() + prefix.size()));
        }
      if (!missing.empty()) {
        Do(action::CreatePods{missing, slots, r.target_generation});
      }
      bool ready = true, all_running = true;
      std::vector<std::string> waiting;
      for (const std::string& m : r.members) {
        if (std::find(st_.members.begin(), st_.members.end(), m) != st_.members.end() &&
            !r.recovery)
          continue;  // current members keep training
        if (!ReadyFor(m)) {
          ready = false;
          const PodView* p = Pod(m);
          all_running = all_running && p && p->phase == PodPhase::kRunning;
          std::string why =
              p ? kube::PodPhaseName(p->phase) + (p->reason.empty() ? "" : ": " + p->reason)
                : "not created yet";
          if (auto e = o_.unreachable_error.find(m); p && e != o_.unreachable_error.end())
            why += "; worker does not answer: " + e->second;
          waiting.push_back(m + " (" + why + ")");
        }
      }
      r.waiting_for = Join(waiting);
      for (const std::string& p : r.new_pods)
        if (const PodView* pod = Pod(p); pod && pod->phase == PodPhase::kFailed) {
          Abandon({p + " (Failed" + (pod->reason.empty() ? "" : ": " + pod->reason) + ")"});
          return;
        }
      if (!ready) {
        const auto timeout = std::chrono::seconds(spec_->elastic.scale_up_timeout_seconds);
        if (o_.now - r.started > timeout) Abandon(waiting);
        // A pod's phase changing wakes the controller (the informer); its worker starting to
        // answer does not: once every pod waited for runs, ask again soon.
        plan_.requeue_after =
            all_running ? std::min(options_.poll, kWorkerStartPoll) : options_.poll;
        return;
      }
      if (!r.prepare_asked) GroupByNode(r.members);  // ranks are given out from here on
      if (r.recovery || st_.members.empty()) {
        r.stage = Stage::kRendezvous;
        Rendezvous();
        return;
      }
      if (!EnginesPrepared(r)) return;
      r.stage = Stage::kBarrier;
      r.barrier_started = o_.now;
      StartScaling(r.reason);
      Emit(EventReason::kCheckpointBarrier,
           "new workers ready; checkpointing every rank at one step before generation " +
               std::to_string(r.target_generation));
      Advance();
      return;
    }
    case Stage::kBarrier:
      StartScaling(r.reason);
      if (!AllPaused(st_.members, /*live_ok=*/true) && r.barrier_started &&
          o_.now - *r.barrier_started > options_.barrier_timeout) {
        AbandonBarrier();
        return;
      }
      if (!AllPaused(st_.members, /*live_ok=*/true)) {
        Barrier(kEndOfGeneration, /*live=*/true);
        // The shell runs the barrier calls off the reconcile (they return once every rank
        // holds, or one fails) and the first to end wakes the job: the Rendezvous goes out
        // then, not a poll later. The poll is the safety net.
        plan_.requeue_after = options_.poll;
        return;
      }
      // Every member holds a live checkpoint of the step it paused at: the new generation
      // reads it from them. (Ranks paused at a store checkpoint only, say by a barrier of
      // a suspend that was then taken back, resume from the store.)
      r.state_peers.clear();
      r.state_step = 0;
      if (std::all_of(st_.members.begin(), st_.members.end(), [&](const std::string& m) {
            const WorkerReport* w = Report(m);
            return w->live_step && *w->live_step == w->step;
          })) {
        r.state_peers = st_.members;
        r.state_step = Report(st_.members.front())->step;
      }
      DropLeavingMembers(r);
      r.stage = Stage::kRendezvous;
      Rendezvous();
      return;
    case Stage::kRendezvous:
      Rendezvous();
      return;
  }
}

void Decider::GroupByNode(std::vector<std::string>& members) const {
  std::vector<std::string> nodes;  // in the order of their first member
  std::map<std::string, std::vector<std::string>> on;
  for (const std::string& m : members) {
    const PodView* p = Pod(m);
    const std::string node = p ? p->node : "";
    if (!on.count(node)) nodes.push_back(node);
    on[node].push_back(m);
  }
  if (nodes.size() < 2) return;
  std::vector<std::string> grouped;
  for (const std::string& node : nodes)
    grouped.insert(grouped.end(), on[node].begin(), on[node].end());
  members = grouped;
}

bool Decider::EnginesPrepared(RescaleState& r) {
  if (r.members.empty() || r.drain) return true;
  const auto soon = std::min(options_.poll, kWorkerStartPoll);
  if (!r.prepare_asked) {
    action::PrepareEngine a{.pods = r.members,
                            .ranks = {},
                            .world_size = static_cast<int>(r.members.size()),
                            .generation = r.target_generation};
    for (size_t rank = 0; rank < r.members.size(); ++rank)
      a.ranks.push_back(static_cast<int>(rank));
    Do(std::move(a));
    r.prepare_asked = o_.now;
    r.waiting_for = Join(r.members, " (preparing)");
    Emit(EventReason::kPreparingEngines,
         Join(r.members) + " ready what they lack for generation " +
             std::to_string(r.target_generation) +
             " (a new pod its engine, a member the base weights its new shard adds) while " +
             "the job trains");
    plan_.requeue_after = soon;
    return false;
  }
  std::vector<std::string> loading;
  for (size_t rank = 0; rank < r.members.size(); ++rank) {
    const WorkerReport* w = Report(r.members[rank]);
    if (!w || !w->prepared) continue;
    const WorkerReport::Prepared& p = *w->prepared;
    if (p.generation == r.target_generation && p.rank == static_cast<int>(rank) &&
        p.world_size == static_cast<int>(r.members.size()) && !p.ready && p.error.empty())
      loading.push_back(r.members[rank]);
  }
  if (loading.empty()) return true;
  const auto timeout = std::chrono::seconds(spec_->elastic.scale_up_timeout_seconds);
  if (o_.now - *r.prepare_asked > timeout) {
    Emit(EventReason::kEnginesStillLoading,
         Join(loading) + " still preparing " + std::to_string(timeout.count()) +
             " s after the ask (elastic.scaleUpTimeoutSeconds): the barrier goes on, and " +
             "they finish loading in generation " + std::to_string(r.target_generation));
    return true;
  }
  r.waiting_for = Join(loading, " (preparing)");
  plan_.requeue_after = soon;
  return false;
}

void Decider::Rendezvous() {
  RescaleState& r = *st_.rescale;
  // Pods of the old generation that are not in the new one. Under a live rescale they hold
  // state the new generation reads: they go once it runs (below).
  if (st_.generation != r.target_generation && r.recovery && st_.generation > 0 &&
      r.state_peers.empty())
    ReadLostStateFromBuddies(r);
  std::vector<std::string> surplus;
  for (const std::string& m : r.state_peers.empty() ? st_.members : r.state_peers)
    if (std::find(r.members.begin(), r.members.end(), m) == r.members.end() &&
        std::find(surplus.begin(), surplus.end(), m) == surplus.end())
      surplus.push_back(m);
  if (st_.generation != r.target_generation) {
    st_.generation = r.target_generation;
    st_.members = r.members;
    // A recovery starts no cooldown: the GPUs it lost are wanted back as soon as they can be
    // had (a recovery at the survivors' size is followed by a scale-up).
    // Nor does a move off pods that had to leave: their GPUs are wanted back elsewhere.
    if (st_.phase != Phase::kRecovering && !r.drain) st_.last_membership_change = o_.now;
    st_.current_gpus = static_cast<int64_t>(r.members.size()) * GpusPerPod();
    Emit(EventReason::kRendezvous, "generation " + std::to_string(r.target_generation) + " at " +
                                       std::to_string(st_.current_gpus) + " GPUs: " + r.reason);
  }
  if (!surplus.empty() && r.state_peers.empty()) {
    Do(action::Shutdown{surplus, r.reason});
    Do(action::DeletePods{surplus});
  }
  std::vector<std::string> pending, joining;
  for (const std::string& m : r.members) {
    const WorkerReport* w = Report(m);
    if (!w || w->generation < r.target_generation)
      pending.push_back(m);
    else if (w->generation == r.target_generation && w->phase == W::kJoining)
      joining.push_back(m);  // still reading its state
  }
  if (!pending.empty() || (!r.state_peers.empty() && !joining.empty())) {
    if (!pending.empty()) {
      std::vector<std::string> nodes;
      for (const std::string& m : r.members) {
        const PodView* p = Pod(m);
        nodes.push_back(p ? p->node : "");
      }
      Do(action::Rendezvous{.pods = r.members,
                            .targets = pending,
                            .generation = r.target_generation,
                            .state_peers = r.state_peers,
                            .state_step = r.state_step,
                            .wards = planner::BuddyWards(nodes),
                            .restarts = st_.restarts});
    }
    // Members reading their state from their peers' memory are done in tens of milliseconds.
    plan_.requeue_after =
        pending.empty() ? std::min(options_.poll, kWorkerStartPoll) : options_.poll;
    return;
  }
  if (!surplus.empty() && !r.state_peers.empty()) {
    Do(action::Shutdown{surplus, r.reason});
    Do(action::DeletePods{surplus});
  }
  const bool recovery = st_.phase == Phase::kRecovering;
  const int64_t from_memory_step = r.state_peers.empty() ? 0 : r.state_step;
  // A change with no member from before it is a start (nothing trained yet), a recovery
  // (after a failure) or a resume (after suspend); else it grew or shrank the generation.
  const bool all_new = r.new_pods.size() == r.members.size();
  plan_.finished_rescale = Plan::FinishedRescale{recovery                ? "recovery"
                                                 : st_.generation == 1   ? "start"
                                                 : r.drain               ? "drain"
                                                 : all_new || r.recovery ? "resume"
                                                 : r.new_pods.empty()    ? "scale_down"
                                                                         : "scale_up",
                                                 r.started};
  st_.rescale.reset();
  CompleteChange("generation " + std::to_string(st_.generation) + " trains");
  // A recovery at fewer GPUs than wanted (the survivors alone) grows again on the next pass.
  if (recovery) plan_.requeue_after = std::chrono::milliseconds(0);
  if (recovery)
    Emit(EventReason::kRecovered,
         "generation " + std::to_string(st_.generation) +
             (from_memory_step == 0 ? " resumed from the newest checkpoint"
                                    : " resumed from the survivors' memory at step " +
                                          std::to_string(from_memory_step)));
  else if (!recovery)
    Emit(EventReason::kRescaled, "generation " + std::to_string(st_.generation) + " training at " +
                                     std::to_string(st_.current_gpus) + " GPUs");
}

void Decider::CollectStrays() {
  std::set<std::string> known(st_.members.begin(), st_.members.end());
  if (st_.rescale) {
    known.insert(st_.rescale->members.begin(), st_.rescale->members.end());
    known.insert(st_.rescale->new_pods.begin(), st_.rescale->new_pods.end());
    known.insert(st_.rescale->state_peers.begin(), st_.rescale->state_peers.end());
  }
  for (const Action& a : plan_.actions)
    if (auto* d = As<action::DeletePods>(a)) known.insert(d->pods.begin(), d->pods.end());
  std::vector<std::string> strays, leaving;
  for (const PodView& p : o_.pods)
    if (!known.count(p.name) && !p.deleting && p.phase != PodPhase::kSucceeded)
      strays.push_back(p.name);
    else if (!known.count(p.name) && p.deleting && Report(p.name) &&
             Report(p.name)->phase != W::kSucceeded)
      leaving.push_back(p.name);
  // A pod moved off that still answers (its Shutdown was lost with a crashed leader) waits in
  // its grace period for one: it is sent again, so that its deletion ends now.
  if (!leaving.empty())
    Do(action::Shutdown{leaving,
                        "moved off: not a member of generation " + std::to_string(st_.generation)});
  if (strays.empty()) return;
  Do(action::Shutdown{strays, "not a member of generation " + std::to_string(st_.generation)});
  Do(action::DeletePods{strays});
}

}  // namespace tidal::reconciler::internal
