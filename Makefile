# Tidal — the two commands a newcomer runs: `make demo` and `make test`.
# Every target installs what is missing first (`make deps`, seconds when all is there).
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps configure build test sanitize tsan fuzz unit integration e2e manifests demo demo-train bench bench-gpu-pack bench-kube bench-checkpoint bench-operator format clean

all: build

deps:
	@tools/deps.sh

# gRPC is required: a suite must never drop out of CI because a package is missing.
$(BUILD_DIR)/build.ninja: CMakeLists.txt | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DTIDAL_REQUIRE_GRPC=ON

configure: deps $(BUILD_DIR)/build.ninja

# Everything, the benchmarks included (`make test` builds all but them: tools/test.sh).
build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target all benchmarks

# Every test (unit, integration and e2e ctest labels), incremental build first; then every test
# that needs no LibTorch once more under AddressSanitizer + UBSan (`make sanitize`), whose build
# runs in the background meanwhile at the lowest CPU priority. tools/test.sh installs what is
# missing itself (`make deps` in two parts, so that this build starts before the venv is in).
test:
	tools/test.sh $(BUILD_DIR) $(CTEST_ARGS)

# AddressSanitizer + LeakSanitizer + UBSan over the tests without LibTorch (build-asan/).
sanitize: deps
	tools/sanitize.sh address $(CTEST_ARGS)

# ThreadSanitizer over the tests of the concurrent code (build-tsan/; tools/sanitize.sh says which).
tsan: deps
	tools/sanitize.sh thread $(CTEST_ARGS)

# libFuzzer over every parser of user or network input (fuzz/), FUZZ_SECONDS each (clang,
# build-fuzz/); what it learns stays in out/fuzz/. A finding exits 1 naming the input.
FUZZ_SECONDS ?= 60
fuzz: deps
	tools/fuzz.sh $(FUZZ_SECONDS)

unit: build
	cd $(BUILD_DIR) && ctest --output-on-failure -L unit $(CTEST_ARGS)

integration: build
	cd $(BUILD_DIR) && ctest --output-on-failure -L integration $(CTEST_ARGS)

e2e: build
	cd $(BUILD_DIR) && ctest --output-on-failure -L e2e $(CTEST_ARGS)

# deploy/kustomize/base/tidal.yaml: the Helm chart rendered with its defaults (for kubectl -k).
manifests: deps
	tools/render-manifests.sh

# The product: `tidal local` with the operator, a TrainingJob that grows 2 -> 4 GPUs when its
# schedule window opens and shrinks back when it closes, watched with kubectl (tools/demo.sh).
# Builds only what the demo runs: the operator and `tidal local` (tidal-local), the worker it
# starts and the data phase's tidal-prep (the prep pod tokenizes the dataset before the job
# trains).
DEMO_TARGETS = tidal tidal-local tidal-worker tidal-prep
demo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target $(DEMO_TARGETS)
	tools/demo.sh $(BUILD_DIR)

# The engine alone: a multi-process LoRA fine-tune of the tiny preset with tidal-train.
DEMO_NPROC ?= 2
demo-train: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target tidal-train
	@mkdir -p out/demo-train
	$(BUILD_DIR)/worker/tidal-train --config examples/tiny-lora.yaml --nproc $(DEMO_NPROC) \
	  --out out/demo-train > out/demo-train/steps.jsonl
	@echo "  per-step JSON lines: out/demo-train/steps.jsonl"

bench: build bench-kube bench-checkpoint bench-operator
	bench/step_time_vs_python.sh $(BUILD_DIR)
	bench/auto_micro_batch.sh $(BUILD_DIR) small
	bench/gradient_compression.sh $(BUILD_DIR) tiny 12 4 0.05
	bench/checkpoint_compression.sh $(BUILD_DIR) small 20
	tools/venv/bin/python3 bench/gloo_collectives.py

# The engine against transformers + PEFT on a GPU host: `make bench-gpu-pack` here, then
# `bench/gpu.sh run` there with out/gpu-bench carried (bench/gpu.sh says how).
bench-gpu-pack: build
	bench/gpu.sh pack $(BUILD_DIR)

# The Kubernetes side: informer memory per Pod, list+watch throughput through tidal local.
bench-kube: build
	$(BUILD_DIR)/bench/informer_memory_bench --pods 10000
	$(BUILD_DIR)/bench/kube_list_watch_bench --objects 10000

# Checkpoints: file:// write and resharded load against dd; training stall on the small preset.
bench-checkpoint: build
	$(BUILD_DIR)/bench/checkpoint_io_bench --mib 512
	bench/checkpoint_stall.sh $(BUILD_DIR) small 8 2

# The operator: training time lost per rescale against stop-and-restart; reconcile latency and
# memory with many jobs (sleeping stand-ins for the workers).
bench-operator: build
	bench/rescale_cost.sh $(BUILD_DIR) 3
	bench/recovery_cost.sh $(BUILD_DIR) 3
	bench/operator_scale.sh $(BUILD_DIR) 200 10 60

format:
	find api common operator worker tests bench -name '*.cc' -o -name '*.h' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz out
