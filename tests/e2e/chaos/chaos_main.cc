// tests/e2e/chaos/chaos_main.cc — tidal-chaos: a seeded fault-injection soak of a real elastic
// job, with its invariants checked from the API, the workers' own step records and the store
// (docs/reliability.md). One program for the e2e test (each kind once) and the 30-minute bench:
//
//   tidal_chaos --seed N --duration SECONDS [--steps N] [--mean-gap SECONDS] [--dir DIR]
//               [--faults kind,kind,...] [--each-once] [--json PATH] [--reference-cache DIR]
//               [--worker EXE]   (pods of tidal-worker run EXE: to show a planted bug caught)
//
// It starts an S3-protocol server (moto) behind a fault proxy, `tidal local --keep-logs` with
// 4 GPUs, two operator replicas with leader election, and one TrainingJob (2-4 workers, ZeRO-3,
// full checkpoints every 5 steps to s3://). From the seed it injects, at exponential intervals,
// faults of these kinds until --duration is over (with --each-once: each kind once, in an order
// drawn from the seed, as the test in `make test` does), then lets the job finish:
//   worker      kill -9 of a worker process
//   operator    kill -9 of an operator replica (the standby takes the lease), restarted 1-3 s on
//   cluster     kill -9 of `tidal local` (its pods' processes die with it), restarted on its data
//   scale       a storm of 3-6 `kubectl scale` to 2, 3 or 4 GPUs
//   window      a schedule window that opens now and closes at the next minute
//   pending     a pod holding 2 GPUs for 10-30 s, so a scale-up stays Pending
//   s3          5-20 s of throttling (503), server errors (500), slow answers, connections
//               reset before the server saw the request, or answers lost (a 500 or a reset)
//               after the server acted
//   corrupt     a flipped byte in the newest checkpoint, then a worker killed to make the job
//               load it
//   token       `kubectl delete secret <job>-token` under the running workers (it must come
//               back with the token they hold: no restart, never a generation beside theirs)
//   badscale    `kubectl scale` to 3 GPUs, a count the batch cannot split at, left standing,
//               then a worker killed: the override is ignored (a condition) and the job is
//               still recovered
//   reapply     `kubectl delete tj` (its final checkpoint), then the job applied again as a
//               user continues one: a new store, `spec.checkpoint.resumeFrom` the old one
// Invariants, each violation printed as it is found:
//   - two generations never train at once (their step records' time spans are disjoint), nor
//     two incarnations of the job (a deleted one and the one applied after it);
//   - every step of the job is in the final record, none lost between generations, and every
//     time a step was trained (recomputed ones too) its loss equals an unperturbed reference
//     run of the same spec to 1e-5;
//   - a generation never trains a step twice;
//   - `latest` never names a checkpoint whose manifest or shards are missing or short;
//   - a re-applied job trains on from its predecessor's final checkpoint (its first step is the
//     one after it: not step 1, nothing skipped), and the store it resumed from is never
//     written again;
//   - a resume that skipped a corrupt checkpoint is a CorruptCheckpoint Event naming it, and
//     no such Event names a checkpoint the driver did not corrupt;
//   - every phase change the API showed is one the lifecycle table allows, the generation never
//     goes back, one Succeeded Event, no RestartsExhausted, and at the end no condition that
//     says the job is unwell;
//   - nothing leaks: no pod after the job is deleted, no process of the run after shutdown, no
//     temporary file in the cluster's directory.
// It ends with a table per fault kind (injected, survived, seconds to training again
// min/median/max) and the totals; exit 0 only with zero violations and a job that succeeded.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/planner/lifecycle.h"
#include "tests/integration/objstore/fault_proxy.h"
#include "tests/integration/objstore/s3_server.h"
#include "tests/integration/process.h"
#include "tests/test_paths.h"
#include "worker/objstore/object_store.h"

namespace tidal::chaos {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using json = nlohmann::json;
using testing::Process;
using testing::RunProcess;
using Clock = std::chrono::steady_clock;

constexpr const char* kJob = "chaos";
constexpr const char* kBucket = "chaos";
const std::vector<std::string> kAllFaults = {"worker", "operator", "cluster", "scale",
                                             "window", "pending",  "s3",      "corrupt",
                                             "token",  "badscale", "reapply"};

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Trimmed(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  return std::string(text);
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------------------------
struct Options {
  uint64_t seed = 1;
  int duration_s = 180;
  int steps = 0;  // 0: sized from the duration and a measured step time (Driver::SizeSteps)
  double mean_gap_s = 10;
  std::string dir;
  std::vector<std::string> faults = kAllFaults;
  bool each_once = false;  // each kind once, in a seeded order, then no more faults
  std::string json_path;
  std::string reference_cache;  // a directory; empty: train the reference every run
  std::string worker;           // another tidal-worker executable (a planted bug's)
};

struct Fault {
  std::string kind, detail;
  double wall = 0;             // when injected (seconds since the epoch)
  int64_t step_before = 0;     // the highest step any generation had recorded by then
  std::optional<double> back;  // seconds until a step beyond step_before was recorded
  std::string uid_after;       // reapply: the new job, whose first step ends the fault
};

struct StepLine {
  double ts = 0;
  std::string uid;  // the incarnation of the job (its UID) the worker ran for
  int64_t generation = 0, step = 0;
  double loss = 0;
};

// The state the status watch saw.
struct Observed {
  std::string uid, phase;
  int64_t generation = 0;
};

// One incarnation of the job: the first, and each applied again after a `reapply`.
struct Incarnation {
  std::string uid, store;  // the store it writes (a key prefix of the bucket)
  std::string resumed_from;
  std::string resume_latest;  // the checkpoint `latest` of resumed_from named when it was applied
  int64_t resume_step = 0;    // its step
};

class Driver {
 public:
  explicit Driver(Options options)
      : o_(std::move(options)), rng_(o_.seed), proxy_rng_(o_.seed ^ 0x9e3779b97f4a7c15ull) {}
  int Run();

 private:
  // Setup and teardown.
  bool Start();
  bool StartCluster();
  void StartOperator(int which);
  bool Shutdown();
  // kubectl against the cluster.
  testing::ProcessResult Kubectl(std::vector<std::string> args,
                                 std::chrono::milliseconds timeout = 60s);
  std::string WriteFile(const std::string& name, const std::string& text);
  std::string JobYaml(bool with_store, int steps, const std::string& store = "ckpt",
                      const std::string& resume_from = "") const;
  std::shared_ptr<objstore::ObjectStore> OpenStore(const std::string& prefix);
  std::shared_ptr<objstore::ObjectStore> Store();
  bool Reapply(std::string& detail);
  std::string JobUid();
  bool SizeSteps();
  std::map<int64_t, double> Reference();
  // Faults.
  void Inject(const std::string& kind);
  std::vector<pid_t> WorkerPids();
  bool KillAWorker(std::string& detail);
  std::optional<http::Response> S3Rule(const http::Request& request);
  std::optional<http::Response> S3AnswerRule(const http::Request& request);
  void RunDue(bool all);
  // Monitors.
  void WatchStatus();
  void WatchStore();
  void Violation(const std::string& what);
  // The record.
  std::vector<StepLine> StepLines();
  void CheckRecord(const std::map<int64_t, double>& reference);
  void CheckEvents();
  void CheckResumes();
  std::vector<std::tuple<std::string, int64_t, int64_t>> CorruptResumes();
  void CheckLeaks();
  void PrintTable();
  template <typename T>
  T Pick(const std::vector<T>& from) {
    return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng_)];
  }
  double Uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng_);
  }

  Options o_;
  std::mt19937_64 rng_;        // the fault schedule (the driver's thread)
  std::mt19937_64 proxy_rng_;  // the proxy's draws (its rules run one request at a time)
  fs::path dir_;
  std::unique_ptr<testing::S3Server> s3_;
  std::unique_ptr<testing::FaultProxy> proxy_;
  std::shared_ptr<objstore::ObjectStore> store_;  // the job's store, past the proxy (under mu_)
  std::unique_ptr<Process> cluster_;
  std::unique_ptr<Process> operators_[2];  // null while killed, until restarted
  std::atomic<bool> stop_{false};
  std::thread status_thread_, store_thread_;

  // The proxy's current fault, set by Inject and read by its rules (under mu_).
  std::mutex mu_;
  std::string s3_mode_;
  double s3_until_ = 0;
  std::vector<std::pair<double, std::function<void()>>> due_;  // undo actions, by wall time
  std::vector<Fault> faults_;
  std::vector<std::string> violations_;
  std::vector<Observed> observed_;
  int64_t max_step_seen_ = 0;  // from status, for faults' step_before
  int s3_injected_ = 0;
  int64_t recomputed_ = 0, generations_ = 0;
  double start_wall_ = WallNow();
  std::atomic<int> latest_reads_{0};  // the store monitor's reads of a `latest`
  json final_status_;
  std::map<std::string, int> event_reasons_;
  std::vector<Incarnation> incarnations_;  // in order of application (under mu_)
  std::set<std::string> corrupted_;        // checkpoint directories the driver corrupted
  std::vector<std::pair<std::string, std::string>> corrupt_events_;  // involved UID, message
};

// ---------------------------------------------------------------------------------------------
// Setup.

testing::ProcessResult Driver::Kubectl(std::vector<std::string> args,
                                       std::chrono::milliseconds timeout) {
  std::vector<std::string> argv = {
      KUBECTL_BIN, "--kubeconfig=" + (dir_ / "cluster" / "kubeconfig").string(),
      "--cache-dir=" + (dir_ / "kube-cache").string(), "--request-timeout=20s"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProcess(argv, timeout);
}

std::string Driver::WriteFile(const std::string& name, const std::string& text) {
  const std::string path = (dir_ / name).string();
  std::ofstream(path) << text;
  return path;
}

// The job: as tests/e2e/local/operator_fixture.h's tiny one, on s3:// through the proxy. Its
// losses do not depend on the world size (the global batch is fixed), so one reference run at 2
// ranks is the truth for every generation.
std::string Driver::JobYaml(bool with_store, int steps, const std::string& store,
                            const std::string& resume_from) const {
  std::ostringstream y;
  y << "apiVersion: tidal.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: " << kJob
    << "}\nspec:\n"
    << "  model: {preset: tiny, seed: 3}\n"
    << "  dataset: {uri: " << TIDAL_SOURCE_DIR
    << "/examples/data/sample.jsonl, format: text, maxSeqLen: 32}\n"
    << "  lora: {rank: 4, alpha: 8, dropout: 0.1, targetModules: [q_proj, v_proj]}\n"
    << "  optimization: {zeroStage: 3, precision: fp32, globalBatchSize: 8, microBatchSize: 2,"
    << " learningRate: 2.0e-3, warmup: {steps: 5, adaptive: true}, maxSteps: " << steps
    << ", seed: 1}\n"
    << "  elastic: {minGPUs: 2, maxGPUs: 4, cooldownSeconds: 0, scaleUpTimeoutSeconds: 30}\n";
  if (with_store) {
    y << "  checkpoint: {uri: \"s3://" << kBucket << "/" << store
      << "\", credentialsSecret: chaos-s3, fullEverySteps: 5, snapshotEverySteps: 0, keep: 3";
    if (!resume_from.empty()) y << ", resumeFrom: \"s3://" << kBucket << "/" << resume_from << "\"";
    y << "}\n"
      << "  restartPolicy: {maxRestarts: 1000, backoffSeconds: 1}\n"
      << "  worker: {env: [{name: TIDAL_INTRA_OP_THREADS, value: \"1\"}]}\n";
  }
  return y.str();
}

bool Driver::StartCluster() {
  const std::string log = (dir_ / "tidal-local.log").string();
  std::vector<std::string> argv = {"/bin/sh",
                                   "-c",
                                   "exec \"$0\" \"$@\" 2>>" + log,
                                   TIDAL_BIN,
                                   "local",
                                   "--data",
                                   (dir_ / "cluster").string(),
                                   "--no-operator",
                                   "--keep-logs",
                                   "--gpus",
                                   "4",
                                   "--crash-backoff-ms",
                                   "500"};
  if (!o_.worker.empty()) argv.insert(argv.end(), {"--image", "tidal-worker=" + o_.worker});
  cluster_ = std::make_unique<Process>(argv);
  return cluster_->WaitForOutput(
      [](const std::string& out) { return out.find("export KUBECONFIG=") != std::string::npos; },
      60s);
}

void Driver::StartOperator(int which) {
  const std::string name = which == 0 ? "operator-a" : "operator-b";
  const std::string log = (dir_ / (name + ".log")).string();
  operators_[which] = std::make_unique<Process>(std::vector<std::string>{
      "/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>" + log, TIDAL_BIN, "operator", "--kubeconfig",
      (dir_ / "cluster" / "kubeconfig").string(), "--install-crd", "--lease-namespace",
      "kube-system", "--metrics-address", "127.0.0.1:0"});
}

// The per-step losses of tidal-train's undisturbed run of the job's spec. With
// --reference-cache, kept there under a key of the spec and the tidal-train binary (its size
// and time), so a soak of several seeds trains the reference once.
// Without --steps, the job is sized so that, undisturbed, it would train for two thirds of the
// duration: faults slow it by more than the other third (seed 1's first 7 faults cost it 20 s of
// 45), so it outlasts them, and they stop at the duration rather than at the job's end. A fixed
// count cannot do that on every machine and operator: 2 steps per second of faults once did,
// until the operator stopped polling workers and the job finished a 3-minute soak in 45 s after
// 7 faults. The step time is measured by a short undisturbed run of the job's spec (its median
// step past the warm-up); the count is rounded up to a multiple of 100 so that a soak of several
// seeds on one machine mostly agrees on it (--reference-cache), of 50 with --each-once.
bool Driver::SizeSteps() {
  constexpr int kProbeSteps = 40;
  const std::string manifest = WriteFile("probe.yaml", JobYaml(false, kProbeSteps));
  auto r = RunProcess({TIDAL_TRAIN_BIN, "--config", manifest, "--nproc", "2"}, 600s);
  std::vector<double> seconds;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("step", int64_t{0}) > 10 &&
        j.contains("seconds") && j["seconds"].is_number())
      seconds.push_back(j["seconds"].get<double>());
  }
  if (r.exit_code != 0 || seconds.empty()) {
    std::cerr << "tidal-chaos: the run that measures a step failed (exit " << r.exit_code << ", "
              << seconds.size() << " step times): " << r.err.substr(0, 2000) << "\n";
    return false;
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  const double step_s = std::max(seconds[seconds.size() / 2], 1e-3);
  // Each kind once (CI's run) is sized as the soak is: the faults end by themselves, before
  // the duration (seed 1's eleven, 3 s apart on average, within 37 s of 60), and what they cost
  // the job (35 s of it not training, from the cluster's restart and the window's closing)
  // keeps it running well past them. Rounded to 50 steps there: it trains its reference
  // itself, so nothing is gained from agreeing with other seeds, and each step is trained twice.
  const int raw = static_cast<int>(std::ceil(o_.duration_s * 2.0 / 3.0 / step_s));
  const int unit = o_.each_once ? 50 : 100;
  o_.steps = std::clamp((raw + unit - 1) / unit * unit, 100, 20000);
  std::cout << "a step takes " << std::to_string(step_s).substr(0, 5)
            << " s undisturbed: the job trains " << o_.steps << " steps" << std::endl;
  return true;
}

std::map<int64_t, double> Driver::Reference() {
  const std::string yaml = JobYaml(false, o_.steps);
  const std::string manifest = WriteFile("reference.yaml", yaml);
  const auto parse = [](const std::string& text) {
    std::map<int64_t, double> losses;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("step") && j.contains("loss"))
        losses[j["step"].get<int64_t>()] = j["loss"].get<double>();
    }
    return losses;
  };
  fs::path cached;
  if (!o_.reference_cache.empty()) {
    std::error_code ec;
    const auto size = fs::file_size(TIDAL_TRAIN_BIN, ec);
    const auto time = fs::last_write_time(TIDAL_TRAIN_BIN, ec).time_since_epoch().count();
    char key[32];
    std::snprintf(key, sizeof key, "%016zx",
                  std::hash<std::string>{}(yaml + std::to_string(size) + std::to_string(time)));
    fs::create_directories(o_.reference_cache, ec);
    cached = fs::path(o_.reference_cache) / ("reference-" + std::string(key) + ".jsonl");
    auto losses = parse(ReadFile(cached));
    if (static_cast<int>(losses.size()) == o_.steps) return losses;
  }
  auto r = RunProcess({TIDAL_TRAIN_BIN, "--config", manifest, "--nproc", "2"}, 1800s);
  auto losses = parse(r.out);
  if (r.exit_code != 0 || static_cast<int>(losses.size()) != o_.steps) {
    std::cerr << "tidal-chaos: the reference run failed (exit " << r.exit_code << ", "
              << losses.size() << " steps): " << r.err.substr(0, 2000) << "\n";
    return {};
  }
  if (!cached.empty()) std::ofstream(cached) << r.out;
  return losses;
}

bool Driver::Start() {
  fs::create_directories(dir_);
  s3_ = testing::S3Server::Start(kBucket);
  if (!s3_) return false;
  proxy_ = testing::FaultProxy::Start(
      s3_->port(), [this](const http::Request& r) { return S3Rule(r); },
      [this](const http::Request& r, const http::Response&) { return S3AnswerRule(r); });
  if (!proxy_) return false;
  store_ = OpenStore("ckpt");
  if (!store_) return false;
  if (!StartCluster()) {
    std::cerr << "tidal-chaos: tidal local did not start; see " << (dir_ / "tidal-local.log")
              << "\n";
    return false;
  }
  StartOperator(0);
  StartOperator(1);
  const auto deadline = Clock::now() + 60s;
  while (Kubectl({"get", "crd", "trainingjobs.tidal.dev"}).exit_code != 0) {
    if (Clock::now() > deadline) {
      std::cerr << "tidal-chaos: the operators installed no CRD\n";
      return false;
    }
    std::this_thread::sleep_for(500ms);
  }
  auto secret =
      Kubectl({"create", "secret", "generic", "chaos-s3",
               "--from-literal=AWS_ACCESS_KEY_ID=" + s3_->access_key(),
               "--from-literal=AWS_SECRET_ACCESS_KEY=" + s3_->secret_key(),
               "--from-literal=AWS_ENDPOINT_URL=" + proxy_->endpoint(),
               "--from-literal=AWS_REGION=us-east-1", "--from-literal=TIDAL_S3_ADDRESSING=path"});
  if (secret.exit_code != 0) {
    std::cerr << "tidal-chaos: " << secret.err << "\n";
    return false;
  }
  return true;
}

std::shared_ptr<objstore::ObjectStore> Driver::OpenStore(const std::string& prefix) {
  objstore::S3Options direct;
  direct.endpoint = s3_->endpoint();
  direct.access_key_id = s3_->access_key();
  direct.secret_access_key = s3_->secret_key();
  direct.path_style = true;
  auto store = objstore::OpenObjectStore(std::string("s3://") + kBucket + "/" + prefix, direct);
  if (!store.ok()) {
    std::cerr << "tidal-chaos: " << store.status().ToString() << "\n";
    return nullptr;
  }
  return std::shared_ptr<objstore::ObjectStore>(std::move(*store));
}

std::shared_ptr<objstore::ObjectStore> Driver::Store() {
  std::lock_guard<std::mutex> lock(mu_);
  return store_;
}

std::string Driver::JobUid() {
  auto r = Kubectl({"get", "tj", kJob, "-o", "jsonpath={.metadata.uid}"});
  return r.exit_code == 0 ? Trimmed(r.out) : std::string();
}

// ---------------------------------------------------------------------------------------------
// Faults.

std::vector<pid_t> Driver::WorkerPids() {
  std::vector<pid_t> pids;
  const std::string marker = (dir_ / "cluster").string();
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::string cmdline = ReadFile(entry.path() / "cmdline");
    // The executable is tidal-worker (--worker's too: `tidal local`, whose command line names
    // that file, is not a worker), and the pod's files under the run's cluster are its
    // arguments.
    const std::string exe = fs::path(cmdline.substr(0, cmdline.find('\0'))).filename();
    const std::string wanted =
        o_.worker.empty() ? "tidal-worker" : fs::path(o_.worker).filename().string();
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (exe == wanted && cmdline.find(marker) != std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

bool Driver::KillAWorker(std::string& detail) {
  const auto pids = WorkerPids();
  if (pids.empty()) return false;
  const pid_t pid = Pick(pids);
  ::kill(pid, SIGKILL);
  detail = "kill -9 worker pid " + std::to_string(pid) + " of " + std::to_string(pids.size());
  return true;
}

std::optional<http::Response> Driver::S3Rule(const http::Request&) {
  std::string mode;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (WallNow() < s3_until_) mode = s3_mode_;
  }
  if (mode.empty() || mode == "lost") return std::nullopt;
  // One draw per request; the proxy calls its rules one request at a time.
  const double u = std::uniform_real_distribution<double>(0, 1)(proxy_rng_);
  if (mode == "throttle" && u < 0.5)
    return testing::FaultProxy::S3Error(503, "SlowDown", "Please reduce your request rate.");
  if (mode == "error" && u < 0.3)
    return testing::FaultProxy::S3Error(500, "InternalError", "We encountered an internal error.");
  if (mode == "reset" && u < 0.3) return testing::FaultProxy::HangUp();
  if (mode == "slow") std::this_thread::sleep_for(std::chrono::milliseconds(200 + int(u * 800)));
  return std::nullopt;
}

std::optional<http::Response> Driver::S3AnswerRule(const http::Request& request) {
  std::string mode;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (WallNow() < s3_until_) mode = s3_mode_;
  }
  // The server did it; the client hears a 500 and must find out (a retried PUT or DELETE is
  // idempotent, a retried multipart completion may find its upload gone).
  if (mode != "lost" || request.method == "GET" || request.method == "HEAD") return std::nullopt;
  const double u = std::uniform_real_distribution<double>(0, 1)(proxy_rng_);
  if (u < 0.15) return testing::FaultProxy::HangUp();
  if (u < 0.3) return testing::FaultProxy::S3Error(500, "InternalError", "the answer was lost");
  return std::nullopt;
}

void Driver::Inject(const std::string& kind) {
  Fault f;
  f.kind = kind;
  f.wall = WallNow();
  {
    std::lock_guard<std::mutex> lock(mu_);
    f.step_before = max_step_seen_;
  }
  if (kind == "worker") {
    if (!KillAWorker(f.detail)) return;  // none running now: not injected
  } else if (kind == "operator") {
    int which = static_cast<int>(rng_() % 2);
    if (!operators_[which]) which = 1 - which;
    if (!operators_[which]) return;  // both are down for now: not injected
    ::kill(operators_[which]->pid(), SIGKILL);
    operators_[which]->Wait(10s);
    operators_[which].reset();
    const double after = Uniform(1, 3);
    f.detail = std::string("kill -9 operator-") + (which == 0 ? "a" : "b") + ", back after " +
               std::to_string(after).substr(0, 3) + " s";
    std::lock_guard<std::mutex> lock(mu_);
    due_.push_back({WallNow() + after, [this, which] { StartOperator(which); }});
  } else if (kind == "cluster") {
    ::kill(cluster_->pid(), SIGKILL);
    cluster_->Wait(10s);
    std::this_thread::sleep_for(std::chrono::milliseconds(500 + rng_() % 1500));
    if (!StartCluster()) Violation("tidal local did not come back on its data directory");
    f.detail = "kill -9 tidal local, restarted";
  } else if (kind == "scale") {
    // 3 GPUs is a count this job cannot run at (8 sequences do not split into whole
    // micro-batches of 2 over 3 ranks): a typo the operator must refuse with a condition. The
    // storm ends on a count it can run at, as a user corrects a typo; a job left at an unusable
    // count waits for its spec to be fixed, and would wait out the run.
    const int n = 3 + static_cast<int>(rng_() % 4);
    for (int i = 0; i < n; ++i) {
      const int gpus =
          i + 1 < n ? 2 + static_cast<int>(rng_() % 3) : 2 + 2 * static_cast<int>(rng_() % 2);
      Kubectl({"scale", "tj", kJob, "--replicas=" + std::to_string(gpus)});
      f.detail += (f.detail.empty() ? "kubectl scale to " : ", ") + std::to_string(gpus);
      std::this_thread::sleep_for(std::chrono::milliseconds(rng_() % 300));
    }
  } else if (kind == "window") {
    // Open from this minute (UTC, the job's zone) to the next: it opens at once and closes
    // within a minute. Manual replicas, if any, would override it: they are cleared.
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    const int m = utc.tm_min, next = (m + 1) % 60, h = utc.tm_hour;
    const int next_h = m == 59 ? (h + 1) % 24 : h;
    json patch = {{"spec",
                   {{"replicas", nullptr},
                    {"elastic",
                     {{"schedule",
                       {{{"name", "chaos"},
                         {"start", std::to_string(m) + " " + std::to_string(h) + " * * *"},
                         {"end", std::to_string(next) + " " + std::to_string(next_h) + " * * *"},
                         {"gpus", 4}}}}}}}}};
    Kubectl({"patch", "tj", kJob, "--type=merge", "-p", patch.dump()});
    f.detail = "window " + patch["spec"]["elastic"]["schedule"][0]["start"].get<std::string>() +
               " to " + patch["spec"]["elastic"]["schedule"][0]["end"].get<std::string>();
  } else if (kind == "pending") {
    const std::string name = "hog-" + std::to_string(faults_.size());
    const std::string pod = WriteFile(
        name + ".yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name +
                            "}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n"
                            "    image: busybox\n    command: [sleep, '600']\n"
                            "    resources: {limits: {nvidia.com/gpu: 2}}\n");
    Kubectl({"apply", "-f", pod});
    const double hold = Uniform(10, 30);
    f.detail = "a pod holds 2 GPUs for " + std::to_string(int(hold)) + " s";
    std::lock_guard<std::mutex> lock(mu_);
    due_.push_back({WallNow() + hold, [this, name] {
                      Kubectl({"delete", "pod", name, "--grace-period=0", "--wait=false"});
                    }});
  } else if (kind == "s3") {
    const std::string mode = Pick<std::string>({"throttle", "error", "slow", "reset", "lost"});
    const double hold = Uniform(5, 20);
    f.detail = mode + " for " + std::to_string(int(hold)) + " s";
    std::lock_guard<std::mutex> lock(mu_);
    s3_mode_ = mode;
    s3_until_ = WallNow() + hold;
    ++s3_injected_;
  } else if (kind == "badscale") {
    Kubectl({"scale", "tj", kJob, "--replicas=3"});
    std::string killed;
    KillAWorker(killed);
    f.detail = "kubectl scale to 3 (refused, left standing); " + killed;
  } else if (kind == "token") {
    Kubectl({"delete", "secret", std::string(kJob) + "-token", "--wait=false"});
    f.detail = "kubectl delete secret " + std::string(kJob) + "-token";
  } else if (kind == "reapply") {
    if (!Reapply(f.detail)) return;
    std::lock_guard<std::mutex> lock(mu_);
    f.uid_after = incarnations_.back().uid;
  } else if (kind == "corrupt") {
    const auto store = Store();
    auto latest = store->Get("latest");
    if (!latest.ok()) return;  // nothing committed yet
    const std::string dir = Trimmed(*latest);
    auto objects = store->List(dir + "/shard-");
    if (!objects.ok() || objects->empty()) return;
    const std::string key = Pick(*objects).key;
    auto bytes = store->Get(key);
    if (!bytes.ok() || bytes->size() < 16) return;
    const size_t at = bytes->size() - 1 - rng_() % 8;  // in the data, past the header
    (*bytes)[at] = static_cast<char>((*bytes)[at] ^ 0x5a);
    if (!store->Put(key, *bytes).ok()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      corrupted_.insert(dir);
    }
    std::string killed;
    KillAWorker(killed);
    f.detail = "flipped byte " + std::to_string(at) + " of " + key + "; " + killed;
  }
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(std::move(f));
  std::cout << "[" << faults_.size() << "] +" << static_cast<int>(faults_.back().wall - start_wall_)
            << " s " << faults_.back().kind << ": " << faults_.back().detail << std::endl;
}

// The job deleted as a user deletes one (the finalizer takes its final checkpoint), then applied
// again as a user continues one: a store of its own, resuming from the deleted job's. Nothing
// waits for the old pods: the new job's must not train beside them (the record shows it).
bool Driver::Reapply(std::string& detail) {
  Incarnation before;
  {
    std::lock_guard<std::mutex> lock(mu_);
    before = incarnations_.back();
  }
  auto deleted = Kubectl({"delete", "tj", kJob, "--wait=true", "--timeout=150s"}, 180s);
  if (deleted.exit_code != 0) {
    Violation("kubectl delete tj " + std::string(kJob) + " did not finish: " + deleted.err);
    return false;
  }
  const auto old_store = Store();
  auto latest = old_store->Get("latest");
  Incarnation next;
  next.store = "ckpt-" + std::to_string(incarnations_.size());
  if (latest.ok() && !Trimmed(*latest).empty()) {
    next.resumed_from = before.store;
    next.resume_latest = Trimmed(*latest);
    auto manifest = old_store->Get(next.resume_latest + "/manifest.json");
    json m = manifest.ok() ? json::parse(*manifest, nullptr, false) : json();
    if (m.is_object()) next.resume_step = m.value("step", int64_t{0});
  } else {
    // Deleted before it committed anything: its store holds no checkpoint (a resumeFrom naming
    // it is refused, rightly), so the user continues from where that job itself started.
    next.resumed_from = before.resumed_from;
    next.resume_latest = before.resume_latest;
    next.resume_step = before.resume_step;
  }
  auto store = OpenStore(next.store);
  const std::string yaml = WriteFile("job-" + next.store + ".yaml",
                                     JobYaml(true, o_.steps, next.store, next.resumed_from));
  if (!store || Kubectl({"apply", "-f", yaml}).exit_code != 0) {
    Violation("the job could not be applied again");
    return false;
  }
  next.uid = JobUid();
  detail = "kubectl delete tj (uid " + before.uid + ", `latest` " + next.resume_latest +
           "), applied again as " + next.uid + " on s3://" + kBucket + "/" + next.store +
           (next.resumed_from.empty()
                ? std::string(", from scratch")
                : " resuming from s3://" + std::string(kBucket) + "/" + next.resumed_from);
  std::lock_guard<std::mutex> lock(mu_);
  incarnations_.push_back(next);
  store_ = std::move(store);
  return true;
}

void Driver::RunDue(bool all) {
  std::vector<std::function<void()>> run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double now = WallNow();
    for (auto it = due_.begin(); it != due_.end();) {
      if (all || it->first <= now) {
        run.push_back(std::move(it->second));
        it = due_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& action : run) action();
}

// ---------------------------------------------------------------------------------------------
// Monitors.

void Driver::Violation(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  violations_.push_back(what);
  std::cout << "VIOLATION: " << what << std::endl;
}

// Every change of the job's status, from a `kubectl get -w` (restarted when the cluster is):
// the phase changes against the lifecycle table, the generation never going back.
void Driver::WatchStatus() {
  const auto allowed = [](const std::string& from, const std::string& to) {
    if (from == to) return true;
    for (planner::Phase a : planner::AllPhases()) {
      if (from != planner::PhaseName(a)) continue;
      for (planner::Event e : planner::AllEvents()) {
        auto next = planner::Transition(a, e);
        if (next.ok() && to == planner::PhaseName(*next)) return true;
      }
    }
    return false;
  };
  while (!stop_) {
    Process watch({KUBECTL_BIN, "--kubeconfig=" + (dir_ / "cluster" / "kubeconfig").string(),
                   "--cache-dir=" + (dir_ / "kube-cache").string(), "get", "tj", kJob, "-w", "-o",
                   "jsonpath={.metadata.uid} {.status.phase} {.status.generation} "
                   "{.status.step}{\"\\n\"}"});
    size_t seen = 0;
    bool continuous = false;  // the first line after a (re)start may skip phases
    while (!stop_) {
      std::string out;
      const bool alive = !watch.WaitForOutput(
          [&](const std::string& s) {
            out = s;
            return stop_ || s.find('\n', seen) != std::string::npos;
          },
          1s);
      size_t nl;
      while ((nl = out.find('\n', seen)) != std::string::npos) {
        std::istringstream line(out.substr(seen, nl - seen));
        seen = nl + 1;
        Observed now;
        int64_t step = 0;
        line >> now.uid >> now.phase >> now.generation >> step;
        if (now.phase.empty()) continue;
        std::lock_guard<std::mutex> lock(mu_);
        max_step_seen_ = std::max(max_step_seen_, step);
        // A job applied again (`reapply`) is a new object: its life starts over.
        if (!observed_.empty() && observed_.back().uid != now.uid) continuous = false;
        if (!observed_.empty() && observed_.back().uid == now.uid) {
          const Observed& before = observed_.back();
          std::vector<std::string> found;
          if (continuous && !allowed(before.phase, now.phase))
            found.push_back("status.phase went " + before.phase + " -> " + now.phase +
                            ", which the lifecycle table does not allow");
          if (now.generation < before.generation)
            found.push_back("status.generation went back from " +
                            std::to_string(before.generation) + " to " +
                            std::to_string(now.generation));
          for (const std::string& v : found) {
            violations_.push_back(v);
            std::cout << "VIOLATION: " << v << std::endl;
          }
        }
        observed_.push_back(now);
        continuous = true;
      }
      // WaitForOutput returns false while the watch lives and nothing new came; a dead watch
      // (the cluster was killed) returns at once: restart it.
      siginfo_t info{};
      if (waitid(P_PID, watch.pid(), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == watch.pid())
        break;
      (void)alive;
    }
    watch.Wait(2s);
    if (!stop_) std::this_thread::sleep_for(500ms);
  }
}

// `latest`, read straight from the server: the checkpoint it names has its manifest and every
// shard the manifest lists, at the size it lists. (A checkpoint pruned between the reads shows
// as `latest` having moved on, and is read again.)
void Driver::WatchStore() {
  while (!stop_) {
    std::this_thread::sleep_for(300ms);
    const auto store = Store();
    auto latest = store->Get("latest");
    if (!latest.ok()) continue;
    const std::string dir = Trimmed(*latest);
    ++latest_reads_;
    std::string problem;
    auto manifest = store->Get(dir + "/manifest.json");
    if (!manifest.ok()) {
      problem = "has no manifest.json (" + manifest.status().message() + ")";
    } else {
      json m = json::parse(*manifest, nullptr, false);
      if (m.is_discarded() || !m.contains("shards")) {
        problem = "has a manifest.json that is not one";
      } else {
        for (const auto& shard : m["shards"]) {
          auto size = store->Size(dir + "/" + shard.value("file", ""));
          if (!size.ok() || *size != shard.value("size", uint64_t{0})) {
            problem = "lists " + shard.value("file", std::string()) + " of " +
                      std::to_string(shard.value("size", uint64_t{0})) + " bytes, " +
                      (size.ok() ? "stored with " + std::to_string(*size) : "not stored");
            break;
          }
        }
      }
    }
    if (problem.empty()) continue;
    auto again = store->Get("latest");
    if (again.ok() && Trimmed(*again) != dir) continue;  // moved on meanwhile
    Violation("latest names " + dir + ", which " + problem);
  }
}

// ---------------------------------------------------------------------------------------------
// The record.

// Rank 0's step lines of every container run of the job's workers: the live logs and the kept
// ones (each file once: a kept log is a hard link).
std::vector<StepLine> Driver::StepLines() {
  std::vector<StepLine> lines;
  std::set<std::pair<dev_t, ino_t>> read;
  for (const char* root : {"logs", "logs-archive"}) {
    const fs::path base = dir_ / "cluster" / root / "default";
    if (!fs::exists(base)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(base)) {
      if (!entry.is_regular_file() || entry.path().extension() != ".log") continue;
      if (entry.path().filename().string().rfind("worker", 0) != 0) continue;
      struct stat st {};
      if (::stat(entry.path().c_str(), &st) != 0 || !read.insert({st.st_dev, st.st_ino}).second)
        continue;
      std::ifstream in(entry.path());
      std::string text, uid;  // one container run is of one job: its first line names it
      while (std::getline(in, text)) {
        json j = json::parse(text, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        if (j.value("msg", "") == "worker starting") uid = j.value("job_uid", "");
        if (j.value("msg", "") != "step" || j.value("job", "") != kJob) continue;
        lines.push_back({j.value("ts", 0.0), uid, j.value("generation", int64_t{0}),
                         j.value("step", int64_t{0}), j.value("loss", 0.0)});
      }
    }
  }
  std::sort(lines.begin(), lines.end(),
            [](const StepLine& a, const StepLine& b) { return a.ts < b.ts; });
  return lines;
}

void Driver::CheckRecord(const std::map<int64_t, double>& reference) {
  const std::vector<StepLine> lines = StepLines();
  std::map<std::string, size_t> incarnation;  // a UID's place in incarnations_
  for (size_t i = 0; i < incarnations_.size(); ++i) incarnation[incarnations_[i].uid] = i;
  // A generation of an incarnation, named for the messages ("generation 3", "job 2 generation
  // 1" once the job was applied again).
  const auto named = [&](const std::pair<size_t, int64_t>& g) {
    return (incarnations_.size() > 1 ? "job " + std::to_string(g.first + 1) + " " : "") +
           "generation " + std::to_string(g.second);
  };
  std::map<std::pair<size_t, int64_t>, std::vector<const StepLine*>> by_generation;
  std::map<int64_t, int> times_trained;
  for (const StepLine& l : lines) {
    auto known = incarnation.find(l.uid);
    if (known == incarnation.end()) {
      Violation("a worker trained step " + std::to_string(l.step) + " for job UID \"" + l.uid +
                "\", which is none the driver applied");
      continue;
    }
    by_generation[{known->second, l.generation}].push_back(&l);
    ++times_trained[l.step];
    auto want = reference.find(l.step);
    if (want == reference.end()) {
      Violation("generation " + std::to_string(l.generation) + " trained step " +
                std::to_string(l.step) + ", which the job does not have");
    } else if (std::abs(l.loss - want->second) > 1e-5 * std::max(1.0, std::abs(want->second))) {
      Violation("step " + std::to_string(l.step) + " of generation " +
                std::to_string(l.generation) + " has loss " + std::to_string(l.loss) +
                ", the reference " + std::to_string(want->second));
    }
  }
  // Within a generation, steps only go forward; between generations, no overlap in time and no
  // gap in steps.
  struct Span {
    std::pair<size_t, int64_t> generation;
    double first_ts, last_ts;
    int64_t first_step, last_step;
  };
  std::vector<Span> spans;
  for (const auto& [generation, ls] : by_generation) {
    for (size_t i = 1; i < ls.size(); ++i)
      if (ls[i]->step <= ls[i - 1]->step)
        Violation(named(generation) + " trained step " + std::to_string(ls[i]->step) +
                  " after step " + std::to_string(ls[i - 1]->step));
    spans.push_back({generation, ls.front()->ts, ls.back()->ts, ls.front()->step, ls.back()->step});
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.first_ts < b.first_ts; });
  for (size_t i = 1; i < spans.size(); ++i) {
    const Span &a = spans[i - 1], &b = spans[i];
    if (b.first_ts <= a.last_ts)
      Violation(named(a.generation) + " and " + named(b.generation) + " trained at once (" +
                std::to_string(a.last_ts - b.first_ts) + " s of overlap)");
    if (b.first_step > a.last_step + 1)
      Violation("steps " + std::to_string(a.last_step + 1) + "-" +
                std::to_string(b.first_step - 1) + " were lost between " + named(a.generation) +
                " and " + named(b.generation));
  }
  // A job applied again trains on from the checkpoint its predecessor's `latest` named: its
  // first step is the next one (not step 1: it did not start over; nothing skipped).
  for (size_t i = 1; i < incarnations_.size(); ++i) {
    const Incarnation& inc = incarnations_[i];
    std::optional<int64_t> first;
    for (const Span& span : spans)
      if (span.generation.first == i)
        first = first ? std::min(*first, span.first_step) : span.first_step;
    const bool corrupt = corrupted_.count(inc.resume_latest) > 0;
    if (first && !inc.resume_latest.empty() &&
        (corrupt ? *first > inc.resume_step + 1 : *first != inc.resume_step + 1))
      Violation("job " + std::to_string(i + 1) + " (applied again, resuming from s3://" + kBucket +
                "/" + inc.resumed_from + " whose `latest` was " + inc.resume_latest +
                ") first trained step " + std::to_string(*first) + ", not step " +
                std::to_string(inc.resume_step + 1));
  }
  for (const auto& [step, loss] : reference)
    if (!times_trained.count(step))
      Violation("step " + std::to_string(step) + " was never trained");
  int64_t recomputed = 0;
  for (const auto& [step, n] : times_trained) recomputed += n - 1;
  std::cout << "record: " << lines.size() << " step records in " << spans.size() << " generations, "
            << recomputed << " steps recomputed" << std::endl;
  recomputed_ = recomputed;
  generations_ = static_cast<int64_t>(spans.size());

  // Time to training again: from each fault to the first record beyond where the job was.
  // (For a re-applied job: to the new job's first step; the old one trains on meanwhile.)
  for (Fault& f : faults_)
    for (const StepLine& l : lines)
      if (l.ts > f.wall && (f.uid_after.empty() ? l.step > f.step_before : l.uid == f.uid_after)) {
        f.back = l.ts - f.wall;
        break;
      }
}

// The job's Events against what happened: it succeeded, once, and never ran out of restarts.
// (Other reasons may be thinned by the spam filter, as client-go's is; the operator exempts
// its once-only ones.)
void Driver::CheckEvents() {
  auto r = Kubectl({"get", "events", "--field-selector", std::string("involvedObject.name=") + kJob,
                    "-o", "json"});
  json events = json::parse(r.out, nullptr, false);
  if (events.is_discarded() || !events.contains("items")) {
    Violation("kubectl get events gave no list: " + r.err);
    return;
  }
  std::string final_uid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_uid = incarnations_.back().uid;
  }
  int succeeded = 0;  // of the job now: a deleted one's Events are not the new one's
  for (const auto& e : events["items"]) {
    const std::string reason = e.value("reason", "");
    event_reasons_[reason] += e.value("count", 1);
    if (reason == "Succeeded" && e["involvedObject"].value("uid", "") == final_uid)
      succeeded += e.value("count", 1);
    if (reason == "CorruptCheckpoint")
      corrupt_events_.push_back({e["involvedObject"].value("uid", ""), e.value("message", "")});
  }
  if (succeeded != 1)
    Violation(std::to_string(succeeded) + " Succeeded events of job " + final_uid + ", expected 1");
  if (event_reasons_["RestartsExhausted"] > 0) Violation("the job ran out of restarts");
}

// Checkpoints read back as they were written: a resume past a corrupt one is reported, nothing
// is reported corrupt that the driver left whole, and a store a re-applied job resumed from is
// not written again.
void Driver::CheckResumes() {
  // No false alarm: every checkpoint a CorruptCheckpoint Event names as skipped is one the
  // driver corrupted.
  const std::regex step_dir("step-[0-9]+");
  for (const auto& [uid, message] : corrupt_events_) {
    const size_t at = message.find("trained again: ");
    const std::string skipped = at == std::string::npos ? message : message.substr(at);
    for (std::sregex_iterator it(skipped.begin(), skipped.end(), step_dir), end; it != end; ++it)
      if (!corrupted_.count(it->str()))
        Violation("a CorruptCheckpoint Event names " + it->str() +
                  ", which the driver did not corrupt: " + message);
  }
  // No silent skip: a generation whose rank 0 resumed past corrupt checkpoints and then trained
  // for 30 s (the operator had time to hear of it, through any failover) has its Event.
  std::map<std::pair<std::string, int64_t>, std::pair<double, double>> trained;  // first, last ts
  for (const StepLine& l : StepLines()) {
    auto [it, fresh] = trained.try_emplace({l.uid, l.generation}, l.ts, l.ts);
    if (!fresh) it->second.second = l.ts;
  }
  for (const auto& [uid, generation, step] : CorruptResumes()) {
    auto t = trained.find({uid, generation});
    if (t == trained.end() || t->second.second - t->second.first < 30) continue;
    const std::string said =
        "generation " + std::to_string(generation) + " resumed from step " + std::to_string(step);
    bool reported = false;
    for (const auto& [event_uid, message] : corrupt_events_)
      reported |= event_uid == uid && message.find(said) != std::string::npos;
    if (!reported)
      Violation("job " + uid + " " + said +
                " past corrupt checkpoints, and no CorruptCheckpoint "
                "Event says so");
  }
  // A store a re-applied job resumed from is read, never written: its `latest` stays.
  for (size_t i = 1; i < incarnations_.size(); ++i) {
    const Incarnation& inc = incarnations_[i];
    if (inc.resumed_from.empty()) continue;
    std::string now;
    if (auto store = OpenStore(inc.resumed_from))
      if (auto latest = store->Get("latest"); latest.ok()) now = Trimmed(*latest);
    if (now != inc.resume_latest)
      Violation("s3://" + std::string(kBucket) + "/" + inc.resumed_from + " was written after " +
                "its job was deleted and another resumed from it: `latest` was " +
                inc.resume_latest + ", is " + now);
  }
}

// Rank 0's reports of a resume that skipped corrupt checkpoints: job UID, generation, the step
// it resumed from.
std::vector<std::tuple<std::string, int64_t, int64_t>> Driver::CorruptResumes() {
  std::vector<std::tuple<std::string, int64_t, int64_t>> found;
  std::set<std::pair<dev_t, ino_t>> read;
  for (const char* root : {"logs", "logs-archive"}) {
    const fs::path base = dir_ / "cluster" / root / "default";
    if (!fs::exists(base)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(base)) {
      if (!entry.is_regular_file() || entry.path().extension() != ".log") continue;
      struct stat st {};
      if (::stat(entry.path().c_str(), &st) != 0 || !read.insert({st.st_dev, st.st_ino}).second)
        continue;
      std::ifstream in(entry.path());
      std::string text, uid;
      while (std::getline(in, text)) {
        json j = json::parse(text, nullptr, false);
        if (j.is_discarded() || !j.is_object()) continue;
        if (j.value("msg", "") == "worker starting") uid = j.value("job_uid", "");
        if (j.value("msg", "") == "resumed from an older checkpoint: newer ones are corrupt" &&
            j.value("rank", -1) == 0)
          found.emplace_back(uid, j.value("generation", int64_t{0}), j.value("step", int64_t{0}));
      }
    }
  }
  return found;
}

// Nothing of the run may outlive it: pods once the job is deleted, processes once the cluster
// and the operators are stopped, temporary files in the cluster's directory.
void Driver::CheckLeaks() {
  const auto pods = [&] {
    return Kubectl({"get", "pods", "-l", std::string("tidal.dev/job=") + kJob, "-o", "name"}).out;
  };
  Kubectl({"delete", "tj", kJob, "--wait=true", "--timeout=120s"}, 150s);
  const auto deadline = Clock::now() + 60s;
  std::string left;
  while (!(left = pods()).empty() && Clock::now() < deadline) std::this_thread::sleep_for(500ms);
  if (!left.empty()) Violation("pods left after the job was deleted: " + left);
}

bool Driver::Shutdown() {
  stop_ = true;
  if (status_thread_.joinable()) status_thread_.join();
  if (store_thread_.joinable()) store_thread_.join();
  RunDue(/*all=*/true);
  for (auto& op : operators_)
    if (op) {
      ::kill(op->pid(), SIGTERM);
      op->Wait(30s);
      op.reset();
    }
  if (cluster_) {
    ::kill(cluster_->pid(), SIGTERM);
    cluster_->Wait(60s);
    cluster_.reset();
  }
  // Everything the cluster ran had the cluster's directory on its command line.
  const std::string marker = (dir_ / "cluster").string();
  std::this_thread::sleep_for(1s);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::string cmdline = ReadFile(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(marker) != std::string::npos && std::stoi(name) != ::getpid())
      Violation("process " + name + " outlived the run: " + cmdline.substr(0, 200));
  }
  for (const auto& entry : fs::recursive_directory_iterator(dir_ / "cluster")) {
    const std::string file = entry.path().filename();
    if (entry.is_regular_file() &&
        (file.find(".tmp") != std::string::npos || file.rfind(".tidal-tmp", 0) == 0))
      Violation("temporary file left behind: " + entry.path().string());
  }
  return true;
}

void Driver::PrintTable() {
  struct Row {
    int injected = 0, survived = 0;
    std::vector<double> back;
  };
  std::map<std::string, Row> rows;
  for (const Fault& f : faults_) {
    Row& r = rows[f.kind];
    ++r.injected;
    if (f.back) {
      ++r.survived;
      r.back.push_back(*f.back);
    }
  }
  const auto fmt = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f", v);
    return std::string(b);
  };
  std::printf("\n%-10s %9s %9s   %s\n", "fault", "injected", "survived",
              "seconds to training again (min / median / max)");
  for (auto& [kind, r] : rows) {
    std::sort(r.back.begin(), r.back.end());
    std::string back = r.back.empty()
                           ? "-"
                           : fmt(r.back.front()) + " / " + fmt(r.back[r.back.size() / 2]) + " / " +
                                 fmt(r.back.back());
    std::printf("%-10s %9d %9d   %s\n", kind.c_str(), r.injected, r.survived, back.c_str());
  }
  std::printf(
      "\nseed %llu, %d steps, %lld generations, %lld steps recomputed, %zu faults, "
      "%zu invariant violations; final phase %s at step %lld\n",
      static_cast<unsigned long long>(o_.seed), o_.steps, static_cast<long long>(generations_),
      static_cast<long long>(recomputed_), faults_.size(), violations_.size(),
      final_status_.value("phase", std::string("?")).c_str(),
      static_cast<long long>(final_status_.value("step", int64_t{-1})));
  std::string reasons;
  for (const auto& [reason, n] : event_reasons_) reasons += " " + reason + "=" + std::to_string(n);
  std::printf("events:%s\n", reasons.c_str());
  if (!o_.json_path.empty()) {
    json report = {
        {"seed", o_.seed},           {"steps", o_.steps},         {"generations", generations_},
        {"recomputed", recomputed_}, {"violations", violations_}, {"events", event_reasons_},
        {"faults", json::array()}};
    for (const Fault& f : faults_)
      report["faults"].push_back({{"kind", f.kind},
                                  {"detail", f.detail},
                                  {"seconds_to_training", f.back ? json(*f.back) : json(nullptr)}});
    std::ofstream(o_.json_path) << report.dump(2) << "\n";
  }
}

int Driver::Run() {
  dir_ = o_.dir.empty() ? fs::temp_directory_path() / ("tidal-chaos-" + std::to_string(::getpid()))
                        : fs::path(o_.dir);
  std::cout << "tidal-chaos: seed " << o_.seed << ", " << o_.duration_s << " s of faults ("
            << o_.mean_gap_s << " s apart on average), in " << dir_ << std::endl;
  if (!Start()) return 2;
  if (o_.steps == 0 && !SizeSteps()) return 2;
  const auto reference = Reference();
  if (reference.empty()) return 2;
  std::cout << "reference: " << reference.size() << " steps trained undisturbed" << std::endl;
  std::cout << "job: " << o_.steps << " steps" << std::endl;
  const std::string manifest = WriteFile("job.yaml", JobYaml(true, o_.steps));
  if (Kubectl({"apply", "-f", manifest}).exit_code != 0) {
    std::cerr << "tidal-chaos: kubectl apply failed\n";
    return 2;
  }
  {
    Incarnation first;
    first.uid = JobUid();
    first.store = "ckpt";
    std::lock_guard<std::mutex> lock(mu_);
    incarnations_.push_back(first);
  }
  status_thread_ = std::thread([this] { WatchStatus(); });
  store_thread_ = std::thread([this] { WatchStore(); });

  // Faults until the duration is over or the job is done.
  start_wall_ = WallNow();
  const auto fault_end = Clock::now() + std::chrono::seconds(o_.duration_s);
  std::exponential_distribution<double> gap(1.0 / o_.mean_gap_s);
  auto next = Clock::now() + std::chrono::milliseconds(static_cast<int>(gap(rng_) * 1000));
  std::vector<std::string> order = o_.faults;  // --each-once: what is left to inject
  std::shuffle(order.begin(), order.end(), rng_);
  const auto phase = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return observed_.empty() ? std::string() : observed_.back().phase;
  };
  const auto near_end = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return max_step_seen_ >= o_.steps - 5;  // a fault after the last step tests nothing
  };
  while (Clock::now() < fault_end && phase() != "Succeeded" && phase() != "Failed" && !near_end() &&
         !(o_.each_once && order.empty())) {
    RunDue(false);
    if (Clock::now() >= next) {
      if (o_.each_once) {
        const size_t before = faults_.size();
        Inject(order.back());
        if (faults_.size() > before) order.pop_back();  // not injectable now: tried again next
      } else {
        Inject(Pick(o_.faults));
      }
      next = Clock::now() + std::chrono::milliseconds(static_cast<int>(gap(rng_) * 1000));
    }
    std::this_thread::sleep_for(100ms);
  }
  RunDue(/*all=*/true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    s3_until_ = 0;
  }
  std::cout << "faults over; waiting for the job to finish" << std::endl;
  const auto finish_deadline = Clock::now() + std::chrono::seconds(300 + o_.steps);
  while (phase() != "Succeeded" && phase() != "Failed" && Clock::now() < finish_deadline)
    std::this_thread::sleep_for(500ms);
  final_status_ =
      json::parse(Kubectl({"get", "tj", kJob, "-o", "jsonpath={.status}"}).out, nullptr, false);
  if (final_status_.is_discarded()) final_status_ = json::object();
  if (final_status_.value("phase", "") != "Succeeded" ||
      final_status_.value("step", int64_t{0}) != o_.steps)
    Violation("the job did not succeed at step " + std::to_string(o_.steps) + ": status " +
              final_status_.dump());
  // A job that succeeded is not left marked unwell.
  if (final_status_.contains("conditions") && final_status_["conditions"].is_array())
    for (const json& c : final_status_["conditions"]) {
      const std::string type = c.value("type", ""), reason = c.value("reason", "");
      if (reason == "InvalidSpec" || reason == "ReconcileError" ||
          (type == "LossAnomaly" && c.value("status", "") == "True"))
        Violation("the finished job still has condition " + c.dump());
    }
  if (latest_reads_ == 0)
    Violation("the store monitor never found a `latest` under s3://" + std::string(kBucket) +
              "/ckpt: it checked nothing");
  CheckEvents();
  CheckLeaks();
  Shutdown();
  CheckRecord(reference);
  CheckResumes();
  PrintTable();
  if (violations_.empty() && o_.dir.empty()) fs::remove_all(dir_);
  if (!violations_.empty()) std::cout << "the run is kept in " << dir_ << std::endl;
  return violations_.empty() ? 0 : 1;
}

int Usage(const std::string& why) {
  std::cerr << "tidal_chaos: " << why
            << "\nusage: tidal_chaos [--seed N] [--duration SECONDS] [--steps N]\n"
               "                   [--mean-gap SECONDS] [--dir DIR] [--faults k,k,...]\n"
               "                   [--each-once true|false]\n"
               "                   [--json PATH] [--reference-cache DIR] [--worker EXE]\n"
               "  fault kinds: worker operator cluster scale window pending s3 corrupt token\n"
               "               badscale reapply\n";
  return 2;
}

}  // namespace
}  // namespace tidal::chaos

int main(int argc, char** argv) {
  using namespace tidal::chaos;
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Usage("missing value for " + flag);
    const std::string value = argv[++i];
    try {
      if (flag == "--seed") {
        o.seed = std::stoull(value);
      } else if (flag == "--duration") {
        o.duration_s = std::stoi(value);
      } else if (flag == "--steps") {
        o.steps = std::stoi(value);
      } else if (flag == "--mean-gap") {
        o.mean_gap_s = std::stod(value);
      } else if (flag == "--dir") {
        o.dir = value;
      } else if (flag == "--json") {
        o.json_path = value;
      } else if (flag == "--reference-cache") {
        o.reference_cache = value;
      } else if (flag == "--worker") {
        o.worker = value;
      } else if (flag == "--each-once") {
        o.each_once = value == "1" || value == "true";
        if (!o.each_once && value != "0" && value != "false")
          return Usage("--each-once: expected true or false");
      } else if (flag == "--faults") {
        o.faults.clear();
        std::stringstream ss(value);
        std::string kind;
        while (std::getline(ss, kind, ','))
          if (std::find(kAllFaults.begin(), kAllFaults.end(), kind) == kAllFaults.end())
            return Usage("--faults: unknown kind \"" + kind + "\"");
          else
            o.faults.push_back(kind);
        if (o.faults.empty()) return Usage("--faults: expected at least one kind");
      } else {
        return Usage("unknown flag " + flag);
      }
    } catch (const std::exception&) {
      return Usage(flag + ": \"" + value + "\" is not a number");
    }
  }
  if (o.duration_s < 1) return Usage("--duration: expected at least 1 second");
  if (o.mean_gap_s <= 0) return Usage("--mean-gap: expected a positive number of seconds");
  if (o.steps != 0 && o.steps < 10) return Usage("--steps: expected at least 10");
  return Driver(std::move(o)).Run();
}
