// bench/informer_memory_bench.cc — heap bytes the informer cache holds per cached Pod,
// measured with glibc's allocator statistics (mallinfo2: bytes in use before and after), against
// the size of the Pod's JSON text — the baseline, measured in the same run. The Pods look like
// Tidal's worker pods (labels, owner reference, env, GPU resources, probes, status with
// conditions and container statuses). The store's own estimate (ApproximateBytes) is printed
// beside the measurement. Prints one JSON line. Usage: informer_memory_bench [--pods N]
#include <malloc.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kube/informer.h"
#include "kube/pod_cache.h"

using nlohmann::json;

namespace {

json WorkerPod(int i) {
  std::string name = "llama-7b-lora-w" + std::to_string(i);
  json env = json::array();
  for (const char* k : {"TIDAL_JOB", "TIDAL_RANK", "TIDAL_GENERATION", "TIDAL_CONTROL_PORT",
                        "TIDAL_CHECKPOINT_URI", "AWS_REGION"})
    env.push_back({{"name", k}, {"value", std::string("value-of-") + k}});
  env.push_back(
      {{"name", "TIDAL_TOKEN"},
       {"valueFrom", {{"secretKeyRef", {{"name", "llama-7b-lora-token"}, {"key", "token"}}}}}});
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata",
       {{"name", name},
        {"namespace", "ml-team"},
        {"uid", "0b6f3c1e-8d7a-4f1b-9c2e-" + std::to_string(100000000000 + i)},
        {"resourceVersion", std::to_string(5000 + i)},
        {"creationTimestamp", "2026-11-23T10:00:00Z"},
        {"labels",
         {{"app.kubernetes.io/name", "tidal-worker"},
          {"tidal.dev/job", "llama-7b-lora"},
          {"tidal.dev/generation", "3"},
          {"tidal.dev/rank", std::to_string(i)}}},
        {"annotations", {{"tidal.dev/gang", "llama-7b-lora-g3"}}},
        {"ownerReferences",
         {{{"apiVersion", "tidal.dev/v1alpha1"},
           {"kind", "TrainingJob"},
           {"name", "llama-7b-lora"},
           {"uid", "7d1c4a52-1f0e-4b8e-a3c4-5e6f7a8b9c0d"},
           {"controller", true},
           {"blockOwnerDeletion", true}}}}}},
      {"spec",
       {{"restartPolicy", "Never"},
        {"nodeName", "gpu-node-" + std::to_string(i / 8)},
        {"containers",
         {{{"name", "worker"},
           {"image", "ghcr.io/tidal-dev/tidal-worker:0.1.0"},
           {"args", {"--config", "/etc/tidal/job.json"}},
           {"env", env},
           {"ports",
            {{{"name", "grpc"}, {"containerPort", 50051}},
             {{"name", "metrics"}, {"containerPort", 9090}}}},
           {"resources", {{"limits", {{"nvidia.com/gpu", "1"}, {"memory", "64Gi"}}}}},
           {"readinessProbe", {{"tcpSocket", {{"port", "grpc"}}}, {"periodSeconds", 2}}},
           {"volumeMounts", {{{"name", "job"}, {"mountPath", "/etc/tidal"}}}}}}},
        {"volumes", {{{"name", "job"}, {"configMap", {{"name", "llama-7b-lora-spec"}}}}}}}},
      {"status",
       {{"phase", "Running"},
        {"podIP", "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250)},
        {"hostIP", "192.168.1.10"},
        {"startTime", "2026-11-23T10:00:05Z"},
        {"conditions",
         {{{"type", "Ready"}, {"status", "True"}, {"lastTransitionTime", "2026-11-23T10:01:00Z"}},
          {{"type", "PodScheduled"},
           {"status", "True"},
           {"lastTransitionTime", "2026-11-23T10:00:01Z"}}}},
        {"containerStatuses",
         {{{"name", "worker"},
           {"ready", true},
           {"restartCount", 0},
           {"image", "ghcr.io/tidal-dev/tidal-worker:0.1.0"},
           {"state", {{"running", {{"startedAt", "2026-11-23T10:00:06Z"}}}}}}}}}}};
}

size_t HeapInUse() { return mallinfo2().uordblks; }

}  // namespace

int main(int argc, char** argv) {
  int pods = 10000;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--pods") pods = std::atoi(argv[i + 1]);

  std::vector<json> incoming;
  size_t json_bytes = 0;
  for (int i = 0; i < pods; ++i) {
    incoming.push_back(WorkerPod(i));
    json_bytes += incoming.back().dump().size();
  }
  // The store gets copies, so every byte it holds is allocated between the two readings
  // (single-threaded: mallinfo2 sees the main arena, which is all there is).
  size_t json_per_pod = json_bytes / static_cast<size_t>(pods);
  // Measures one store filled with (transformed) copies.
  auto measure = [&](const std::function<void(json&)>& transform, size_t& estimated) {
    malloc_trim(0);
    size_t before = HeapInUse();
    auto store = std::make_unique<tidal::kube::Store>();
    for (const auto& pod : incoming) {
      json copy = pod;
      if (transform) transform(copy);
      store->Apply({tidal::kube::ObjectEvent::kAdded, std::move(copy)});
    }
    size_t after = HeapInUse();
    estimated = store->ApproximateBytes() / static_cast<size_t>(pods);
    return (after - before) / static_cast<size_t>(pods);
  };
  size_t estimated = 0, estimated_slim = 0;
  size_t per_pod = measure(nullptr, estimated);
  // What the operator keeps (controller.cc): the store holds each pod's identity and owner
  // (KeepIdentity, an informer transform as controller-runtime's cache.TransformFunc), and
  // the pod cache the typed fields the controller reads, filled from the same events.
  tidal::kube::PodCacheOptions kept;
  kept.labels = {"tidal.dev/slot", "tidal.dev/role"};
  kept.annotations = {"tidal.dev/created-for-generation"};
  std::unique_ptr<tidal::kube::PodCache> cache;
  size_t operator_cache = 0;
  {
    malloc_trim(0);
    const size_t before = HeapInUse();
    cache = std::make_unique<tidal::kube::PodCache>(kept);
    auto store = std::make_unique<tidal::kube::Store>();
    for (const auto& pod : incoming) {
      cache->Apply(tidal::kube::ObjectEvent::kAdded, pod);
      json copy = pod;
      tidal::kube::KeepIdentity(copy);
      store->Apply({tidal::kube::ObjectEvent::kAdded, std::move(copy)});
    }
    operator_cache = (HeapInUse() - before) / static_cast<size_t>(pods);
    estimated_slim = store->ApproximateBytes() / static_cast<size_t>(pods);
  }
  const size_t slim = operator_cache;
  json out = {{"bench", "informer_memory"},
              {"pods", pods},
              {"indexes", "namespace,label,owner,controller"},
              {"json_bytes_per_pod", json_per_pod},
              {"measured_bytes_per_pod", per_pod},
              {"estimated_bytes_per_pod", estimated},
              {"ratio_measured_vs_json", static_cast<double>(per_pod) / json_per_pod},
              {"measured_bytes_per_pod_operator_cache", slim},
              {"estimated_store_bytes_per_pod_operator_cache", estimated_slim},
              {"ratio_operator_cache_vs_json", static_cast<double>(slim) / json_per_pod}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
