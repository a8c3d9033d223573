// operator/controller/execute.cc — a plan carried out (TrainingJobController::Execute): its API
// writes in order on the api-writes pool after the pass, the status write first; its worker
// calls on their own threads once the status is written.
#include <future>

#include "common/log.h"
#include "operator/controller/controller_internal.h"
#include "operator/controller/metrics.h"
#include "operator/reconciler/children.h"
#include "operator/reconciler/event_reason.h"

namespace tidal::controller {

using nlohmann::json;
using shell::Key;
using shell::ResourceVersion;
using shell::RetryMeetsAgain;

namespace {

// The actions that write API objects (Execute runs them after the pass, in order); the others
// call workers.
bool IsApiWrite(Action::Kind kind) {
  switch (kind) {
    case Action::Kind::kAddFinalizer:
    case Action::Kind::kRemoveFinalizer:
    case Action::Kind::kEnsureService:
    case Action::Kind::kEnsureTokenSecret:
    case Action::Kind::kEnsureSpecConfig:
    case Action::Kind::kUpdateSpecConfig:
    case Action::Kind::kCreatePods:
    case Action::Kind::kDeletePods:
    case Action::Kind::kForceDeletePods:
    case Action::Kind::kCreatePrepPod:
      return true;
    default:
      return false;
  }
}

}  // namespace

Status TrainingJobController::Execute(const json& job, const Observed& o, const Plan& plan,
                                      WorkerConnections& connections,
                                      std::optional<kube::Request> status_write,
                                      std::shared_ptr<const Landing> landing, bool* wrote) {
  const JobRef ref{o.name, o.namespace_, o.uid};
  const std::string token = TokenOf(o.namespace_, o.name);
  auto client_for = [&](const std::string& pod, const std::string& ip) {
    return ClientFor(connections, pod, ip, token, options_.status_timeout);
  };
  // The plan's API writes, in its order: run after this pass, on api_writes_ (below).
  struct Write {
    Action::Kind kind;
    std::function<Status()> call;
  };
  std::vector<Write> writes;
  auto create = [this, ns = o.namespace_](kube::Resource r, json object) {
    return [this, ns, r, object = std::move(object)]() -> Status {
      TIDAL_ASSIGN_OR_RETURN(auto request, kube::CreateRequest(r, ns, object));
      auto made = client_.Call(request);
      if (made.ok() || made.status().code() == StatusCode::kAlreadyExists) return OkStatus();
      return made.status().WithContext("creating " + r.plural + "/" +
                                       object["metadata"].value("name", std::string()));
    };
  };
  auto call = [this](kube::Request request) {
    return [this, request = std::move(request)] { return client_.Call(request).status(); };
  };
  auto pod_ip = [&](const std::string& name) -> std::string {
    for (const PodView& p : o.pods)
      if (p.name == name) return p.ip;
    return "";
  };
  const std::string job_key = Key(o.namespace_, o.name);
  // A worker call of the plan, started on its own thread (WorkerCalls) once the status is
  // written: once per pod and `what` while it runs; its failure is logged and, with `wake`,
  // its end reconciles the job again.
  std::vector<std::function<void()>> starts;
  auto start = [&](const std::string& pod, const std::string& what, std::function<Status()> call,
                   bool wake) {
    starts.push_back([this, job_key, pod, what, wake, call = std::move(call)] {
      worker_calls_.Start(
          job_key + "/" + pod + "/" + what, call,
          [this, job_key, pod, what, wake](const Status& s) {
            if (!s.ok())
              LogInfo("worker call failed",
                      {{"job", job_key}, {"pod", pod}, {"call", what}, {"error", s.ToString()}});
            if (wake) queue_.Add(job_key);
          });
    });
  };
  // The job's resourceVersion when the plan's writes run: the status write's, once made.
  auto version = std::make_shared<std::string>(ResourceVersion(job));
  // The API writes of an earlier plan, ended (Reconcile decides nothing while they run). One
  // that failed fails this pass if it writes too, as it would have failed the pass that planned
  // it (an Event and Ready=False for an error a retry would meet again; a retry with backoff);
  // a plan that writes nothing any more (the pods came, the job was suspended) leaves it.
  // (A status write that failed for a reason a retry meets again — refused, not a conflict —
  // fails a pass that writes the status again.)
  if (std::shared_ptr<WorkerConnections::Writes> w = connections.writing) {
    std::optional<Status> result;
    bool status_failed = false;
    {
      std::lock_guard<std::mutex> lock(w->mu);
      result = w->result;
      status_failed = w->status_failed;
    }
    connections.writing.reset();
    const bool writes_again =
        (status_failed && status_write && result && RetryMeetsAgain(*result)) ||
        std::any_of(plan.actions.begin(), plan.actions.end(),
                    [](const Action& a) { return IsApiWrite(a.kind); });
    if (result && !result->ok() && writes_again) return *result;
  }
  // The plan's actions, collected: worker calls (`starts`) and API writes. Whatever ends the
  // loop, what was collected before it is done (as it was done before it, in order).
  auto act = [&]() -> Status {
    for (const Action& a : plan.actions) {
      Status done = OkStatus();
      // The pod's worker client; nullptr when the pod has no IP yet, or (recorded in `done`)
      // when its TLS Secret is unusable.
      auto worker_of = [&](const std::string& pod) -> std::shared_ptr<contract::WorkerApi> {
        const std::string ip = pod_ip(pod);
        if (ip.empty()) return nullptr;
        std::shared_ptr<contract::WorkerApi> c = client_for(pod, ip);
        if (!c) done = FailedPrecondition(connections.tls_unusable);
        return c;
      };
      switch (a.kind) {
        case Action::Kind::kAddFinalizer:
        case Action::Kind::kRemoveFinalizer: {
          json finalizers = json::array();
          for (const json& f : job["metadata"].value("finalizers", json::array()))
            if (f != kFinalizer) finalizers.push_back(f);
          if (a.kind == Action::Kind::kAddFinalizer) finalizers.push_back(kFinalizer);
          // Named at the version the status write (before it) leaves.
          writes.push_back(
              {a.kind, [this, version, finalizers, ns = o.namespace_, name = o.name]() -> Status {
                 const json patch = {
                     {"metadata", {{"finalizers", finalizers}, {"resourceVersion", *version}}}};
                 TIDAL_ASSIGN_OR_RETURN(
                     auto request,
                     kube::MergePatchRequest(kube::Resource::TrainingJobs(), ns, name, patch));
                 return client_.Call(request).status();
               }});
          break;
        }
        case Action::Kind::kEnsureService:
          writes.push_back({a.kind, create(kube::Resource::Services(), HeadlessService(ref))});
          break;
        case Action::Kind::kEnsureTokenSecret: {
          // The token this job's workers hold, when it had one: its Secret was deleted under
          // them. Emitted so that `kubectl describe` says why the Secret is back.
          std::string known =
              connections.token_uid == o.uid && !o.uid.empty() ? connections.token : "";
          if (!known.empty()) {
            recorder_.Record(job, EventTypeOf(EventReason::kTokenSecretRecreated),
                             EventReasonName(EventReason::kTokenSecretRecreated),
                             "Secret " + TokenSecretName(o.name) +
                                 " was deleted while the job's workers hold its token: made again "
                                 "with the same token");
          } else {
            TIDAL_ASSIGN_OR_RETURN(known, NewToken());
          }
          writes.push_back({a.kind, create(kube::Resource::Secrets(), TokenSecret(ref, known))});
          break;
        }
        case Action::Kind::kEnsureSpecConfig:
          writes.push_back(
              {a.kind, create(kube::Resource::ConfigMaps(), SpecConfigMap(ref, o.raw_spec))});
          break;
        case Action::Kind::kUpdateSpecConfig: {
          json config = SpecConfigMap(ref, o.raw_spec);
          TIDAL_ASSIGN_OR_RETURN(
              auto request,
              kube::MergePatchRequest(kube::Resource::ConfigMaps(), o.namespace_,
                                      SpecConfigMapName(o.name), {{"data", config["data"]}}));
          writes.push_back({a.kind, [patch = call(std::move(request)),
                                     make = create(kube::Resource::ConfigMaps(), config)] {
                              Status patched = patch();
                              return patched.code() == StatusCode::kNotFound ? make() : patched;
                            }});
          break;
        }
        case Action::Kind::kCreatePods: {
          if (!o.spec.ok()) break;
          WorkerPodOptions w;
          w.generation = a.generation;
          w.group_size = static_cast<int>(a.slots.size());
          if (!options_.default_checkpoint_root.empty())
            w.default_checkpoint_uri = DefaultCheckpointUri(options_.default_checkpoint_root, ref);
          if (plan.status.data && plan.status.data->phase == "Ready")
            w.dataset_store = plan.status.data->store_uri;
          std::vector<json> pods;
          for (int slot : a.slots) {
            w.slot = slot;
            pods.push_back(WorkerPod(ref, *o.spec, w));
          }
          if (pods.empty()) break;
          // All pods of the step at once (one gang). The first alone: a pod the server refuses
          // (quota, admission, a bad field) is refused once, not once per slot. The rest side by
          // side, as the Job controller's slow start does: a 10-pod gang costs two round trips.
          std::vector<std::function<Status()>> each;
          for (json& pod : pods) each.push_back(create(kube::Resource::Pods(), std::move(pod)));
          writes.push_back({a.kind, [each = std::move(each)] {
                              Status made = each[0]();
                              if (!made.ok()) return made;
                              std::vector<std::future<Status>> rest;
                              for (size_t i = 1; i < each.size(); ++i)
                                rest.push_back(std::async(std::launch::async, each[i]));
                              for (auto& f : rest)
                                if (Status s = f.get(); !s.ok()) made = s;
                              return made;
                            }});
          break;
        }
        case Action::Kind::kCreatePrepPod:
          if (!o.spec.ok() || !plan.status.data) break;
          writes.push_back(
              {a.kind, create(kube::Resource::Pods(),
                              PrepPod(ref, *o.spec, a.pods.at(0), plan.status.data->key))});
          break;
        case Action::Kind::kDeletePods:
        case Action::Kind::kForceDeletePods:
          for (const std::string& pod : a.pods) {
            kube::DeleteOptions options;
            if (a.kind == Action::Kind::kForceDeletePods) options.grace_period_seconds = 0;
            TIDAL_ASSIGN_OR_RETURN(auto request, kube::DeleteRequest(kube::Resource::Pods(),
                                                                     o.namespace_, pod, options));
            writes.push_back({a.kind, [delete_pod = call(std::move(request))] {
                                Status deleted = delete_pod();
                                return deleted.code() == StatusCode::kNotFound ? OkStatus()
                                                                               : deleted;
                              }});
            connections.clients.erase(pod);
            connections.answered.erase(pod);
            connections.unreachable_since.erase(pod);
            connections.unreachable_error.erase(pod);
            connections.asking.erase(pod);
          }
          break;
        case Action::Kind::kBarrier:
          // Returns when every rank holds (or one fails): its end wakes the job, whose next pass
          // finds the ranks paused and goes on (the Rendezvous, without waiting for a poll).
          for (const std::string& pod : a.pods)
            if (std::shared_ptr<contract::WorkerApi> c = worker_of(pod))
              start(
                  pod, "barrier " + std::to_string(a.barrier_id),
                  [c,
                   timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
                       options_.reconcile.barrier_timeout),
                   id = a.barrier_id, live = a.live] {
                    return c->Checkpoint(/*pause=*/true, timeout, id, live).status();
                  },
                  /*wake=*/true);
          break;
        case Action::Kind::kRendezvous: {
          if (a.pods.empty()) break;
          const std::string store =
              pod_ip(a.pods[0]) + ":" + std::to_string(StorePort(a.generation));
          // The old ranks' control addresses; one that has none any more makes the new ranks
          // resume from the store (they would fail to read from it anyway).
          std::vector<std::string> peers;
          for (const std::string& pod : a.state_peers) {
            const std::string ip = pod_ip(pod);
            if (ip.empty()) {
              peers.clear();
              break;
            }
            peers.push_back(ip + ":" + std::to_string(kControlPort));
          }
          // The members' control addresses, for buddy copies (none when one has no address yet).
          std::vector<std::string> members;
          for (const std::string& pod : a.pods) {
            const std::string ip = pod_ip(pod);
            if (ip.empty() || a.wards.size() != a.pods.size()) {
              members.clear();
              break;
            }
            members.push_back(ip + ":" + std::to_string(kControlPort));
          }
          for (const std::string& pod : a.targets) {
            const auto rank = std::find(a.pods.begin(), a.pods.end(), pod) - a.pods.begin();
            std::shared_ptr<contract::WorkerApi> c = worker_of(pod);
            if (!c) continue;
            const int ward = members.empty() ? static_cast<int>(rank) : a.wards[rank];
            start(
                pod, "rendezvous " + std::to_string(a.generation),
                [c, generation = a.generation, world = static_cast<int>(a.pods.size()),
                 rank = static_cast<int>(rank), store, peers,
                 step = peers.empty() ? 0 : a.state_step, members, ward, restarts = a.restarts] {
                  Status s = c->Rendezvous(generation, world, rank, store, peers, step, members,
                                           ward, restarts);
                  // Already there (a repeated call after a crash) is success.
                  return s.code() == StatusCode::kAlreadyExists ? OkStatus() : s;
                },
                /*wake=*/true);
          }
          break;
        }
        case Action::Kind::kPrepareEngine:
          // A refusal (TIDAL_KEEP_ENGINE=0, an older worker) only means that worker loads after
          // the Rendezvous: Decide does not wait for it (its failure is logged).
          for (size_t i = 0; i < a.pods.size() && i < a.ranks.size(); ++i)
            if (std::shared_ptr<contract::WorkerApi> c = worker_of(a.pods[i]))
              start(
                  a.pods[i], "prepare " + std::to_string(a.generation),
                  [c, generation = a.generation, world = a.world_size, rank = a.ranks[i]] {
                    return c->PrepareEngine(generation, world, rank);
                  },
                  /*wake=*/false);
          break;
        case Action::Kind::kResume:
          for (const std::string& pod : a.pods)
            if (std::shared_ptr<contract::WorkerApi> c = worker_of(pod))
              start(
                  pod, "resume",
                  [c] {
                    // Not paused (any more) is what this asks for: Decide looks again.
                    Status s = c->Resume();
                    return s.code() == StatusCode::kFailedPrecondition ? OkStatus() : s;
                  },
                  /*wake=*/true);
          break;
        case Action::Kind::kShutdown:
          for (const std::string& pod : a.pods) {
            const std::string ip = pod_ip(pod);
            if (ip.empty() || token.empty()) continue;
            if (std::shared_ptr<contract::WorkerApi> c = client_for(pod, ip))
              start(
                  pod, "shutdown", [c, reason = a.reason] { return c->Shutdown(reason); },
                  /*wake=*/false);  // the pod is deleted anyway
          }
          break;
      }
      if (!done.ok()) {
        LogWarn("action failed",
                {{"job", o.name}, {"action", ActionKindName(a.kind)}, {"error", done.ToString()}});
        return done.WithContext(ActionKindName(a.kind));
      }
    }
    return OkStatus();
  };
  const Status acted = act();
  if (!status_write) {
    // Nothing to write first: the plan lands and its worker calls start now.
    Land(*landing, job);
    for (auto& s : starts) s();
    if (writes.empty()) return acted;
  }
  // In order, the first failure ending them, on api_writes_: a slow API server holds no
  // reconcile (the status write, creating a job's pods and updating its spec's ConfigMap were
  // the slow passes at 200 jobs). Their end wakes the job.
  auto batch = std::make_shared<WorkerConnections::Writes>();
  connections.writing = batch;
  *wrote = true;
  const bool api_writes = !writes.empty(), pass_ok = acted.ok();
  const auto submitted = std::chrono::steady_clock::now();
  api_writes_.Submit([this, batch, job_key, version, api_writes, pass_ok, submitted,
                      landing = std::move(landing), status_write = std::move(status_write),
                      starts = std::move(starts), writes = std::move(writes)]() mutable {
    // Whatever ends them (one that throws: no thread for a side-by-side creation, say) ends
    // them like a failure; the result is always set, or the job's passes would wait forever.
    auto run = [](const std::function<Status()>& step) -> Status {
      try {
        return step();
      } catch (const std::exception& e) {
        return Internal(std::string("threw: ") + e.what());
      } catch (...) {
        return Internal("threw an unknown exception");
      }
    };
    Status result = OkStatus();
    bool status_failed = false;
    if (status_write) {
      result = run([&]() -> Status {
        const std::string before = *version;
        auto written = client_.Call(*status_write);
        if (!written.ok()) {
          status_failed = true;
          return written.status().WithContext("writing status");
        }
        *version = ResourceVersion(*written);
        auto ptr = std::make_shared<const json>(std::move(*written));
        if (*version != before) RememberOwnWrite(job_key, landing->cached_version, ptr);
        Land(*landing, *ptr);
        for (auto& s : starts) s();
        return OkStatus();
      });
      if (!result.ok())
        LogWarn("status write failed", {{"job", job_key}, {"error", result.ToString()}});
    }
    for (const Write& w : writes) {
      if (!result.ok()) break;
      if (Status s = run(w.call); !s.ok()) {
        LogWarn("action failed",
                {{"job", job_key}, {"action", ActionKindName(w.kind)}, {"error", s.ToString()}});
        result = s.WithContext(ActionKindName(w.kind));
      }
    }
    if (OperatorMetrics* m = options_.metrics)
      m->ObservePlanWrites(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count(),
          result.ok());
    bool deferred = false;
    {
      std::lock_guard<std::mutex> lock(batch->mu);
      batch->result = result;
      batch->status_failed = status_failed;
      deferred = batch->deferred;
    }
    // A failure's retry backs off (the pass that reads it returns it, and requeues with backoff
    // again).
    if (!result.ok()) {
      queue_.AddRateLimited(job_key);
      return;
    }
    // A plan whose pass went well and whose writes all landed ends a streak of failures, and
    // the Ready=False that streak left (as Work does after a pass that writes nothing).
    bool was_failing = false;
    if (pass_ok) {
      queue_.Forget(job_key);
      std::lock_guard<std::mutex> lock(connections_mu_);
      if (auto it = connections_.find(job_key); it != connections_.end())
        was_failing = std::exchange(it->second->reconcile_failing, false);
    }
    // What the API writes made wakes the job through its informer's event, once the cache has
    // it (a wake now would beat the pods into the cache and plan them again); a second later is
    // only the look for a write that changed nothing. A status write alone changes nothing the
    // next pass would plan again: a pass it held back (or the one that writes the job's own
    // Ready) runs now.
    if (api_writes)
      queue_.AddAfter(job_key, std::chrono::seconds(1));
    else if (deferred || was_failing)
      queue_.Add(job_key);
  });
  return acted;
}

}  // namespace tidal::controller
