// worker/worker_main.cc — `tidal-worker`, the container entrypoint of every worker pod.
//   tidal-worker --spec FILE --token-file FILE [--listen HOST:PORT] [--pod-ip IP]
//                [--checkpoint-uri URI] [--tls-cert FILE --tls-key FILE] [--port-file FILE]
//                [--max-steps K] [--intra-op-threads N] [--collective-timeout-seconds S]
//                [--metrics-listen HOST:PORT] [--drain-seconds S]
// Reads the TrainingJob (mounted), serves the control API (tidal.worker.v1) and /metrics
// (worker/control/metrics.h), and waits for its
// first Rendezvous; then trains generation after generation until the last step (exit 0), a
// Shutdown call or SIGTERM (checkpointed first, exit 0). A SIGTERM during a generation with
// --drain-seconds S > 0 is a notice (a drain, an eviction, `kubectl delete pod`): training goes
// on while the operator moves the job off this pod live, and ends with its Shutdown call; only
// when none comes within S seconds does the worker leave on its own, checkpointing to the store.
// Environment fallbacks: TIDAL_SPEC_FILE, TIDAL_TOKEN_FILE, POD_IP, TIDAL_CHECKPOINT_URI,
// TIDAL_JOB_UID (the job the checkpoint store belongs to),
// TIDAL_S3_SECRET_DIR, TIDAL_INTRA_OP_THREADS, TIDAL_DRAIN_SECONDS; TIDAL_DATASET_STORE (set by
// the operator) replaces spec.dataset.uri with the prepared store; TIDAL_KEEP_ENGINE=0 builds
// the engine anew for every generation instead of keeping it (a baseline for benches);
// TIDAL_READ_AHEAD_MAX_BYTES caps the host memory a read ahead for the next generation holds.
#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "api/training_job.h"
#include "common/environment.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/metrics/endpoint.h"
#include "common/yaml_json.h"
#include "worker/control/metrics.h"
#include "worker/control/peer_store.h"
#include "worker/control/runtime.h"
#include "worker/control/service.h"
#include "worker/data/provider.h"
#include "worker/engine/failpoints.h"
#include "worker/engine/numa.h"

namespace {

using tidal::Status;
using tidal::StatusOr;

constexpr const char* kUsage =
    "usage: tidal-worker --spec FILE --token-file FILE [options]\n"
    "  --spec FILE         the TrainingJob (manifest or its spec), YAML or JSON\n"
    "  --token-file FILE   the job token every control call must carry\n"
    "  --listen HOST:PORT  control API address (default $POD_IP:50051, port 0: any free one)\n"
    "  --pod-ip IP         this worker's address for the process group (default $POD_IP,\n"
    "                      else the host of --listen)\n"
    "  --checkpoint-uri U  where checkpoints go when spec.checkpoint.uri is empty\n"
    "  --tls-cert FILE --tls-key FILE   serve the control API over TLS\n"
    "  --port-file FILE    write the control port there once listening\n"
    "  --metrics-listen HOST:PORT  /metrics address (default: --listen's host, port 9090;\n"
    "                      port 0 when --listen's is 0; \"none\" serves none)\n"
    "  --max-steps K       stop after K optimizer steps (default spec.optimization.maxSteps)\n"
    "  --intra-op-threads N   LibTorch threads (default: every core)\n"
    "  --collective-timeout-seconds S   bound on a join or a collective (default 120)\n"
    "  --base-dir DIR      resolve relative model/dataset paths there (default: the spec's)\n"
    "  --drain-seconds S   after a SIGTERM in a generation, train on up to S seconds for the\n"
    "                      operator's Shutdown (it moves the job off this pod live); 0, the\n"
    "                      default: checkpoint to the store and leave at once\n";

struct Args {
  std::string spec, token_file, listen, pod_ip, checkpoint_uri, tls_cert, tls_key, port_file,
      base_dir, metrics_listen;
  std::optional<int64_t> max_steps;
  int intra_op_threads = 0;
  int collective_timeout_s = 120;
  int drain_seconds = 0;
};

StatusOr<Args> ParseArgs(int argc, char** argv, const std::map<std::string, std::string>& env) {
  Args a;
  auto from_env = [&](const char* name) {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  };
  a.spec = from_env("TIDAL_SPEC_FILE");
  a.token_file = from_env("TIDAL_TOKEN_FILE");
  a.pod_ip = from_env("POD_IP");
  a.checkpoint_uri = from_env("TIDAL_CHECKPOINT_URI");
  if (const std::string threads = from_env("TIDAL_INTRA_OP_THREADS"); !threads.empty()) {
    TIDAL_ASSIGN_OR_RETURN(a.intra_op_threads,
                           tidal::ParseIntFlag<int>("TIDAL_INTRA_OP_THREADS", threads, 1));
  }
  if (const std::string drain = from_env("TIDAL_DRAIN_SECONDS"); !drain.empty()) {
    TIDAL_ASSIGN_OR_RETURN(a.drain_seconds,
                           tidal::ParseIntFlag<int>("TIDAL_DRAIN_SECONDS", drain, 0));
  }
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") return tidal::InvalidArgument("help");
    if (i + 1 >= argc) return tidal::InvalidArgument(flag + ": missing value");
    const std::string value = argv[++i];
    if (flag == "--spec") {
      a.spec = value;
    } else if (flag == "--token-file") {
      a.token_file = value;
    } else if (flag == "--listen") {
      a.listen = value;
    } else if (flag == "--pod-ip") {
      a.pod_ip = value;
    } else if (flag == "--checkpoint-uri") {
      a.checkpoint_uri = value;
    } else if (flag == "--tls-cert") {
      a.tls_cert = value;
    } else if (flag == "--tls-key") {
      a.tls_key = value;
    } else if (flag == "--port-file") {
      a.port_file = value;
    } else if (flag == "--base-dir") {
      a.base_dir = value;
    } else if (flag == "--metrics-listen") {
      a.metrics_listen = value;
    } else if (flag == "--max-steps") {
      TIDAL_ASSIGN_OR_RETURN(a.max_steps, tidal::ParseIntFlag<int64_t>(flag, value, 1));
    } else if (flag == "--intra-op-threads") {
      TIDAL_ASSIGN_OR_RETURN(a.intra_op_threads, tidal::ParseIntFlag<int>(flag, value, 1));
    } else if (flag == "--drain-seconds") {
      TIDAL_ASSIGN_OR_RETURN(a.drain_seconds, tidal::ParseIntFlag<int>(flag, value, 0));
    } else if (flag == "--collective-timeout-seconds") {
      TIDAL_ASSIGN_OR_RETURN(a.collective_timeout_s, tidal::ParseIntFlag<int>(flag, value, 1));
    } else {
      return tidal::InvalidArgument("unknown flag " + flag);
    }
  }
  if (a.spec.empty()) return tidal::InvalidArgument("--spec (or TIDAL_SPEC_FILE) is required");
  if (a.token_file.empty())
    return tidal::InvalidArgument("--token-file (or TIDAL_TOKEN_FILE) is required");
  if (a.tls_cert.empty() != a.tls_key.empty())
    return tidal::InvalidArgument("--tls-cert and --tls-key: expected both or neither");
  if (a.listen.empty()) {
    if (a.pod_ip.empty())
      return tidal::InvalidArgument("--listen: required when POD_IP is not set");
    a.listen = a.pod_ip + ":50051";
  }
  const auto colon = a.listen.rfind(':');
  if (colon == std::string::npos)
    return tidal::InvalidArgument("--listen: expected HOST:PORT, got \"" + a.listen + "\"");
  if (a.pod_ip.empty()) a.pod_ip = a.listen.substr(0, colon);
  if (a.metrics_listen.empty())  // beside the control API; a test's free port gets a free one
    a.metrics_listen =
        a.listen.substr(0, colon + 1) + (a.listen.substr(colon + 1) == "0" ? "0" : "9090");
  return a;
}

// The control clients of this worker's peers (buddy copies read their wards' parts), one per
// address, made on first use. Thread-safe.
class PeerClients {
 public:
  explicit PeerClients(tidal::contract::ClientOptions options) : options_(std::move(options)) {
    options_.timeout = std::chrono::seconds(10);
  }
  StatusOr<std::string> Read(const std::string& address, const std::string& key) {
    tidal::contract::WorkerClient* client;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& slot = clients_[address];
      if (!slot) {
        tidal::contract::ClientOptions o = options_;
        o.address = address;
        slot = std::make_unique<tidal::contract::WorkerClient>(o);
      }
      client = slot.get();
    }
    std::string data;
    TIDAL_RETURN_IF_ERROR(client->ReadState(key, 0, 0, /*to_end=*/true, &data).status());
    return data;
  }

 private:
  tidal::contract::ClientOptions options_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<tidal::contract::WorkerClient>> clients_;
};

StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return tidal::InvalidArgument(std::string(what) + ": cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

StatusOr<tidal::worker::RuntimeOptions> LoadOptions(const Args& a,
                                                    const std::map<std::string, std::string>& env) {
  TIDAL_ASSIGN_OR_RETURN(nlohmann::json doc, tidal::ReadYamlFile(a.spec));
  if (!doc.is_object()) return tidal::InvalidArgument(a.spec + ": expected a mapping");
  std::string name = "local";
  nlohmann::json spec = doc;
  if (auto s = doc.find("spec"); s != doc.end()) {
    spec = *s;
    if (auto md = doc.find("metadata"); md != doc.end() && md->is_object())
      if (auto n = md->find("name"); n != md->end() && n->is_string()) name = *n;
  }
  // spec.replicas is the operator's (the GPU count): one it refuses is no reason for a worker
  // not to start (a replacement would never join).
  std::string refused_replicas;
  auto job = tidal::api::ParseManagedJobSpec(spec, &refused_replicas);
  if (!job.ok()) return job.status().WithContext(a.spec);
  const std::string base =
      a.base_dir.empty() ? std::filesystem::absolute(a.spec).parent_path().string() : a.base_dir;
  auto config = tidal::engine::TrainConfigFromJson(doc, base);
  if (!config.ok()) return config.status().WithContext(a.spec);
  config->name = name;

  tidal::worker::RuntimeOptions o;
  o.config = std::move(*config);
  // The token store the job's data phase prepared (and checked against the model) from
  // spec.dataset.uri: the operator sets it on every worker pod it creates after that phase.
  if (auto store = env.find("TIDAL_DATASET_STORE"); store != env.end() && !store->second.empty()) {
    tidal::LogInfo("training on the prepared token store",
                   {{"spec_dataset_uri", o.config.dataset.uri}, {"store", store->second}});
    o.config.dataset.uri = store->second;
  }
  o.policy.uri = job->checkpoint.uri.empty() ? a.checkpoint_uri : job->checkpoint.uri;
  if (o.policy.uri.empty())
    return tidal::InvalidArgument(
        "spec.checkpoint.uri is empty and no --checkpoint-uri (TIDAL_CHECKPOINT_URI) was given: "
        "an elastic worker needs a checkpoint store");
  // The job's UID (set by the operator on its pods): the store belongs to this job
  // (Repository::Claim). Without it (a worker started by hand) nothing is claimed.
  if (auto uid = env.find("TIDAL_JOB_UID"); uid != env.end() && !uid->second.empty())
    o.policy.owner = {uid->second, o.config.namespace_, name};
  o.policy.start_from_uri = job->checkpoint.resume_from;
  o.policy.full_every = job->checkpoint.full_every_steps;
  if (job->checkpoint.full_every_auto) o.policy.auto_full = job->checkpoint.auto_interval;
  o.policy.snapshot_every = job->checkpoint.snapshot_every_steps;
  o.policy.keep = static_cast<int>(job->checkpoint.keep);
  o.buddy_every = job->checkpoint.buddy_every_steps;
  // The engine kept from one generation to the next (TIDAL_KEEP_ENGINE=0: built anew each
  // time, the baseline of bench/rescale_cost.sh).
  if (auto keep = env.find("TIDAL_KEEP_ENGINE"); keep != env.end()) {
    if (keep->second != "0" && keep->second != "1")
      return tidal::InvalidArgument("TIDAL_KEEP_ENGINE: expected 0 or 1, got \"" + keep->second +
                                    "\"");
    o.keep_engine = keep->second == "1";
  }
  // A cap on the host memory a read ahead for the next generation may hold (PrepareEngine); 0:
  // only one with nothing to read is done. It never holds more than what the pod's memory limit
  // and half of what the host leave anyway.
  if (auto cap = env.find("TIDAL_READ_AHEAD_MAX_BYTES"); cap != env.end()) {
    TIDAL_ASSIGN_OR_RETURN(
        o.session.read_ahead_max_bytes,
        tidal::ParseIntFlag<int64_t>("TIDAL_READ_AHEAD_MAX_BYTES", cap->second, 0));
  }
  const bool any_s3 = o.policy.uri.rfind("s3://", 0) == 0 ||
                      o.policy.start_from_uri.rfind("s3://", 0) == 0 ||
                      o.config.dataset.uri.rfind("s3://", 0) == 0 ||
                      o.config.dataset.prepared_uri.rfind("s3://", 0) == 0 ||
                      o.config.model.uri.rfind("s3://", 0) == 0;
  if (any_s3) {
    auto secret = env.find("TIDAL_S3_SECRET_DIR");
    TIDAL_ASSIGN_OR_RETURN(
        o.s3, tidal::objstore::S3OptionsFromEnv(secret == env.end() ? "" : secret->second, env));
  }
  // The node-local data cache: spec.dataset.loader.cacheDir, else the pod's TIDAL_DATA_CACHE
  // (an emptyDir or hostPath the chart mounts).
  if (auto cache = env.find("TIDAL_DATA_CACHE");
      o.config.dataset.cache_dir.empty() && cache != env.end())
    o.config.dataset.cache_dir = cache->second;
  auto provider = std::make_shared<tidal::data::StoreDataProvider>(o.s3);
  provider->set_progress(tidal::data::LogPrepProgress());
  o.session.data = provider;
  o.session.max_steps = a.max_steps;
  o.session.intra_op_threads = a.intra_op_threads;
  o.interface_host = a.pod_ip;
  o.collective_timeout = std::chrono::seconds(a.collective_timeout_s);
  // The test hooks (worker/engine/failpoints.h): an unknown TIDAL_TEST_ variable is refused.
  TIDAL_ASSIGN_OR_RETURN(const tidal::engine::Failpoints failpoints,
                         tidal::engine::Failpoints::From(env));
  if (const std::string hook = failpoints.Get("TIDAL_TEST_LOSS_HOOK"); !hook.empty()) {
    TIDAL_ASSIGN_OR_RETURN(o.loss_hook, tidal::worker::ParseLossHook(hook));
    if (o.loss_hook.kind != tidal::worker::LossHook::Kind::kNone)
      tidal::LogWarn("test hook: the reported loss is altered (TIDAL_TEST_LOSS_HOOK)",
                     {{"hook", hook}});
  }
  if (const std::string stall = failpoints.Get("TIDAL_TEST_STALL_AT_STEP"); !stall.empty()) {
    TIDAL_ASSIGN_OR_RETURN(o.stall_at_step,
                           tidal::ParseIntFlag<int64_t>("TIDAL_TEST_STALL_AT_STEP", stall, 1));
    tidal::LogWarn("test hook: rank 0 stalls at this step of generation 1",
                   {{"step", o.stall_at_step}});
  }
  if (const std::string hold = failpoints.Get("TIDAL_TEST_BARRIER_HOLD"); !hold.empty()) {
    if (hold != "until-request")
      return tidal::InvalidArgument("TIDAL_TEST_BARRIER_HOLD: expected until-request, got \"" +
                                    hold + "\"");
    o.hold_barriers_until_request = true;
    tidal::LogWarn(
        "test hook: every barrier holds until a request arrives (TIDAL_TEST_BARRIER_HOLD)", {});
  }
  return o;
}

int Fail(const Status& status) {
  std::fprintf(stderr, "tidal-worker: %s\n", status.message().c_str());
  return status.code() == tidal::StatusCode::kInvalidArgument ? 2 : 1;
}

// Ends main's wait: a Shutdown call, SIGTERM/SIGINT, or the last step.
struct ExitSignal {
  std::mutex mu;
  std::condition_variable cv;
  std::string reason;
  bool shutdown_call = false;  // the operator's Shutdown came (perhaps after a SIGTERM)
  void Raise(std::string why) {
    std::lock_guard<std::mutex> lock(mu);
    if (reason.empty()) reason = std::move(why);
    cv.notify_all();
  }
  void RaiseShutdownCall() {
    std::lock_guard<std::mutex> lock(mu);
    shutdown_call = true;
    if (reason.empty()) reason = "Shutdown call";
    cv.notify_all();
  }
};

bool InGeneration(tidal::worker::Phase phase) {
  using tidal::worker::Phase;
  return phase == Phase::kJoining || phase == Phase::kRunning || phase == Phase::kCheckpointing ||
         phase == Phase::kPaused;
}

// TIDAL_NUMA_BIND: "auto" (the default) binds the worker's threads and memory to the NUMA node
// of its GPU (NVML), or on CPU gives it the memory of the node its cpuset lies on, if one holds
// it all; "off" leaves them where the kernel puts them. What cannot be bound is logged, never
// fatal; only a value other than those two stops the worker.
tidal::Status BindNuma(const std::map<std::string, std::string>& env,
                       tidal::worker::GpuMonitor* gpu) {
  auto it = env.find("TIDAL_NUMA_BIND");
  const std::string mode = it == env.end() || it->second.empty() ? "auto" : it->second;
  if (mode == "off") {
    tidal::LogInfo("NUMA binding off", {{"why", "TIDAL_NUMA_BIND=off"}});
    return tidal::OkStatus();
  }
  if (mode != "auto")
    return tidal::InvalidArgument("TIDAL_NUMA_BIND: expected auto or off, got \"" + mode + "\"");
  std::optional<std::vector<int>> gpu_cpus;
  if (gpu) {
    // The pod's GPU: the first the runtime made visible (NVML, unlike CUDA, sees past
    // CUDA_VISIBLE_DEVICES: under `tidal local`, every GPU of the host).
    auto visible = env.find("CUDA_VISIBLE_DEVICES");
    if (visible == env.end()) visible = env.find("NVIDIA_VISIBLE_DEVICES");
    const std::string named = visible == env.end() ? "" : visible->second;
    const std::optional<int> index = gpu->IndexOf(named);
    if (!index) {
      tidal::LogInfo("not bound to a NUMA node", {{"why", "NVML knows no GPU \"" + named + "\""}});
      return tidal::OkStatus();
    }
    gpu_cpus = gpu->IdealCpus(*index);
  }
  std::string why_not;
  const auto binding =
      tidal::numa::Choose(tidal::numa::ReadNodes(), tidal::numa::AllowedCpus(), gpu_cpus, &why_not);
  if (!binding) {
    tidal::LogInfo("not bound to a NUMA node", {{"why", why_not}});
    return tidal::OkStatus();
  }
  if (Status s = tidal::numa::Apply(*binding); !s.ok()) {
    // FailedPrecondition: the CPUs are bound, the memory policy was refused (seccomp).
    tidal::LogWarn(s.code() == tidal::StatusCode::kFailedPrecondition
                       ? "bound to a NUMA node's CPUs, not its memory"
                       : "not bound to a NUMA node",
                   {{"node", binding->node}, {"why", s.message()}});
    return tidal::OkStatus();
  }
  tidal::LogInfo(
      "bound to a NUMA node",
      {{"node", binding->node}, {"cpus", binding->cpus.size()}, {"by", binding->reason}});
  return tidal::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  const auto env = tidal::EnvironmentMap();
  auto args = ParseArgs(argc, argv, env);
  if (!args.ok()) {
    if (args.status().message() != "help")
      std::fprintf(stderr, "tidal-worker: %s\n", args.status().message().c_str());
    std::fputs(kUsage, stderr);
    return args.status().message() == "help" ? 0 : 2;
  }
  auto token = ReadFile(args->token_file, "--token-file");
  if (!token.ok()) return Fail(token.status());
  while (!token->empty() && (token->back() == '\n' || token->back() == '\r')) token->pop_back();
  auto options = LoadOptions(*args, env);
  if (!options.ok()) return Fail(options.status());
  // Which job this process works for, whatever its name: a job deleted and applied again under
  // the same name is another job (its own UID and checkpoint store).
  tidal::LogInfo("worker starting", {{"job", options->config.name},
                                     {"job_uid", options->policy.owner.uid},
                                     {"checkpoint_uri", options->policy.uri},
                                     {"resume_from", options->policy.start_from_uri}});
  tidal::worker::ControlServerOptions server_options;
  server_options.listen = args->listen;
  server_options.token = *token;
  if (!args->tls_cert.empty()) {
    auto cert = ReadFile(args->tls_cert, "--tls-cert");
    if (!cert.ok()) return Fail(cert.status());
    auto key = ReadFile(args->tls_key, "--tls-key");
    if (!key.ok()) return Fail(key.status());
    server_options.tls_cert_pem = *cert;
    server_options.tls_key_pem = *key;
  }

  // Signals go to one thread (blocked everywhere else, before any thread starts).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // NVML, and the NUMA binding before any thread starts: every thread the worker starts
  // (gRPC's, the data loader's, LibTorch's) inherits it.
  std::string no_gpu;
  std::unique_ptr<tidal::worker::GpuMonitor> gpu = tidal::worker::GpuMonitor::Open(&no_gpu);
  if (Status bound = BindNuma(env, gpu.get()); !bound.ok()) return Fail(bound);
  ExitSignal exit_signal;
  std::thread([&signals, &exit_signal] {
    int sig = 0;
    if (sigwait(&signals, &sig) == 0) exit_signal.Raise(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  }).detach();

  const std::string job_name = options->config.name;
  tidal::worker::WorkerMetrics metrics(job_name);
  std::unique_ptr<tidal::metrics::Endpoint> metrics_endpoint;
  if (args->metrics_listen != "none") {
    auto endpoint = tidal::metrics::Endpoint::Start(args->metrics_listen, metrics.registry());
    if (!endpoint.ok()) return Fail(endpoint.status().WithContext("--metrics-listen"));
    metrics_endpoint = std::move(*endpoint);
  }
  options->observer = &metrics;
  if (gpu)
    tidal::LogInfo("GPU counters from NVML", {{"gpus", gpu->devices()}});
  else
    tidal::LogInfo("no GPU counters: utilisation and memory are not reported", {{"why", no_gpu}});
  options->gpu = gpu.get();
  // A live rescale's state is read from the previous generation's workers over their control
  // API, with the job token, and over TLS when this worker serves TLS: verified against the
  // ca.crt of the same Secret, under the name the workers' certificate holds.
  tidal::contract::ClientOptions peer_client;
  peer_client.token = *token;
  peer_client.timeout = std::chrono::seconds(60);
  bool peers_reachable = true;
  if (!args->tls_cert.empty()) {
    const std::string ca_path =
        std::filesystem::path(args->tls_cert).parent_path().string() + "/ca.crt";
    auto ca = ReadFile(ca_path, "the TLS Secret's ca.crt");
    if (ca.ok()) {
      peer_client.tls_ca_pem = *ca;
      peer_client.tls_server_name =
          options->config.name + "-workers." + options->config.namespace_ + ".svc";
    } else {
      peers_reachable = false;
      tidal::LogWarn("no ca.crt beside --tls-cert: rescales resume from the store, not from peers",
                     {{"path", ca_path}});
    }
  }
  if (peers_reachable) {
    options->open_peers = [peer_client](const tidal::worker::LiveState& from)
        -> StatusOr<std::shared_ptr<tidal::objstore::ObjectStore>> {
      return std::shared_ptr<tidal::objstore::ObjectStore>(
          std::make_shared<tidal::worker::PeerStore>(from.peers, peer_client));
    };
    // Buddy copies: one channel per peer, kept; a read is bounded (a ward that is gone must
    // not hold the end of a failed generation for long).
    auto clients = std::make_shared<PeerClients>(peer_client);
    options->read_peer_object = [clients](const std::string& address, const std::string& key) {
      return clients->Read(address, key);
    };
  }
  tidal::worker::WorkerRuntime runtime(std::move(*options));
  server_options.on_shutdown = [&exit_signal] { exit_signal.RaiseShutdownCall(); };
  auto server = tidal::worker::ControlServer::Start(runtime, server_options);
  if (!server.ok()) return Fail(server.status());
  if (!args->port_file.empty()) {
    std::ofstream out(args->port_file + ".tmp");
    out << (*server)->port() << "\n";
    out.close();
    std::filesystem::rename(args->port_file + ".tmp", args->port_file);
  }
  tidal::LogInfo("waiting for the first rendezvous",
                 {{"job", job_name},
                  {"control_port", (*server)->port()},
                  {"metrics_port", metrics_endpoint ? metrics_endpoint->port() : 0}});

  std::string reason;
  {
    std::unique_lock<std::mutex> lock(exit_signal.mu);
    while (exit_signal.reason.empty() && !runtime.exited())
      exit_signal.cv.wait_for(lock, std::chrono::milliseconds(200));
    reason = exit_signal.reason.empty() ? "finished" : exit_signal.reason;
    // A SIGTERM in a generation is the notice of a drain or a deletion: the operator sees the
    // pod terminating and moves the job off it live (its peers read this rank's state from its
    // memory), then calls Shutdown. Leaving now would end the generation for every rank.
    if (reason == "SIGTERM" && args->drain_seconds > 0 && InGeneration(runtime.State().phase)) {
      tidal::LogInfo(
          "SIGTERM: training goes on while the operator moves the job off this pod",
          {{"job", job_name}, {"step", runtime.State().step}, {"wait_s", args->drain_seconds}});
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::seconds(args->drain_seconds);
      // Also over once the generation failed (a peer is gone; the operator replaces this pod
      // rather than move off it) or the job finished: nothing is left to hand over. (Waiting,
      // between two generations it takes part in, is not over.)
      auto over = [&runtime] {
        const tidal::worker::Phase phase = runtime.State().phase;
        return phase == tidal::worker::Phase::kFailed || phase == tidal::worker::Phase::kSucceeded;
      };
      while (!exit_signal.shutdown_call && !runtime.exited() && !over() &&
             std::chrono::steady_clock::now() < deadline)
        exit_signal.cv.wait_for(lock, std::chrono::milliseconds(200));
      if (exit_signal.shutdown_call) {
        reason = "Shutdown call after SIGTERM";
      } else if (!runtime.exited() && !over()) {
        tidal::LogWarn(
            "SIGTERM: no Shutdown from the operator in time; leaving with a checkpoint to the "
            "store",
            {{"job", job_name}, {"waited_s", args->drain_seconds}});
      }
    }
  }
  const bool succeeded = runtime.State().phase == tidal::worker::Phase::kSucceeded;
  runtime.Shutdown(reason);  // checkpoints a running generation first
  // A rank stuck in a collective with a hung peer cannot be interrupted: give it the
  // collective timeout, then leave without it.
  const auto grace =
      std::chrono::steady_clock::now() + std::chrono::seconds(args->collective_timeout_s + 10);
  if (!runtime.WaitExited(grace)) {
    tidal::LogError("training thread did not stop; exiting without it", {{"reason", reason}});
    (*server)->Stop();
    std::fflush(nullptr);
    std::_Exit(1);
  }
  (*server)->Stop();
  server->reset();
  const auto state = runtime.State();
  tidal::LogInfo(
      "exiting",
      {{"reason", reason}, {"phase", tidal::worker::PhaseName(state.phase)}, {"step", state.step}});
  if (succeeded || state.phase == tidal::worker::Phase::kSucceeded) return 0;
  return state.phase == tidal::worker::Phase::kFailed && reason == "finished" ? 1 : 0;
}
