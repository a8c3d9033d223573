// The process kubelet of `tidal local`, seen through the real kubectl: pods run as local
// processes with their own loopback address, logs, exit codes, restart policy, GPU-aware
// scheduling, graceful deletion, and no process outliving `tidal local`.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include "tests/e2e/local/kubectl_fixture.h"
#include "tests/test_paths.h"

namespace tidal::testing {
namespace {

class KubeletTest : public KubectlTest {
 protected:
  std::vector<std::string> ExtraClusterArgs() override {
    return {"--gpus", "4", "--crash-backoff-ms", "200"};
  }
  // A pod manifest running `script` under sh in busybox, with the test directory mounted at
  // /work (hostPath) so tests can see what the process wrote.
  std::string Pod(const std::string& name, const std::string& script,
                  const std::string& extra_spec = "", const std::string& container_extra = "") {
    std::string yaml = "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name + "}\nspec:\n" +
                       extra_spec +
                       "  volumes: [{name: work, hostPath: {path: " + (dir_ / "work").string() +
                       "}}]\n  containers:\n  - name: main\n    image: busybox:1.36\n"
                       "    volumeMounts: [{name: work, mountPath: /work}]\n" +
                       container_extra + "    command: [sh, -c, '" + script + "']\n";
    fs::create_directories(dir_ / "work");
    return WriteFile(name + ".yaml", yaml);
  }
  std::string ReadWork(const std::string& file) {
    std::ifstream in(dir_ / "work" / file);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static bool Alive(pid_t pid) { return ::kill(pid, 0) == 0; }
  bool WaitGone(pid_t pid, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (Alive(pid) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(50ms);
    return !Alive(pid);
  }
};

TEST_F(KubeletTest, LogsShowWhatAProcessPodPrintedAndFollowStreamsUntilItEnds) {
  // (Imperative `kubectl create configmap` sends protobuf, which tidal local does not decode.)
  Ok({"apply", "-f",
      WriteFile("greeting.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: greeting}\n"
                "data: {text: hello from a configmap}\n")});
  std::string yaml =
      "apiVersion: v1\nkind: Pod\nmetadata: {name: talker}\nspec:\n  restartPolicy: Never\n"
      "  volumes: [{name: cfg, configMap: {name: greeting}}]\n"
      "  containers:\n  - name: main\n    image: busybox\n"
      "    volumeMounts: [{name: cfg, mountPath: /etc/greeting}]\n"
      "    env: [{name: ME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]\n"
      "    command: [sh, -c, 'for i in 1 2 3; do echo line $i from $ME; sleep 0.3; done; "
      "cat /etc/greeting/text; echo']\n";
  Ok({"apply", "-f", WriteFile("talker.yaml", yaml)});
  // Follow from the start: everything the process prints, ending when the pod does.
  WaitFor({"pod", "talker"}, "{.status.phase}",
          [](const std::string& s) { return s == "Running"; });
  ProcessResult followed = Kubectl({"logs", "-f", "talker"});
  EXPECT_EQ(followed.exit_code, 0) << followed.err;
  std::string expected =
      "line 1 from talker\nline 2 from talker\nline 3 from talker\nhello from a configmap\n";
  EXPECT_EQ(followed.out, expected);
  EXPECT_EQ(WaitFor({"pod", "talker"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Succeeded"; }),
            "Succeeded");
  EXPECT_EQ(Ok({"logs", "talker"}), expected);
  EXPECT_EQ(Ok({"logs", "talker", "--tail=1"}), "hello from a configmap\n");
  EXPECT_TRUE(
      std::regex_search(Ok({"get", "pod", "talker"}), std::regex("talker +0/1 +Completed +0")));
}

TEST_F(KubeletTest, PodsGetTheirOwnLoopbackAddressAndBecomeReadyWhenTheirProbePasses) {
  // python3's http.server bound to the pod's own address; ready once it answers the probe.
  for (const char* name : {"web-a", "web-b"}) {
    std::string yaml = std::string("apiVersion: v1\nkind: Pod\nmetadata: {name: ") + name +
                       "}\nspec:\n  containers:\n  - name: http\n    image: debian\n"
                       "    env: [{name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]\n"
                       "    command: [python3, -m, http.server, '8080', --bind, $(IP)]\n"
                       "    ports: [{name: http, containerPort: 8080}]\n"
                       "    readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}\n";
    Ok({"apply", "-f", WriteFile(std::string(name) + ".yaml", yaml)});
  }
  for (const char* name : {"web-a", "web-b"})
    EXPECT_EQ(WaitFor({"pod", name}, "{.status.conditions[?(@.type==\"Ready\")].status}",
                      [](const std::string& s) { return s == "True"; }),
              "True")
        << name;
  std::string ip_a = Ok({"get", "pod", "web-a", "-o", "jsonpath={.status.podIP}"});
  std::string ip_b = Ok({"get", "pod", "web-b", "-o", "jsonpath={.status.podIP}"});
  EXPECT_TRUE(std::regex_match(ip_a, std::regex(R"(127\.\d+\.\d+\.\d+)"))) << ip_a;
  EXPECT_NE(ip_a, ip_b);
  EXPECT_NE(ip_a, "127.0.0.1");
  EXPECT_TRUE(std::regex_search(Ok({"get", "pods"}), std::regex("web-a +1/1 +Running")));
}

// Two clusters on one machine (two benches, or ctest -j running two e2e tests): each hands out
// pod addresses from a block of the loopback network of its own, so a job of one never reaches
// the other's workers (it once did: "wrong job token" while a bench ran beside the tests).
TEST_F(KubeletTest, TwoClustersOnOneMachineHandOutDisjointPodAddresses) {
  std::string command = "exec \"$0\" \"$@\" 2>>" + (dir_ / "second.log").string();
  Process second({"/bin/sh", "-c", command, TIDAL_BIN, "local", "--data",
                  (dir_ / "second").string(), "--no-operator"});
  ASSERT_TRUE(second.WaitForOutput(
      [](const std::string& out) { return out.find("export KUBECONFIG=") != std::string::npos; },
      30s));
  const std::string yaml =
      WriteFile("sleeper.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: sleeper}\nspec:\n  containers:\n"
                "  - {name: main, image: busybox, command: [sleep, '600']}\n");
  auto kubectl = [&](const std::string& data, std::vector<std::string> args) {
    std::vector<std::string> argv = {KUBECTL_BIN,
                                     "--kubeconfig=" + (dir_ / data / "kubeconfig").string(),
                                     "--cache-dir=" + (dir_ / (data + "-cache")).string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv, 60s);
  };
  std::map<std::string, std::string> ips;
  for (const std::string data : {"data", "second"}) {
    ASSERT_EQ(kubectl(data, {"apply", "-f", yaml}).exit_code, 0);
    ASSERT_TRUE(WaitUntilTrue(
        [&] {
          ips[data] =
              kubectl(data, {"get", "pod", "sleeper", "-o", "jsonpath={.status.podIP}"}).out;
          return !ips[data].empty();
        },
        30s))
        << data;
  }
  // 127.B.x.y: the blocks B differ, and neither is block 0 (127.0.0.1, where servers listen).
  const std::regex address(R"(127\.(\d+)\.\d+\.\d+)");
  std::smatch a, b;
  ASSERT_TRUE(std::regex_match(ips["data"], a, address)) << ips["data"];
  ASSERT_TRUE(std::regex_match(ips["second"], b, address)) << ips["second"];
  EXPECT_NE(a[1].str(), b[1].str()) << ips["data"] << " and " << ips["second"];
  EXPECT_NE(a[1].str(), "0");
  EXPECT_NE(b[1].str(), "0");
}

TEST_F(KubeletTest, PodsWhoseGpusDoNotFitStayPendingUnschedulableAndOthersGetDistinctGpus) {
  auto gpu_pod = [&](const std::string& name, int gpus) {
    std::string yaml = "apiVersion: v1\nkind: Pod\nmetadata: {name: " + name +
                       "}\nspec:\n  containers:\n  - name: main\n    image: busybox\n"
                       "    resources: {limits: {nvidia.com/gpu: " +
                       std::to_string(gpus) +
                       "}}\n    command: [sh, -c, 'echo gpus=$CUDA_VISIBLE_DEVICES; sleep 300']\n";
    Ok({"apply", "-f", WriteFile(name + ".yaml", yaml)});
  };
  gpu_pod("too-big", 8);  // the node has 4
  gpu_pod("three", 3);
  gpu_pod("two", 2);  // 1 left after "three"
  EXPECT_EQ(WaitFor({"pod", "three"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Running"; }),
            "Running");
  EXPECT_EQ(WaitFor({"pod", "too-big"}, "{.status.conditions[?(@.type==\"PodScheduled\")].reason}",
                    [](const std::string& s) { return s == "Unschedulable"; }),
            "Unschedulable");
  EXPECT_EQ(Ok({"get", "pod", "two", "-o",
                "jsonpath={.status.phase} {.status.conditions[?(@.type==\"PodScheduled\")]"
                ".status}"}),
            "Pending False");
  EXPECT_NE(Ok({"describe", "pod", "too-big"})
                .find("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."),
            std::string::npos);
  EXPECT_EQ(WaitFor({"pod", "three"}, "{.metadata.name}",
                    [&](const std::string&) {
                      return Ok({"logs", "three"}) == "gpus=0,1,2\n";
                    }),
            "three");
  // Freeing the GPUs lets the waiting pod in, on the freed ids.
  Ok({"delete", "pod", "three", "--grace-period=0", "--force"});
  EXPECT_EQ(WaitFor({"pod", "two"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Running"; }),
            "Running");
  EXPECT_EQ(
      Ok({"get", "pod", "two", "-o", "jsonpath={.metadata.annotations.tidal\\.dev/local-gpu-ids}"}),
      "0,1");
}

// `kubectl cordon` and `kubectl taint` as the scheduler honours them: a cordoned node takes no
// new pod (Pending, "node(s) were unschedulable") until `kubectl uncordon`; a NoSchedule taint
// only pods that tolerate it, and says which taint the others did not.
TEST_F(KubeletTest, ACordonedOrTaintedNodeTakesOnlyPodsThatTolerateItAndSaysWhy) {
  const std::string node = Ok({"get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"});
  Ok({"cordon", node});
  EXPECT_EQ(Ok({"get", "node", node, "-o", "jsonpath={.spec.unschedulable}"}), "true");
  Ok({"apply", "-f", Pod("waits", "sleep 300")});
  EXPECT_EQ(WaitFor({"pod", "waits"}, "{.status.conditions[?(@.type==\"PodScheduled\")].message}",
                    [](const std::string& s) { return !s.empty(); }),
            "0/1 nodes are available: 1 node(s) were unschedulable.");
  Ok({"uncordon", node});
  EXPECT_EQ(WaitFor({"pod", "waits"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Running"; }),
            "Running");

  Ok({"taint", "nodes", node, "spot=true:NoSchedule"});
  Ok({"apply", "-f", Pod("refused", "sleep 300")});
  EXPECT_EQ(WaitFor({"pod", "refused"}, "{.status.conditions[?(@.type==\"PodScheduled\")].message}",
                    [](const std::string& s) { return !s.empty(); }),
            "0/1 nodes are available: 1 node(s) had untolerated taint {spot: true}.");
  Ok({"apply", "-f",
      Pod("tolerates", "sleep 300",
          "  tolerations: [{key: spot, operator: Equal, value: \"true\", "
          "effect: NoSchedule}]\n")});
  EXPECT_EQ(WaitFor({"pod", "tolerates"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Running"; }),
            "Running");
  EXPECT_EQ(Ok({"get", "pod", "refused", "-o", "jsonpath={.status.phase}"}), "Pending");
  Ok({"taint", "nodes", node, "spot=true:NoSchedule-"});
  EXPECT_EQ(WaitFor({"pod", "refused"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Running"; }),
            "Running");
}

// `kubectl drain` (cordon, then the Eviction API: policy/v1 Eviction POSTed to
// pods/{name}/eviction, found in discovery) stops a pod gracefully: SIGTERM, which it traps, and it
// is gone before drain returns. kubectl says "evicted" only when it used the Eviction API
// ("deleted" otherwise). An Eviction for another name, or for a pod that is not there, is refused
// as upstream does.
TEST_F(KubeletTest, KubectlDrainEvictsThroughTheEvictionApiAndThePodStopsGracefully) {
  const std::string node = Ok({"get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"});
  Ok({"apply", "-f",
      Pod("drained",
          "trap \"echo term > /work/drained-term; exit 0\" TERM; echo up; "
          "while true; do sleep 0.1; done")});
  WaitFor({"pod", "drained"}, "{.status.phase}",
          [](const std::string& s) { return s == "Running"; });
  ProcessResult drain = Kubectl({"drain", node, "--force", "--grace-period=10", "--timeout=60s"});
  EXPECT_EQ(drain.exit_code, 0) << drain.out << drain.err;
  EXPECT_NE(drain.out.find("pod/drained evicted"), std::string::npos) << drain.out << drain.err;
  EXPECT_NE(drain.out.find("node/" + node + " drained"), std::string::npos) << drain.out;
  EXPECT_EQ(Ok({"get", "node", node, "-o", "jsonpath={.spec.unschedulable}"}), "true");
  EXPECT_EQ(ReadWork("drained-term"), "term\n") << "the pod was not stopped with SIGTERM";
  EXPECT_NE(Kubectl({"get", "pod", "drained"}).err.find("NotFound"), std::string::npos);
  Ok({"uncordon", node});

  Ok({"apply", "-f", Pod("kept", "sleep 300")});
  const std::string mismatch = WriteFile(
      "eviction.json",
      R"({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}})");
  ProcessResult wrong =
      Kubectl({"create", "--raw", "/api/v1/namespaces/default/pods/kept/eviction", "-f", mismatch});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("name in URL does not match name in Eviction object"), std::string::npos)
      << wrong.err;
  ProcessResult missing = Kubectl(
      {"create", "--raw", "/api/v1/namespaces/default/pods/other/eviction", "-f", mismatch});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("NotFound"), std::string::npos) << missing.err;
  EXPECT_EQ(Ok({"get", "pod", "kept", "-o", "jsonpath={.metadata.deletionTimestamp}"}), "");
}

// The taint manager: a NoExecute taint evicts the pods that do not tolerate it at once (Event
// TaintManagerEviction), those that tolerate it for tolerationSeconds after that, and leaves
// those that tolerate it for good.
TEST_F(KubeletTest, ANoExecuteTaintEvictsThePodsThatDoNotTolerateItForGood) {
  const std::string node = Ok({"get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"});
  Ok({"apply", "-f", Pod("intolerant", "sleep 300")});
  Ok({"apply", "-f",
      Pod("brief", "sleep 300",
          "  tolerations: [{key: maintenance, operator: Exists, effect: NoExecute, "
          "tolerationSeconds: 3}]\n")});
  Ok({"apply", "-f",
      Pod("tolerant", "sleep 300",
          "  tolerations: [{key: maintenance, operator: Exists, effect: NoExecute}]\n")});
  for (const char* pod : {"intolerant", "brief", "tolerant"})
    WaitFor({"pod", pod}, "{.status.phase}", [](const std::string& s) { return s == "Running"; });
  // Timed from before the taint (its timeAdded is whole seconds): "brief", tolerating it for
  // 3 s, is marked for deletion 2 s later at the earliest.
  const auto before = std::chrono::steady_clock::now();
  Ok({"taint", "nodes", node, "maintenance=now:NoExecute"});
  auto marked = [&](const char* pod) {
    std::chrono::steady_clock::duration after{};
    const bool ok = WaitUntilTrue(
        [&] {
          ProcessResult r =
              Kubectl({"get", "pod", pod, "-o", "jsonpath={.metadata.deletionTimestamp}"});
          after = std::chrono::steady_clock::now() - before;
          return !r.out.empty() || r.err.find("NotFound") != std::string::npos;
        },
        30s);
    EXPECT_TRUE(ok) << pod << " was not evicted";
    return after;
  };
  marked("intolerant");
  EXPECT_GE(marked("brief"), 2s) << "evicted before its tolerationSeconds";
  // "brief" went after its 3 s: "tolerant", there all along, was kept.
  EXPECT_EQ(Ok({"get", "pod", "tolerant", "-o", "jsonpath={.status.phase}"}), "Running");
  EXPECT_EQ(Ok({"get", "pod", "tolerant", "-o", "jsonpath={.metadata.deletionTimestamp}"}), "");
  const std::string events = Ok({"get", "events", "--field-selector", "reason=TaintManagerEviction",
                                 "-o", "jsonpath={.items[*].message}"});
  EXPECT_NE(events.find("Marking for deletion Pod default/intolerant"), std::string::npos)
      << events;
  EXPECT_EQ(events.find("default/tolerant"), std::string::npos) << events;
}

TEST_F(KubeletTest, ExitCodesAndRestartPolicyShowInPodStatus) {
  Ok({"apply", "-f", Pod("fails", "echo failing; exit 3", "  restartPolicy: Never\n")});
  Ok({"apply", "-f",
      Pod("retries", "echo attempt >> /work/attempts; exit 1", "  restartPolicy: OnFailure\n")});
  EXPECT_EQ(WaitFor({"pod", "fails"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Failed"; }),
            "Failed");
  EXPECT_EQ(Ok({"get", "pod", "fails", "-o",
                "jsonpath={.status.containerStatuses[0].state.terminated.exitCode} "
                "{.status.containerStatuses[0].state.terminated.reason}"}),
            "3 Error");
  EXPECT_GE(std::stoi(WaitFor({"pod", "retries"}, "{.status.containerStatuses[0].restartCount}",
                              [](const std::string& s) { return !s.empty() && s[0] >= '2'; })),
            2);
  EXPECT_EQ(Ok({"get", "pod", "retries", "-o",
                "jsonpath={.status.phase} "
                "{.status.containerStatuses[0].lastState.terminated.exitCode}"}),
            "Running 1");
  EXPECT_GE(ReadWork("attempts").size(), std::string("attempt\nattempt\nattempt\n").size());
  EXPECT_NE(
      Ok({"get", "events", "--field-selector", "involvedObject.name=retries"}).find("BackOff"),
      std::string::npos);
}

// Kubernetes: what the container writes to terminationMessagePath (default
// /dev/termination-log) is its terminated state's message; with terminationMessagePolicy
// FallbackToLogsOnError a failed container that wrote none gets the tail of its log; without
// it, none.
TEST_F(KubeletTest, TerminationMessagesComeFromTheMessageFileOrTheLogTailOnError) {
  Ok({"apply", "-f",
      Pod("reports", "echo noise; printf \"{\\\"store\\\": 7}\" > /dev/termination-log",
          "  restartPolicy: Never\n")});
  Ok({"apply", "-f",
      Pod("elsewhere", "printf done > /tmp/custom-message; exit 4", "  restartPolicy: Never\n",
          "    terminationMessagePath: /tmp/custom-message\n")});
  Ok({"apply", "-f",
      Pod("fallback", "echo first; echo the last words; exit 2", "  restartPolicy: Never\n",
          "    terminationMessagePolicy: FallbackToLogsOnError\n")});
  Ok({"apply", "-f", Pod("silent", "echo only a log line; exit 2", "  restartPolicy: Never\n")});
  const std::string message = "{.status.containerStatuses[0].state.terminated.message}";
  for (const char* pod : {"reports", "elsewhere", "fallback", "silent"})
    WaitFor({"pod", pod}, "{.status.phase}",
            [](const std::string& s) { return s == "Succeeded" || s == "Failed"; });
  EXPECT_EQ(Ok({"get", "pod", "reports", "-o", "jsonpath=" + message}), "{\"store\": 7}");
  EXPECT_EQ(Ok({"get", "pod", "elsewhere", "-o", "jsonpath=" + message}), "done");
  EXPECT_EQ(Ok({"get", "pod", "fallback", "-o", "jsonpath=" + message}), "first\nthe last words\n");
  EXPECT_EQ(Ok({"get", "pod", "silent", "-o", "jsonpath=" + message}), "");
}

TEST_F(KubeletTest, DeleteSendsSigtermAndSigkillsAfterTheGracePeriod) {
  // One process stops on SIGTERM; the other ignores it and must be killed after its grace.
  Ok({"apply", "-f",
      Pod("polite",
          "echo $$$$ > /work/polite.pid; trap \"echo TERM > /work/polite.term; exit 0\" "
          "TERM; while true; do sleep 0.1; done",
          "  terminationGracePeriodSeconds: 30\n")});
  Ok({"apply", "-f",
      Pod("stubborn",
          "echo $$$$ > /work/stubborn.pid; trap \"\" TERM; while true; do sleep 0.1; done",
          "  terminationGracePeriodSeconds: 2\n")});
  for (const char* name : {"polite", "stubborn"})
    WaitFor({"pod", name}, "{.status.phase}", [](const std::string& s) { return s == "Running"; });
  WaitFor({"pod", "stubborn"}, "{.metadata.name}",
          [&](const std::string&) { return !ReadWork("stubborn.pid").empty(); });
  pid_t stubborn = std::stoi(ReadWork("stubborn.pid"));
  ASSERT_TRUE(Alive(stubborn));

  auto start = std::chrono::steady_clock::now();
  Ok({"delete", "pod", "polite"});  // kubectl waits until the pod is gone
  EXPECT_EQ(ReadWork("polite.term"), "TERM\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);  // well inside its 30 s grace
  EXPECT_FALSE(Alive(std::stoi(ReadWork("polite.pid"))));

  ProcessResult deleting = Kubectl({"delete", "pod", "stubborn", "--wait=false"});
  EXPECT_EQ(deleting.exit_code, 0) << deleting.err;
  EXPECT_EQ(Ok({"get", "pod", "stubborn", "-o", "jsonpath={.metadata.deletionGracePeriodSeconds}"}),
            "2");
  EXPECT_TRUE(Alive(stubborn));  // SIGTERM ignored, still inside the grace period
  EXPECT_TRUE(WaitGone(stubborn, 15s)) << "SIGKILL did not follow the grace period";
  EXPECT_EQ(WaitFor({"pods"}, "{.items[*].metadata.name}",
                    [](const std::string& s) { return s.empty(); }),
            "");
}

TEST_F(KubeletTest, NoProcessOutlivesKillNineOfTidalLocalAndPodsRestartAfterIt) {
  Ok({"apply", "-f", Pod("survivor", "echo $$$$ >> /work/pids; exec sleep 300")});
  WaitFor({"pod", "survivor"}, "{.status.phase}",
          [](const std::string& s) { return s == "Running"; });
  WaitFor({"pod", "survivor"}, "{.metadata.name}",
          [&](const std::string&) { return !ReadWork("pids").empty(); });
  pid_t first = std::stoi(ReadWork("pids"));
  ASSERT_TRUE(Alive(first));
  ::kill(cluster_->pid(), SIGKILL);
  cluster_->Wait(10s);
  EXPECT_TRUE(WaitGone(first, 10s)) << "pod process outlived tidal local";

  StartCluster(ExtraClusterArgs());
  EXPECT_EQ(WaitFor({"pod", "survivor"}, "{.status.containerStatuses[0].restartCount}",
                    [](const std::string& s) { return s == "1"; }),
            "1");
  EXPECT_EQ(Ok({"get", "pod", "survivor", "-o",
                "jsonpath={.status.containerStatuses[0].lastState.terminated.reason}"}),
            "ContainerStatusUnknown");
  WaitFor({"pod", "survivor"}, "{.metadata.name}", [&](const std::string&) {
    return ReadWork("pids").find('\n') != ReadWork("pids").rfind('\n');
  });
  std::string pids = ReadWork("pids");
  pid_t second = std::stoi(pids.substr(pids.find('\n') + 1));
  EXPECT_TRUE(Alive(second));
  // A clean stop (SIGTERM) stops the pods too.
  ::kill(cluster_->pid(), SIGTERM);
  EXPECT_EQ(cluster_->Wait(20s).exit_code, 0);
  EXPECT_FALSE(Alive(second));
}

TEST_F(KubeletTest, UnknownImagesAndMissingSecretsAreReportedAsWaitingReasons) {
  std::string yaml =
      "apiVersion: v1\nkind: Pod\nmetadata: {name: unknown-image}\nspec:\n  containers:\n"
      "  - {name: main, image: 'registry.example/nothing:1'}\n";
  Ok({"apply", "-f", WriteFile("unknown.yaml", yaml)});
  EXPECT_EQ(WaitFor({"pod", "unknown-image"}, "{.status.containerStatuses[0].state.waiting.reason}",
                    [](const std::string& s) { return s == "ErrImagePull"; }),
            "ErrImagePull");
  EXPECT_NE(Ok({"describe", "pod", "unknown-image"}).find("--image registry.example/nothing="),
            std::string::npos);
  yaml =
      "apiVersion: v1\nkind: Pod\nmetadata: {name: needs-secret}\nspec:\n  containers:\n"
      "  - name: main\n    image: busybox\n    command: [sh, -c, 'echo token=$T; sleep 300']\n"
      "    env: [{name: T, valueFrom: {secretKeyRef: {name: later, key: token}}}]\n";
  Ok({"apply", "-f", WriteFile("secret.yaml", yaml)});
  EXPECT_EQ(WaitFor({"pod", "needs-secret"}, "{.status.containerStatuses[0].state.waiting.message}",
                    [](const std::string& s) { return s == "secret \"later\" not found"; }),
            "secret \"later\" not found");
  // Once the Secret exists the container starts (after its back-off).
  Ok({"apply", "-f",
      WriteFile("later.yaml",
                "apiVersion: v1\nkind: Secret\nmetadata: {name: later}\n"
                "stringData: {token: t0k3n}\n")});
  EXPECT_EQ(WaitFor({"pod", "needs-secret"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Running"; }),
            "Running");
  EXPECT_EQ(WaitFor({"pod", "needs-secret"}, "{.metadata.name}",
                    [&](const std::string&) {
                      return Ok({"logs", "needs-secret"}) == "token=t0k3n\n";
                    }),
            "needs-secret");
}

// `tidal local --keep-logs`: the output of every container run stays readable after a restart
// replaced it and after its pod, and a same-named successor, are gone (what the chaos driver
// reads each generation's steps from).
class KeptLogsTest : public KubeletTest {
 protected:
  std::vector<std::string> ExtraClusterArgs() override {
    auto args = KubeletTest::ExtraClusterArgs();
    args.push_back("--keep-logs");
    return args;
  }
  // Every kept log of pod `name`, concatenated in file-name order (<container>-<ms>-<n>).
  std::vector<std::string> Kept(const std::string& name) {
    std::vector<std::string> out;
    const fs::path dir = dir_ / "data" / "logs-archive" / "default" / name;
    if (!fs::exists(dir)) return out;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f);
      std::stringstream ss;
      ss << in.rdbuf();
      out.push_back(ss.str());
    }
    return out;
  }
};

TEST_F(KeptLogsTest, EveryRunsOutputOutlivesItsRestartItsPodAndASameNamedSuccessor) {
  // Fails twice, then succeeds: three runs.
  Ok({"apply", "-f",
      Pod("crashy",
          "n=$(cat /work/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /work/n; "
          "echo run $n; test $n -ge 3",
          "  restartPolicy: OnFailure\n")});
  ASSERT_EQ(WaitFor({"pod", "crashy"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Succeeded"; }),
            "Succeeded");
  Ok({"delete", "pod", "crashy", "--wait=true"});
  constexpr int kRuns = 3;
  // The successor's own output is its log; each earlier run's is kept, whole, once.
  Ok({"apply", "-f", Pod("crashy", "echo successor; sleep 30", "  restartPolicy: Never\n")});
  EXPECT_EQ(WaitFor({"pod", "crashy"}, "{.status.phase}",
                    [&](const std::string& phase) {
                      return phase == "Running" && Kubectl({"logs", "crashy"}).out == "successor\n";
                    }),
            "Running");
  std::vector<std::string> kept = Kept("crashy");
  ASSERT_EQ(kept.size(), static_cast<size_t>(kRuns)) << ::testing::PrintToString(kept);
  std::set<std::string> seen(kept.begin(), kept.end());
  for (int run = 1; run <= kRuns; ++run)
    EXPECT_EQ(seen.count("run " + std::to_string(run) + "\n"), 1u) << "run " << run;
  Ok({"delete", "pod", "crashy", "--grace-period=0", "--wait=true"});
  // The kubelet lets go of the pod on its next pass after the API did.
  EXPECT_TRUE(WaitUntilTrue(
      [&] {
        kept = Kept("crashy");
        return std::count(kept.begin(), kept.end(), "successor\n") == 1;
      },
      10s))
      << ::testing::PrintToString(kept);
}

TEST_F(KubeletTest, WithoutKeepLogsThePodsLogsGoWithIt) {
  if (KeepLogsDir()) GTEST_SKIP() << "TIDAL_E2E_KEEP_LOGS starts every cluster with --keep-logs";
  Ok({"apply", "-f", Pod("brief", "echo bye", "  restartPolicy: Never\n")});
  EXPECT_EQ(WaitFor({"pod", "brief"}, "{.status.phase}",
                    [](const std::string& s) { return s == "Succeeded"; }),
            "Succeeded");
  Ok({"delete", "pod", "brief", "--wait=true"});
  EXPECT_TRUE(WaitUntilTrue(
      [&] { return !fs::exists(dir_ / "data" / "logs" / "default" / "brief"); }, 10s));
  EXPECT_FALSE(fs::exists(dir_ / "data" / "logs-archive"));
}

}  // namespace
}  // namespace tidal::testing
